//! The MXFP8 GEMM on CUDA (`cuda/gemm_mma_mxfp8.cu`) against its CPU twin
//! `gemm::cpu::gemm`, held to the contract of `docs/numerics.md` (GEMM, MXFP8
//! operands): the same bits wherever every 32-wide block's partial sum is exact
//! (small-integer probes: scales all ones, then powers of two, then the E8M0
//! extremes 2^-127, 2^127 and NaN), else the accumulation bound, printed as
//! err/bound. Every pair the engine runs (E4M3 x E4M3 forward, E5M2 x E4M3 and
//! E4M3 x E5M2 backward), ragged M/N, K tails of 16 past a multiple of 32, every
//! output type, bias, alpha and beta, and the operands of the MXFP8 recipe's own
//! quantizer. Below sm_89 the GEMM must be a typed error naming the GPU. Without
//! a usable GPU this prints one line, "gpu_mxfp8: skipped: <why>", and passes.

mod common;

use std::process::ExitCode;

use common::out_buf::{Out, OutBuf};
use fp8_engine::backend::cuda::CudaDevice;
use fp8_engine::backend::cuda::error_bound::{Accumulation, accumulation_bound, worst_ratio};
use fp8_engine::backend::cuda::gemm::gemm_host;
use fp8_engine::format::Fp8Format::{self, E4M3, E5M2};
use fp8_engine::gemm::{GemmParams, GemmReport, Operand, Output, cpu};
use fp8_engine::quantize::quantize_mxfp8;
use fp8_engine::tensor::{QuantizedMatrix, Scales};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `Ok`: the worst err/bound (0 for the same bits); `Err`: what broke.
type Check = Result<f64, String>;

/// The engine's MXFP8 GEMM pairs: forward, then the two backward ones.
const PAIRS: [(Fp8Format, Fp8Format); 3] = [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)];

/// (M, N, K): one element, ragged tiles, K = 16 mod 32 (a half block at the end), K = 32 mod 64
/// (the kernel's last 64-byte tile holds one block), a full tile, two K tiles of 128.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 16),
    (3, 5, 48),
    (17, 9, 96),
    (130, 200, 272),
    (257, 129, 400),
    (128, 128, 256),
];

const OUTS: [Out; 4] = [Out::F32, Out::Bf16, Out::F16, Out::Fp8(E4M3)];

/// How the E8M0 exponents of a probe are drawn.
#[derive(Clone, Copy, Debug)]
enum Exponents {
    /// 127: every scale is 1.
    Ones,
    /// 127 +- 12: powers of two, no overflow or underflow.
    PowersOfTwo,
    /// Mostly 127 +- 4, with 0 (2^-127), 254 (2^127) and 255 (NaN) sprinkled in.
    Extremes,
    /// 127 +- 6 (the random cases).
    Random,
}

fn exponents(rng: &mut StdRng, n: usize, how: Exponents) -> Vec<u8> {
    (0..n)
        .map(|_| match how {
            Exponents::Ones => 127,
            Exponents::PowersOfTwo => rng.random_range(115..=139),
            Exponents::Random => rng.random_range(121..=133),
            Exponents::Extremes => match rng.random_range(0..40) {
                0 => 0,
                1 => 254,
                2 => 255,
                _ => rng.random_range(123..=131),
            },
        })
        .collect()
}

/// Codes of `format` whose values are integers with |v| <= 4 (so 32 products sum exactly).
fn small_integer_codes(rng: &mut StdRng, n: usize, format: Fp8Format) -> Vec<u8> {
    let table = format.decode_table();
    let pool: Vec<u8> = (0..=255u8)
        .filter(|&c| {
            let v = table[c as usize];
            v.is_finite() && v.abs() <= 4.0 && v.fract() == 0.0
        })
        .collect();
    (0..n).map(|_| pool[rng.random_range(0..pool.len())]).collect()
}

/// Finite codes of `format` spread over about 8 binades around 1, and zeros.
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

fn mx_matrix(codes: Vec<u8>, rows: usize, k: usize, e8m0: Vec<u8>) -> Result<QuantizedMatrix, String> {
    QuantizedMatrix::new(codes, rows, k, Scales::Mxfp8(e8m0)).map_err(|e| e.to_string())
}

/// `S_ij = |alpha| sum_k |a_ik b_jk| 2^(ea + eb)`, per output, in f64 (a NaN scale gives NaN).
fn magnitude(a: &QuantizedMatrix, fa: Fp8Format, b: &QuantizedMatrix, fb: Fp8Format, alpha: f32) -> Vec<f64> {
    let (m, n, k) = (a.rows(), b.rows(), a.cols());
    let blocks = k.div_ceil(32);
    let (ta, tb) = (fa.decode_table(), fb.decode_table());
    let scale = |q: &QuantizedMatrix, r: usize, kb: usize| match q.scales() {
        Scales::Mxfp8(e) => fp8_engine::format::decode_e8m0(e[r * blocks + kb]) as f64,
        _ => f64::NAN,
    };
    let mut s = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut t = 0.0;
            for kk in 0..k {
                let p = (ta[a.data()[i * k + kk] as usize] as f64 * tb[b.data()[j * k + kk] as usize] as f64).abs();
                if p != 0.0 {
                    t += p * scale(a, i, kk / 32) * scale(b, j, kk / 32);
                }
            }
            s[i * n + j] = t * alpha.abs() as f64;
        }
    }
    s
}

/// Equal values (either zero sign; a NaN only where the CPU has one).
fn same(g: f32, c: f32) -> bool {
    g == c || (g.is_nan() && c.is_nan())
}

/// One GEMM on both backends. `exact`: the same values everywhere (and the same amax); else
/// within the accumulation bound, whose worst ratio is returned.
#[allow(clippy::too_many_arguments)]
fn compare(
    gpu: &CudaDevice,
    (fa, a): (Fp8Format, &QuantizedMatrix),
    (fb, b): (Fp8Format, &QuantizedMatrix),
    out: Out,
    params: &GemmParams,
    exact: bool,
    rng: &mut StdRng,
) -> Check {
    let (m, n, k) = (a.rows(), b.rows(), a.cols());
    let init: Vec<f32> = (0..m * n).map(|_| rng.random_range(-4i32..=4) as f32).collect();
    let out_scale = 2f32.powi(rng.random_range(-3..3));
    let (mut c_out, mut g_out) = (OutBuf::new(out, &init), OutBuf::new(out, &init));
    let (oa, ob) = (Operand::Fp8(fa, a), Operand::Fp8(fb, b));
    let c_rep: GemmReport = cpu::gemm(&oa, &ob, c_out.output(out_scale), params).map_err(|e| format!("CPU: {e}"))?;
    let g_rep = gemm_host(gpu, &oa, &ob, g_out.output(out_scale), params).map_err(|e| format!("GPU: {e}"))?;
    let (cv, gv) = (c_out.values(out_scale), g_out.values(out_scale));
    if exact {
        if let Some(i) = (0..m * n).find(|&i| !same(gv[i], cv[i])) {
            return Err(format!(
                "D[{}, {}]: gpu {} cpu {} (bits {:#010x} vs {:#010x}), expected the same bits",
                i / n,
                i % n,
                gv[i],
                cv[i],
                gv[i].to_bits(),
                cv[i].to_bits()
            ));
        }
        if !same(g_rep.amax, c_rep.amax) {
            return Err(format!("amax: gpu {} cpu {}", g_rep.amax, c_rep.amax));
        }
        return Ok(0.0);
    }
    let s = magnitude(a, fa, b, fb, params.alpha);
    let acc: Vec<f64> = s
        .iter()
        .map(|&sij| accumulation_bound(Accumulation::Fp8, sij, k))
        .collect();
    let w = worst_ratio(&gv, &cv, &acc, c_out.ulp(), out_scale as f64);
    if !w.passed() {
        return Err(format!("D[{}, {}]: {w}", w.index / n, w.index % n));
    }
    // The amax is the largest |D| before the output cast: within the largest bound.
    let worst_acc = acc.iter().cloned().fold(0.0, f64::max);
    if (g_rep.amax as f64 - c_rep.amax as f64).abs() > worst_acc + 1e-30 {
        return Err(format!(
            "amax: gpu {} cpu {} (bound {worst_acc:.3e})",
            g_rep.amax, c_rep.amax
        ));
    }
    Ok(w.ratio)
}

fn random_params<'a>(rng: &mut StdRng, bias: &'a [f32], out: Out) -> GemmParams<'a> {
    GemmParams {
        alpha: [1.0, 0.5, -2.0][rng.random_range(0..3)],
        beta: if matches!(out, Out::F32) && rng.random_bool(0.5) {
            1.0
        } else {
            0.0
        },
        bias: if rng.random_bool(0.5) { Some(bias.into()) } else { None },
        split_accumulator: true,
        report_amax: true,
    }
}

/// Small-integer operands: every block's partial sum is exact on both backends, so the
/// GPU must give the CPU's bits, whatever the exponents (both apply them in the same order).
fn probes(gpu: &CudaDevice, rng: &mut StdRng, results: &mut Vec<(String, Check)>) {
    for how in [Exponents::Ones, Exponents::PowersOfTwo, Exponents::Extremes] {
        for (fa, fb) in PAIRS {
            for &(m, n, k) in SHAPES {
                let blocks = k.div_ceil(32);
                let out = OUTS[rng.random_range(0..OUTS.len())];
                let check = (|| {
                    let a = mx_matrix(
                        small_integer_codes(rng, m * k, fa),
                        m,
                        k,
                        exponents(rng, m * blocks, how),
                    )?;
                    let b = mx_matrix(
                        small_integer_codes(rng, n * k, fb),
                        n,
                        k,
                        exponents(rng, n * blocks, how),
                    )?;
                    // Integer bias and power-of-two alpha keep the epilogue exact too.
                    let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-8i32..=8) as f32).collect();
                    let params = random_params(rng, &bias, out);
                    compare(gpu, (fa, &a), (fb, &b), out, &params, true, rng)
                })();
                results.push((format!("probe {how:?} {fa:?}x{fb:?} {m}x{n}x{k} out={out:?}"), check));
            }
        }
    }
}

/// Random codes and exponents: the accumulation bound.
fn random_cases(gpu: &CudaDevice, rng: &mut StdRng, results: &mut Vec<(String, Check)>) {
    for (fa, fb) in PAIRS {
        for &(m, n, k) in SHAPES {
            for out in OUTS {
                let blocks = k.div_ceil(32);
                let check = (|| {
                    let ea = exponents(rng, m * blocks, Exponents::Random);
                    let eb = exponents(rng, n * blocks, Exponents::Random);
                    let a = mx_matrix(random_codes(rng, m * k, fa), m, k, ea)?;
                    let b = mx_matrix(random_codes(rng, n * k, fb), n, k, eb)?;
                    let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
                    let params = random_params(rng, &bias, out);
                    compare(gpu, (fa, &a), (fb, &b), out, &params, false, rng)
                })();
                results.push((format!("random {fa:?}x{fb:?} {m}x{n}x{k} out={out:?}"), check));
            }
        }
    }
}

/// The recipe's own operands: `quantize_mxfp8` of random activations and weights (forward) and
/// of an E5M2 gradient (dgrad), as a linear layer makes them.
fn quantized_cases(gpu: &CudaDevice, rng: &mut StdRng, results: &mut Vec<(String, Check)>) {
    for &(m, n, k, fa) in &[
        (64usize, 96usize, 160usize, E4M3),
        (33, 70, 272, E5M2),
        (200, 130, 512, E4M3),
    ] {
        let check = (|| {
            let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-0.1f32..0.1)).collect();
            let qa = quantize_mxfp8(&x, m, k, fa, false).map_err(|e| e.to_string())?;
            let qb = quantize_mxfp8(&w, n, k, E4M3, false).map_err(|e| e.to_string())?;
            compare(
                gpu,
                (fa, qa.rowwise()),
                (E4M3, qb.rowwise()),
                Out::F32,
                &GemmParams::default(),
                false,
                rng,
            )
        })();
        results.push((format!("quantize_mxfp8 {fa:?}xE4M3 {m}x{n}x{k}"), check));
    }
}

/// Below sm_89 there are no FP8 tensor cores: a typed error naming MXFP8 and the GPU, as the
/// per-tensor FP8 GEMM gives.
fn refused_below_sm89(gpu: &CudaDevice, results: &mut Vec<(String, Check)>) {
    let (major, minor) = gpu.info().compute_capability;
    let check = (|| {
        let a = mx_matrix(vec![0x38; 4 * 32], 4, 32, vec![127; 4])?;
        let mut d = vec![0.0f32; 16];
        let oa = Operand::Fp8(E4M3, &a);
        match gemm_host(gpu, &oa, &oa, Output::F32(&mut d), &GemmParams::default()) {
            Err(e) if e.to_string().contains("MXFP8") && e.to_string().contains(&format!("{major}.{minor}")) => Ok(0.0),
            other => Err(format!(
                "expected an error naming MXFP8 and {major}.{minor}, got {other:?}"
            )),
        }
    })();
    results.push((format!("refused on sm_{major}{minor}"), check));
}

fn main() -> ExitCode {
    let gpu = match CudaDevice::open(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            println!("gpu_mxfp8: skipped: {err}");
            return ExitCode::SUCCESS;
        }
    };
    println!("gpu_mxfp8: on {:?} (the MXFP8 GEMM kernels' first run)", gpu.info());
    let mut rng = StdRng::seed_from_u64(0x3F8_E8A0);
    let mut results = Vec::new();
    if gpu.info().compute_capability >= (8, 9) {
        probes(&gpu, &mut rng, &mut results);
        random_cases(&gpu, &mut rng, &mut results);
        quantized_cases(&gpu, &mut rng, &mut results);
    } else {
        refused_below_sm89(&gpu, &mut results);
    }
    for (label, r) in &results {
        match r {
            Ok(0.0) => println!("ok {label}: exact (err/bound=0)"),
            Ok(ratio) => println!("ok {label}: err/bound={ratio:.3}"),
            Err(why) => println!("FAIL {label}: {why}"),
        }
    }
    let failed = results.iter().filter(|(_, r)| r.is_err()).count();
    println!("gpu_mxfp8: {} checks, {failed} failed", results.len());
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
