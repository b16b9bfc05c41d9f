//! `fp8 train`'s data-parallel settings (docs/distributed.md): ranks as CPU threads, gradient
//! buckets and wire format, ZeRO-1, and the amax reduce switch.

use std::path::Path;

use clap::Args;
use fp8_engine::amp::Precision;
use fp8_engine::data::Dataset;
use fp8_engine::dist::{DataParallel, Wire};
use fp8_engine::model::{DecoderModel, LanguageModel};
use fp8_engine::scaling::Recipe;
use fp8_engine::train::data_parallel::run_data_parallel;
use fp8_engine::train::memory::human_bytes;
use fp8_engine::train::session::{RunConfig, RunControl, RunOutput, StepCallback};

use crate::error::CliError;

/// Data-parallel settings.
#[derive(Args, Clone, Debug)]
pub struct DistArgs {
    /// Data-parallel ranks, as threads on the CPU: each step's --batch is split over them, and
    /// --micro-batches counts each rank's own micro-batches. Losses are bit-identical to one rank
    /// with --micro-batches N (docs/distributed.md).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub world_size: usize,
    /// Gradient all-reduce bucket size in MiB of f32 gradient (one collective per bucket).
    #[arg(long, default_value_t = 25.0, value_name = "MIB")]
    pub bucket_mb: f64,
    /// Number format of the gradient all-reduce: f32 (exact rank-order sum) or bf16 (half the bytes).
    #[arg(long, default_value = "f32")]
    pub grad_wire: String,
    /// ZeRO stage: 0, or 1 to shard the AdamW moments over the ranks.
    #[arg(long, default_value_t = 0)]
    pub zero: u8,
    /// fp8-delayed: do not max-reduce the amaxes across ranks, so each rank keeps its own scales
    /// (for experiments; ranks then diverge from one another).
    #[arg(long)]
    pub no_amax_reduce: bool,
    /// Reduce the gradient buckets after backward instead of during it (same results; for
    /// comparing step times).
    #[arg(long)]
    pub no_overlap: bool,
}

impl DistArgs {
    /// Whether any data-parallel setting was given beyond one rank.
    pub fn parallel(&self) -> bool {
        self.world_size != 1 || self.zero != 0 || self.grad_wire != "f32"
    }

    /// The settings as the library takes them, checked.
    pub fn options(&self) -> Result<DataParallel, CliError> {
        if self.world_size == 0 {
            return Err(CliError("--world-size 0: a run needs at least one rank".into()));
        }
        let bytes = self.bucket_mb * (1 << 20) as f64;
        if !(bytes.is_finite() && bytes >= 4.0) {
            return Err(CliError(format!(
                "--bucket-mb {}: expected a size that holds at least one f32 gradient",
                self.bucket_mb
            )));
        }
        let wire: Wire = self.grad_wire.parse()?;
        let options = DataParallel {
            bucket_bytes: bytes as usize,
            wire,
            zero: self.zero,
            overlap: !self.no_overlap,
        };
        options.validate()?;
        Ok(options)
    }

    /// `--micro-batches` per rank as the run's total over all ranks.
    pub fn total_micro_batches(&self, per_rank: usize) -> Result<usize, CliError> {
        per_rank.checked_mul(self.world_size).ok_or_else(|| {
            CliError(format!(
                "--micro-batches {per_rank} x --world-size {} is too large",
                self.world_size
            ))
        })
    }

    /// `precision` with the amax reduce turned off when asked (fp8-delayed only).
    pub fn apply(&self, precision: Precision) -> Precision {
        match precision {
            Precision::Fp8(Recipe::Delayed(mut recipe)) if self.no_amax_reduce => {
                recipe.reduce_amax = false;
                Precision::Fp8(Recipe::Delayed(recipe))
            }
            other => other,
        }
    }
}

/// Trains the built-in decoder on `--world-size` CPU ranks; rank 0's output, after a line per
/// rank with its optimizer state (the ZeRO-1 saving).
pub fn run_parallel(
    args: &DistArgs,
    precision: &Precision,
    config: &RunConfig,
    data: &Dataset,
    dir: &Path,
    control: RunControl,
    on_step: StepCallback,
) -> Result<RunOutput, CliError> {
    let options = args.options()?;
    let model_config = config.model_for(data);
    let build = || -> fp8_engine::Result<Box<dyn LanguageModel>> {
        Ok(Box::new(DecoderModel::new(&model_config, precision, config.seed)?))
    };
    let mut outputs = run_data_parallel(
        args.world_size,
        &options,
        &build,
        precision,
        config,
        data,
        dir,
        control,
        on_step,
    )?;
    for (rank, out) in outputs.iter().enumerate() {
        eprintln!(
            "fp8 train: {} rank {rank}/{}: optimizer state {} (ZeRO-{}), peak memory {}",
            precision.name(),
            args.world_size,
            human_bytes(out.optimizer_state_bytes),
            options.zero,
            human_bytes(out.summary.peak_bytes)
        );
    }
    Ok(outputs.swap_remove(0))
}
