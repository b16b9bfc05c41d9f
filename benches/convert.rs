//! Slice conversion throughput: the plain scalar loop against every SIMD path
//! this CPU has (single thread, 64 Ki elements: in L2), the rayon split on
//! 16 Mi elements (DRAM), and the split threshold. Results: docs/benchmarks.md.
//!
//! Run: `cargo bench --bench convert` (about 1.5 minutes).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fp8_engine::convert::{self, HighPrecision, Isa, scalar};
use fp8_engine::format::{Fp8Format, Overflow};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

const SMALL: usize = 64 << 10;
const LARGE: usize = 16 << 20;
/// A typical activation scale: amax ~600 mapped near E4M3's 448.
const SCALE: f32 = 0.75;

/// Normal-ish activations: mostly small, a few large enough to saturate.
fn activations<T: HighPrecision>(len: usize) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(7);
    (0..len)
        .map(|_| T::from_f32(rng.random_range(-1.0f32..1.0).powi(3) * 600.0))
        .collect()
}

fn codes(len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(8);
    (0..len).map(|_| rng.random()).collect()
}

fn simd_isas() -> Vec<Isa> {
    Isa::available().into_iter().filter(|&isa| isa != Isa::Scalar).collect()
}

fn quantize_case<T: HighPrecision>(c: &mut Criterion, format: Fp8Format, overflow: Overflow) {
    let src = activations::<T>(SMALL);
    let mut dst = vec![0u8; SMALL];
    let mode = if overflow == Overflow::Saturate {
        "sat"
    } else {
        "nonsat"
    };
    let mut group = c.benchmark_group(format!("quantize {} -> {format} {mode}", T::NAME));
    group.throughput(Throughput::Elements(SMALL as u64));
    group.bench_function("plain loop", |b| {
        b.iter(|| scalar::quantize(black_box(&src), &mut dst, format, SCALE, overflow))
    });
    for isa in simd_isas() {
        group.bench_function(isa.name(), |b| {
            b.iter(|| convert::quantize_on(isa, black_box(&src), &mut dst, format, SCALE, overflow).unwrap())
        });
    }
    group.finish();
}

fn dequantize_case<T: HighPrecision>(c: &mut Criterion, format: Fp8Format) {
    let src = codes(SMALL);
    let mut dst = vec![T::from_f32(0.0); SMALL];
    let mut group = c.benchmark_group(format!("dequantize {format} -> {}", T::NAME));
    group.throughput(Throughput::Elements(SMALL as u64));
    group.bench_function("plain loop", |b| {
        b.iter(|| scalar::dequantize(black_box(&src), &mut dst, format, 1.5))
    });
    for isa in simd_isas() {
        group.bench_function(isa.name(), |b| {
            b.iter(|| convert::dequantize_on(isa, black_box(&src), &mut dst, format, 1.5).unwrap())
        });
    }
    group.finish();
}

fn single_thread(c: &mut Criterion) {
    quantize_case::<f32>(c, Fp8Format::E4M3, Overflow::Saturate);
    quantize_case::<f32>(c, Fp8Format::E5M2, Overflow::Saturate);
    quantize_case::<bf16>(c, Fp8Format::E4M3, Overflow::Saturate);
    quantize_case::<f16>(c, Fp8Format::E5M2, Overflow::NonSaturating);
    dequantize_case::<f32>(c, Fp8Format::E4M3);
    dequantize_case::<f32>(c, Fp8Format::E5M2);
    dequantize_case::<bf16>(c, Fp8Format::E4M3);
    dequantize_case::<f16>(c, Fp8Format::E5M2);
}

/// 16 Mi elements: plain loop, best ISA on one thread, and the public
/// (rayon-split) entry points.
fn large(c: &mut Criterion) {
    let best = Isa::best();
    let src = activations::<f32>(LARGE);
    let mut q = vec![0u8; LARGE];
    let mut group = c.benchmark_group("quantize f32 -> e4m3 sat, 16 Mi");
    group.throughput(Throughput::Elements(LARGE as u64));
    let (format, overflow) = (Fp8Format::E4M3, Overflow::Saturate);
    group.bench_function("plain loop", |b| {
        b.iter(|| scalar::quantize(black_box(&src), &mut q, format, SCALE, overflow))
    });
    group.bench_function(format!("{best} one thread"), |b| {
        b.iter(|| convert::quantize_on(best, black_box(&src), &mut q, format, SCALE, overflow).unwrap())
    });
    group.bench_function(format!("{best} rayon"), |b| {
        b.iter(|| convert::quantize(black_box(&src), &mut q, format, SCALE, overflow).unwrap())
    });
    group.finish();

    let codes = codes(LARGE);
    let mut y = vec![0.0f32; LARGE];
    let mut group = c.benchmark_group("dequantize e4m3 -> f32, 16 Mi");
    group.throughput(Throughput::Elements(LARGE as u64));
    group.bench_function("plain loop", |b| {
        b.iter(|| scalar::dequantize(black_box(&codes), &mut y, format, 1.5))
    });
    group.bench_function(format!("{best} one thread"), |b| {
        b.iter(|| convert::dequantize_on(best, black_box(&codes), &mut y, format, 1.5).unwrap())
    });
    group.bench_function(format!("{best} rayon"), |b| {
        b.iter(|| convert::dequantize(black_box(&codes), &mut y, format, 1.5).unwrap())
    });
    group.finish();
}

/// One thread against a rayon split in 64 Ki chunks around `PARALLEL_MIN_LEN`.
fn split_threshold(c: &mut Criterion) {
    let best = Isa::best();
    let (format, overflow) = (Fp8Format::E4M3, Overflow::Saturate);
    let mut group = c.benchmark_group("split threshold, quantize f32 -> e4m3");
    for len in [256 << 10, 1 << 20, 2 << 20, 4 << 20] {
        let src = activations::<f32>(len);
        let mut q = vec![0u8; len];
        group.throughput(Throughput::Elements(len as u64));
        group.bench_with_input(BenchmarkId::new("one thread", len), &len, |b, _| {
            b.iter(|| convert::quantize_on(best, black_box(&src), &mut q, format, SCALE, overflow).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("rayon 64 Ki chunks", len), &len, |b, _| {
            b.iter(|| {
                black_box(&src)
                    .par_chunks(64 << 10)
                    .zip(q.par_chunks_mut(64 << 10))
                    .map(|(s, d)| convert::quantize_on(best, s, d, format, SCALE, overflow).unwrap())
                    .reduce(|| 0.0, f32::max)
            })
        });
    }
    group.finish();
}

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

fn slow() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
}

criterion_group! { name = small; config = quick(); targets = single_thread, split_threshold }
criterion_group! { name = big; config = slow(); targets = large }
criterion_main!(small, big);
