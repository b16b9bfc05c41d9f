//! `fp8 bench layer [--json] [--device D] [--precision P,...] [--hidden --heads --ffn --seq --batch]`:
//! forward + backward time of one `TransformerLayer` per precision, on the CPU
//! reference backend or (`--device cuda`) the CUDA backend, whose ops are staged
//! through host memory today, so GPU times include every upload and download
//! (`docs/cuda-backend.md`). The default size is small enough to run in seconds;
//! the GPU size of the issue is hidden 4096, 32 heads, FFN 16384, sequence 2048.

use std::time::Instant;

use clap::Args;
use fp8_engine::amp::Precision;
use fp8_engine::device::{Device, DeviceChoice, DeviceKind};
use fp8_engine::nn::{Module, Tensor, TransformerConfig, TransformerLayer};
use fp8_engine::op_times::{self, OpTime, Phase, TransferTimes};

use crate::bench_layer_breakdown::Breakdown;
use crate::error::CliError;

/// Options of `fp8 bench layer`.
#[derive(Args, Clone)]
pub struct LayerArgs {
    /// Comma-separated precisions (fp32, bf16, fp16, fp8-delayed, fp8-current, fp8-block, mxfp8);
    /// default: all of them on the CPU, bf16,fp8-delayed on CUDA (FP8 against bf16;
    /// fp32 runs there on cuBLASLt and mxfp8 on the E8M0 GEMM kernels of sm_89+ when named).
    #[arg(long)]
    precision: Option<String>,
    /// Where the layer runs: cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// MLP hidden units.
    #[arg(long, default_value_t = 512)]
    ffn: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Timed steps per precision (median reported), after one warm-up step.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Also print the time per op family (GEMMs, casts, norms, ...), forward and backward,
    /// averaged over the timed steps.
    #[arg(long)]
    breakdown: bool,
    /// With `--breakdown` on a GPU: every op waits for its kernels before its clock stops, so
    /// each op family is charged with its own GPU time and "outside ops" is host work only.
    /// The step is slower by a stream sync per op: a diagnosis, not a speed.
    #[arg(long, requires = "breakdown")]
    sync_ops: bool,
}

struct Row {
    precision: String,
    seconds: f64,
    saved_bytes: usize,
    weight_cache_bytes: usize,
    /// With `--breakdown`: every op's time over all timed steps, and those steps' total.
    ops: Option<(Vec<OpTime>, TransferTimes, f64)>,
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    // A cheap deterministic pseudo-normal pattern; timing does not depend on the values.
    (0..n)
        .map(|i| {
            let h = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
        })
        .collect()
}

fn bench_one(args: &LayerArgs, precision: &Precision, device: DeviceKind) -> Result<Row, CliError> {
    let config = TransformerConfig {
        hidden: args.hidden,
        heads: args.heads,
        ffn_hidden: args.ffn,
        ..TransformerConfig::default()
    };
    let mut layer = TransformerLayer::new("layer", &config, precision, 1)?;
    layer.to_device(device)?;
    let tokens = args.batch * args.seq;
    let x = Tensor::new(values(tokens * args.hidden, 1), tokens, args.hidden)?;
    let dy = Tensor::new(values(tokens * args.hidden, 2), tokens, args.hidden)?;
    let mut saved_bytes = 0;
    let mut step = |layer: &mut TransformerLayer| -> Result<f64, CliError> {
        let start = Instant::now();
        op_times::set_phase(Phase::Forward);
        layer.forward(&x, args.batch, args.seq)?;
        saved_bytes = layer.saved_activation_bytes();
        op_times::set_phase(Phase::Backward);
        layer.backward(&dy)?;
        let seconds = start.elapsed().as_secs_f64();
        op_times::set_phase(Phase::Other);
        layer.visit_parameters(&mut |p| p.mark_updated()); // each step casts the weights again
        Ok(seconds)
    };
    step(&mut layer)?;
    op_times::take();
    op_times::take_transfers();
    op_times::enable(args.breakdown);
    op_times::sync_ops(args.sync_ops);
    let times = (0..args.runs.max(1))
        .map(|_| step(&mut layer))
        .collect::<Result<Vec<_>, _>>();
    op_times::enable(false);
    op_times::sync_ops(false);
    let mut times = times?;
    let ops = args
        .breakdown
        .then(|| (op_times::take(), op_times::take_transfers(), times.iter().sum::<f64>()));
    times.sort_by(f64::total_cmp);
    Ok(Row {
        precision: precision.name().to_string(),
        seconds: times[times.len() / 2],
        saved_bytes,
        weight_cache_bytes: layer.weight_cache_bytes(),
        ops,
    })
}

/// Runs the benchmark and prints a table or one JSON object.
pub fn run(args: &LayerArgs, json: bool) -> Result<(), CliError> {
    crate::bench_memory::check_layer(args.hidden, args.heads, args.ffn, args.seq, args.batch)?;
    let device = Device::select(args.device.parse::<DeviceChoice>()?)?;
    let on_gpu = matches!(device, Device::Cuda(_));
    let default = match on_gpu {
        true => "bf16,fp8-delayed",
        false => "fp32,bf16,fp16,fp8-delayed,fp8-current,fp8-block,mxfp8",
    };
    let precisions = args
        .precision
        .as_deref()
        .unwrap_or(default)
        .split(',')
        .map(|name| name.trim().parse::<Precision>())
        .collect::<Result<Vec<_>, _>>()?;
    let rows = precisions
        .iter()
        .map(|p| bench_one(args, p, device.kind()))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens = args.batch.saturating_mul(args.seq);
    // GEMM FLOPs of forward + backward: 3x the forward's 2 * tokens * (4 h^2 + 2 h ffn) (qkv, proj, fc1,
    // fc2), plus attention's 2 * 2 * tokens * seq * h / 2 (causal half) forward, twice that backward.
    let (h, f, s) = (args.hidden as f64, args.ffn as f64, args.seq as f64);
    let flops = 3.0 * 2.0 * tokens as f64 * (4.0 * h * h + 2.0 * h * f) + 3.0 * 2.0 * tokens as f64 * s * h;
    if json {
        let items: Vec<_> = rows
            .iter()
            .map(|r| {
                let mut item = serde_json::json!({
                    "precision": r.precision, "seconds": r.seconds, "gflop_per_s": flops / r.seconds / 1e9,
                    "tflop_per_s": flops / r.seconds / 1e12,
                    "saved_activation_bytes": r.saved_bytes, "weight_cache_bytes": r.weight_cache_bytes,
                });
                if let Some((ops, transfers, total)) = &r.ops {
                    item["breakdown"] = Breakdown::new(ops, transfers, *total, args.runs.max(1)).json();
                }
                item
            })
            .collect();
        let doc = serde_json::json!({
            "device": device.describe(), "staged": on_gpu && !device.resident_layers(), "resident": device.resident_layers(),
            "device_slot_banks": device.device_slot_banks(),
            "sync_ops": args.sync_ops, "layer": {"hidden": args.hidden, "heads": args.heads, "ffn": args.ffn,
            "seq": args.seq, "batch": args.batch}, "runs": args.runs, "results": items,
        });
        println!("{doc}");
    } else {
        println!(
            "TransformerLayer forward+backward on {}: hidden {}, heads {}, ffn {}, seq {}, batch {} \
             (median of {})",
            device.describe(),
            args.hidden,
            args.heads,
            args.ffn,
            args.seq,
            args.batch,
            args.runs
        );
        if on_gpu && device.resident_layers() {
            println!(
                "(resident: activations stay on the GPU between ops; the times include one upload of \
                 the input and one download of the output per pass, and the staging of weights and statistics)"
            );
        } else if on_gpu {
            println!("(staged CUDA ops: the times include every host<->device copy of every op)");
        }
        if device.device_slot_banks() {
            println!(
                "(FP8_CUDA_DEVICE_BANKS=1: delayed-scaling banks on the GPU, amaxes folded and updates run \
                 there, nothing read back per op)"
            );
        }
        if on_gpu && args.sync_ops {
            println!(
                "(--sync-ops: every op waited for its kernels, so the step times are slower than a plain run's; \
                 each family holds its own GPU time and \"outside ops\" is host work only)"
            );
        }
        let (unit, per) = if on_gpu { ("TFLOP/s", 1e12) } else { ("GFLOP/s", 1e9) };
        println!(
            "{:<12} {:>10} {:>10} {:>14} {:>14}",
            "precision", "ms", unit, "saved MiB", "weights MiB"
        );
        for r in &rows {
            println!(
                "{:<12} {:>10.1} {:>10.2} {:>14.2} {:>14.2}",
                r.precision,
                r.seconds * 1e3,
                flops / r.seconds / per,
                r.saved_bytes as f64 / (1 << 20) as f64,
                r.weight_cache_bytes as f64 / (1 << 20) as f64
            );
        }
        for r in &rows {
            if let Some((ops, transfers, total)) = &r.ops {
                println!();
                Breakdown::new(ops, transfers, *total, args.runs.max(1)).print(&r.precision);
            }
        }
    }
    Ok(())
}
