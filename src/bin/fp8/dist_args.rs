//! `fp8 train`'s data-parallel settings (docs/distributed.md): ranks as CPU threads, gradient
//! buckets and wire format, ZeRO-1, and the amax reduce switch.

use clap::Args;
use fp8_engine::amp::Precision;
use fp8_engine::backend::cuda::nccl::NcclCollective;
use fp8_engine::device::Device;
use fp8_engine::dist::env::LaunchEnv;
use fp8_engine::dist::{DataParallel, Parallel, Wire};
use fp8_engine::scaling::Recipe;
use fp8_engine::train::data_parallel::{run_data_parallel, run_on_gpus};
use fp8_engine::train::memory::human_bytes;
use fp8_engine::train::session::{RunControl, RunInputs, RunOutput, StepCallback, run};

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
    /// ZeRO stage: 0, or 1 to shard the AdamW moments over the ranks (and the linear weights' f32
    /// masters under bf16, fp16 and fp8-delayed).
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
    /// Data-parallel ranks on GPUs 0..N, one thread each, joined by NCCL in this process
    /// (--micro-batches counts each rank's own). Needs N usable GPUs and libnccl.
    #[arg(long, value_name = "N")]
    pub gpus: Option<usize>,
    /// This process's rank when launched once per rank (torchrun-style RANK, WORLD_SIZE,
    /// LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment); read by `fp8 train` itself.
    #[arg(skip)]
    pub launch: Option<LaunchEnv>,
}

impl DistArgs {
    /// Whether any data-parallel setting was given beyond one rank.
    pub fn parallel(&self) -> bool {
        self.world_size != 1
            || self.zero != 0
            || self.grad_wire != "f32"
            || self.gpus.is_some()
            || self.launch.is_some()
    }

    /// Ranks of the run: the launch's WORLD_SIZE, --gpus, or --world-size.
    pub fn ranks(&self) -> usize {
        match (&self.launch, self.gpus) {
            (Some(env), _) => env.world_size,
            (None, Some(gpus)) => gpus,
            (None, None) => self.world_size,
        }
    }

    /// Refuses combinations of the three ways to make ranks, and GPU ranks on the CPU: a
    /// launch once per rank (environment) makes NCCL ranks, so on the CPU backend it is an
    /// error that points to --world-size (threads share one process's memory; a cross-process
    /// CPU transport would add a second home-made collective for no run that needs it).
    pub fn check_launch(&self, on_gpu: bool, init_from: bool) -> Result<(), CliError> {
        let gpu_ranks = match (&self.launch, self.gpus) {
            (Some(env), _) if self.world_size != 1 || self.gpus.is_some() => {
                return Err(CliError(format!(
                    "RANK={} WORLD_SIZE={} launch this process as one rank of several: give no \
                     --world-size or --gpus with them",
                    env.rank, env.world_size
                )));
            }
            (Some(env), _) => Some(format!("RANK={} WORLD_SIZE={}", env.rank, env.world_size)),
            (None, Some(gpus)) if self.world_size != 1 => {
                return Err(CliError(format!(
                    "--gpus {gpus} and --world-size {}: give one (--gpus for GPU ranks, --world-size for CPU ranks)",
                    self.world_size
                )));
            }
            (None, Some(gpus)) => Some(format!("--gpus {gpus}")),
            (None, None) => None,
        };
        match gpu_ranks {
            Some(what) if !on_gpu => Err(CliError(format!(
                "{what}: GPU ranks over NCCL, and this run is on the CPU; on the CPU, run N ranks \
                 as threads of one process with --world-size N (bit-identical to --micro-batches N)"
            ))),
            Some(what) if init_from => Err(CliError(format!(
                "{what}: data parallelism trains the built-in model (no --init-from)"
            ))),
            Some(_) => Ok(()),
            None if self.parallel() && (on_gpu || init_from) => Err(CliError(
                "--world-size, --zero and --grad-wire run the built-in model on CPU ranks (--device cpu, \
                 no --init-from); on GPUs use --gpus N or a launch once per rank"
                    .into(),
            )),
            _ => Ok(()),
        }
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
        per_rank.checked_mul(self.ranks()).ok_or_else(|| {
            CliError(format!(
                "--micro-batches {per_rank} x {} ranks is too large",
                self.ranks()
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

/// Trains the built-in decoder on `--world-size` CPU ranks or `--gpus` GPU ranks; rank 0's
/// output, after a line per rank with its optimizer state and master weights (the ZeRO-1 saving).
pub fn run_parallel(args: &DistArgs, inputs: &RunInputs, on_step: StepCallback) -> Result<RunOutput, CliError> {
    let options = args.options()?;
    let precision = inputs.precision;
    let build = inputs.decoder_builder();
    // NCCL cannot release ranks that wait for a failed one: the process ends with the error.
    let exit = |rank: usize, reason: &str| {
        eprintln!("fp8 train: GPU rank {rank} {reason}; stopping every rank");
        std::process::exit(1);
    };
    let mut outputs = match args.gpus {
        Some(gpus) => run_on_gpus(gpus, &options, &build, inputs, on_step, &exit)?,
        None => run_data_parallel(args.world_size, &options, &build, inputs, on_step)?,
    };
    for (rank, out) in outputs.iter().enumerate() {
        eprintln!(
            "fp8 train: {} rank {rank}/{}: optimizer state {} (ZeRO-{}), master weights {}, peak memory {}",
            precision.name(),
            outputs.len(),
            human_bytes(out.optimizer_state_bytes),
            options.zero,
            human_bytes(out.master_weight_bytes),
            human_bytes(out.summary.peak_bytes)
        );
    }
    Ok(outputs.swap_remove(0))
}

/// This process as rank `env.rank` of a launch once per rank on `device` (GPU `LOCAL_RANK`),
/// NCCL set up through the TCP rendezvous on `MASTER_ADDR:MASTER_PORT` (rank 0 writes the
/// outputs).
pub fn run_launched(
    args: &DistArgs,
    env: &LaunchEnv,
    device: &Device,
    inputs: &RunInputs,
    on_step: StepCallback,
) -> Result<RunOutput, CliError> {
    let options = args.options()?;
    let Device::Cuda(gpu) = device else {
        return Err(CliError(format!("LOCAL_RANK={}: not a GPU", env.local_rank)));
    };
    let nccl = NcclCollective::from_launch(env, gpu)?;
    let parallel = Parallel {
        collective: &nccl,
        options,
    };
    let inputs = RunInputs {
        control: RunControl {
            parallel: Some(&parallel),
            ..inputs.control
        },
        ..*inputs
    };
    let output = run(device, &inputs, on_step)?;
    eprintln!(
        "fp8 train: {} rank {}/{} on GPU {}: optimizer state {}, master weights {}, peak memory {}",
        inputs.precision.name(),
        env.rank,
        env.world_size,
        env.local_rank,
        human_bytes(output.optimizer_state_bytes),
        human_bytes(output.master_weight_bytes),
        human_bytes(output.summary.peak_bytes)
    );
    Ok(output)
}
