//! The Hopper GEMM fast path against the CPU reference (`gemm::cpu::gemm`) on
//! an H100/H200: every kernel variant (tile width, A format, split/fast), every
//! scale mode and output dtype, ragged shapes, bias, beta and amax. Without a
//! GPU of compute capability 9.0 (or without kernels in the build) it prints
//! "hopper_host: skipped: <why>" and passes: its host-side logic is unit-tested
//! in `src/backend/cuda/hopper/`.

use fp8_engine::backend::cuda::gemm::DeviceOutput;
use fp8_engine::backend::cuda::hopper::{self, HopperGemm, HopperScales};
use fp8_engine::backend::cuda::{CudaDevice, DeviceBuffer};
use fp8_engine::device::MemoryCategory::{Activations, Workspace};
use fp8_engine::format::Fp8Format;
use fp8_engine::gemm::{self, GemmParams, Operand, Output};
use fp8_engine::tensor::{QuantizedMatrix, Scales};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Agreement with the CPU reference, relative to the output's largest magnitude:
/// tensor cores round inside a 128-K block (~2^-13) and sum in another order.
const RTOL: f32 = 1.0 / 512.0;

#[derive(Clone, Copy, Debug)]
enum Mode {
    PerTensor,
    Block128,
    Block1x128,
}

fn codes(rng: &mut StdRng, format: Fp8Format, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            loop {
                let c: u8 = rng.random();
                if format.decode(c).is_finite() {
                    break c;
                }
            }
        })
        .collect()
}

fn scales(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(0.25f32..2.0)).collect()
}

fn operand(rng: &mut StdRng, format: Fp8Format, rows: usize, k: usize, kind: &str) -> QuantizedMatrix {
    let kb = k.div_ceil(128);
    let s = match kind {
        "tensor" => Scales::PerTensor(rng.random_range(0.25f32..2.0)),
        "1x128" => Scales::Block1x128(scales(rng, rows * kb)),
        _ => Scales::Block128x128(scales(rng, rows.div_ceil(128) * kb)),
    };
    QuantizedMatrix::new(codes(rng, format, rows * k), rows, k, s).unwrap()
}

fn scale_values(q: &QuantizedMatrix) -> Vec<f32> {
    match q.scales() {
        Scales::PerTensor(s) => vec![*s],
        Scales::Block1x128(v) | Scales::Block128x128(v) => v.clone(),
        Scales::Mxfp8(_) => unreachable!("not a fast-path mode"),
    }
}

fn close(what: &str, gpu: &[f32], cpu: &[f32], extra_rel: f32) -> Result<(), String> {
    let scale = cpu.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        if (g - c).abs() > RTOL * scale + extra_rel * c.abs() {
            return Err(format!("{what}: element {i}: gpu {g} vs cpu {c} (max |ref| {scale})"));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn check(
    gpu: &CudaDevice,
    rng: &mut StdRng,
    (m, n, k): (usize, usize, usize),
    a_format: Fp8Format,
    mode: Mode,
    split: bool,
    out: &str,
    with_bias: bool,
    beta: f32,
) -> Result<(), String> {
    let e = |x: fp8_engine::Error| x.to_string();
    let (ka, kb) = match mode {
        Mode::PerTensor => ("tensor", "tensor"),
        Mode::Block128 => ("1x128", "128x128"),
        Mode::Block1x128 => ("1x128", "1x128"),
    };
    let qa = operand(rng, a_format, m, k, ka);
    let qb = operand(rng, Fp8Format::E4M3, n, k, kb);
    let bias: Option<Vec<f32>> = with_bias.then(|| (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect());
    let d_old: Vec<f32> = (0..m * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let alpha = 0.75;
    let params = GemmParams {
        alpha,
        beta,
        bias: bias.as_deref(),
        split_accumulator: split,
    };
    let (a, b) = (Operand::Fp8(a_format, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
    // CPU reference, f32 (its amax is of the f32 result, as the GPU's).
    let mut reference = d_old.clone();
    let report = gemm::cpu::gemm(&a, &b, Output::F32(&mut reference), &params).map_err(e)?;

    let up_u8 = |v: &[u8]| gpu.upload(v, Activations).map_err(e);
    let up_f32 = |v: &[f32]| gpu.upload(v, Workspace).map_err(e);
    let (da, db) = (up_u8(qa.data())?, up_u8(qb.data())?);
    let (sa, sb) = (up_f32(&scale_values(&qa))?, up_f32(&scale_values(&qb))?);
    let dbias = bias.as_deref().map(up_f32).transpose()?;
    let mut amax = up_f32(&[0.0])?;
    let mut flag: DeviceBuffer<u32> = gpu.upload(&[0u32], Workspace).map_err(e)?;
    let scales = match mode {
        Mode::PerTensor => HopperScales::PerTensor { a: &sa, b: &sb },
        Mode::Block128 => HopperScales::Block1x128By128x128 { a: &sa, b: &sb },
        Mode::Block1x128 => HopperScales::Block1x128By1x128 { a: &sa, b: &sb },
    };
    let gemm = HopperGemm {
        m,
        n,
        k,
        a: &da,
        a_format,
        b: &db,
        b_format: Fp8Format::E4M3,
        scales,
        bias: dbias.as_ref(),
        alpha,
        beta,
        split_accumulator: split,
        amax: Some(&mut amax),
        error_flag: Some(&mut flag),
    };
    // Poisoned outputs: anything the kernel forgets shows up.
    let got: Vec<f32> = match out {
        "f32" => {
            let mut d = up_f32(&d_old)?;
            hopper::launch(gpu, gemm, DeviceOutput::F32(&mut d)).map_err(e)?;
            gpu.download(&d).map_err(e)?
        }
        "bf16" => {
            let mut d = gpu.upload(&vec![bf16::NAN; m * n], Activations).map_err(e)?;
            hopper::launch(gpu, gemm, DeviceOutput::Bf16(&mut d)).map_err(e)?;
            gpu.download(&d).map_err(e)?.iter().map(|x| x.to_f32()).collect()
        }
        _ => {
            let mut d = up_u8(&vec![0x7Fu8; m * n])?;
            let scale = up_f32(&[2.0])?;
            let fp8 = DeviceOutput::Fp8 {
                codes: &mut d,
                format: Fp8Format::E4M3,
                scale: &scale,
            };
            hopper::launch(gpu, gemm, fp8).map_err(e)?;
            let q = gpu.download(&d).map_err(e)?;
            q.iter().map(|&c| Fp8Format::E4M3.decode(c) / 2.0).collect()
        }
    };
    let flag = gpu.download(&flag).map_err(e)?[0];
    if flag != 0 {
        return Err(format!("kernel error flag {flag}"));
    }
    let expected: Vec<f32> = match out {
        "f32" => reference.clone(),
        "bf16" => reference.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
        _ => reference
            .iter()
            .map(|&x| {
                Fp8Format::E4M3.decode(Fp8Format::E4M3.encode(x * 2.0, fp8_engine::format::Overflow::Saturate)) / 2.0
            })
            .collect(),
    };
    // Rounding to bf16 / E4M3 can land one step apart: allow one unit of the format.
    let extra = match out {
        "f32" => 0.0,
        "bf16" => 1.0 / 128.0,
        _ => 1.0 / 4.0,
    };
    close(out, &got, &expected, extra)?;
    let amax = gpu.download(&amax).map_err(e)?[0];
    close("amax", &[amax], &[report.amax], 0.0)
}

#[test]
fn hopper_gemm_matches_cpu_reference() {
    let gpu = match CudaDevice::open(0) {
        Ok(gpu) if hopper::device_capable(&gpu) => gpu,
        Ok(gpu) => return println!("hopper_host: skipped: {} is not sm_90", gpu.info().name),
        Err(err) => return println!("hopper_host: skipped: {err}"),
    };
    let mut rng = StdRng::seed_from_u64(0x4077_E55E);
    let shapes = [
        (200, 300, 272),
        (128, 256, 128),
        (1, 1, 16),
        (257, 513, 400),
        (130, 520, 1040),
    ];
    let mut failures = Vec::new();
    for &shape in &shapes {
        for a_format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for (mode, split) in [
                (Mode::PerTensor, true),
                (Mode::PerTensor, false),
                (Mode::Block128, true),
                (Mode::Block1x128, true),
            ] {
                for (out, bias, beta) in [("f32", true, 0.5), ("bf16", false, 0.0), ("e4m3", true, 0.0)] {
                    let r = check(&gpu, &mut rng, shape, a_format, mode, split, out, bias, beta);
                    let name = format!("{shape:?} {a_format:?} {mode:?} split={split} {out} bias={bias} beta={beta}");
                    println!("hopper_host: {name}: {}", if r.is_ok() { "ok" } else { "FAILED" });
                    if let Err(why) = r {
                        failures.push(format!("{name}: {why}"));
                    }
                }
            }
        }
    }
    // Both tile widths: a wide problem picks 256, the small ones 128.
    assert_eq!(
        hopper::choose(4096, 4096, gpu.info().multiprocessors).unwrap().block_n,
        256
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
