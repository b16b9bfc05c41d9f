//! The 12 f32 GEMMs of one transformer layer step of the issue-20 model (hidden 256, FFN 1024,
//! 1024 tokens = seq 64 x batch 16), each timed alone with the operand layouts the linear layer
//! passes (`nn/linear_gemms.rs`): forward `Y = X W^T` (+ bias), dgrad `dX = dY W` (B read from
//! W transposed), wgrad `dW += dY^T X` (A and B read from their `[tokens, ...]` storage,
//! beta = 1). Next to each, the f32 GEMM crate on K-major copies in the same process.
//! `benches/layer_gemms_torch.py` times the same GEMMs with PyTorch (MKL).
//!
//! `cargo bench --bench layer_gemms [-- REPEAT [FILTER]]` (FILTER: only the GEMMs whose name
//! contains it, e.g. `wgrad`, for a profiler), threads from `RAYON_NUM_THREADS`; prints
//! one row per GEMM: the median of REPEAT timed calls (default 50) after warm-up, wall ms and
//! the process's CPU ms (all threads; on a shared machine the CPU time is the steadier figure),
//! and the best wall ms (the call that found the machine's cores free). With
//! `LAYER_GEMMS_ALIGNED=1` every operand starts on a 64-byte line (wgrad then reads `X^T` in
//! place, `gemm/cpu/packed.rs`); else where the allocator puts it, as in the layer.
//! `LAYER_GEMMS_OPERANDS=bf16` passes the operands as bf16 (same layouts, the bf16 policy), and
//! `=fp8` as E4M3 codes with per-tensor scales, K-major (the FP8 recipes' layouts: the casts
//! make the column-wise copies); both run the pair-order GEMM (`gemm/cpu/pairs.rs`). The crate
//! column stays the f32 GEMM on the same shapes.

use std::hint::black_box;
use std::time::Instant;

use fp8_engine::format::Fp8Format;
use fp8_engine::gemm::{self, GemmParams, Mat, Operand, Output};
use fp8_engine::quantize::{ScaleRule, quantize_current};
use fp8_engine::tensor::QuantizedMatrix;
use half::bf16;

/// `len` deterministic values in [-0.5, 0.5) inside a buffer: the buffer and their first index
/// (0, or the first on a 64-byte line with `aligned`).
fn input(len: usize, seed: u64, aligned: bool) -> (Vec<f32>, usize) {
    let mut state = 0x2545_F491_4F6C_DD1Du64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut values: Vec<f32> = Vec::with_capacity(len + 16);
    let at = if aligned {
        values.as_ptr().align_offset(64).min(16)
    } else {
        0
    };
    values.resize(at, 0.0);
    values.extend((0..len).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }));
    (values, at)
}

/// The operands' type (`LAYER_GEMMS_OPERANDS`).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Operands {
    F32,
    Bf16,
    Fp8,
}

/// `mat` (f32, any layout) as an operand of `kind`, built once: bf16 values in the same layout,
/// or E4M3 codes (current scaling) of its K-major copy.
enum Owned {
    F32,
    Bf16(Vec<bf16>),
    Fp8(QuantizedMatrix),
}

impl Owned {
    fn of(kind: Operands, mat: Mat<f32>) -> Owned {
        match kind {
            Operands::F32 => Owned::F32,
            Operands::Bf16 => Owned::Bf16(mat.data.iter().map(|&x| bf16::from_f32(x)).collect()),
            Operands::Fp8 => {
                let (rows, k) = (mat.rows, mat.cols);
                let rule = ScaleRule {
                    format: Fp8Format::E4M3,
                    power_2_scale: false,
                    amax_epsilon: 0.0,
                };
                let (q, _) = quantize_current(&mat.k_major(), rows, k, &rule, false).unwrap();
                Owned::Fp8(q.into_parts().1)
            }
        }
    }

    fn operand<'a>(&'a self, mat: Mat<'a, f32>) -> Operand<'a> {
        match self {
            Owned::F32 => Operand::F32(mat),
            // Same layout as the f32 matrix: transposed where it is.
            Owned::Bf16(v) => Operand::Bf16(Mat {
                data: v,
                rows: mat.rows,
                cols: mat.cols,
                transposed: mat.transposed,
                mirror: None,
            }),
            Owned::Fp8(q) => Operand::Fp8(Fp8Format::E4M3, q),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Forward,
    Dgrad,
    Wgrad,
}

/// CPU seconds of this process so far, all threads (0 where not measured).
fn cpu_s() -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant of this OS.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        if rc == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    0.0
}

/// Median (wall, CPU) seconds and the best wall seconds of `repeat` calls of `f` after 3
/// warm-up calls.
fn median_s(repeat: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..3 {
        f();
    }
    let (mut wall, mut cpu): (Vec<f64>, Vec<f64>) = (0..repeat)
        .map(|_| {
            let (start, cpu0) = (Instant::now(), cpu_s());
            f();
            (start.elapsed().as_secs_f64(), cpu_s() - cpu0)
        })
        .unzip();
    wall.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    (wall[repeat / 2], cpu[repeat / 2], wall[0])
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let repeat = args.first().and_then(|a| a.parse::<usize>().ok()).unwrap_or(50).max(1);
    let filter = args.get(1).cloned().unwrap_or_default();
    let aligned = std::env::var_os("LAYER_GEMMS_ALIGNED").is_some_and(|v| v == "1");
    let kind = match std::env::var("LAYER_GEMMS_OPERANDS").as_deref() {
        Ok("bf16") => Operands::Bf16,
        Ok("fp8") => Operands::Fp8,
        _ => Operands::F32,
    };
    let tokens = 1024;
    // (name, in, out) of the layer's linears.
    let linears = [
        ("qkv", 256, 768),
        ("out-proj", 256, 256),
        ("fc1", 256, 1024),
        ("fc2", 1024, 256),
    ];
    println!(
        "threads {}, {repeat} timed calls per GEMM, median ms, {kind:?} operands {}",
        rayon::current_num_threads(),
        if aligned {
            "on 64-byte lines"
        } else {
            "where the allocator put them"
        }
    );
    println!(
        "| GEMM | M x N x K | layouts (A, B) | ours wall ms | GFLOP/s | best wall ms | ours CPU ms | crate K-major CPU ms | ours / crate CPU |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|");
    let (mut total, mut total_best, mut total_cpu, mut total_crate) = (0.0, 0.0, 0.0, 0.0);
    for pass in [Pass::Forward, Pass::Dgrad, Pass::Wgrad] {
        for (name, inp, out) in linears {
            let label = match pass {
                Pass::Forward => "fwd",
                Pass::Dgrad => "dgrad",
                Pass::Wgrad => "wgrad",
            };
            if !format!("{name} {label}").contains(&filter) {
                continue;
            }
            let (xs, xi) = input(tokens * inp, 1, aligned);
            let (ws, wi) = input(out * inp, 2, aligned);
            let (dys, dyi) = input(tokens * out, 3, aligned);
            let (x, w, dy) = (&xs[xi..], &ws[wi..], &dys[dyi..]);
            let (bias, _) = input(out, 4, false);
            // (A, B, M, N, K, layouts) as the layer passes them.
            let (a, b, m, n, k, layouts) = match pass {
                Pass::Forward => (
                    Mat::new(x, tokens, inp).unwrap(),
                    Mat::new(w, out, inp).unwrap(),
                    tokens,
                    out,
                    inp,
                    "X, W (both K-major)",
                ),
                Pass::Dgrad => (
                    Mat::new(dy, tokens, out).unwrap(),
                    Mat::transposed(w, inp, out).unwrap(),
                    tokens,
                    inp,
                    out,
                    "dY K-major, W^T from W",
                ),
                Pass::Wgrad => (
                    Mat::transposed(dy, out, tokens).unwrap(),
                    Mat::transposed(x, inp, tokens).unwrap(),
                    out,
                    inp,
                    tokens,
                    "dY^T from dY, X^T from X",
                ),
            };
            let params = GemmParams {
                bias: (pass == Pass::Forward).then_some((&bias[..]).into()),
                beta: if pass == Pass::Wgrad { 1.0 } else { 0.0 },
                ..GemmParams::default()
            };
            let mut d = vec![0.0f32; m * n];
            let (oa, ob) = (Owned::of(kind, a), Owned::of(kind, b));
            let (opa, opb) = (oa.operand(a), ob.operand(b));
            let ours = median_s(repeat, || {
                gemm::cpu::gemm(&opa, &opb, Output::F32(&mut d), &params).unwrap();
                black_box(&d);
            });
            let (ak, bk) = (a.k_major().into_owned(), b.k_major().into_owned());
            let (ak, bk) = (Mat::new(&ak, m, k).unwrap(), Mat::new(&bk, n, k).unwrap());
            let (_, krate, _) = median_s(repeat, || {
                gemm::cpu::f32_crate_gemm(ak, bk, &mut d).unwrap();
                black_box(&d);
            });
            let (ours, ours_cpu, best) = ours;
            total += ours;
            total_best += best;
            total_cpu += ours_cpu;
            total_crate += krate;
            let gflops = 2.0 * (m * n * k) as f64 / ours / 1e9;
            println!(
                "| {name} {label} | {m} x {n} x {k} | {layouts} | {:.3} | {gflops:.0} | {:.3} | {:.3} | {:.3} | {:.2} |",
                ours * 1e3,
                best * 1e3,
                ours_cpu * 1e3,
                krate * 1e3,
                ours_cpu / krate
            );
        }
    }
    println!(
        "| sum of 12 | | | {:.3} | | {:.3} | {:.3} | {:.3} | {:.2} |",
        total * 1e3,
        total_best * 1e3,
        total_cpu * 1e3,
        total_crate * 1e3,
        total_cpu / total_crate
    );
}
