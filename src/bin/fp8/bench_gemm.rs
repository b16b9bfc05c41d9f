//! `fp8 bench gemm`: throughput and accuracy of the GEMM per case, next to a
//! baseline GEMM timed in the same run (the f32 GEMM crate on the CPU,
//! cuBLASLt on a GPU). A backend is a
//! [`GemmRunner`]; inputs, references and reporting are shared.

use std::io::Write;

use clap::{Args, ValueEnum};
use fp8_engine::backend::cuda::error_bound::{Accumulation, OutputUlp, accumulation_bound, worst_ratio};
use fp8_engine::gemm::{self, GemmParams, Output};

use crate::bench_gemm_cpu::CpuRunner;
use crate::bench_gemm_cuda::CudaRunner;
use crate::bench_gemm_inputs::{
    Dist, Input, InputFormat, SAMPLE_ROWS, Scaling, Side, random, reference_rows, relative_error, sample_rows,
};
use crate::bench_gemm_runner::{CaseInputs, GemmRunner, OutFormat};
use crate::error::CliError;
use crate::table::Table;

/// Options of `fp8 bench gemm`.
#[derive(Args)]
#[command(after_help = "\
Columns: our throughput (GFLOP/s on the CPU, TFLOPS on a GPU; JSON `tflops` is always TFLOPS), \
the baseline's in the same run (the f32 GEMM crate on the dequantized inputs on the CPU; cuBLASLt on the same \
FP8 codes or bf16 values on a GPU), their ratio, \
% of the device's dense peak (`-` / null on the CPU: no datasheet peak), \
rel_err: relative Frobenius error against the f64 product of the same quantized (dequantized) inputs \
(the GEMM's own arithmetic, output rounding included), \
quant_err: the same against the f64 product of the unquantized inputs (format and recipe). \
Both references are computed on a deterministic sample of 64 evenly spaced output rows (all rows when M <= 64). \
With --backend cuda, `tflops` is the path the engine chooses (FP8_GEMM_PATH) and the JSON adds \
portable_tflops / hopper_tflops (null with *_error when a path cannot run), *_kernel and path, and \
portable_err_bound / hopper_err_bound: each path's worst |error| on the sampled rows over its bound, \
sum_k |a b| sA sB (K/32 + 2) 2^-12 for FP8 inputs, (K/16 + 2) 2^-22 otherwise, plus one output ulp; \
a result above 1 fails the run.")]
pub struct GemmBenchArgs {
    /// cpu, or cuda (GPU 0: the portable kernel, the Hopper path on sm_90, and cuBLASLt as the baseline).
    #[arg(long, value_enum, default_value = "cpu")]
    backend: Backend,
    /// Rows of A and D.
    #[arg(long, default_value_t = 2048, conflicts_with = "suite")]
    m: usize,
    /// Rows of B, columns of D.
    #[arg(long, default_value_t = 2048, conflicts_with = "suite")]
    n: usize,
    /// The reduction dimension (a multiple of 16 for FP8).
    #[arg(long, default_value_t = 2048, conflicts_with = "suite")]
    k: usize,
    /// A list of shapes instead of one: llm (LLM training shapes, slow on a CPU) or small (seconds).
    #[arg(long, value_enum)]
    suite: Option<Suite>,
    /// Format of A.
    #[arg(long, value_enum, default_value = "e4m3")]
    a_format: InputFormat,
    /// Format of B.
    #[arg(long, value_enum, default_value = "e4m3")]
    b_format: InputFormat,
    /// Scaling of FP8 inputs (ignored for plain ones).
    #[arg(long, value_enum, default_value = "tensor")]
    scaling: Scaling,
    /// Output type (FP8 outputs get the scale fp8_max / amax of an untimed run).
    #[arg(long, value_enum, default_value = "bf16")]
    out: OutFormat,
    /// Split accumulation (promote every 128 of K) for FP8 inputs; forced on for block scales.
    #[arg(long, value_enum, default_value = "on")]
    split: OnOff,
    /// Distribution of the unquantized inputs.
    #[arg(long, value_enum, default_value = "normal")]
    dist: Dist,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Timed runs per GEMM after one warm-up, ours and the baseline alternating; the medians are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// One JSON object per case and line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Suite {
    /// 8192^3, 4096x7168x16384, 4096x4096x7168, 4096x2112x7168, 4096x24576x1536, 128x7168x16384, 64x2112x7168.
    Llm,
    /// 256^3, 512^3, 1024^3, 2048^3 and a ragged 1000x1500x784.
    Small,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

const LLM: [(usize, usize, usize); 7] = [
    (8192, 8192, 8192),
    (4096, 7168, 16384),
    (4096, 4096, 7168),
    (4096, 2112, 7168),
    (4096, 24576, 1536),
    (128, 7168, 16384),
    (64, 2112, 7168),
];

const SMALL: [(usize, usize, usize); 5] = [
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (1000, 1500, 784),
];

fn runner(backend: Backend) -> Result<Box<dyn GemmRunner>, CliError> {
    match backend {
        Backend::Cpu => Ok(Box::new(CpuRunner)),
        Backend::Cuda => Ok(Box::new(CudaRunner::open()?)),
    }
}

/// One line of the report.
struct Row {
    m: usize,
    n: usize,
    k: usize,
    split: bool,
    tflops: Result<f64, String>,
    baseline_tflops: Result<f64, String>,
    peak_pct: Option<f64>,
    rel_err: Option<f64>,
    quant_err: Option<f64>,
    /// Worst err/bound per checked path (see [`error_bounds`]).
    bounds: Vec<(&'static str, f64)>,
    extra: Vec<(&'static str, serde_json::Value)>,
}

/// Rejects format, scaling and output combinations before any big input is
/// made: the library's own checks on a 16x16x16 stand-in.
fn validate(args: &GemmBenchArgs) -> Result<(), CliError> {
    let x = vec![0.5f32; 16 * 16];
    let a = Input::new(&x, 16, 16, args.a_format, args.scaling, Side::A)?;
    let b = Input::new(&x, 16, 16, args.b_format, args.scaling, Side::B)?;
    let mut d = vec![0.0f32; 16 * 16];
    gemm::plan(&a.view()?, &b.view()?, &Output::F32(&mut d), &GemmParams::default())?;
    Ok(())
}

/// Shown in the table and JSON: "none" for plain inputs.
fn scaling_name(args: &GemmBenchArgs) -> &'static str {
    if args.a_format.fp8().is_some() {
        args.scaling.name()
    } else {
        "none"
    }
}

fn run_case(
    runner: &mut dyn GemmRunner,
    args: &GemmBenchArgs,
    (m, n, k): (usize, usize, usize),
) -> Result<Row, CliError> {
    let xa = random(m * k, args.dist, args.seed.wrapping_mul(2).wrapping_add(1));
    let xb = random(n * k, args.dist, args.seed.wrapping_mul(2).wrapping_add(2));
    let a = Input::new(&xa, m, k, args.a_format, args.scaling, Side::A)?;
    let b = Input::new(&xb, n, k, args.b_format, args.scaling, Side::B)?;
    // Split accumulation concerns FP8 inputs only, and block scales force it.
    let fp8 = args.a_format.fp8().is_some();
    let split = fp8 && (args.split == OnOff::On || args.scaling != Scaling::Tensor);
    let inputs = CaseInputs {
        a,
        b,
        out: args.out,
        split,
    };
    let measured = runner.measure(&inputs, args.repeat as usize)?;
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let tflops = measured.seconds.map(|s| flops / s / 1e12);
    let bounds = error_bounds(&inputs, &measured.checked, fp8, (m, n, k));
    let (rel_err, quant_err) = match &measured.output {
        Some(output) => {
            let rows = sample_rows(m);
            let exact = reference_rows(&rows, n, 1.0, |i| inputs.a.row_f64(i), |j| inputs.b.row_f64(j));
            let widen = |x: &[f32], r: usize| x[r * k..(r + 1) * k].iter().map(|&v| v as f64).collect();
            let unquantized = reference_rows(&rows, n, 1.0, |i| widen(&xa, i), |j| widen(&xb, j));
            (
                Some(relative_error(output, n, &rows, &exact)),
                Some(relative_error(output, n, &rows, &unquantized)),
            )
        }
        None => (None, None),
    };
    Ok(Row {
        m,
        n,
        k,
        split,
        peak_pct: match (&tflops, runner.peak_tflops(fp8)) {
            (Ok(t), Some(p)) => Some(100.0 * t / p),
            _ => None,
        },
        tflops,
        baseline_tflops: measured.baseline_seconds.map(|s| flops / s / 1e12),
        rel_err,
        quant_err,
        bounds,
        extra: measured.extra,
    })
}

/// Worst `error / bound` of each checked output on the sampled rows, against the
/// f64 product of the quantized inputs: the bound is `error_bound`'s accumulation
/// bound on `S_ij = sum_k |a_ik b_jk| sA sB` plus one output ulp (above 1 fails the bench).
fn error_bounds(
    inputs: &CaseInputs,
    checked: &[(&'static str, Vec<f32>, f32)],
    fp8: bool,
    (m, n, k): (usize, usize, usize),
) -> Vec<(&'static str, f64)> {
    if checked.is_empty() {
        return Vec::new();
    }
    let rows = sample_rows(m);
    let exact = reference_rows(&rows, n, 1.0, |i| inputs.a.row_f64(i), |j| inputs.b.row_f64(j));
    let abs = |v: Vec<f64>| v.into_iter().map(f64::abs).collect();
    let magnitude = reference_rows(
        &rows,
        n,
        1.0,
        |i| abs(inputs.a.row_f64(i)),
        |j| abs(inputs.b.row_f64(j)),
    );
    let kind = if fp8 { Accumulation::Fp8 } else { Accumulation::Half };
    let accumulation: Vec<f64> = magnitude.iter().map(|&x| accumulation_bound(kind, x, k)).collect();
    let reference: Vec<f32> = exact.iter().map(|&x| x as f32).collect();
    let ulp = match inputs.out {
        OutFormat::F32 => OutputUlp::F32,
        OutFormat::Bf16 => OutputUlp::BF16,
        OutFormat::F16 => OutputUlp::F16,
        OutFormat::E4m3 => OutputUlp::E4M3,
        OutFormat::E5m2 => OutputUlp::E5M2,
    };
    checked
        .iter()
        .map(|(name, out, scale)| {
            let sampled: Vec<f32> = rows
                .iter()
                .flat_map(|&i| out[i * n..(i + 1) * n].iter().copied())
                .collect();
            // The f64 reference rounded to f32 adds at most half an f32 ulp: inside the bound.
            let ratio = worst_ratio(&sampled, &reference, &accumulation, ulp, *scale as f64).ratio;
            (*name, ratio)
        })
        .collect()
}

/// Rough seconds for a suite on this machine: time a 512^3 f32 GEMM, scale by
/// the flops of every run (warm-up and repeats of ours and the baseline's,
/// plus one untimed run) and add the two f64 references on the sampled rows.
fn estimate_seconds(shapes: &[(usize, usize, usize)], repeat: usize) -> Result<f64, CliError> {
    let s = 512;
    let x = random(s * s, Dist::Uniform, 7);
    let mut d = vec![0.0f32; s * s];
    let mat = fp8_engine::gemm::Mat::new(&x, s, s)?;
    gemm::cpu::f32_crate_gemm(mat, mat, &mut d)?;
    let start = std::time::Instant::now();
    gemm::cpu::f32_crate_gemm(mat, mat, &mut d)?;
    let flops_per_s = 2.0 * (s * s * s) as f64 / start.elapsed().as_secs_f64();
    // f64 references run scalar: about 1 GFLOP/s per thread.
    let f64_per_s = 1e9 * rayon::current_num_threads() as f64;
    Ok(shapes
        .iter()
        .map(|&(m, n, k)| {
            let flops = 2.0 * (m * n * k) as f64;
            let sampled = 2.0 * 2.0 * (m.min(SAMPLE_ROWS) * n * k) as f64;
            flops * (2 * (repeat + 1) + 1) as f64 / flops_per_s + sampled / f64_per_s
        })
        .sum())
}

/// Runs `fp8 bench gemm`.
pub fn run(args: GemmBenchArgs) -> Result<(), CliError> {
    let mut runner = runner(args.backend)?;
    validate(&args)?;
    let shapes: Vec<(usize, usize, usize)> = match args.suite {
        Some(Suite::Llm) => LLM.to_vec(),
        Some(Suite::Small) => SMALL.to_vec(),
        None => vec![(args.m, args.n, args.k)],
    };
    crate::bench_memory::check_gemm(&shapes)?;
    let on_cpu = args.backend == Backend::Cpu;
    if on_cpu && args.suite == Some(Suite::Llm) {
        let minutes = estimate_seconds(&shapes, args.repeat as usize)? / 60.0;
        eprintln!(
            "warning: --suite llm on the CPU is slow: about {minutes:.0} minutes on this machine (--suite small runs in seconds)"
        );
    }
    let progress = shapes.len() > 1;
    let mut rows = Vec::new();
    for (i, &shape) in shapes.iter().enumerate() {
        if progress {
            eprintln!("case {}/{}: {}x{}x{}", i + 1, shapes.len(), shape.0, shape.1, shape.2);
        }
        let row = run_case(runner.as_mut(), &args, shape)?;
        if args.json {
            // One line per case as soon as it is measured.
            println!("{}", json_line(&args, &row, on_cpu));
            std::io::stdout().flush()?;
        }
        rows.push(row);
    }
    if !args.json {
        print_table(&args, runner.describe(), &rows, on_cpu);
    }
    let over: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.bounds
                .iter()
                .filter(|(_, ratio)| ratio.is_nan() || *ratio > 1.0)
                .map(move |(path, ratio)| format!("{}x{}x{} {path}: err/bound={ratio:.3}", r.m, r.n, r.k))
        })
        .collect();
    if !over.is_empty() {
        return Err(CliError(format!(
            "{} result(s) exceed their error bound: {}",
            over.len(),
            over.join("; ")
        )));
    }
    Ok(())
}

/// JSON has no infinity: a non-finite ratio is written as null (and fails the run).
fn finite_or_null(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn json_line(args: &GemmBenchArgs, row: &Row, on_cpu: bool) -> serde_json::Value {
    let ok = |r: &Result<f64, String>| r.as_ref().ok().copied();
    let ratio = match (&row.tflops, &row.baseline_tflops) {
        (Ok(t), Ok(b)) => Some(t / b),
        _ => None,
    };
    let mut line = serde_json::json!({
        "backend": if on_cpu { "cpu" } else { "cuda" },
        "m": row.m, "n": row.n, "k": row.k,
        "a_format": args.a_format.name(), "b_format": args.b_format.name(),
        "scaling": scaling_name(args), "out": args.out.name(),
        "split_accumulator": row.split,
        "tflops": ok(&row.tflops), "baseline_tflops": ok(&row.baseline_tflops),
        "ratio": ratio,
        "peak_pct": row.peak_pct,
        "rel_err": row.rel_err, "quant_err": row.quant_err,
    });
    let object = line.as_object_mut().expect("a JSON object");
    if let Err(e) = &row.tflops {
        object.insert("error".into(), e.clone().into());
    }
    if let Err(e) = &row.baseline_tflops {
        object.insert("baseline_error".into(), e.clone().into());
    }
    for (key, value) in &row.extra {
        object.insert((*key).into(), value.clone());
    }
    for (path, ratio) in &row.bounds {
        object.insert(format!("{path}_err_bound"), serde_json::json!(finite_or_null(*ratio)));
    }
    line
}

fn print_table(args: &GemmBenchArgs, device: String, rows: &[Row], on_cpu: bool) {
    let (unit, per) = if on_cpu { ("GFLOP/s", 1e3) } else { ("TFLOPS", 1.0) };
    let baseline = if on_cpu { "f32 crate" } else { "cuBLASLt" };
    println!(
        "device: {device}; A {} x B {}, scaling {}, out {}, {:?} inputs, median of {}",
        args.a_format.name(),
        args.b_format.name(),
        scaling_name(args),
        args.out.name(),
        args.dist,
        args.repeat
    );
    let ours = format!("ours {unit}");
    let theirs = format!("{baseline} {unit}");
    let mut table = Table::new(&[
        "m",
        "n",
        "k",
        "split",
        &ours,
        &theirs,
        "ratio",
        "% peak",
        "rel_err",
        "quant_err",
    ]);
    let cell = |r: &Result<f64, String>| r.as_ref().map_or("error".to_string(), |t| format!("{:.1}", t * per));
    let sci = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2e}"));
    let mut notes = Vec::new();
    for r in rows {
        table.push(vec![
            r.m.to_string(),
            r.n.to_string(),
            r.k.to_string(),
            if r.split { "on" } else { "off" }.to_string(),
            cell(&r.tflops),
            cell(&r.baseline_tflops),
            match (&r.tflops, &r.baseline_tflops) {
                (Ok(t), Ok(b)) => format!("{:.2}", t / b),
                _ => "-".to_string(),
            },
            r.peak_pct.map_or("-".to_string(), |p| format!("{p:.1}")),
            sci(r.rel_err),
            sci(r.quant_err),
        ]);
        let shape = format!("{}x{}x{}", r.m, r.n, r.k);
        for e in [&r.tflops, &r.baseline_tflops]
            .into_iter()
            .filter_map(|x| x.as_ref().err())
        {
            notes.push(format!("{shape}: {e}"));
        }
        // Per-path columns of the CUDA runner, one line per case.
        let paths: Vec<String> = r
            .extra
            .iter()
            .filter(|(key, value)| key.ends_with("_tflops") && !value.is_null())
            .map(|(key, value)| {
                format!(
                    "{} {:.1}",
                    key.trim_end_matches("_tflops"),
                    value.as_f64().unwrap_or(f64::NAN)
                )
            })
            .chain(
                r.extra
                    .iter()
                    .filter(|(key, value)| key.ends_with("_error") && !value.is_null())
                    .map(|(key, value)| {
                        format!("{}: {}", key.trim_end_matches("_error"), value.as_str().unwrap_or(""))
                    }),
            )
            .collect();
        if !paths.is_empty() {
            notes.push(format!("{shape}: {}", paths.join("; ")));
        }
        if !r.bounds.is_empty() {
            let ratios: Vec<String> = r.bounds.iter().map(|(p, x)| format!("{p} {x:.3}")).collect();
            notes.push(format!("{shape}: err/bound {}", ratios.join(", ")));
        }
    }
    print!("{}", table.render());
    for note in notes {
        println!("  {note}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bounds_pass_the_exact_product_and_flag_a_wrong_element() {
        let (m, n, k) = (8, 6, 256);
        let (xa, xb) = (random(m * k, Dist::Normal, 1), random(n * k, Dist::Normal, 2));
        let inputs = CaseInputs {
            a: Input::new(&xa, m, k, InputFormat::E4m3, Scaling::Tensor, Side::A).unwrap(),
            b: Input::new(&xb, n, k, InputFormat::E4m3, Scaling::Tensor, Side::B).unwrap(),
            out: OutFormat::F32,
            split: true,
        };
        let rows = sample_rows(m);
        let exact = reference_rows(&rows, n, 1.0, |i| inputs.a.row_f64(i), |j| inputs.b.row_f64(j));
        let good: Vec<f32> = exact.iter().map(|&x| x as f32).collect();
        let mut bad = good.clone();
        // A tenth of the row's scale off: far outside (K/32 + 2) 2^-12 of S.
        bad[7] += 0.1 * exact[6..12].iter().fold(0.0f64, |a, &x| a.max(x.abs())) as f32;
        let r = error_bounds(&inputs, &[("good", good, 1.0), ("bad", bad, 1.0)], true, (m, n, k));
        assert_eq!((r[0].0, r[1].0), ("good", "bad"));
        assert!(r[0].1 < 0.01, "{r:?}");
        assert!(r[1].1 > 1.0, "{r:?}");
    }
}
