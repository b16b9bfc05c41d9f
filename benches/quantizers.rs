//! Throughput of the CPU quantizers on a 2048 x 2048 tensor (4 Mi elements:
//! 16 MiB of f32, beyond L2; it fits the 32 MiB L3 of the machine in
//! `docs/benchmarks.md`). Short runs: the whole file takes under a minute.
//!
//! `cargo bench --bench quantizers`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fp8_engine::convert::HighPrecision;
use fp8_engine::format::Fp8Format;
use fp8_engine::quantize::{
    ScaleRule, amax, cast_amax, cast_transpose_amax, quantize_1x128, quantize_1x128_columnwise, quantize_1x128_rowwise,
    quantize_128x128, quantize_current, quantize_mxfp8, quantize_mxfp8_columnwise, quantize_mxfp8_rowwise,
};
use half::bf16;

const ROWS: usize = 2048;
const COLS: usize = 2048;

/// Deterministic values over a few binades, like activations.
fn input<T: HighPrecision>() -> Vec<T> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..ROWS * COLS)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            T::from_f32(unit * (1 << (i / COLS % 8)) as f32)
        })
        .collect()
}

fn quantizers(c: &mut Criterion) {
    let x: Vec<f32> = input();
    let xb: Vec<bf16> = input();
    let n = ROWS * COLS;
    let rule = ScaleRule {
        format: Fp8Format::E4M3,
        power_2_scale: true,
        amax_epsilon: 0.0,
    };
    let mut group = c.benchmark_group("quantize_2048x2048");
    group.throughput(Throughput::Elements(n as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));

    let mut q = vec![0u8; n];
    let mut qt = vec![0u8; n];
    group.bench_function("amax_f32", |b| b.iter(|| amax(black_box(&x))));
    group.bench_function("cast_amax_f32", |b| {
        b.iter(|| cast_amax(black_box(&x), &mut q, Fp8Format::E4M3, 0.5).unwrap())
    });
    group.bench_function("cast_amax_bf16", |b| {
        b.iter(|| cast_amax(black_box(&xb), &mut q, Fp8Format::E4M3, 0.5).unwrap())
    });
    group.bench_function("current_scaling_f32", |b| {
        b.iter(|| quantize_current(black_box(&x), ROWS, COLS, &rule, false).unwrap())
    });
    group.bench_function("cast_transpose_amax_f32", |b| {
        b.iter(|| cast_transpose_amax(black_box(&x), ROWS, COLS, Fp8Format::E4M3, 0.5, &mut q, &mut qt).unwrap())
    });
    let mut s1 = vec![0.0f32; ROWS * COLS.div_ceil(128)];
    group.bench_function("block_1x128_rowwise_f32", |b| {
        b.iter(|| quantize_1x128_rowwise(black_box(&x), ROWS, COLS, &rule, &mut q, &mut s1).unwrap())
    });
    let mut s1t = vec![0.0f32; COLS * ROWS.div_ceil(128)];
    group.bench_function("block_1x128_columnwise_f32", |b| {
        b.iter(|| quantize_1x128_columnwise(black_box(&x), ROWS, COLS, &rule, &mut qt, &mut s1t).unwrap())
    });
    // The convenience wrapper: both copies, output buffers allocated per call.
    group.bench_function("block_1x128_row_and_col_alloc_f32", |b| {
        b.iter(|| quantize_1x128(black_box(&x), ROWS, COLS, &rule, true).unwrap())
    });
    let mut s2 = vec![0.0f32; ROWS.div_ceil(128) * COLS.div_ceil(128)];
    group.bench_function("block_128x128_f32", |b| {
        b.iter(|| quantize_128x128(black_box(&x), ROWS, COLS, &rule, &mut q, &mut s2).unwrap())
    });
    let mut e = vec![0u8; ROWS * COLS.div_ceil(32)];
    group.bench_function("mxfp8_rowwise_f32", |b| {
        b.iter(|| quantize_mxfp8_rowwise(black_box(&x), ROWS, COLS, Fp8Format::E4M3, &mut q, &mut e).unwrap())
    });
    let mut et = vec![0u8; COLS * ROWS.div_ceil(32)];
    group.bench_function("mxfp8_columnwise_f32", |b| {
        b.iter(|| quantize_mxfp8_columnwise(black_box(&x), ROWS, COLS, Fp8Format::E4M3, &mut qt, &mut et).unwrap())
    });
    group.bench_function("mxfp8_rowwise_bf16", |b| {
        b.iter(|| quantize_mxfp8_rowwise(black_box(&xb), ROWS, COLS, Fp8Format::E4M3, &mut q, &mut e).unwrap())
    });

    let per_tensor = quantize_current(&x, ROWS, COLS, &rule, false).unwrap().0;
    let blocks = quantize_1x128(&x, ROWS, COLS, &rule, false).unwrap();
    let mx = quantize_mxfp8(&x, ROWS, COLS, Fp8Format::E4M3, false).unwrap();
    group.bench_function("dequantize_per_tensor_f32", |b| {
        b.iter(|| black_box(&per_tensor).dequantize::<f32>().unwrap())
    });
    group.bench_function("dequantize_1x128_f32", |b| {
        b.iter(|| black_box(&blocks).dequantize::<f32>().unwrap())
    });
    group.bench_function("dequantize_mxfp8_bf16", |b| {
        b.iter(|| black_box(&mx).dequantize::<bf16>().unwrap())
    });
    group.finish();
}

criterion_group!(benches, quantizers);
criterion_main!(benches);
