//! The portable CUDA GEMMs against the CPU reference `gemm::cpu::gemm` on random
//! inputs: every kernel family the GPU has (FP8 pairs, bf16, f16 k16 and the sm_75
//! k8 kernel, which runs anywhere), ragged M/N, K not a multiple of 128, every
//! output type, bias, beta = 1, every scale mode, split accumulation on and off;
//! cuBLASLt against the same reference; and the split-accumulation experiment
//! (K = 4096, 8192, 16384; split on/off and cuBLASLt fast accumulation on/off
//! against an f64 reference), printed. Without a usable GPU this prints one line,
//! "gpu_gemm: skipped: <why>", and passes.
//!
//! Tolerance: GPU and CPU sum the same exact products in different orders (and
//! FP8 tensor cores truncate to 13 significant bits inside an mma), so element (i, j)
//! may differ by `S_ij * (K / step + 2) * 2^-bits` with `S_ij = |alpha| sum_k |a_ik b_jk| sA sB`
//! (step = K per mma, bits = 12 for FP8 as measured on an H200, 22 for 16-bit inputs:
//! `error_bound::accumulation_bound`), plus one unit in the last place of the output
//! type at the larger magnitude (`error_bound::OutputUlp`). Each check prints its
//! line as it finishes, so a step cut short by its time limit still shows how far it got.

mod common;

use std::process::ExitCode;

use common::out_buf::{Out, OutBuf};
use fp8_engine::backend::cuda::CudaDevice;
use fp8_engine::backend::cuda::cublaslt::{CublasLt, LtInputs, LtOutput, cublaslt_present};
use fp8_engine::backend::cuda::error_bound::{Accumulation, OutputUlp, accumulation_bound};
use fp8_engine::backend::cuda::gemm::{gemm_host, gemm_host_with};
use fp8_engine::backend::cuda::gemm_dispatch::{GemmInputs, GemmKernel, cached_kernel, select_kernel};
use fp8_engine::device::MemoryCategory::Workspace;
use fp8_engine::format::Fp8Format::{self, E4M3, E5M2};
use fp8_engine::gemm::{GemmParams, Mat, Operand, Output, cpu};
use fp8_engine::tensor::{QuantizedMatrix, ScaleKind, Scales};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// `Ok`: the worst `err/bound` of the check as text; `Err`: what failed.
type Check = Result<String, String>;

/// scale_inv of (row, K-block).
type ScaleOf<'a> = Box<dyn Fn(usize, usize) -> f64 + 'a>;

/// Prints one check's line at once (a step cut short still shows how far it got) and keeps it.
fn record(results: &mut Vec<(String, Check)>, label: String, check: Check) {
    match &check {
        Ok(ratio) => println!("ok {label}: {ratio}"),
        Err(why) => println!("FAIL {label}: {why}"),
    }
    results.push((label, check));
}

/// `diff <= bound`, false for a NaN difference.
fn within(diff: f64, bound: f64) -> bool {
    diff <= bound
}

fn text<T>(r: fp8_engine::Result<T>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

/// (M, N, K): ragged tiles, K not a multiple of 128 (FP8 K % 16 == 0), one exact tile.
const FP8_SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 16),
    (3, 5, 32),
    (128, 128, 128),
    (130, 200, 272),
    (257, 129, 400),
    (300, 520, 1072),
];
/// 16-bit shapes (K % 8 == 0).
const HALF_SHAPES: &[(usize, usize, usize)] =
    &[(1, 1, 8), (7, 9, 24), (128, 128, 64), (131, 250, 200), (260, 385, 520)];

const OUTS: [Out; 5] = [Out::F32, Out::Bf16, Out::F16, Out::Fp8(E4M3), Out::Fp8(E5M2)];

/// Finite FP8 codes of `format` spread over about 8 binades around 1.
fn random_codes(rng: &mut StdRng, n: usize, format: Fp8Format) -> Vec<u8> {
    let table = format.decode_table();
    (0..n)
        .map(|_| {
            loop {
                let c: u8 = rng.random();
                let v = table[c as usize];
                if v.is_finite() && (v == 0.0 || (v.abs() > 1.0 / 16.0 && v.abs() < 16.0)) {
                    break c;
                }
            }
        })
        .collect()
}

fn random_scales(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| 2f32.powi(rng.random_range(-6..3)) * rng.random_range(0.5..1.5))
        .collect()
}

fn fp8_matrix(rng: &mut StdRng, rows: usize, k: usize, format: Fp8Format, kind: ScaleKind) -> QuantizedMatrix {
    let (r, c) = kind.scale_shape(rows, k);
    let scales = match kind {
        ScaleKind::PerTensor => Scales::PerTensor(random_scales(rng, 1)[0]),
        ScaleKind::Block1x128 => Scales::Block1x128(random_scales(rng, r * c)),
        ScaleKind::Block128x128 => Scales::Block128x128(random_scales(rng, r * c)),
        ScaleKind::Mxfp8 => Scales::Mxfp8(vec![127; r * c]),
    };
    QuantizedMatrix::new(random_codes(rng, rows * k, format), rows, k, scales).expect("consistent shapes")
}

/// |a| values and the scale_inv of (row, K-block) of an operand, for the error bound.
fn abs_values<'a>(op: &'a Operand<'a>) -> (Vec<f64>, ScaleOf<'a>) {
    match op {
        Operand::Fp8(format, q) => {
            let table = format.decode_table();
            let kb = q.cols().div_ceil(128);
            let vals = q.data().iter().map(|&c| table[c as usize].abs() as f64).collect();
            let scale: Box<dyn Fn(usize, usize) -> f64> = match q.scales() {
                Scales::PerTensor(s) => Box::new(move |_, _| *s as f64),
                Scales::Block1x128(s) => Box::new(move |r, b| s[r * kb + b] as f64),
                Scales::Block128x128(s) => Box::new(move |r, b| s[(r / 128) * kb + b] as f64),
                Scales::Mxfp8(_) => Box::new(|_, _| 1.0),
            };
            (vals, scale)
        }
        Operand::Bf16(m) => (
            m.data.iter().map(|x| x.to_f32().abs() as f64).collect(),
            Box::new(|_, _| 1.0),
        ),
        Operand::F16(m) => (
            m.data.iter().map(|x| x.to_f32().abs() as f64).collect(),
            Box::new(|_, _| 1.0),
        ),
        Operand::F32(m) => (m.data.iter().map(|x| x.abs() as f64).collect(), Box::new(|_, _| 1.0)),
    }
}

/// `|a_rk| s(r, k / 128)` of every element of an operand, row-major.
fn scaled_abs(op: &Operand) -> Vec<f64> {
    let (rows, k) = op.shape();
    let (v, s) = abs_values(op);
    (0..rows * k).map(|i| v[i] * s(i / k, (i % k) / 128)).collect()
}

/// `S_ij = |alpha| sum_k |a_ik b_jk| sA sB` for every output, rows in parallel
/// (O(M N K) in f64: the largest cases take seconds on one core).
fn magnitude(a: &Operand, b: &Operand, alpha: f32) -> Vec<f64> {
    let ((m, k), (n, _)) = (a.shape(), b.shape());
    let (av, bv) = (scaled_abs(a), scaled_abs(b));
    let mut s = vec![0.0; m * n];
    s.par_chunks_mut(n.max(1)).enumerate().for_each(|(i, row)| {
        let ai = &av[i * k..(i + 1) * k];
        for (j, out) in row.iter_mut().enumerate() {
            let t: f64 = ai.iter().zip(&bv[j * k..(j + 1) * k]).map(|(x, y)| x * y).sum();
            *out = t * alpha.abs() as f64;
        }
    });
    s
}

/// Runs CPU and GPU on the same inputs and compares element by element and the amax.
#[allow(clippy::too_many_arguments)]
fn compare(
    gpu: &CudaDevice,
    kernel: Option<GemmKernel>,
    label: &str,
    a: &Operand,
    b: &Operand,
    out: Out,
    params: &GemmParams,
    rng: &mut StdRng,
) -> Check {
    let ((m, k), (n, _)) = (a.shape(), b.shape());
    let fp8 = matches!(a, Operand::Fp8(..));
    let init: Vec<f32> = (0..m * n).map(|_| rng.random_range(-4.0..4.0)).collect();
    let out_scale = 2f32.powi(rng.random_range(-4..4));
    let mut cpu_out = OutBuf::new(out, &init);
    let mut gpu_out = OutBuf::new(out, &init);
    let cpu_report = cpu::gemm(a, b, cpu_out.output(out_scale), params).map_err(|e| format!("cpu: {e}"))?;
    let gpu_report =
        gemm_host_with(gpu, kernel, a, b, gpu_out.output(out_scale), params).map_err(|e| format!("gpu: {e}"))?;
    let s = magnitude(a, b, params.alpha);
    let kind = if fp8 { Accumulation::Fp8 } else { Accumulation::Half };
    let f32_tol = |sij: f64| accumulation_bound(kind, sij, k);
    let OutputUlp {
        relative: rel,
        subnormal: sub,
    } = cpu_out.ulp();
    let cv = cpu_out.values(out_scale);
    let gv = gpu_out.values(out_scale);
    let mut worst_tol = 0.0f64;
    let mut worst_ratio = 0.0f64;
    for idx in 0..m * n {
        let (c, g) = (cv[idx] as f64, gv[idx] as f64);
        let tol = f32_tol(s[idx]);
        worst_tol = worst_tol.max(tol);
        // One output ulp at the larger of the two magnitudes, plus the f32 difference.
        let bound = tol + rel * c.abs().max(g.abs()) + sub / out_scale as f64 + 1e-30;
        worst_ratio = worst_ratio.max((c - g).abs() / bound);
        if !within((c - g).abs(), bound) {
            return Err(format!(
                "{label}: D[{}, {}] gpu {g} cpu {c} (|diff| {} > {bound}, S = {}, err/bound={:.3})",
                idx / n,
                idx % n,
                (c - g).abs(),
                s[idx],
                (c - g).abs() / bound
            ));
        }
    }
    let (ca, ga) = (cpu_report.amax as f64, gpu_report.amax as f64);
    if !within((ca - ga).abs(), worst_tol + 1e-30) {
        return Err(format!("{label}: amax gpu {ga} cpu {ca}"));
    }
    Ok(format!("err/bound={worst_ratio:.3}"))
}

/// Worst `|got - reference| / tol` (tolerances from `tol_of(i)`); `Err` past 1.
fn ratio_check(got: &[f32], reference: &[f32], tol_of: impl Fn(usize) -> f64, who: &str) -> Check {
    let mut worst = 0.0f64;
    for i in 0..got.len() {
        let (diff, tol) = (((got[i] - reference[i]) as f64).abs(), tol_of(i) + 1e-30);
        if !within(diff, tol) {
            return Err(format!(
                "D[{i}]: {who} {} cpu {} tol {tol} (err/bound={:.3})",
                got[i],
                reference[i],
                diff / tol
            ));
        }
        worst = worst.max(diff / tol);
    }
    Ok(format!("err/bound={worst:.3}"))
}

fn random_params<'a>(rng: &mut StdRng, bias: &'a [f32], out: Out, split: bool) -> GemmParams<'a> {
    GemmParams {
        alpha: [1.0, 0.5, -1.75][rng.random_range(0..3)],
        beta: if matches!(out, Out::F32) && rng.random_bool(0.5) {
            1.0
        } else {
            0.0
        },
        bias: if rng.random_bool(0.5) { Some(bias.into()) } else { None },
        split_accumulator: split,
        report_amax: true,
    }
}

fn check_fp8(gpu: &CudaDevice, rng: &mut StdRng, results: &mut Vec<(String, Check)>) {
    let pairs = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)];
    let modes = [
        (ScaleKind::PerTensor, ScaleKind::PerTensor, true),
        (ScaleKind::PerTensor, ScaleKind::PerTensor, false),
        (ScaleKind::Block1x128, ScaleKind::Block128x128, true),
        (ScaleKind::Block1x128, ScaleKind::Block1x128, true),
    ];
    for &(fa, fb) in &pairs {
        for &(m, n, k) in FP8_SHAPES {
            for &(ka, kb, split) in &modes {
                for out in OUTS {
                    let a = fp8_matrix(rng, m, k, fa, ka);
                    let b = fp8_matrix(rng, n, k, fb, kb);
                    let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
                    let params = random_params(rng, &bias, out, split);
                    let label = format!(
                        "fp8 {fa:?}x{fb:?} {m}x{n}x{k} {ka:?}x{kb:?} split={split} out={out:?} alpha={} beta={} bias={}",
                        params.alpha,
                        params.beta,
                        params.bias.is_some()
                    );
                    let check = compare(
                        gpu,
                        None,
                        &label,
                        &Operand::Fp8(fa, &a),
                        &Operand::Fp8(fb, &b),
                        out,
                        &params,
                        rng,
                    );
                    record(results, label, check);
                }
            }
        }
    }
    // MXFP8 operands: tests/gpu_mxfp8.rs.
}

fn check_half(gpu: &CudaDevice, rng: &mut StdRng, results: &mut Vec<(String, Check)>) {
    for &(m, n, k) in HALF_SHAPES {
        for out in OUTS {
            let av: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2.0..2.0)).collect();
            let bv: Vec<f32> = (0..n * k).map(|_| rng.random_range(-2.0..2.0)).collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
            let params = random_params(rng, &bias, out, true);
            if gpu.info().compute_capability >= (8, 0) {
                let (a, b): (Vec<bf16>, Vec<bf16>) = (
                    av.iter().map(|&x| bf16::from_f32(x)).collect(),
                    bv.iter().map(|&x| bf16::from_f32(x)).collect(),
                );
                let label = format!("bf16 {m}x{n}x{k} out={out:?} beta={}", params.beta);
                let (ma, mb) = (Mat::new(&a, m, k).unwrap(), Mat::new(&b, n, k).unwrap());
                let check = compare(
                    gpu,
                    None,
                    &label,
                    &Operand::Bf16(ma),
                    &Operand::Bf16(mb),
                    out,
                    &params,
                    rng,
                );
                record(results, label, check);
            }
            let (a, b): (Vec<f16>, Vec<f16>) = (
                av.iter().map(|&x| f16::from_f32(x)).collect(),
                bv.iter().map(|&x| f16::from_f32(x)).collect(),
            );
            let kernel = cached_kernel(gpu.info().compute_capability, GemmInputs::F16).map(|k| k.function);
            let label = format!("f16 ({kernel:?}) {m}x{n}x{k} out={out:?} beta={}", params.beta);
            let (ma, mb) = (Mat::new(&a, m, k).unwrap(), Mat::new(&b, n, k).unwrap());
            let check = compare(
                gpu,
                None,
                &label,
                &Operand::F16(ma),
                &Operand::F16(mb),
                out,
                &params,
                rng,
            );
            record(results, label, check);
        }
    }
}

/// The sm_75 kernel (two m16n8k8 per k16) runs on every GPU: launched through the override.
fn check_f16_k8(gpu: &CudaDevice, rng: &mut StdRng, results: &mut Vec<(String, Check)>) {
    let k8 = select_kernel((7, 5), GemmInputs::F16).expect("sm_75 has an f16 kernel");
    for &(m, n, k) in HALF_SHAPES {
        for out in [Out::F32, Out::F16] {
            let a: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rng.random_range(-2.0..2.0))).collect();
            let b: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.random_range(-2.0..2.0))).collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
            let params = random_params(rng, &bias, out, true);
            let label = format!(
                "f16 m16n8k8 (sm_75 kernel) {m}x{n}x{k} out={out:?} beta={}",
                params.beta
            );
            let (ma, mb) = (Mat::new(&a, m, k).unwrap(), Mat::new(&b, n, k).unwrap());
            let check = compare(
                gpu,
                Some(k8),
                &label,
                &Operand::F16(ma),
                &Operand::F16(mb),
                out,
                &params,
                rng,
            );
            record(results, label, check);
        }
    }
}

/// Our FP8 and bf16 GEMMs against cuBLASLt and the CPU on one mid-size shape.
fn check_cublaslt(gpu: &CudaDevice, rng: &mut StdRng, results: &mut Vec<(String, Check)>) {
    if !cublaslt_present() {
        println!("gpu_gemm: cuBLASLt cross-check skipped: libcublasLt not found");
        return;
    }
    let (m, n, k) = (256, 384, 1024);
    let mut lt = match CublasLt::new(gpu) {
        Ok(lt) => lt,
        Err(e) => {
            record(results, "cublaslt handle".into(), Err(e.to_string()));
            return;
        }
    };
    for (fa, fast) in [(E4M3, false), (E4M3, true), (E5M2, false)] {
        if gpu.info().compute_capability < (8, 9) {
            break;
        }
        let a = fp8_matrix(rng, m, k, fa, ScaleKind::PerTensor);
        let b = fp8_matrix(rng, n, k, E4M3, ScaleKind::PerTensor);
        let label = format!("cublaslt fp8 {fa:?}xE4M3 {m}x{n}x{k} fast_accum={fast}");
        let check = (|| -> Check {
            let mut cpu_d = vec![0.0f32; m * n];
            cpu::gemm(
                &Operand::Fp8(fa, &a),
                &Operand::Fp8(E4M3, &b),
                Output::F32(&mut cpu_d),
                &GemmParams::default(),
            )
            .map_err(|e| e.to_string())?;
            let s = |q: &QuantizedMatrix| match q.scales() {
                Scales::PerTensor(s) => *s,
                _ => unreachable!(),
            };
            let da = text(gpu.upload(a.data(), Workspace))?;
            let db = text(gpu.upload(b.data(), Workspace))?;
            let sa = text(gpu.upload(&[s(&a)], Workspace))?;
            let sb = text(gpu.upload(&[s(&b)], Workspace))?;
            let mut d = text(gpu.alloc_zeros::<f32>(m * n, Workspace))?;
            let inputs = LtInputs::Fp8 {
                a: (&da, fa),
                b: (&db, E4M3),
                a_scale_inv: &sa,
                b_scale_inv: &sb,
                fast_accum: fast,
            };
            text(lt.matmul(gpu, (m, n, k), inputs, LtOutput::F32(&mut d), 1.0))?;
            let lt_d = text(gpu.download(&d))?;
            let mag = magnitude(&Operand::Fp8(fa, &a), &Operand::Fp8(E4M3, &b), 1.0);
            ratio_check(
                &lt_d,
                &cpu_d,
                |i| accumulation_bound(Accumulation::Fp8, mag[i], k),
                "cuBLASLt",
            )
        })();
        record(results, label, check);
    }
    // bf16 baseline vs CPU.
    if gpu.info().compute_capability >= (8, 0) {
        let av: Vec<bf16> = (0..m * k)
            .map(|_| bf16::from_f32(rng.random_range(-2.0..2.0)))
            .collect();
        let bv: Vec<bf16> = (0..n * k)
            .map(|_| bf16::from_f32(rng.random_range(-2.0..2.0)))
            .collect();
        let check = (|| -> Check {
            let mut cpu_d = vec![0.0f32; m * n];
            let (ma, mb) = (Mat::new(&av, m, k).unwrap(), Mat::new(&bv, n, k).unwrap());
            cpu::gemm(
                &Operand::Bf16(ma),
                &Operand::Bf16(mb),
                Output::F32(&mut cpu_d),
                &GemmParams::default(),
            )
            .map_err(|e| e.to_string())?;
            let da = text(gpu.upload(&av, Workspace))?;
            let db = text(gpu.upload(&bv, Workspace))?;
            let mut d = text(gpu.alloc_zeros::<f32>(m * n, Workspace))?;
            text(lt.matmul(
                gpu,
                (m, n, k),
                LtInputs::Bf16 { a: &da, b: &db },
                LtOutput::F32(&mut d),
                1.0,
            ))?;
            let lt_d = text(gpu.download(&d))?;
            let mag = magnitude(&Operand::Bf16(ma), &Operand::Bf16(mb), 1.0);
            ratio_check(
                &lt_d,
                &cpu_d,
                |i| accumulation_bound(Accumulation::Half, mag[i], k),
                "cuBLASLt",
            )
        })();
        record(results, format!("cublaslt bf16 {m}x{n}x{k}"), check);
    }
}

/// Split accumulation vs fast accumulation at large K on same-sign data (the worst
/// case for a short accumulator): max and mean relative error against f64, printed.
fn split_experiment(gpu: &CudaDevice, rng: &mut StdRng) {
    if gpu.info().compute_capability < (8, 9) {
        println!("gpu_gemm: split experiment skipped: no FP8 tensor cores");
        return;
    }
    let (m, n) = (128, 128);
    println!("gpu_gemm: split accumulation, E4M3 x E4M3, {m}x{n}, positive data, error vs f64 (max rel / mean rel):");
    for k in [4096usize, 8192, 16384] {
        let table = E4M3.decode_table();
        let positive = |rng: &mut StdRng, len: usize| -> Vec<u8> {
            (0..len).map(|_| rng.random_range(0x30u8..0x48)).collect() // 0.5 .. ~4, positive
        };
        let a = QuantizedMatrix::new(positive(rng, m * k), m, k, Scales::PerTensor(1.0)).unwrap();
        let b = QuantizedMatrix::new(positive(rng, n * k), n, k, Scales::PerTensor(1.0)).unwrap();
        let mut exact = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                exact[i * n + j] = (0..k)
                    .map(|kk| table[a.data()[i * k + kk] as usize] as f64 * table[b.data()[j * k + kk] as usize] as f64)
                    .sum();
            }
        }
        let err = |d: &[f32]| {
            let rel: Vec<f64> = d
                .iter()
                .zip(&exact)
                .map(|(&x, &e)| ((x as f64 - e) / e).abs())
                .collect();
            (
                rel.iter().cloned().fold(0.0, f64::max),
                rel.iter().sum::<f64>() / rel.len() as f64,
            )
        };
        let mut line = format!("  K={k:>5}:");
        for split in [true, false] {
            let mut d = vec![0.0f32; m * n];
            let params = GemmParams {
                split_accumulator: split,
                ..Default::default()
            };
            match gemm_host(
                gpu,
                &Operand::Fp8(E4M3, &a),
                &Operand::Fp8(E4M3, &b),
                Output::F32(&mut d),
                &params,
            ) {
                Ok(_) => {
                    let (mx, mean) = err(&d);
                    line += &format!(" ours split={split}: {mx:.2e}/{mean:.2e};");
                }
                Err(e) => line += &format!(" ours split={split}: error {e};"),
            }
        }
        let mut cpu_d = vec![0.0f32; m * n];
        if cpu::gemm(
            &Operand::Fp8(E4M3, &a),
            &Operand::Fp8(E4M3, &b),
            Output::F32(&mut cpu_d),
            &GemmParams::default(),
        )
        .is_ok()
        {
            let (mx, mean) = err(&cpu_d);
            line += &format!(" cpu f32: {mx:.2e}/{mean:.2e};");
        }
        if cublaslt_present()
            && let Ok(mut lt) = CublasLt::new(gpu)
        {
            for fast in [false, true] {
                let mut run = || -> fp8_engine::Result<Vec<f32>> {
                    let da = gpu.upload(a.data(), Workspace)?;
                    let db = gpu.upload(b.data(), Workspace)?;
                    let one = gpu.upload(&[1.0f32], Workspace)?;
                    let mut d = gpu.alloc_zeros::<f32>(m * n, Workspace)?;
                    let inputs = LtInputs::Fp8 {
                        a: (&da, E4M3),
                        b: (&db, E4M3),
                        a_scale_inv: &one,
                        b_scale_inv: &one,
                        fast_accum: fast,
                    };
                    lt.matmul(gpu, (m, n, k), inputs, LtOutput::F32(&mut d), 1.0)?;
                    gpu.download(&d)
                };
                match run() {
                    Ok(d) => {
                        let (mx, mean) = err(&d);
                        line += &format!(" cuBLASLt fast={fast}: {mx:.2e}/{mean:.2e};");
                    }
                    Err(e) => line += &format!(" cuBLASLt fast={fast}: error {e};"),
                }
            }
        }
        println!("{line}");
    }
}

fn main() -> ExitCode {
    let gpu = match CudaDevice::open(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            println!("gpu_gemm: skipped: {err}");
            return ExitCode::SUCCESS;
        }
    };
    println!("gpu_gemm: on {:?}", gpu.info());
    let mut rng = StdRng::seed_from_u64(0x6E33);
    let mut results = Vec::new();
    if gpu.info().compute_capability >= (8, 9) {
        check_fp8(&gpu, &mut rng, &mut results);
    }
    check_half(&gpu, &mut rng, &mut results);
    check_f16_k8(&gpu, &mut rng, &mut results);
    check_cublaslt(&gpu, &mut rng, &mut results);
    split_experiment(&gpu, &mut rng);
    // The failures again, after every check's own line.
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    for (label, r) in &failed {
        println!("FAIL {label}: {}", r.as_ref().err().map(String::as_str).unwrap_or(""));
    }
    println!("gpu_gemm: {} checks, {} failed", results.len(), failed.len());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
