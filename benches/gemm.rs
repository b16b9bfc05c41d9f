//! GEMM throughput on the CPU, in elements/s where one "element" is one
//! multiply-add (criterion's Elements throughput = M*N*K; GFLOP/s = 2x that):
//! the f32 GEMM crate (`gemm`) on f32 inputs, next to the engine's CPU GEMM on
//! FP8 E4M3 with per-tensor scales (split accumulation on and off), 1x128 x
//! 128x128 block scales, and plain bf16, at 512^3 and 2048^3, bf16 output.
//!
//! `cargo bench --bench gemm`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fp8_engine::format::Fp8Format;
use fp8_engine::gemm::{self, GemmParams, Mat, Operand, Output};
use fp8_engine::quantize::{ScaleRule, quantize_1x128, quantize_block_128x128, quantize_current};
use fp8_engine::tensor::QuantizedMatrix;
use half::bf16;

/// Deterministic values in [-0.5, 0.5) times a few binades along the rows.
fn input(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut state = 0x2545_F491_4F6C_DD1Du64 ^ seed;
    (0..rows * cols)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            unit * (1 << (i / cols % 4)) as f32
        })
        .collect()
}

fn rowwise(t: fp8_engine::tensor::QuantizedTensor) -> QuantizedMatrix {
    t.into_parts().1
}

fn gemms(c: &mut Criterion) {
    let e4m3 = Fp8Format::E4M3;
    let current = ScaleRule {
        format: e4m3,
        power_2_scale: false,
        amax_epsilon: 0.0,
    };
    let block = ScaleRule {
        power_2_scale: true,
        ..current
    };
    for size in [512usize, 2048] {
        let (m, n, k) = (size, size, size);
        let (xa, xb) = (input(m, k, 1), input(n, k, 2));
        let (ha, hb): (Vec<bf16>, Vec<bf16>) = (
            xa.iter().map(|&x| bf16::from_f32(x)).collect(),
            xb.iter().map(|&x| bf16::from_f32(x)).collect(),
        );
        let qa = rowwise(quantize_current(&xa, m, k, &current, false).unwrap().0);
        let qb = rowwise(quantize_current(&xb, n, k, &current, false).unwrap().0);
        let ba = rowwise(quantize_1x128(&xa, m, k, &block, false).unwrap());
        let bb = rowwise(quantize_block_128x128(&xb, n, k, &block, false).unwrap());
        let mut d32 = vec![0.0f32; m * n];
        let mut d16 = vec![bf16::ZERO; m * n];

        let mut group = c.benchmark_group(format!("gemm_{size}^3"));
        group.throughput(Throughput::Elements((m * n * k) as u64));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(if size > 1024 { 6 } else { 2 }));

        let (fa, fb) = (Mat::new(&xa, m, k).unwrap(), Mat::new(&xb, n, k).unwrap());
        group.bench_function("f32_crate", |b| {
            b.iter(|| gemm::cpu::f32_crate_gemm(black_box(fa), fb, &mut d32).unwrap())
        });
        let mut ours = |name: &str, a: Operand, b: Operand, split: bool| {
            let params = GemmParams {
                split_accumulator: split,
                ..GemmParams::default()
            };
            group.bench_function(name, |bench| {
                bench.iter(|| gemm::cpu::gemm(black_box(&a), &b, Output::Bf16(&mut d16), &params).unwrap())
            });
        };
        ours(
            "e4m3_tensor_split",
            Operand::Fp8(e4m3, &qa),
            Operand::Fp8(e4m3, &qb),
            true,
        );
        ours(
            "e4m3_tensor_fast",
            Operand::Fp8(e4m3, &qa),
            Operand::Fp8(e4m3, &qb),
            false,
        );
        ours(
            "e4m3_block_1x128_128x128",
            Operand::Fp8(e4m3, &ba),
            Operand::Fp8(e4m3, &bb),
            true,
        );
        let (pa, pb) = (Mat::new(&ha, m, k).unwrap(), Mat::new(&hb, n, k).unwrap());
        ours("bf16", Operand::Bf16(pa), Operand::Bf16(pb), false);
        group.finish();
    }
}

criterion_group!(benches, gemms);
criterion_main!(benches);
