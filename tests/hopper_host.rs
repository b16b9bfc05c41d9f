//! The Hopper GEMM fast path on an H100/H200, in three tests:
//!
//! * `hopper_probes_are_bit_exact`: the exact small-integer probes of
//!   `hopper::probe` in the first-run order (one tile, ring wrap, K tails,
//!   ragged M/N, several tiles per CTA, block scales, E5M2), each on its forced
//!   tile width / CTA cap and the bounded-wait kernel; any difference is a bug.
//! * `hopper_probes_with_epilogues_are_bit_exact`: the same exactness through
//!   alpha, bias, beta, bf16/fp16/FP8 outputs, the fused amax and a NaN input
//!   (`hopper::probe_epilogue`).
//! * `hopper_gemm_matches_cpu_reference`: random FP8 data against the CPU
//!   reference (`gemm::cpu::gemm`) at both tile widths (the 256-wide one on two
//!   CTAs), every scale mode and output dtype, bias, beta and amax, judged by
//!   the magnitude bound of `error_bound` (as `gpu_gemm`); every case prints
//!   its `err/bound`.
//!
//! Without a GPU of compute capability 9.0 (or without kernels in the build)
//! each prints one "hopper_host: skipped: <why>" line and passes: the host-side
//! logic is unit-tested in `src/backend/cuda/hopper/`.

use fp8_engine::backend::cuda::error_bound::{Accumulation, OutputUlp, accumulation_bound, worst_ratio};
use fp8_engine::backend::cuda::gemm::DeviceOutput;
use fp8_engine::backend::cuda::hopper::probe::{Probe, ProbeScales, first_run_probes};
use fp8_engine::backend::cuda::hopper::probe_epilogue::{EpilogueProbe, ExpectedOutput, ProbeOutput, epilogue_probes};
use fp8_engine::backend::cuda::hopper::{self, HopperGemm, HopperScales, PlanOverride};
use fp8_engine::backend::cuda::{CudaDevice, DeviceBuffer, describe_error_flag};
use fp8_engine::device::MemoryCategory::{Activations, Workspace};
use fp8_engine::format::Fp8Format;
use fp8_engine::gemm::{self, Bias, GemmParams, Operand, Output};
use fp8_engine::tensor::{QuantizedMatrix, Scales};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

/// `S_ij = |alpha| sum_k |a_ik b_jk| sA sB` for every output (the bound's magnitude).
fn magnitude(qa: &QuantizedMatrix, fa: Fp8Format, qb: &QuantizedMatrix, alpha: f32) -> Vec<f64> {
    let (m, n, k) = (qa.rows(), qb.rows(), qa.cols());
    let kb = k.div_ceil(128);
    let scale = |q: &QuantizedMatrix, r: usize, b: usize| -> f64 {
        match q.scales() {
            Scales::PerTensor(s) => *s as f64,
            Scales::Block1x128(v) => v[r * kb + b] as f64,
            Scales::Block128x128(v) => v[(r / 128) * kb + b] as f64,
            Scales::Mxfp8(_) => unreachable!("not a fast-path mode"),
        }
    };
    let av: Vec<f64> = qa.data().iter().map(|&c| fa.decode(c).abs() as f64).collect();
    let bv: Vec<f64> = qb
        .data()
        .iter()
        .map(|&c| Fp8Format::E4M3.decode(c).abs() as f64)
        .collect();
    let mut s = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let t: f64 = (0..k)
                .map(|kk| av[i * k + kk] * bv[j * k + kk] * scale(qa, i, kk / 128) * scale(qb, j, kk / 128))
                .sum();
            s[i * n + j] = t * alpha.abs() as f64;
        }
    }
    s
}

fn flag_error(gpu: &CudaDevice, flag: &DeviceBuffer<u32>) -> Result<(), String> {
    let code = gpu.download(flag).map_err(|e| e.to_string())?[0];
    describe_error_flag(code).map_or(Ok(()), |what| Err(format!("kernel error flag: {what}")))
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
    tiles: PlanOverride,
) -> Result<(f64, String), String> {
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
        bias: bias.as_deref().map(Bias::host),
        split_accumulator: split,
        report_amax: true,
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
            hopper::launch_with(gpu, gemm, DeviceOutput::F32(&mut d), tiles).map_err(e)?;
            gpu.download(&d).map_err(e)?
        }
        "bf16" => {
            let mut d = gpu.upload(&vec![bf16::NAN; m * n], Activations).map_err(e)?;
            hopper::launch_with(gpu, gemm, DeviceOutput::Bf16(&mut d), tiles).map_err(e)?;
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
            hopper::launch_with(gpu, gemm, fp8, tiles).map_err(e)?;
            let q = gpu.download(&d).map_err(e)?;
            q.iter().map(|&c| Fp8Format::E4M3.decode(c) / 2.0).collect()
        }
    };
    flag_error(gpu, &flag)?;
    // bf16 / E4M3 outputs against the reference rounded (and saturated) the same way;
    // rounding that lands one step apart is inside the bound's output ulp.
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
    let (ulp, out_scale) = match out {
        "f32" => (OutputUlp::F32, 1.0),
        "bf16" => (OutputUlp::BF16, 1.0),
        _ => (OutputUlp::E4M3, 2.0),
    };
    let s = magnitude(&qa, a_format, &qb, alpha);
    let bounds: Vec<f64> = s.iter().map(|&x| accumulation_bound(Accumulation::Fp8, x, k)).collect();
    let worst = worst_ratio(&got, &expected, &bounds, ulp, out_scale);
    let amax = gpu.download(&amax).map_err(e)?[0];
    let worst_bound = bounds.iter().fold(0.0f64, |a, &b| a.max(b));
    let amax_ratio = worst_ratio(&[amax], &[report.amax], &[worst_bound], OutputUlp::F32, 1.0);
    // The worst of both ratios decides (> 1 fails); the text gives both.
    Ok((worst.ratio.max(amax_ratio.ratio), format!("{worst}; amax {amax_ratio}")))
}

/// Runs one probe (f32 output, bounded-wait kernel, its tile override) and
/// compares bit for bit with its exact value; `Ok` carries the launch's plan.
fn run_probe(gpu: &CudaDevice, p: &Probe) -> Result<String, String> {
    let e = |x: fp8_engine::Error| x.to_string();
    let (da, db) = (
        gpu.upload(&p.a, Activations).map_err(e)?,
        gpu.upload(&p.b, Activations).map_err(e)?,
    );
    let (sa, sb) = match &p.scales {
        ProbeScales::PerTensor => (vec![1.0f32], vec![1.0f32]),
        ProbeScales::Block1x128By128x128 { a, b } | ProbeScales::Block1x128By1x128 { a, b } => (a.clone(), b.clone()),
    };
    let (sa, sb) = (
        gpu.upload(&sa, Workspace).map_err(e)?,
        gpu.upload(&sb, Workspace).map_err(e)?,
    );
    let scales = match &p.scales {
        ProbeScales::PerTensor => HopperScales::PerTensor { a: &sa, b: &sb },
        ProbeScales::Block1x128By128x128 { .. } => HopperScales::Block1x128By128x128 { a: &sa, b: &sb },
        ProbeScales::Block1x128By1x128 { .. } => HopperScales::Block1x128By1x128 { a: &sa, b: &sb },
    };
    let mut flag: DeviceBuffer<u32> = gpu.alloc_zeros(1, Workspace).map_err(e)?;
    // Poisoned output: a tile the kernel never writes shows up as NaN.
    let mut d = gpu.upload(&vec![f32::NAN; p.m * p.n], Activations).map_err(e)?;
    let gemm = HopperGemm {
        m: p.m,
        n: p.n,
        k: p.k,
        a: &da,
        a_format: p.a_format,
        b: &db,
        b_format: Fp8Format::E4M3,
        scales,
        bias: None,
        alpha: 1.0,
        beta: 0.0,
        split_accumulator: p.split,
        amax: None,
        error_flag: Some(&mut flag),
    };
    let plan = hopper::launch_with(gpu, gemm, DeviceOutput::F32(&mut d), p.tiles).map_err(e)?;
    let got = match gpu.download(&d) {
        Ok(got) => got,
        // A trap (bounded wait timed out) fails the sync; the flag may still say why.
        Err(err) => return Err(format!("{err}; {:?}", flag_error(gpu, &flag))),
    };
    flag_error(gpu, &flag)?;
    let expected = p.expected();
    let wrong: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != expected[i].to_bits())
        .collect();
    let what = format!(
        "{} ctas {} tiles {} k_blocks {}",
        plan.kernel, plan.config.ctas, plan.config.tiles, plan.k_blocks
    );
    match wrong.first() {
        None => Ok(format!("{what}: exact")),
        Some(&i) => Err(format!(
            "{what}: {} of {} outputs differ, first D[{}, {}] = {} expected {} (err/bound=inf: the bound is 0)",
            wrong.len(),
            got.len(),
            i / p.n,
            i % p.n,
            got[i],
            expected[i]
        )),
    }
}

/// GPU 0 when it can run the fast path, else why not.
fn hopper_gpu() -> Result<CudaDevice, String> {
    match CudaDevice::open(0) {
        Ok(gpu) if hopper::device_capable(&gpu) => Ok(gpu),
        Ok(gpu) => Err(format!("{} is not sm_90", gpu.info().name)),
        Err(err) => Err(err.to_string()),
    }
}

#[test]
fn hopper_probes_are_bit_exact() {
    let gpu = match hopper_gpu() {
        Ok(gpu) => gpu,
        Err(why) => return println!("hopper_host: skipped: {why}"),
    };
    let mut failures = Vec::new();
    // In order: the first failure is the most local one. HOPPER_HOST_SMALL (set
    // under compute-sanitizer) leaves out the two shapes with more tiles than SMs.
    let large = std::env::var_os("HOPPER_HOST_SMALL").is_none();
    for p in first_run_probes(large) {
        let r = run_probe(&gpu, &p);
        match &r {
            Ok(what) => println!("hopper_host: probe {}: ok: {what}", p.name),
            Err(why) => {
                println!("hopper_host: probe {}: FAILED: {why}", p.name);
                failures.push(format!("{}: {why}", p.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} probes failed (the first is the most local):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn hopper_gemm_matches_cpu_reference() {
    let gpu = match hopper_gpu() {
        Ok(gpu) => gpu,
        Err(why) => return println!("hopper_host: skipped: {why}"),
    };
    let mut rng = StdRng::seed_from_u64(0x4077_E55E);
    let shapes = [
        (200, 300, 272),
        (128, 256, 128),
        (1, 1, 16),
        (257, 513, 400),
        (130, 520, 1040),
    ];
    // Both tile widths; the 256-wide one on at most two CTAs (several tiles each).
    let tilings = [
        PlanOverride {
            block_n: Some(128),
            ..Default::default()
        },
        PlanOverride {
            block_n: Some(256),
            max_ctas: Some(2),
            bounded_waits: false,
        },
    ];
    let mut failures = Vec::new();
    let mut worst = 0.0f64;
    for &shape in &shapes {
        for tiles in tilings {
            for a_format in [Fp8Format::E4M3, Fp8Format::E5M2] {
                for (mode, split) in [
                    (Mode::PerTensor, true),
                    (Mode::PerTensor, false),
                    (Mode::Block128, true),
                    (Mode::Block1x128, true),
                ] {
                    for (out, bias, beta) in [("f32", true, 0.5), ("bf16", false, 0.0), ("e4m3", true, 0.0)] {
                        let r = check(&gpu, &mut rng, shape, a_format, mode, split, out, bias, beta, tiles);
                        let name = format!(
                            "{shape:?} N{} ctas<={:?} {a_format:?} {mode:?} split={split} {out} bias={bias} beta={beta}",
                            tiles.block_n.unwrap_or(0),
                            tiles.max_ctas
                        );
                        let (ratio, text) = r.unwrap_or_else(|why| (f64::INFINITY, why));
                        worst = worst.max(ratio);
                        if ratio <= 1.0 {
                            println!("hopper_host: {name}: ok: {text}");
                        } else {
                            println!("hopper_host: {name}: FAILED: {text}");
                            failures.push(format!("{name}: {text}"));
                        }
                    }
                }
            }
        }
    }
    println!("hopper_host: worst err/bound={worst:.3} over all random cases");
    // The heuristic itself still picks the wide tile for a wide problem.
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

/// Runs one epilogue probe (bounded-wait kernel, its base probe's tile override)
/// and compares its output bits and amax with the exact ones (any NaN matches NaN).
fn run_epilogue_probe(gpu: &CudaDevice, p: &EpilogueProbe) -> Result<String, String> {
    let e = |x: fp8_engine::Error| x.to_string();
    let b = &p.base;
    let (da, db) = (
        gpu.upload(&b.a, Activations).map_err(e)?,
        gpu.upload(&b.b, Activations).map_err(e)?,
    );
    let (sa, sb) = (
        gpu.upload(&[1.0f32], Workspace).map_err(e)?,
        gpu.upload(&[1.0f32], Workspace).map_err(e)?,
    );
    let dbias = p
        .bias
        .as_deref()
        .map(|v| gpu.upload(v, Workspace))
        .transpose()
        .map_err(e)?;
    let mut amax = gpu.upload(&[0.0f32], Workspace).map_err(e)?;
    let mut flag: DeviceBuffer<u32> = gpu.alloc_zeros(1, Workspace).map_err(e)?;
    let gemm = HopperGemm {
        m: b.m,
        n: b.n,
        k: b.k,
        a: &da,
        a_format: b.a_format,
        b: &db,
        b_format: Fp8Format::E4M3,
        scales: HopperScales::PerTensor { a: &sa, b: &sb },
        bias: dbias.as_ref(),
        alpha: p.alpha,
        beta: p.beta,
        split_accumulator: b.split,
        amax: Some(&mut amax),
        error_flag: Some(&mut flag),
    };
    let len = b.m * b.n;
    // Poisoned low-precision outputs (NaN); the f32 one holds the old D that beta reads.
    let launched = match p.output {
        ProbeOutput::F32 => {
            let mut d = gpu.upload(&p.old, Activations).map_err(e)?;
            hopper::launch_with(gpu, gemm, DeviceOutput::F32(&mut d), b.tiles)
                .and_then(|_| gpu.download(&d))
                .map(|d| ExpectedOutput::F32(d.iter().map(|x| x.to_bits()).collect()))
        }
        ProbeOutput::Bf16 => {
            let mut d = gpu.upload(&vec![bf16::NAN; len], Activations).map_err(e)?;
            hopper::launch_with(gpu, gemm, DeviceOutput::Bf16(&mut d), b.tiles)
                .and_then(|_| gpu.download(&d))
                .map(|d| ExpectedOutput::Bf16(d.iter().map(|x| x.to_bits()).collect()))
        }
        ProbeOutput::F16 => {
            let mut d = gpu.upload(&vec![f16::NAN; len], Activations).map_err(e)?;
            hopper::launch_with(gpu, gemm, DeviceOutput::F16(&mut d), b.tiles)
                .and_then(|_| gpu.download(&d))
                .map(|d| ExpectedOutput::F16(d.iter().map(|x| x.to_bits()).collect()))
        }
        ProbeOutput::Fp8 { format, scale } => {
            let mut d = gpu.upload(&vec![0x7Fu8; len], Activations).map_err(e)?;
            let scale = gpu.upload(&[scale], Workspace).map_err(e)?;
            let out = DeviceOutput::Fp8 {
                codes: &mut d,
                format,
                scale: &scale,
            };
            hopper::launch_with(gpu, gemm, out, b.tiles)
                .and_then(|_| gpu.download(&d))
                .map(ExpectedOutput::Fp8)
        }
    };
    let got = match launched {
        Ok(got) => got,
        Err(err) => return Err(format!("{err}; {:?}", flag_error(gpu, &flag))),
    };
    flag_error(gpu, &flag)?;
    let amax = gpu.download(&amax).map_err(e)?[0];
    let want_amax = p.expected_amax();
    if !(amax.to_bits() == want_amax.to_bits() || (amax.is_nan() && want_amax.is_nan())) {
        return Err(format!(
            "amax {amax} expected {want_amax} (err/bound=inf: the bound is 0)"
        ));
    }
    let expected = p.expected_output();
    let nan16 = |x: u16, bf: bool| {
        if bf {
            bf16::from_bits(x).is_nan()
        } else {
            f16::from_bits(x).is_nan()
        }
    };
    let first_wrong = match (&got, &expected) {
        (ExpectedOutput::F32(g), ExpectedOutput::F32(w)) => g
            .iter()
            .zip(w)
            .position(|(&x, &y)| x != y && !(f32::from_bits(x).is_nan() && f32::from_bits(y).is_nan())),
        (ExpectedOutput::Bf16(g), ExpectedOutput::Bf16(w)) => g
            .iter()
            .zip(w)
            .position(|(&x, &y)| x != y && !(nan16(x, true) && nan16(y, true))),
        (ExpectedOutput::F16(g), ExpectedOutput::F16(w)) => g
            .iter()
            .zip(w)
            .position(|(&x, &y)| x != y && !(nan16(x, false) && nan16(y, false))),
        (ExpectedOutput::Fp8(g), ExpectedOutput::Fp8(w)) => {
            let format = match p.output {
                ProbeOutput::Fp8 { format, .. } => format,
                _ => Fp8Format::E4M3,
            };
            g.iter()
                .zip(w)
                .position(|(&x, &y)| x != y && !(format.is_nan(x) && format.is_nan(y)))
        }
        _ => return Err("output dtype differs from the probe's".into()),
    };
    match first_wrong {
        None => Ok(format!("exact, amax {amax}")),
        Some(i) => Err(format!(
            "D[{}, {}] differs: got {got_i:?} expected {want_i:?} (err/bound=inf: the bound is 0)",
            i / b.n,
            i % b.n,
            got_i = element(&got, i),
            want_i = element(&expected, i),
        )),
    }
}

/// Element `i` of an output, as bits (for the failure message).
fn element(out: &ExpectedOutput, i: usize) -> u32 {
    match out {
        ExpectedOutput::F32(v) => v[i],
        ExpectedOutput::Bf16(v) | ExpectedOutput::F16(v) => u32::from(v[i]),
        ExpectedOutput::Fp8(v) => u32::from(v[i]),
    }
}

#[test]
fn hopper_probes_with_epilogues_are_bit_exact() {
    let gpu = match hopper_gpu() {
        Ok(gpu) => gpu,
        Err(why) => return println!("hopper_host: skipped: {why}"),
    };
    let mut failures = Vec::new();
    for p in epilogue_probes() {
        match run_epilogue_probe(&gpu, &p) {
            Ok(what) => println!("hopper_host: probe {}: ok: {what}", p.name),
            Err(why) => {
                println!("hopper_host: probe {}: FAILED: {why}", p.name);
                failures.push(format!("{}: {why}", p.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} epilogue probes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
