//! `fp8 plan`: the memory a fine-tune of a Llama-family model needs, by category, from its config
//! alone (nothing is loaded), and with a memory limit whether it fits and the cheapest change
//! that makes it fit.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::Args;
use fp8_engine::amp::Precision;
use fp8_engine::device::{Device, DeviceChoice};
use fp8_engine::hf::HfConfig;
use fp8_engine::memory::{MemoryCategory, human_bytes, parse_bytes};
use fp8_engine::model::FrozenDtype;
use fp8_engine::plan::{
    BasePrecision, LoraPlan, MemoryPlan, PlanSettings, Suggestion, cheapest_fit, parse_targets, plan,
};
use serde_json::{Map, Value, json};

use crate::error::CliError;

/// Plan the memory of a fine-tune before running it.
///
/// Prints the parameter count, the trainable parameter count, the peak bytes by the memory
/// summary's categories and their total. With --gpu-memory it says whether the run fits and, if
/// not, the cheapest change that does (recompute, a smaller micro-batch with accumulation, an FP8
/// base, LoRA). docs/finetune.md says what each term assumes.
#[derive(Args)]
#[command(
    after_help = "Example:\n  fp8 plan --model Llama-2-7b --lora-rank 16 --base-precision fp8 --seq 2048 --recompute every --gpu-memory 24GiB"
)]
pub struct PlanArgs {
    /// A Hugging Face model directory or its config.json.
    #[arg(long, value_name = "DIR|config.json")]
    pub model: PathBuf,
    /// LoRA rank R (A [R, in] and B [out, R] per target per layer); the base is then frozen.
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<usize>,
    /// The linears that get adapters.
    #[arg(long, default_value = "q_proj,k_proj,v_proj,o_proj", requires = "lora_rank")]
    pub lora_targets: String,
    /// fp32, bf16, fp16, fp8-delayed, fp8-current, fp8-block or mxfp8.
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// How frozen linear weights are held: bf16 (the run's dtype) or fp8 (codes with 128x128 block scales).
    #[arg(long, default_value = "bf16")]
    pub base_precision: String,
    /// How frozen embeddings, norms and head are held (with LoRA): checkpoint (the width of
    /// config.json's dtype: 2 bytes a value for bfloat16 or float16) or f32.
    #[arg(long, value_name = "checkpoint|f32", default_value = "checkpoint")]
    pub frozen_dtype: String,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 2048)]
    pub seq: usize,
    /// none or every.
    #[arg(long, default_value = "none")]
    pub recompute: String,
    /// The run accumulates gradients over several micro-batches per step (`fp8 train
    /// --micro-batches N`, N > 1): the step's sum is held beside each micro-batch's gradient.
    #[arg(long)]
    pub accumulate: bool,
    /// The memory to fit in, e.g. 24GiB or 80GB (default: the free memory of GPU 0 when
    /// --device finds one; without a GPU the plan is printed with no verdict).
    #[arg(long, value_name = "BYTES")]
    pub gpu_memory: Option<String>,
    /// Where the default limit comes from: auto (GPU 0's free memory if a GPU is usable) or cpu
    /// (no default limit).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `config.json` files above this are refused (published ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

fn read_config(path: &Path) -> Result<HfConfig, CliError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let bytes = fp8_engine::io::read_regular(&file, MAX_CONFIG_BYTES, "")?;
    let text = String::from_utf8(bytes).map_err(|_| CliError(format!("{}: not UTF-8", file.display())))?;
    HfConfig::from_json(&text).map_err(|err| CliError(format!("{}: {err}", file.display())))
}

fn settings(args: &PlanArgs, config: &HfConfig) -> Result<PlanSettings, CliError> {
    let frozen: FrozenDtype = args.frozen_dtype.parse()?;
    let base = match args.base_precision.as_str() {
        "fp8" => BasePrecision::Fp8,
        "bf16" => BasePrecision::Same,
        other => return Err(CliError(format!("--base-precision {other}: expected fp8 or bf16"))),
    };
    let recompute = match args.recompute.as_str() {
        "none" => false,
        "every" => true,
        other => return Err(CliError(format!("--recompute {other}: expected none or every"))),
    };
    for (flag, value) in [("--micro-batch", args.micro_batch), ("--seq", args.seq)] {
        if value == 0 {
            return Err(CliError(format!("{flag} 0: must be at least 1")));
        }
    }
    let lora = match args.lora_rank {
        Some(0) => return Err(CliError("--lora-rank 0: must be at least 1".into())),
        Some(rank) => Some(LoraPlan {
            rank,
            targets: parse_targets(&args.lora_targets)?,
        }),
        None => None,
    };
    Ok(PlanSettings {
        precision: Precision::from_str(&args.precision)?,
        base,
        lora,
        frozen_dtype: frozen.planned(config),
        micro_batch: args.micro_batch,
        seq: args.seq,
        recompute,
        accumulate: args.accumulate,
    })
}

/// The JSON key of a category.
fn key(category: MemoryCategory) -> &'static str {
    match category {
        MemoryCategory::Parameters => "parameters",
        MemoryCategory::MasterWeights => "master_weights",
        MemoryCategory::Gradients => "gradients",
        MemoryCategory::OptimizerState => "optimizer_state",
        MemoryCategory::Activations => "activations",
        MemoryCategory::Fp8Copies => "fp8_copies",
        MemoryCategory::Workspace => "workspace",
    }
}

fn to_u64(bytes: u128) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

fn plan_json(p: &MemoryPlan) -> Map<String, Value> {
    let bytes: Map<String, Value> = p
        .bytes
        .iter()
        .map(|(c, b)| (key(*c).to_string(), json!(to_u64(*b))))
        .collect();
    let mut out = Map::new();
    out.insert("parameters".into(), json!(to_u64(p.parameters)));
    out.insert("trainable_parameters".into(), json!(to_u64(p.trainable_parameters)));
    out.insert("bytes".into(), Value::Object(bytes));
    out.insert("total_bytes".into(), json!(to_u64(p.total_bytes())));
    out
}

fn print_table(p: &MemoryPlan) {
    println!("parameters            {:>16}", p.parameters);
    println!("trainable parameters  {:>16}", p.trainable_parameters);
    println!("{:<22} {:>16} {:>10}", "category", "bytes", "");
    for (category, bytes) in &p.bytes {
        println!(
            "{:<22} {:>16} {:>10}",
            category.name(),
            bytes,
            human_bytes(to_u64(*bytes))
        );
    }
    let total = p.total_bytes();
    println!("{:<22} {:>16} {:>10}", "total", total, human_bytes(to_u64(total)));
}

fn describe(s: &Suggestion) -> String {
    s.changes.iter().map(|c| c.flags()).collect::<Vec<_>>().join(" ")
}

/// The limit to plan against: `--gpu-memory` when given, else the free memory `device_free`
/// reports (a GPU's, with its description), else none.
fn limit(
    gpu_memory: Option<&str>,
    device_free: impl FnOnce() -> Option<(u64, String)>,
) -> Result<Option<(u64, String)>, CliError> {
    match gpu_memory {
        Some(text) => parse_bytes(text)
            .map(|bytes| Some((bytes, "--gpu-memory".to_string())))
            .ok_or_else(|| {
                CliError(format!(
                    "--gpu-memory {text}: expected a byte count such as 24GiB, 80GB or 1073741824"
                ))
            }),
        None => Ok(device_free()),
    }
}

/// Free memory of the GPU `--device` names, if one is usable.
fn device_free(device: &str) -> Result<impl FnOnce() -> Option<(u64, String)>, CliError> {
    let choice = match device {
        "auto" => Some(DeviceChoice::Cuda(0)),
        "cpu" => None,
        other => return Err(CliError(format!("--device {other}: expected auto or cpu"))),
    };
    Ok(move || {
        let gpu = Device::select(choice?).ok()?;
        let free = gpu.free_memory()?;
        Some((free, format!("the free memory of {}", gpu.describe())))
    })
}

pub fn run(args: PlanArgs) -> Result<(), CliError> {
    let config = read_config(&args.model)?;
    let settings = settings(&args, &config)?;
    let limit = limit(args.gpu_memory.as_deref(), device_free(&args.device)?)?;
    if let (Some((bytes, source)), None) = (&limit, &args.gpu_memory) {
        eprintln!("fp8 plan: limit {} ({source})", human_bytes(*bytes));
    }
    let limit = limit.map(|(bytes, _)| bytes);
    let p = plan(&config, &settings);
    let fits = limit.map(|l| p.total_bytes() <= u128::from(l));
    let suggestion = match (limit, fits) {
        (Some(l), Some(false)) => Some(cheapest_fit(&config, &settings, u128::from(l))),
        _ => None,
    };
    // A resident GPU run also keeps device copies of trainable values and gradients (booked as
    // workspace there; with FP8_CUDA_ARENA_VIEWS=1 only the micro-batch sums); reported beside
    // the plan, which follows the CPU ledger.
    let copies = fp8_engine::plan::device_copies(&config, &settings);
    if args.json {
        let mut out = plan_json(&p);
        out.insert("gpu_device_copies_bytes".into(), json!(to_u64(copies)));
        if let (Some(l), Some(f)) = (limit, fits) {
            out.insert("limit_bytes".into(), json!(l));
            out.insert("fits".into(), json!(f));
        }
        if let Some(s) = &suggestion {
            let value = s.as_ref().map_or(Value::Null, |s| {
                let mut o = plan_json(&s.plan);
                o.insert(
                    "changes".into(),
                    json!(s.changes.iter().map(|c| c.flags()).collect::<Vec<_>>()),
                );
                Value::Object(o)
            });
            out.insert("suggestion".into(), value);
        }
        println!("{}", Value::Object(out));
        return Ok(());
    }
    print_table(&p);
    if copies > 0 {
        println!(
            "on a GPU also {} of device copies of master values and gradients (beside the arenas, and gradient sums while micro-batches accumulate; total {})",
            human_bytes(to_u64(copies)),
            human_bytes(to_u64(p.total_bytes().saturating_add(copies)))
        );
    }
    if let (Some(l), Some(f)) = (limit, fits) {
        let verdict = if f { "fits" } else { "does not fit" };
        println!("{verdict} in {} ({l} bytes)", human_bytes(l));
    }
    match suggestion {
        Some(Some(s)) => println!(
            "cheapest change that fits: {} (total {})",
            describe(&s),
            human_bytes(to_u64(s.plan.total_bytes()))
        ),
        Some(None) => println!("nothing fits: not even LoRA r16 on an FP8 base with recompute and micro-batch 1"),
        None => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_flag_else_the_devices_free_memory_else_none() {
        let gpu = || Some((80u64 << 30, "the free memory of cuda:0".to_string()));
        // The flag wins over the device.
        assert_eq!(limit(Some("24GiB"), gpu).unwrap().unwrap().0, 24 << 30);
        // No flag: the device's free memory, said where it came from.
        let (bytes, source) = limit(None, gpu).unwrap().unwrap();
        assert_eq!(bytes, 80 << 30);
        assert!(source.contains("cuda:0"));
        // No flag and no GPU: no limit, so no verdict.
        assert_eq!(limit(None, || None).unwrap(), None);
        assert!(limit(Some("lots"), gpu).is_err());
        // --device cpu never asks a GPU.
        assert_eq!(device_free("cpu").unwrap()(), None);
        assert!(device_free("tpu").is_err());
    }
}
