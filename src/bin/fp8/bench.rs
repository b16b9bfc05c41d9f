//! `fp8 bench cast [--json] [--device auto|cpu|cuda[:N]]`: bandwidth of each
//! memory-bound FP8 kernel at 8192^2 and 16384^2 bf16 elements, in GB/s of
//! bytes read + written, next to a device-to-device copy of the input measured
//! in the same run. On the CPU the same command benches the CPU quantizers.

use std::time::Instant;

use clap::{Args, Subcommand};
use fp8_engine::backend::cuda::{CudaDevice, DequantScales, DeviceBuffer};
use fp8_engine::convert;
use fp8_engine::device::{Device, DeviceChoice, MemoryCategory};
use fp8_engine::format::{Fp8Format, Overflow};
use fp8_engine::quantize::ScaleRule;
use fp8_engine::scaling::{BlockScaling, TensorRole};
use half::bf16;

use crate::error::CliError;
use crate::timing::{median, median_ms};

/// Benchmark a family of kernels.
#[derive(Args)]
pub struct BenchArgs {
    /// What to bench.
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// The memory-bound casts, quantizers and dequantize.
    Cast(CastBenchArgs),
    /// GEMM throughput and accuracy next to a baseline GEMM.
    Gemm(crate::bench_gemm::GemmBenchArgs),
    /// Forward + backward of one TransformerLayer per precision (CPU backend).
    Layer(LayerBenchArgs),
}

/// Options of `fp8 bench layer`.
#[derive(Args)]
struct LayerBenchArgs {
    /// Print one JSON object per precision instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    layer: crate::bench_layer::LayerArgs,
}

/// Options of `fp8 bench cast`.
#[derive(Args)]
struct CastBenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
}

/// Edge lengths of the square bf16 inputs.
const SIZES: [usize; 2] = [8192, 16384];
/// Timed runs per kernel (median reported), after one warm-up.
const RUNS: usize = 10;

struct Row {
    kernel: &'static str,
    size: usize,
    bytes: u64,
    seconds: f64,
}

/// Runs `f` once to warm up, then RUNS times; returns the median seconds.
fn time_cpu(mut f: impl FnMut() -> Result<(), CliError>) -> Result<f64, CliError> {
    f()?;
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

/// The same on the GPU: one warm-up, then the median of RUNS calls, each timed by a pair
/// of CUDA events on the device's stream (events with timing enabled: `timing::median_ms`).
fn time_gpu(gpu: &CudaDevice, f: impl FnMut() -> fp8_engine::Result<()>) -> Result<f64, CliError> {
    Ok(median_ms(gpu, 1, RUNS, f)? / 1e3)
}

fn input(n: usize) -> Vec<bf16> {
    // A cheap deterministic spread of magnitudes and signs.
    (0..n)
        .map(|i| bf16::from_f32(((i * 2_654_435_761) % 2001) as f32 * 0.37 - 370.0))
        .collect()
}

fn bench_cpu(size: usize, rows: &mut Vec<Row>) -> Result<(), CliError> {
    let n = size * size;
    let src = input(n);
    let mut q = vec![0u8; n];
    let mut y = vec![bf16::ZERO; n];
    let mut copy = vec![bf16::ZERO; n];
    let mut push = |kernel, bytes: usize, seconds| {
        rows.push(Row {
            kernel,
            size,
            bytes: bytes as u64,
            seconds,
        })
    };
    push(
        "copy (baseline)",
        4 * n,
        time_cpu(|| {
            copy.copy_from_slice(&src);
            Ok(())
        })?,
    );
    push(
        "cast + amax",
        3 * n,
        time_cpu(|| {
            convert::quantize(&src, &mut q, Fp8Format::E4M3, 1.0, Overflow::Saturate)?;
            Ok(())
        })?,
    );
    push(
        "dequantize",
        3 * n,
        time_cpu(|| Ok(convert::dequantize(&q, &mut y, Fp8Format::E4M3, 1.0)?))?,
    );
    Ok(())
}

fn bench_gpu(gpu: &CudaDevice, size: usize, rows: &mut Vec<Row>) -> Result<(), CliError> {
    let n = size * size;
    let src = gpu.upload(&input(n), MemoryCategory::Activations)?;
    let mut copy: DeviceBuffer<bf16> = gpu.alloc_zeros(n, MemoryCategory::Workspace)?;
    let mut q: DeviceBuffer<u8> = gpu.alloc_zeros(n, MemoryCategory::Fp8Copies)?;
    let mut qt: DeviceBuffer<u8> = gpu.alloc_zeros(n, MemoryCategory::Fp8Copies)?;
    let mut y: DeviceBuffer<bf16> = gpu.alloc_zeros(n, MemoryCategory::Workspace)?;
    let scale = gpu.upload(&[1.0f32], MemoryCategory::Workspace)?;
    let mut amax = gpu.upload(&[0.0f32], MemoryCategory::Workspace)?;
    let mut s128: DeviceBuffer<f32> = gpu.alloc_zeros(size * size.div_ceil(128), MemoryCategory::Fp8Copies)?;
    let mut s128t: DeviceBuffer<f32> = gpu.alloc_zeros(size * size.div_ceil(128), MemoryCategory::Fp8Copies)?;
    let mut e32: DeviceBuffer<u8> = gpu.alloc_zeros(size * size.div_ceil(32), MemoryCategory::Fp8Copies)?;
    // The block recipe's defaults (E4M3, power-of-two scales, epsilon 0).
    let rule = ScaleRule::block(&BlockScaling::default(), TensorRole::Input);
    let mut push = |kernel, bytes: usize, seconds| {
        rows.push(Row {
            kernel,
            size,
            bytes: bytes as u64,
            seconds,
        })
    };
    push("copy (baseline)", 4 * n, time_gpu(gpu, || gpu.copy(&src, &mut copy))?);
    let f = Fp8Format::E4M3;
    push(
        "cast + amax",
        3 * n,
        time_gpu(gpu, || {
            gpu.cast_amax(&src, size, size, f, (&scale, 0), &mut q, None, (&mut amax, 0), None)
        })?,
    );
    push(
        "cast + transpose + amax",
        4 * n,
        time_gpu(gpu, || {
            gpu.cast_amax(
                &src,
                size,
                size,
                f,
                (&scale, 0),
                &mut q,
                Some(&mut qt),
                (&mut amax, 0),
                None,
            )
        })?,
    );
    push("amax", 2 * n, time_gpu(gpu, || gpu.amax(&src, &mut amax))?);
    push(
        "1x128 row-wise",
        3 * n,
        time_gpu(gpu, || {
            gpu.quantize_1x128(&src, size, size, &rule, Some((&mut q, &mut s128)), None)
        })?,
    );
    push(
        "1x128 column-wise",
        3 * n,
        time_gpu(gpu, || {
            gpu.quantize_1x128(&src, size, size, &rule, None, Some((&mut qt, &mut s128t)))
        })?,
    );
    let mut s_tile: DeviceBuffer<f32> = gpu.alloc_zeros(size.div_ceil(128).pow(2), MemoryCategory::Fp8Copies)?;
    push(
        "128x128",
        3 * n,
        time_gpu(gpu, || {
            gpu.quantize_128x128(&src, size, size, &rule, (&mut q, &mut s_tile), None)
        })?,
    );
    push(
        "mxfp8 row-wise",
        3 * n,
        time_gpu(gpu, || {
            gpu.quantize_mxfp8(&src, size, size, f, Some((&mut q, &mut e32)), None)
        })?,
    );
    push(
        "mxfp8 column-wise",
        3 * n,
        time_gpu(gpu, || {
            gpu.quantize_mxfp8(&src, size, size, f, None, Some((&mut qt, &mut e32)))
        })?,
    );
    push(
        "dequantize",
        3 * n,
        time_gpu(gpu, || {
            gpu.dequantize(&q, size, size, f, DequantScales::PerTensor(&scale), &mut y)
        })?,
    );
    Ok(())
}

/// Runs `fp8 bench`.
pub fn run(args: BenchArgs) -> Result<(), CliError> {
    match args.what {
        BenchWhat::Cast(args) => run_cast(args),
        BenchWhat::Gemm(args) => crate::bench_gemm::run(args),
        BenchWhat::Layer(args) => crate::bench_layer::run(&args.layer, args.json),
    }
}

fn run_cast(args: CastBenchArgs) -> Result<(), CliError> {
    let device = Device::select(args.device.parse::<DeviceChoice>()?)?;
    let mut rows = Vec::new();
    for size in SIZES {
        match &device {
            Device::Cuda(gpu) => bench_gpu(gpu, size, &mut rows)?,
            Device::Cpu(_) => bench_cpu(size, &mut rows)?,
        }
    }
    let copy_gbs = |size: usize| {
        rows.iter()
            .find(|r| r.size == size && r.kernel == "copy (baseline)")
            .map(|r| r.bytes as f64 / r.seconds / 1e9)
            .unwrap_or(f64::NAN)
    };
    let gbs = |r: &Row| r.bytes as f64 / r.seconds / 1e9;
    if args.json {
        let items: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "kernel": r.kernel, "shape": [r.size, r.size], "input": "bf16",
                    "bytes": r.bytes, "seconds": r.seconds, "gb_per_s": gbs(r),
                    "fraction_of_copy": gbs(r) / copy_gbs(r.size),
                })
            })
            .collect();
        let doc = serde_json::json!({ "device": device.describe(), "runs": RUNS, "results": items });
        println!("{doc}");
    } else {
        println!(
            "device: {} (bf16 input, E4M3 output, median of {RUNS} runs)",
            device.describe()
        );
        println!("{:<26} {:>12} {:>10} {:>9}", "kernel", "shape", "GB/s", "of copy");
        for r in &rows {
            let shape = format!("{}^2", r.size);
            let pct = 100.0 * gbs(r) / copy_gbs(r.size);
            println!("{:<26} {:>12} {:>10.1} {:>8.1}%", r.kernel, shape, gbs(r), pct);
        }
    }
    Ok(())
}
