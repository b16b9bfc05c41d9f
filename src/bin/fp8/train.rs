//! `fp8 train`: trains the small decoder model on the built-in addition task
//! (or `--text FILE`) under one or several precisions with the same seed and
//! data, then prints a comparison table and writes `summary.json`,
//! `PRECISION/metrics.jsonl`, `PRECISION/checkpoint.safetensors` and `loss.png`.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use clap::Args;
use fp8_engine::amp::{Precision, PrecisionChoice, resolve};
use fp8_engine::data::Dataset;
use fp8_engine::data::addition::AdditionConfig;
use fp8_engine::device::{Device, DeviceChoice};
use fp8_engine::hf::HfModelDir;
use fp8_engine::model::{ModelConfig, Recompute};
use fp8_engine::scaling::Recipe;
use fp8_engine::train::gpu_preflight::GpuNeed;
use fp8_engine::train::metrics::{Summary, read_summary, write_summary};
use fp8_engine::train::plot::plot_losses;
use fp8_engine::train::session::{RunConfig, RunControl, RunInputs, RunOutput, run, run_model};
use indicatif::{ProgressBar, ProgressStyle};

use crate::base_args::BaseArgs;
use crate::delayed_args::DelayedArgs;
use crate::dist_args::{DistArgs, run_launched, run_parallel};
use crate::error::CliError;
use crate::fine_tune;
use crate::table::Table;

/// Train the small decoder model, or fine-tune a Hugging Face model (--init-from), and compare
/// precisions.
#[derive(Args)]
pub struct TrainArgs {
    /// One precision: auto, fp32, bf16, fp16, fp8-delayed, fp8-current, fp8-block, mxfp8.
    #[arg(long, conflicts_with = "compare")]
    precision: Option<String>,
    /// Comma-separated precisions run with the same seed and data (default: fp32,fp8-delayed; on a
    /// GPU below sm_89, which has no FP8 tensor cores: fp32,bf16 on sm_80/86, fp32,fp16 on sm_75).
    #[arg(long)]
    compare: Option<String>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 3000)]
    steps: u64,
    /// Sequences per step (over all micro-batches).
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Micro-batches per step (gradient accumulation); per rank with --world-size.
    #[arg(long, default_value_t = 1)]
    micro_batches: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f32,
    /// Learning-rate schedule after warmup: constant or cosine.
    #[arg(long, default_value = "cosine")]
    schedule: String,
    /// Linear warmup steps (default: a tenth of the steps; with --resume, the checkpoint's).
    #[arg(long)]
    warmup: Option<u64>,
    /// Clip the global gradient norm to this (0 or inf: no clipping).
    #[arg(long, default_value_t = 1.0)]
    clip: f32,
    /// Transformer layers.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Model width (a multiple of 16 for FP8).
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// MLP width (default 4 x hidden).
    #[arg(long)]
    ffn: Option<usize>,
    /// SwiGLU MLP instead of GELU.
    #[arg(long)]
    swiglu: bool,
    /// RMSNorm instead of LayerNorm.
    #[arg(long)]
    rmsnorm: bool,
    /// Tie the output head to the token embedding.
    #[arg(long)]
    tied_head: bool,
    /// Activation recompute: none, every, or every-N.
    #[arg(long, default_value = "none")]
    recompute: String,
    /// Initial loss scale (default: 2^16 for fp16, off otherwise).
    #[arg(long)]
    loss_scale: Option<f32>,
    /// Seed of the model, the data and the task's held-out split.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Digits per operand of the addition task.
    #[arg(long, default_value_t = 2)]
    digits: usize,
    /// Addition task: take the loss on the answer digits only, not on every position.
    #[arg(long, conflicts_with = "text")]
    answer_loss_only: bool,
    /// Train a character-level model on this text file instead of the addition task.
    #[arg(long)]
    text: Option<PathBuf>,
    /// Characters per sequence with --text.
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// Largest --text file read, in bytes (tokenizing takes about 20 bytes of memory per byte).
    #[arg(long, default_value_t = fp8_engine::data::text::DEFAULT_MAX_TEXT_BYTES)]
    max_text_bytes: u64,
    /// auto, cpu, cuda or cuda:N (the CUDA ops are staged through host memory: docs/cuda-backend.md).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Shadow every op with its CPU twin and stop at the first result outside the op's contract
    /// (docs/numerics.md, Op contracts between backends), naming op, layer and element. Slower
    /// (every op runs twice). On the CPU device it compares the CPU with itself: only a self-test.
    #[arg(long)]
    check_cpu: bool,
    /// Output directory.
    #[arg(long, default_value = "runs/train")]
    out: PathBuf,
    /// Continue from this checkpoint (one precision only).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Write the checkpoint every N steps too (the final one is always written).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Stop after this many steps (checkpoint written), to --resume later.
    #[arg(long)]
    stop_after: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Exit 0 even when a run ends with a NaN or infinite training loss (diverged).
    #[arg(long)]
    allow_non_finite_loss: bool,
    /// Fine-tune this Hugging Face model directory (Llama, Mistral, Qwen2) on --text, tokenized
    /// by the model's tokenizer into windows of --seq tokens (the model flags are ignored).
    #[arg(long, value_name = "DIR", requires = "text")]
    init_from: Option<PathBuf>,
    /// With --init-from: sequential (window i of batch b is window b*batch+i, wrapping) or
    /// shuffled (a seeded permutation of the windows per pass).
    #[arg(long, default_value = "sequential", requires = "init_from")]
    data_order: String,
    /// With --init-from: write the fine-tuned model here as a Hugging Face directory (config,
    /// f32 safetensors with the HF names, tokenizer files); one sub-directory per precision with
    /// --compare.
    #[arg(long, value_name = "DIR", requires = "init_from")]
    save_hf: Option<PathBuf>,
    /// LoRA options (with --init-from).
    #[command(flatten, next_help_heading = "LoRA (with --init-from)")]
    lora: fine_tune::LoraArgs,
    /// How the base weights are held (with --init-from).
    #[command(flatten, next_help_heading = "Base weights (with --init-from)")]
    base: BaseArgs,
    /// AdamW decoupled weight decay (on matrices).
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f32,
    /// AdamW first-moment decay (default 0.9).
    #[arg(long)]
    beta1: Option<f32>,
    /// AdamW second-moment decay (default 0.999).
    #[arg(long)]
    beta2: Option<f32>,
    /// AdamW denominator epsilon (default 1e-8).
    #[arg(long)]
    eps: Option<f32>,
    /// fp8-delayed's recipe settings.
    #[command(flatten, next_help_heading = "fp8-delayed scaling")]
    delayed: DelayedArgs,
    /// Data parallelism (CPU ranks as threads).
    #[command(flatten, next_help_heading = "Data parallel")]
    dist: DistArgs,
}

fn precisions(args: &TrainArgs, device: &Device) -> Result<Vec<Precision>, CliError> {
    let names = match (&args.precision, &args.compare) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(list)) => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        (None, None) => default_precisions(device),
    };
    let mut out = Vec::new();
    for name in names {
        let choice: PrecisionChoice = name.parse()?;
        let (mut precision, why) = resolve(&choice, device)?;
        if matches!(choice, PrecisionChoice::Auto) {
            eprintln!("fp8 train: precision auto -> {}: {why}", precision.name());
        }
        if let Precision::Fp8(Recipe::Delayed(recipe)) = &precision {
            precision = Precision::Fp8(Recipe::Delayed(args.delayed.apply(recipe)));
            precision
                .validate()
                .map_err(|e| CliError(format!("fp8-delayed (--history-len, --algo, --margin): {e}")))?;
        }
        let precision = args.dist.apply(precision);
        if out.contains(&precision) {
            return Err(CliError(format!("precision {} is listed twice", precision.name())));
        }
        out.push(precision);
    }
    if out.is_empty() {
        return Err(CliError("no precision to train".into()));
    }
    let delayed_runs = out.iter().any(|p| matches!(p, Precision::Fp8(Recipe::Delayed(_))));
    if args.delayed.any() && !delayed_runs {
        return Err(CliError(
            "--history-len, --algo and --margin set fp8-delayed's recipe, and no fp8-delayed run is listed".into(),
        ));
    }
    Ok(out)
}

/// The default comparison: fp32 against fp8-delayed, on a GPU too (its f32 GEMM is the
/// cuBLASLt reference path), where fp8-delayed needs FP8 tensor cores (sm_89+): the GPU's best
/// 16-bit precision replaces it below that; said once. Without libcublasLt a GPU has no f32
/// GEMM, and the 16-bit precision replaces fp32.
fn default_precisions(device: &Device) -> Vec<String> {
    let Device::Cuda(gpu) = device else {
        return vec!["fp32".to_string(), "fp8-delayed".to_string()];
    };
    let (half, fp8) = match gpu.info().compute_capability {
        cc if cc >= (8, 9) => ("bf16", true),
        cc if cc >= (8, 0) => ("bf16", false),
        _ => ("fp16", false),
    };
    let lt = fp8_engine::backend::cuda::cublaslt::cublaslt_present();
    let mut names = vec![if lt { "fp32" } else { half }];
    if fp8 {
        names.push("fp8-delayed");
    } else if lt {
        names.push(half);
    }
    let why = match (lt, fp8) {
        (true, true) => "",
        (true, false) => " (no FP8 tensor cores below sm_89)",
        (false, _) => " (libcublasLt is missing: no f32 GEMM on the GPU)",
    };
    eprintln!(
        "fp8 train: default precisions on {}: {}{why}",
        device.describe(),
        names.join(",")
    );
    names.iter().map(|n| n.to_string()).collect()
}

/// Opens the device: without a usable GPU, `cuda` is an error and `auto` falls back to the CPU.
/// On a GPU, the run stops at the first op the CUDA backend does not implement, naming it.
fn select_device(name: &str) -> Result<Device, CliError> {
    let choice: DeviceChoice = name.parse()?;
    Ok(Device::select(choice)?)
}

/// The warmup recorded in a checkpoint's run settings, if it has one.
fn saved_warmup(path: &std::path::Path) -> Result<Option<u64>, CliError> {
    let progress = fp8_engine::train::checkpoint::read_progress(path)?;
    Ok(progress.config.pointer("/run/warmup").and_then(|w| w.as_u64()))
}

/// `--clip`: a finite positive norm clips; 0 and inf do not; NaN and negative values are errors.
fn clip_norm(clip: f32) -> Result<Option<f32>, CliError> {
    if clip.is_nan() || clip < 0.0 {
        return Err(CliError(format!(
            "--clip {clip}: expected a gradient norm > 0, or 0 or inf for no clipping"
        )));
    }
    Ok((clip > 0.0 && clip.is_finite()).then_some(clip))
}

pub(crate) fn run_config(args: &TrainArgs) -> Result<RunConfig, CliError> {
    let recompute: Recompute = args.recompute.parse()?;
    let ffn_hidden = match args.ffn {
        Some(ffn) => ffn,
        None => args
            .hidden
            .checked_mul(4)
            .ok_or_else(|| CliError(format!("--hidden {} is too large", args.hidden)))?,
    };
    Ok(RunConfig {
        model: ModelConfig {
            hidden: args.hidden,
            heads: args.heads,
            layers: args.layers,
            ffn_hidden,
            swiglu: args.swiglu,
            rmsnorm: args.rmsnorm,
            tied_head: args.tied_head,
            recompute,
            ..ModelConfig::default()
        },
        steps: args.steps,
        batch: args.batch,
        micro_batches: args.dist.total_micro_batches(args.micro_batches)?,
        lr: args.lr,
        schedule: args.schedule.clone(),
        warmup: match (args.warmup, &args.resume) {
            (Some(warmup), _) => warmup,
            // Extending a run with --steps must not move its warmup: keep the checkpoint's.
            (None, Some(path)) => saved_warmup(path)?.unwrap_or(args.steps / 10),
            (None, None) => args.steps / 10,
        },
        weight_decay: args.weight_decay,
        max_grad_norm: clip_norm(args.clip)?,
        seed: args.seed,
        loss_scale: args.loss_scale,
        checkpoint_every: args.checkpoint_every,
        beta1: args.beta1,
        beta2: args.beta2,
        eps: args.eps,
    })
}

fn progress_bar(args: &TrainArgs, label: &str) -> ProgressBar {
    if args.quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(args.steps);
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar
}

fn fmt_or_dash(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        "-".into()
    }
}

/// On a GPU whose layers keep their activations there (the default), the planned peak `needs`
/// against its free memory (`train::gpu_preflight`): refused when the activations and workspace do not
/// fit, a warning when the rest does not. One rank per process only (ranks made in this process
/// each have their own GPU).
fn check_gpu_memory(args: &TrainArgs, device: &Device, needs: &[GpuNeed]) -> Result<(), CliError> {
    let one_rank = args.dist.launch.is_some() || args.dist.ranks() <= 1;
    let Some(free) = device.free_memory().filter(|_| one_rank && device.resident_layers()) else {
        return Ok(());
    };
    if let Some(warning) = fp8_engine::train::gpu_preflight::check_gpu(&device.describe(), needs, free)? {
        eprintln!("{warning}");
    }
    Ok(())
}

pub fn run_train(mut args: TrainArgs) -> Result<(), CliError> {
    args.dist.launch = fp8_engine::dist::env::LaunchEnv::from_env()?;
    let device = match &args.dist.launch {
        // One process per rank: its GPU is LOCAL_RANK, not GPU 0 (every rank would share it).
        // On a machine without GPUs --device auto gives the CPU, which is refused below.
        Some(env) if args.device != "cpu" => match Device::select(DeviceChoice::Cuda(env.local_rank)) {
            Ok(gpu) => gpu,
            Err(err) => match select_device(&args.device)? {
                Device::Cuda(_) => return Err(CliError(format!("LOCAL_RANK={}: {err}", env.local_rank))),
                cpu => cpu,
            },
        },
        _ => select_device(&args.device)?,
    };
    let precisions = precisions(&args, &device)?;
    if args.resume.is_some() && precisions.len() != 1 {
        return Err(CliError("--resume continues one run: give a single --precision".into()));
    }
    let config = run_config(&args)?;
    if args.base.given() && args.init_from.is_none() {
        return Err(CliError(
            "--base-precision, --base-scaling and --frozen-dtype say how the weights of --init-from are held: give \
             --init-from DIR"
                .into(),
        ));
    }
    args.base.plan_base()?;
    args.base.frozen_dtype()?;
    args.dist
        .check_launch(matches!(device, Device::Cuda(_)), args.init_from.is_some())?;
    args.dist.options()?;
    let init = args.init_from.as_deref().map(HfModelDir::open).transpose()?;
    let data = match (&args.text, &init) {
        (Some(path), Some(hf)) => {
            let windows = fine_tune::TextWindows {
                seq: args.seq,
                order: &args.data_order,
                seed: args.seed,
                max_bytes: args.max_text_bytes,
            };
            fine_tune::token_data(path, hf, &windows)?
        }
        (Some(path), None) => Dataset::text_limited(path, args.seq, args.max_text_bytes)?,
        (None, _) => Dataset::addition(
            AdditionConfig {
                digits: args.digits,
                prompt_loss: !args.answer_loss_only,
                ..AdditionConfig::default()
            },
            args.seed,
        )?,
    };
    // Everything that can be checked is checked before the first step.
    let gpu_needs = match &init {
        Some(hf) => fine_tune::preflight(&precisions, &config, &data, hf, &args.base, &args.lora)?,
        None => {
            // Ranks made in this process (--world-size, --gpus) each hold a model on this host.
            let host = fp8_engine::train::preflight::HostRanks {
                ranks: if args.dist.launch.is_some() {
                    1
                } else {
                    args.dist.ranks()
                },
                zero: args.dist.zero,
            };
            fp8_engine::train::preflight::check_run_on(&precisions, &config, &data, host)?;
            fp8_engine::train::gpu_preflight::decoder_needs(&precisions, &config, &data)?
        }
    };
    check_gpu_memory(&args, &device, &gpu_needs)?;
    fs::create_dir_all(&args.out).map_err(|e| CliError(format!("{}: cannot create: {e}", args.out.display())))?;
    check_outputs(&args, &precisions)?;
    let (layers, hidden) = match &init {
        Some(hf) => (hf.config.num_hidden_layers, hf.config.hidden_size),
        None => (config.model.layers, config.model.hidden),
    };
    eprintln!(
        "fp8 train: {} on {}; model {layers} layers x {hidden} wide, {} steps x {} sequences; output in {}",
        data.describe(),
        device.describe(),
        config.steps,
        config.batch,
        args.out.display()
    );

    let mut outputs: Vec<(Precision, RunOutput)> = Vec::new();
    let mut peaks = Vec::new(); // the GPU's allocation peak of each precision's run
    for precision in &precisions {
        let dir = args.out.join(precision.name());
        let bar = progress_bar(&args, precision.name());
        let mut on_step = |m: &fp8_engine::train::metrics::StepMetrics| {
            bar.set_position(m.step + 1);
            bar.set_message(format!("loss {:.4}", m.loss));
        };
        let inputs = RunInputs {
            precision,
            config: &config,
            data: &data,
            dir: &dir,
            control: RunControl {
                resume: args.resume.as_deref(),
                stop_after: args.stop_after,
                check_cpu: args.check_cpu,
                ..RunControl::default()
            },
        };
        let gpu = allocation_peak_from(&device);
        let mut output = match &init {
            Some(hf) => {
                let mut model = args.base.load(hf, precision, config.model.recompute, "fp8 train")?;
                let lora = args.lora.attach(&mut model, args.seed)?;
                args.base.hold_frozen(&mut model, hf)?;
                if let (Some(_), Some(path)) = (&lora, &args.resume) {
                    // The dropout masks follow the count of training forwards: one per micro-batch
                    // of every step the checkpoint has done.
                    let steps = fp8_engine::train::checkpoint::read_progress(path)?.step;
                    let forwards = steps.saturating_mul(config.micro_batches as u64);
                    model.visit_adapters(&mut |a| a.set_training_forwards(forwards));
                }
                let output = run_model(&mut model, &device, &inputs, &mut on_step)?;
                if let (Some(lora), Some(source)) = (&lora, &args.init_from) {
                    let adapter = dir.join("adapter");
                    model.save_adapter(lora, &source.display().to_string(), &adapter)?;
                    eprintln!(
                        "fp8 train: wrote the LoRA adapters (PEFT layout) to {}",
                        adapter.display()
                    );
                    // --save-hf writes the merged model: W + (alpha / r) B A. Only then: merging
                    // thaws the frozen FP8 weights it touches (8.6 GB of f32 for a 7B model's
                    // q/k/v/o), seconds of work for nothing else to read.
                    if args.save_hf.is_some() {
                        model.merge_lora()?;
                    }
                }
                if let (Some(save), Some(source)) = (&args.save_hf, &args.init_from) {
                    let target = match precisions.len() {
                        1 => save.clone(),
                        _ => save.join(precision.name()),
                    };
                    model.save_hf(source, &target)?;
                    eprintln!(
                        "fp8 train: saved {} as a Hugging Face model in {}",
                        precision.name(),
                        target.display()
                    );
                }
                output
            }
            None => match &args.dist.launch {
                Some(env) => run_launched(&args.dist, env, &device, &inputs, &mut on_step)?,
                None if args.dist.parallel() => run_parallel(&args.dist, &inputs, &mut on_step)?,
                None => run(&device, &inputs, &mut on_step)?,
            },
        };
        bar.finish_and_clear();
        let peak = gpu.and_then(|gpu| read_or_warn(gpu.allocation_peak()));
        output.summary.device_peak_bytes = peak.map(|p| p.used);
        outputs.push((precision.clone(), output));
        peaks.push(peak);
    }
    if args.dist.launch.as_ref().is_some_and(|env| env.rank != 0) {
        // Rank 0 writes the summary, the plot and the table; every rank computed the same.
        return Ok(());
    }

    let mut table = Table::new(&[
        "precision",
        "train loss",
        "held-out loss",
        "vs first",
        "answer loss",
        "accuracy",
        "tokens/s",
        "skipped",
        "peak memory",
    ]);
    let reference = outputs.first().map(|(_, o)| o.summary.heldout_loss).unwrap_or(f32::NAN);
    let speed = ModelSpeed::new(&args, &config, &data, &device, init.is_some());
    let mut summary: Summary = BTreeMap::new();
    for (_, out) in &mut outputs {
        speed.fill(&mut out.summary);
    }
    for (precision, out) in &outputs {
        let s = &out.summary;
        let delta = 100.0 * (f64::from(s.heldout_loss) / f64::from(reference) - 1.0);
        table.push(vec![
            precision.name().to_string(),
            fmt_or_dash(f64::from(s.final_train_loss), 4),
            fmt_or_dash(f64::from(s.heldout_loss), 4),
            format!("{delta:+.2}%"),
            fmt_or_dash(f64::from(s.heldout_answer_loss), 4),
            fmt_or_dash(100.0 * s.heldout_accuracy, 1) + if s.heldout_accuracy.is_finite() { "%" } else { "" },
            format!("{:.0}", s.tokens_per_s),
            out.skipped_steps.to_string(),
            fp8_engine::train::memory::human_bytes(s.peak_bytes),
        ]);
        summary.insert(precision.name().to_string(), s.clone());
    }
    println!("{}", table.render());
    if let Some(line) = speed.describe(&outputs) {
        println!("{line}");
    }
    if let Some(floor) = data.loss_floor().filter(|f| *f > 0.0) {
        println!(
            "the held-out loss cannot fall below {floor:.4} (the operand digits are random); \
             answer loss: the mean loss over the answer digits alone"
        );
    }
    for ((precision, out), peak) in outputs.iter().zip(&peaks) {
        println!("{} peak memory by category:\n{}", precision.name(), out.memory_summary);
        if let Some(peak) = peak {
            println!(
                "{} on {}: allocations peaked at {}, their memory pool at {} (the driver's counts of \
                 every device buffer; the CUDA context is not in them)",
                precision.name(),
                device.describe(),
                fp8_engine::train::memory::human_bytes(peak.used),
                fp8_engine::train::memory::human_bytes(peak.reserved)
            );
        }
    }
    let summary_path = args.out.join("summary.json");
    if args.resume.is_some() {
        summary = merge_summary(&summary_path, summary, &outputs)?;
    }
    write_summary(&summary_path, &summary)?;
    let curves: Vec<_> = outputs
        .iter()
        .map(|(p, o)| (p.name().to_string(), o.curve.clone()))
        .collect();
    let plotted = curves.iter().flat_map(|(_, c)| c).any(|(_, loss)| loss.is_finite());
    if plotted {
        plot_losses(&args.out.join("loss.png"), &curves)?;
    } else {
        println!("loss.png left as it was: this call trained no step with a finite loss");
    }
    println!(
        "wrote {}/summary.json{} and per precision metrics.jsonl + checkpoint.safetensors",
        args.out.display(),
        if plotted { ", loss.png" } else { "" }
    );
    diverged(&args, &outputs)
}

/// Refuses output paths that are not regular files before any training (devices, directories,
/// symlinks), so a run never ends on an unwritable output.
fn check_outputs(args: &TrainArgs, precisions: &[Precision]) -> Result<(), CliError> {
    let mut paths = vec![args.out.join("summary.json"), args.out.join("loss.png")];
    for precision in precisions {
        let dir = args.out.join(precision.name());
        paths.push(dir.join("metrics.jsonl"));
        paths.push(dir.join("checkpoint.safetensors"));
    }
    for path in paths {
        fp8_engine::io::check_output_path(&path)?;
    }
    Ok(())
}

/// On resume, `summary.json` keeps the entries of precisions not run now; a precision that
/// trained no step in this call (it was finished) keeps its recorded training loss, speed and peak.
fn merge_summary(
    path: &std::path::Path,
    fresh: Summary,
    outputs: &[(Precision, RunOutput)],
) -> Result<Summary, CliError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(fresh);
    }
    let mut merged = read_summary(path)?;
    for (name, mut entry) in fresh {
        let idle = outputs.iter().any(|(p, o)| p.name() == name && o.curve.is_empty());
        if let (true, Some(old)) = (idle, merged.get(&name)) {
            entry.final_train_loss = old.final_train_loss;
            entry.tokens_per_s = old.tokens_per_s;
            entry.model_flop_per_s = old.model_flop_per_s;
            entry.mfu = old.mfu;
            entry.peak_bytes = old.peak_bytes;
            entry.device_peak_bytes = old.device_peak_bytes;
        }
        merged.insert(name, entry);
    }
    Ok(merged)
}

/// On a GPU, the device with its allocation peak restarted for the run about to start (`None`
/// on the CPU, or with a warning if the driver refuses).
fn allocation_peak_from(device: &Device) -> Option<&fp8_engine::backend::cuda::CudaDevice> {
    let Device::Cuda(gpu) = device else {
        return None;
    };
    read_or_warn(gpu.reset_allocation_peak()).map(|()| gpu)
}

/// The value, or `None` after a warning line: the allocation peak is a measurement, not a
/// reason to stop a run.
fn read_or_warn<T>(result: fp8_engine::error::Result<T>) -> Option<T> {
    result
        .map_err(|e| eprintln!("fp8 train: warning: the GPU's allocation peak cannot be read: {e}"))
        .ok()
}

/// A run whose last training loss is NaN or infinite diverged: an error (after every output is
/// written) unless --allow-non-finite-loss.
fn diverged(args: &TrainArgs, outputs: &[(Precision, RunOutput)]) -> Result<(), CliError> {
    let bad: Vec<&str> = outputs
        .iter()
        .filter(|(_, o)| !o.curve.is_empty() && !o.summary.final_train_loss.is_finite())
        .map(|(p, _)| p.name())
        .collect();
    if bad.is_empty() || args.allow_non_finite_loss {
        return Ok(());
    }
    Err(CliError(format!(
        "{}: the training loss is {} at the last step (the run diverged; outputs were written; \
         --allow-non-finite-loss exits 0 anyway)",
        bad.join(", "),
        outputs
            .iter()
            .find(|(p, _)| p.name() == bad[0])
            .map_or(f32::NAN, |(_, o)| o.summary.final_train_loss)
    )))
}

/// Model FLOP/s and MFU of a run (`model::flops`): counted for the built-in decoder model on one
/// rank; MFU only on a GPU whose dense bf16 peak is known.
struct ModelSpeed {
    /// Training FLOPs per token; `None` where not counted.
    flops_per_token: Option<f64>,
    /// The GPU's name and dense bf16 peak in FLOP/s.
    peak: Option<(String, f64)>,
}

impl ModelSpeed {
    fn new(args: &TrainArgs, config: &RunConfig, data: &Dataset, device: &Device, fine_tune: bool) -> Self {
        let one_rank = args.dist.ranks() <= 1;
        let flops_per_token =
            (one_rank && !fine_tune).then(|| config.model_for(data).training_flops_per_token(data.seq_len()));
        let peak = match device {
            Device::Cuda(gpu) => fp8_engine::model::flops::bf16_peak_tflops(&gpu.info().name)
                .map(|tflops| (gpu.info().name.clone(), tflops * 1e12)),
            _ => None,
        };
        ModelSpeed { flops_per_token, peak }
    }

    fn fill(&self, summary: &mut fp8_engine::train::metrics::PrecisionSummary) {
        let Some(per_token) = self.flops_per_token else { return };
        summary.model_flop_per_s = summary.tokens_per_s * per_token;
        if let Some((_, peak)) = &self.peak {
            summary.mfu = summary.model_flop_per_s / peak;
        }
    }

    /// One line: FLOPs per token, each precision's model FLOP/s and MFU.
    fn describe(&self, outputs: &[(Precision, RunOutput)]) -> Option<String> {
        let per_token = self.flops_per_token?;
        let rates: Vec<String> = outputs
            .iter()
            .map(|(p, o)| {
                let mfu = match o.summary.mfu.is_finite() {
                    true => format!(", MFU {:.2}%", 100.0 * o.summary.mfu),
                    false => String::new(),
                };
                format!("{} {:.3} TFLOP/s{mfu}", p.name(), o.summary.model_flop_per_s / 1e12)
            })
            .collect();
        let peak = match &self.peak {
            Some((name, peak)) => format!(
                "; MFU against the {name}'s dense bf16 peak of {:.1} TFLOP/s",
                peak / 1e12
            ),
            None => String::new(),
        };
        Some(format!(
            "model FLOPs: {:.3} MFLOP per token (6 N + 6 L seq h); {}{peak}",
            per_token / 1e6,
            rates.join(", ")
        ))
    }
}
