//! One training run of the decoder model under one precision: the loop that
//! `fp8 train` drives, and that a Rust program can drive the same way.
//!
//! Per step: draw `micro_batches` batches, forward + backward each with the loss
//! divided by the count and multiplied by the loss scale (gradients add up in
//! f32), then unscale, check for inf/NaN, clip, AdamW (or skip), update the
//! scaler; record the step's metrics and FP8 statistics. At the end: held-out
//! loss and accuracy (FP8 scaling state untouched), a checkpoint, the summary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::accumulate::{AccumulatedLoss, MicroBatch, Share, accumulate_share, accumulate_share_with};
use super::adamw::{AdamW, AdamWConfig};
use super::checkpoint::{TrainProgress, load_checkpoint};
use super::memory::{memory_summary, set_usage};
use super::metrics::{MetricsWriter, PrecisionSummary, StepMetrics};
use super::rank_optimizer::RankOptimizer;
use super::schedule::{LrSchedule, ScheduleKind};
use super::step::check_and_clip_with;
use crate::amp::loss_scaler::{DynamicLossScaler, LossScalerConfig};
use crate::amp::{Fp8Recipe, Precision};
use crate::data::{DataStream, Dataset, SplitMix64, counted, exact_match_accuracy};
use crate::device::{Device, MemoryCategory, MemoryLedger};
use crate::dist::{Collective, DataParallel, Parallel, SingleRank, Wire};
use crate::error::{Error, Result};
use crate::model::{DecoderModel, GradReady, LanguageModel, ModelConfig};
use crate::nn::Fp8TensorStats;
use crate::tensor::Dtype;
use crate::train::amax_sync as amax;
use crate::train::grad_overlap::reduce_during_backward;
use crate::train::grad_sync::all_reduce_gradients;

/// Everything that fixes a run besides its precision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Model shape (`vocab` and `max_seq` are taken from the data).
    pub model: ModelConfig,
    /// Optimizer steps.
    pub steps: u64,
    /// Sequences per step, over all micro-batches (and all ranks of a data-parallel run).
    pub batch: usize,
    /// Micro-batches per step over all ranks (`batch` must be a multiple; in a data-parallel
    /// run, a multiple of the world size: each rank runs `micro_batches / world_size`).
    pub micro_batches: usize,
    /// Peak learning rate.
    pub lr: f32,
    /// `constant` or `cosine` after warmup.
    pub schedule: String,
    /// Linear warmup steps.
    pub warmup: u64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// Clip the global gradient norm to this (none if absent).
    pub max_grad_norm: Option<f32>,
    /// Seeds the model, the data stream and the task's split.
    pub seed: u64,
    /// Initial loss scale; `None`: 2^16 for fp16, off for the others.
    pub loss_scale: Option<f32>,
    /// Also write the checkpoint every this many steps (the final one is always written).
    pub checkpoint_every: Option<u64>,
    /// AdamW first-moment decay (`None`: 0.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta1: Option<f32>,
    /// AdamW second-moment decay (`None`: 0.999).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f32>,
    /// AdamW denominator epsilon (`None`: 1e-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f32>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            model: ModelConfig::default(),
            steps: 300,
            batch: 32,
            micro_batches: 1,
            lr: 3e-3,
            schedule: "cosine".into(),
            warmup: 30,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            seed: 1,
            loss_scale: None,
            checkpoint_every: None,
            beta1: None,
            beta2: None,
            eps: None,
        }
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// The numbers `summary.json` keeps.
    pub summary: PrecisionSummary,
    /// `(step, train loss)` for the loss plot.
    pub curve: Vec<(u64, f32)>,
    /// Steps whose update was skipped (inf/NaN gradients).
    pub skipped_steps: u64,
    /// Peak bytes of saved activations.
    pub peak_activation_bytes: u64,
    /// The memory table (current and peak by category).
    pub memory_summary: String,
    /// Where the final checkpoint was written.
    pub checkpoint: PathBuf,
    /// Peak bytes of optimizer state this rank held (all of it, or its ZeRO-1 shard).
    pub optimizer_state_bytes: u64,
    /// Peak bytes of f32 master values this rank held (all of them, or under ZeRO-1 the
    /// replicated ones and its slices of the sharded linear weights).
    pub master_weight_bytes: u64,
}

/// Called after every step with its metrics.
pub type StepCallback<'a> = &'a mut dyn FnMut(&StepMetrics);

/// How one call of [`run`] starts and stops.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunControl<'a> {
    /// Continue from this checkpoint (written by a run with the same precision and config).
    pub resume: Option<&'a Path>,
    /// Stop after this step count (a checkpoint is written), as if the run were interrupted.
    pub stop_after: Option<u64>,
    /// Run every op also on its CPU twin and stop at the first result that breaks the op's
    /// contract (`docs/numerics.md`, Op contracts between backends) with `Error::TwinMismatch`.
    /// On the CPU device this compares the CPU with itself: a self-test of the check. Results
    /// are unchanged either way (the primary backend's results are kept).
    pub check_cpu: bool,
    /// This run is one rank of a data-parallel group (`docs/distributed.md`); `None`: one rank.
    pub parallel: Option<&'a Parallel<'a>>,
}

fn invalid(setting: &'static str, value: impl ToString, reason: impl Into<String>) -> Error {
    Error::InvalidSetting {
        setting,
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl RunConfig {
    /// The model config with the data's vocabulary and sequence length.
    pub fn model_for(&self, data: &Dataset) -> ModelConfig {
        ModelConfig {
            vocab: data.vocab_size(),
            max_seq: data.seq_len(),
            ..self.model.clone()
        }
    }

    fn micro_batch_size(&self) -> Result<usize> {
        if self.micro_batches == 0 || self.batch == 0 || !self.batch.is_multiple_of(self.micro_batches) {
            return Err(invalid(
                "batch",
                self.batch,
                format!(
                    "must be a positive multiple of the micro-batch count {}",
                    self.micro_batches
                ),
            ));
        }
        Ok(self.batch / self.micro_batches)
    }

    /// The micro-batches rank `rank` of `world` runs: consecutive ones, in rank order.
    fn rank_share(&self, world: usize, rank: usize) -> Result<Share> {
        if !self.micro_batches.is_multiple_of(world) {
            return Err(invalid(
                "micro_batches",
                self.micro_batches,
                format!("must be a multiple of the world size {world} (each rank runs the same number)"),
            ));
        }
        let count = self.micro_batches / world;
        Ok(Share {
            first: rank * count,
            count,
            total: self.micro_batches,
        })
    }
}

/// What one training run reads besides its model and device: the precision, the run's settings,
/// the data, the output directory and how the run starts and stops. Every rank of a
/// data-parallel run reads the same inputs.
#[derive(Clone, Copy)]
pub struct RunInputs<'a> {
    /// The precision the model trains in.
    pub precision: &'a Precision,
    /// Everything else that fixes the run.
    pub config: &'a RunConfig,
    /// The training and held-out data.
    pub data: &'a Dataset,
    /// Where `metrics.jsonl` and the checkpoint go.
    pub dir: &'a Path,
    /// Resume, stop, CPU twin check, data-parallel group.
    pub control: RunControl<'a>,
}

impl RunInputs<'_> {
    /// The built-in decoder for these inputs: `config.model` with the data's vocabulary and
    /// sequence length, seeded with `config.seed` (every rank builds the same one).
    pub fn decoder(&self) -> Result<DecoderModel> {
        DecoderModel::new(&self.config.model_for(self.data), self.precision, self.config.seed)
    }

    /// [`Self::decoder`] boxed, as a data-parallel run builds one per rank.
    pub fn decoder_builder(&self) -> impl Fn() -> Result<Box<dyn LanguageModel>> + Sync + '_ {
        move || Ok(Box::new(self.decoder()?) as Box<dyn LanguageModel>)
    }
}

/// Trains the built-in decoder ([`RunInputs::decoder`]) on `device`, counting its memory in the
/// device's ledger (peaks restart at the start of the run; the run's bytes are released at
/// its end, so runs one after another report their own peaks), writing `dir/metrics.jsonl` and
/// `dir/checkpoint.safetensors`; resumes and stops as `control` says.
pub fn run(device: &Device, inputs: &RunInputs, on_step: StepCallback) -> Result<RunOutput> {
    let mut model = inputs.decoder()?;
    run_model(&mut model, device, inputs, on_step)
}

/// [`run`] with a model built by the caller (e.g. a loaded checkpoint to fine-tune, which the
/// caller can save afterwards); `config.model` is then only recorded, not used.
pub fn run_model(
    model: &mut dyn LanguageModel,
    device: &Device,
    inputs: &RunInputs,
    on_step: StepCallback,
) -> Result<RunOutput> {
    let RunInputs {
        precision,
        config,
        data,
        dir,
        control,
    } = *inputs;
    let micro_size = config.micro_batch_size()?;
    let single = SingleRank;
    let (collective, dp): (&dyn Collective, DataParallel) = match control.parallel {
        Some(p) => (p.collective, p.options.clone()),
        None => (&single, DataParallel::default()),
    };
    dp.validate()?;
    let (world, rank) = (collective.world_size(), collective.rank());
    let share = config.rank_share(world, rank)?;
    // Overlap only where there is something to reduce (world size 1 with an f32 wire is none).
    let overlap = dp.overlap && (world > 1 || dp.wire != Wire::F32);
    // Amaxes are max-reduced across ranks unless the delayed recipe turns it off.
    let reduce_amax = match precision {
        Precision::Fp8(Fp8Recipe::Delayed(recipe)) => recipe.reduce_amax,
        _ => false,
    };
    model.to_device(device.kind())?;
    model.check_against_cpu(control.check_cpu);
    let defaults = AdamWConfig::default();
    let mut optimizer = AdamW::new(AdamWConfig {
        lr: config.lr,
        weight_decay: config.weight_decay,
        beta1: config.beta1.unwrap_or(defaults.beta1),
        beta2: config.beta2.unwrap_or(defaults.beta2),
        eps: config.eps.unwrap_or(defaults.eps),
        ..defaults
    })?;
    optimizer.to_device(device.kind());
    optimizer.check_against_cpu(control.check_cpu);
    let mut scaler = match (config.loss_scale, precision.needs_loss_scaling()) {
        (Some(init_scale), _) => DynamicLossScaler::new(LossScalerConfig {
            init_scale,
            ..LossScalerConfig::default()
        })?,
        (None, true) => DynamicLossScaler::new(LossScalerConfig::default())?,
        (None, false) => DynamicLossScaler::disabled(),
    };
    let kind: ScheduleKind = config.schedule.parse()?;
    let schedule = LrSchedule::new(kind, config.lr, config.warmup, config.steps, config.lr * 0.1)?;
    // What must not change across a resume: the precision with its recipe settings, the data
    // (task, objective, sizes) and the run's settings.
    let recipe = match precision {
        Precision::Fp8(recipe) => serde_json::to_value(recipe).unwrap_or_default(),
        _ => serde_json::Value::Null,
    };
    let config_json = serde_json::json!({
        "precision": precision.name(),
        "recipe": recipe,
        "data": data.describe(),
        "run": config,
    });

    let mut progress = TrainProgress {
        step: 0,
        data: DataStream::new(config.seed ^ 0x5EED_DA7A),
        rng: SplitMix64::new(config.seed),
        config: config_json.clone(),
    };
    let metrics_path = dir.join("metrics.jsonl");
    if let Some(path) = control.resume {
        // Every rank loads the whole checkpoint (any world size wrote it the same way).
        let loaded = load_checkpoint(path, model, &mut optimizer, &mut scaler)?;
        if let Some(difference) = super::resume_checks::run_difference(&loaded.config, &config_json) {
            return Err(Error::CheckpointMismatch {
                path: path.display().to_string(),
                reason: format!("it was written by another run: {difference}"),
            });
        }
        progress = TrainProgress {
            config: config_json.clone(),
            ..loaded
        };
    }
    // Rank 0 alone writes the metrics (every rank computes the same ones).
    let mut metrics = match (rank, control.resume) {
        (1.., _) => None,
        (0, Some(_)) => Some(MetricsWriter::resume(&metrics_path, progress.step)?),
        (0, None) => Some(MetricsWriter::create(&metrics_path)?),
    };
    let mut optimizer = RankOptimizer::new(optimizer, dp.zero, model, collective)?;
    // Delayed scaling is updated once per step, after the amax reduce (`train::amax_sync`).
    amax::set_update_per_step(model, true);

    let ledger = device.ledger().clone();
    ledger.restart_peaks();
    account_static(&ledger, model, precision, &optimizer);
    // What `account_static` books as gradients (trainable values in f32).
    let gradient_bytes = model.parameter_count() as u64 * 4;
    let mut curve = Vec::new();
    let (mut skipped, mut tokens, mut seconds, mut peak_activations) = (0u64, 0u64, 0f64, 0u64);
    let mut last_loss = f32::NAN;
    let checkpoint = dir.join("checkpoint.safetensors");
    let last_step = control.stop_after.map_or(config.steps, |s| s.min(config.steps));
    while progress.step < last_step {
        let started = Instant::now();
        let batches: Vec<_> = (0..config.micro_batches)
            .map(|_| data.train_batch(&mut progress.data, micro_size))
            .collect();
        // Every rank draws the whole step from the shared stream and runs its own share.
        let step_tokens: usize = batches.iter().map(|b| b.batch * b.seq).sum();
        let mut run_micro = |m: &mut dyn LanguageModel, micro: MicroBatch, ready: GradReady<'_>| -> Result<f32> {
            if micro.index > share.first {
                // From the second micro-batch on, the step's sum is held beside the gradients.
                set_usage(&ledger, MemoryCategory::Gradients, 2 * gradient_bytes);
            }
            let b = &batches[micro.index];
            let loss = m.forward_loss(&b.inputs, &b.targets, b.batch, b.seq)?;
            let saved = m.saved_activation_bytes() as u64;
            peak_activations = peak_activations.max(saved);
            set_usage(&ledger, MemoryCategory::Activations, saved);
            m.backward_with(micro.backward_seed, ready)?;
            set_usage(&ledger, MemoryCategory::Activations, m.saved_activation_bytes() as u64);
            Ok(loss)
        };
        // The gradient all-reduce: during the rank's last backward, or after it.
        let (local, reduced) = if overlap {
            let last = share.first + share.count - 1;
            let (local, _) = reduce_during_backward(model, collective, dp.bucket_bytes, dp.wire, |model, launcher| {
                accumulate_share_with(model, share, scaler.scale(), |m, micro, earlier| match micro.index {
                    i if i == last => run_micro(m, micro, &mut |group| launcher.ready(group, earlier)),
                    _ => run_micro(m, micro, &mut |_| Ok(())),
                })
            })?;
            (local, true)
        } else {
            let local = accumulate_share(model, share, scaler.scale(), |m, micro| {
                run_micro(m, micro, &mut |_| Ok(()))
            })?;
            (local, false)
        };
        let micro_losses = gather_losses(collective, &local.micro)?;
        let losses = AccumulatedLoss {
            mean: super::accumulate::mean_loss(&micro_losses),
            micro: micro_losses,
        };
        if !reduced {
            all_reduce_gradients(model, collective, dp.bucket_bytes, dp.wire)?;
        }
        amax::reduce_and_update(model, collective, reduce_amax)?;
        let lr = schedule.lr_at(progress.step);
        let backend = optimizer.backend();
        let checked = check_and_clip_with(
            model,
            &scaler,
            optimizer.whole_mut(),
            backend,
            config.max_grad_norm,
            &mut |finite| agree_finite(collective, finite),
        )?;
        if !checked.skipped {
            optimizer.step(model, lr, collective)?;
        }
        let outcome = checked.finish(&mut scaler, lr);
        account_static(&ledger, model, precision, &optimizer);
        // The statistics' reads from a GPU (one download per element type) count in the step.
        crate::train::fp8_stats_reads::read_pending_stats(model)?;
        let mut fp8: Vec<Fp8TensorStats> = Vec::new();
        model.collect_fp8_stats(&mut fp8);
        let elapsed = started.elapsed().as_secs_f64();
        skipped += u64::from(outcome.skipped);
        tokens += step_tokens as u64;
        seconds += elapsed;
        last_loss = losses.mean;
        last_micro_batch_stats(collective, &mut fp8)?;
        let record = StepMetrics {
            step: progress.step,
            loss: losses.mean,
            lr,
            grad_norm: outcome.grad_norm,
            loss_scale: outcome.loss_scale,
            tokens_per_s: step_tokens as f64 / elapsed.max(1e-9),
            fp8,
        };
        if let Some(metrics) = &mut metrics {
            metrics.append(&record)?;
        }
        on_step(&record);
        curve.push((progress.step, losses.mean));
        progress.step += 1;
        if config
            .checkpoint_every
            .is_some_and(|n| n > 0 && progress.step.is_multiple_of(n))
            && progress.step < last_step
        {
            optimizer.save(&checkpoint, model, &scaler, &progress, collective)?;
        }
    }

    // The checkpoint first: a failing evaluation must not lose the trained model.
    optimizer.save(&checkpoint, model, &scaler, &progress, collective)?;
    // The caller gets the model whole (ZeRO-1 may have sharded its f32 masters).
    optimizer.unshard_masters(model, collective)?;
    amax::set_update_per_step(model, false);
    // Every rank holds the same model: rank 0 alone evaluates it.
    let heldout = match rank {
        0 => evaluate(model, data, micro_size)?,
        _ => Evaluation::NOT_RUN,
    };
    let report = ledger.report();
    let peak_of = |category: MemoryCategory| {
        report
            .categories
            .iter()
            .find(|(c, _)| *c == category)
            .map_or(0, |(_, u)| u.peak)
    };
    let memory_summary = memory_summary(&ledger);
    // The run's own accounting is released; Workspace is counted by the allocations themselves
    // (the CUDA staging pool, which outlives the run) and stays as it is.
    // The optimizer's device arenas are booked by their own allocations, released when it drops;
    // so are a frozen FP8 base's device copies (FP8 copies), released with the model.
    let frozen_on_device = frozen_device_bytes(model);
    for category in MemoryCategory::ALL {
        let held = match category {
            MemoryCategory::Workspace => continue,
            MemoryCategory::Fp8Copies => frozen_on_device,
            _ => 0,
        };
        set_usage(&ledger, category, optimizer.device_bytes(category) + held);
    }
    Ok(RunOutput {
        summary: PrecisionSummary {
            final_train_loss: last_loss,
            heldout_loss: heldout.loss,
            heldout_answer_loss: heldout.answer_loss,
            heldout_accuracy: heldout.accuracy,
            tokens_per_s: tokens as f64 / seconds.max(1e-9),
            peak_bytes: report.total.peak,
            // Read by the caller, which holds the device.
            device_peak_bytes: None,
            // Counted by the caller, which knows the model's shape (`model::flops`).
            model_flop_per_s: f64::NAN,
            mfu: f64::NAN,
        },
        curve,
        skipped_steps: skipped,
        peak_activation_bytes: peak_activations,
        memory_summary,
        checkpoint,
        optimizer_state_bytes: peak_of(MemoryCategory::OptimizerState),
        master_weight_bytes: peak_of(MemoryCategory::MasterWeights),
    })
}

/// Bytes that change only at optimizer steps: parameters, masters, gradients, moments, weight caches.
///
/// A trainable linear's weight cache is its compute copy (the GEMMs read that one buffer), so
/// outside FP8 the larger of the compute copies and the trainable weights' caches is booked, not
/// their sum. The caches of frozen weights (a LoRA base's plain copies, an FP8 base's codes) copy
/// no trainable value: they are held beside the compute copies and added.
fn account_static(
    ledger: &MemoryLedger,
    model: &mut dyn LanguageModel,
    precision: &Precision,
    optimizer: &RankOptimizer,
) {
    let optimizer_bytes = optimizer.state_bytes();
    let values = model.parameter_count() as u64;
    // ZeRO-1 with sharded masters: the f32 values of the other ranks' weight slices are not here.
    let masters = values - optimizer.master_values_not_held() as u64;
    let dtype = precision.compute_dtype();
    let compute_copies = if dtype == Dtype::F32 {
        0
    } else {
        values * dtype.bytes() as u64
    };
    let cache = model.weight_cache_bytes() as u64;
    let frozen_caches = frozen_weight_caches(model);
    // Frozen values (LoRA's base, an FP8 base's embeddings, norms and head) have no gradient or
    // moments; they are held in f32, or embeddings, norms and head at their checkpoint's 16 bits.
    let frozen = model.frozen_parameter_bytes() as u64;
    // On a GPU the optimizer's arenas hold the masters, gradients and moments in device memory,
    // booked by their allocations (padding included): the ledger shows the larger of the two.
    let at_least = |category, bytes: u64| set_usage(ledger, category, bytes.max(optimizer.device_bytes(category)));
    at_least(MemoryCategory::MasterWeights, masters * 4);
    at_least(MemoryCategory::Gradients, values * 4);
    at_least(MemoryCategory::OptimizerState, optimizer_bytes as u64);
    if precision.is_fp8() {
        set_usage(ledger, MemoryCategory::Parameters, frozen + compute_copies);
        set_usage(ledger, MemoryCategory::Fp8Copies, cache);
    } else {
        let trainable_caches = cache.saturating_sub(frozen_caches.plain + frozen_caches.fp8_codes);
        set_usage(
            ledger,
            MemoryCategory::Parameters,
            frozen + compute_copies.max(trainable_caches) + frozen_caches.plain,
        );
        set_usage(ledger, MemoryCategory::Fp8Copies, frozen_caches.fp8_codes);
    }
}

/// Bytes of the weight caches of frozen linear weights.
#[derive(Default)]
struct FrozenCaches {
    /// Plain (16/32-bit) copies of frozen f32 weights.
    plain: u64,
    /// Frozen FP8 codes with their scales (`--base-precision fp8`).
    fp8_codes: u64,
}

fn frozen_weight_caches(model: &mut dyn LanguageModel) -> FrozenCaches {
    let mut caches = FrozenCaches::default();
    model.visit_linears(&mut |linear| {
        let codes = linear.frozen_fp8().map_or(0, |w| w.bytes()) as u64;
        if linear.weight().is_frozen() {
            let adapters: usize = linear.adapters().iter().map(|a| a.weight_cache_bytes()).sum();
            let own = (crate::nn::Module::weight_cache_bytes(linear) - adapters) as u64;
            caches.fp8_codes += codes;
            caches.plain += own - codes;
        }
    });
    caches
}

/// Bytes of frozen FP8 weights also held in device memory (their device copies, booked by
/// their allocations).
fn frozen_device_bytes(model: &mut dyn LanguageModel) -> u64 {
    let mut bytes = 0u64;
    model.visit_linears(&mut |linear| {
        bytes += linear.frozen_fp8().map_or(0, |w| w.device_bytes()) as u64;
    });
    bytes
}

/// Every rank's micro-batch losses in step order (rank order); this rank's alone on one rank.
fn gather_losses(collective: &dyn Collective, local: &[f32]) -> Result<Vec<f32>> {
    if collective.world_size() == 1 {
        return Ok(local.to_vec());
    }
    let mut all = vec![0.0f32; local.len() * collective.world_size()];
    collective.all_gather(local, &mut all)?;
    Ok(all)
}

/// The FP8 statistics of the step's last micro-batch, which the last rank ran (one rank: its
/// own), so the metrics of N ranks are those of one rank with N micro-batches. Every value
/// travels as raw bits (f64 and u64 as two f32 words each), so nothing is rounded.
fn last_micro_batch_stats(collective: &dyn Collective, stats: &mut [Fp8TensorStats]) -> Result<()> {
    let world = collective.world_size();
    if world == 1 {
        return Ok(());
    }
    let words = |bits: u64| [f32::from_bits((bits >> 32) as u32), f32::from_bits(bits as u32)];
    let mut buffer: Vec<f32> = Vec::with_capacity(8 * stats.len());
    for s in stats.iter() {
        buffer.extend([s.amax, s.scale]);
        buffer.extend(words(s.saturated.to_bits()));
        buffer.extend(words(s.underflow.to_bits()));
        buffer.extend(words(s.nonfinite));
    }
    collective.broadcast(&mut buffer, world - 1)?;
    let bits = |w: &[f32]| (u64::from(w[0].to_bits()) << 32) | u64::from(w[1].to_bits());
    for (s, w) in stats.iter_mut().zip(buffer.chunks_exact(8)) {
        s.amax = w[0];
        s.scale = w[1];
        s.saturated = f64::from_bits(bits(&w[2..4]));
        s.underflow = f64::from_bits(bits(&w[4..6]));
        s.nonfinite = bits(&w[6..8]);
    }
    Ok(())
}

/// The group's "every gradient is finite": false on every rank if false on any, so every rank
/// skips the same steps (the gradients are equal after the all-reduce; this makes it a rule).
fn agree_finite(collective: &dyn Collective, finite: bool) -> Result<bool> {
    if collective.world_size() == 1 {
        return Ok(finite);
    }
    let mut found_inf = [if finite { 0.0f32 } else { 1.0 }];
    collective.all_reduce_max(&mut found_inf)?;
    Ok(found_inf[0] == 0.0)
}

/// Held-out results of the trained model.
struct Evaluation {
    /// Mean loss over every counted target.
    loss: f32,
    /// Mean loss over the answer targets only (NaN for text, which has no answer).
    answer_loss: f32,
    /// Exact-match accuracy (NaN for text).
    accuracy: f64,
}

impl Evaluation {
    /// What a rank that does not evaluate reports.
    const NOT_RUN: Evaluation = Evaluation {
        loss: f32::NAN,
        answer_loss: f32::NAN,
        accuracy: f64::NAN,
    };
}

/// Weighted mean of per-batch mean losses (NaN when nothing was counted).
fn mean_loss(sum: f64, count: usize) -> f32 {
    if count == 0 {
        f32::NAN
    } else {
        (sum / count as f64) as f32
    }
}

/// Runs the held-out split: loss over every counted target, the answer loss, exact-match accuracy.
fn evaluate(model: &mut dyn LanguageModel, data: &Dataset, batch: usize) -> Result<Evaluation> {
    let (mut loss_sum, mut total_counted) = (0f64, 0usize);
    let (mut answer_sum, mut answer_counted) = (0f64, 0usize);
    let (mut correct, mut scored) = (0f64, 0usize);
    for b in data.heldout_batches(batch) {
        // One forward pass scores every target and, where the task has an answer, the answer alone.
        let answer_targets = data.has_accuracy().then(|| b.answer_targets());
        let mut target_sets: Vec<&[u32]> = vec![&b.targets];
        target_sets.extend(answer_targets.as_deref());
        let (losses, predicted) = model.evaluate_losses(&b.inputs, &target_sets, b.batch, b.seq)?;
        loss_sum += f64::from(losses[0]) * b.counted_targets() as f64;
        total_counted += b.counted_targets();
        if let Some(answer) = &answer_targets {
            answer_sum += f64::from(losses[1]) * counted(answer) as f64;
            answer_counted += counted(answer);
            if let Some(acc) = exact_match_accuracy(&predicted, &b) {
                correct += acc * b.batch as f64;
                scored += b.batch;
            }
        }
    }
    Ok(Evaluation {
        loss: mean_loss(loss_sum, total_counted),
        answer_loss: mean_loss(answer_sum, answer_counted),
        accuracy: if scored > 0 { correct / scored as f64 } else { f64::NAN },
    })
}
