//! Ranks as threads of this process, each with its own model, optimizer (or optimizer shard),
//! loss scaler and memory ledger: `fp8 train --world-size N` on the CPU (joined by a
//! [`cpu_group`]) and `--gpus N` (one GPU each, joined by NCCL). Rank 0 runs on the calling
//! thread (it reports progress, writes the metrics and the checkpoint); the others on scoped
//! threads.

use crate::backend::cuda::CudaDevice;
use crate::backend::cuda::nccl::{NcclCollective, nccl_present};
use crate::device::{Device, DeviceChoice};
use crate::dist::cpu_group::cpu_group;
use crate::dist::{Collective, DataParallel, Parallel};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::train::metrics::StepMetrics;
use crate::train::session::{RunControl, RunInputs, RunOutput, StepCallback, run_model};

/// Builds one rank's model (every rank builds the same one: same config, same seed).
pub type ModelBuilder<'a> = &'a (dyn Fn() -> Result<Box<dyn LanguageModel>> + Sync);

/// Trains on `world_size` CPU ranks; returns every rank's output, by rank. `config.batch` and
/// `config.micro_batches` of `inputs` are the step's totals over all ranks (`micro_batches` a
/// multiple of `world_size`); `on_step` sees rank 0's metrics. The first failing rank's error
/// is returned (the others stop at their next collective).
pub fn run_data_parallel(
    world_size: usize,
    options: &DataParallel,
    build: ModelBuilder,
    inputs: &RunInputs,
    on_step: StepCallback,
) -> Result<Vec<RunOutput>> {
    options.validate()?;
    let group = cpu_group(world_size)?;
    let aborts: Vec<_> = group.iter().map(|c| move |reason: &str| c.abort(reason)).collect();
    let seats: Vec<Seat> = group
        .iter()
        .zip(&aborts)
        .map(|(c, abort)| Seat {
            collective: c,
            device: DeviceChoice::Cpu,
            on_failure: abort,
        })
        .collect();
    run_seats(&seats, options, build, inputs, on_step)
}

/// One rank of a group in this process: its handle, its device, and what releases the other
/// ranks when it fails (called with a reason, from the failing rank's thread).
pub struct Seat<'a> {
    /// The rank's handle on its group (`collective.rank()` is the rank).
    pub collective: &'a dyn Collective,
    /// The device the rank trains on.
    pub device: DeviceChoice,
    /// Called once when the rank fails or panics.
    pub on_failure: &'a (dyn Fn(&str) + Sync),
}

/// Calls a seat's `on_failure` when dropped unless disarmed (errors and panics alike).
struct FailureGuard<'a> {
    seat: &'a Seat<'a>,
    armed: bool,
}

impl Drop for FailureGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            (self.seat.on_failure)("it failed");
        }
    }
}

/// Trains one rank per seat, each on its own thread (seat 0 on the calling thread, which
/// reports progress), every rank building its own model; returns every rank's output by rank,
/// or the first failing rank's error.
pub fn run_seats(
    seats: &[Seat],
    options: &DataParallel,
    build: ModelBuilder,
    inputs: &RunInputs,
    on_step: StepCallback,
) -> Result<Vec<RunOutput>> {
    options.validate()?;
    let rank_run = |seat: &Seat, on_step: StepCallback| -> Result<RunOutput> {
        let mut guard = FailureGuard { seat, armed: true };
        let device = Device::select(seat.device)?;
        let mut model = build()?;
        let parallel = Parallel {
            collective: seat.collective,
            options: options.clone(),
        };
        let inputs = RunInputs {
            control: RunControl {
                parallel: Some(&parallel),
                ..inputs.control
            },
            ..*inputs
        };
        let output = run_model(model.as_mut(), &device, &inputs, on_step);
        guard.armed = output.is_err();
        output
    };
    let Some((first, rest)) = seats.split_first() else {
        return Err(Error::InvalidSetting {
            setting: "world_size",
            value: "0".into(),
            reason: "a group needs at least one rank".into(),
        });
    };
    let results: Vec<Result<RunOutput>> = std::thread::scope(|s| {
        let others: Vec<_> = rest
            .iter()
            .map(|seat| {
                let rank_run = &rank_run;
                s.spawn(move || rank_run(seat, &mut |_: &StepMetrics| {}))
            })
            .collect();
        let mut results = vec![rank_run(first, on_step)];
        for (i, handle) in others.into_iter().enumerate() {
            results.push(handle.join().unwrap_or_else(|_| {
                Err(Error::Collective {
                    op: "run",
                    rank: i + 1,
                    reason: "the rank's thread panicked".into(),
                })
            }));
        }
        results
    });
    // The root cause: the first error that is not another rank's stop seen in a collective.
    let root = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .find(|e| !matches!(e, Error::Collective { reason, .. } if reason.contains("stopped")))
        .or_else(|| results.iter().find_map(|r| r.as_ref().err()))
        .cloned();
    match root {
        Some(error) => Err(error),
        None => Ok(results.into_iter().flatten().collect()),
    }
}

/// `--gpus N`: one rank per GPU `0..gpus`, one thread each, joined by NCCL in this process
/// (`ncclCommInitAll`). A machine without that many usable GPUs, or without libnccl, is an
/// error naming the setting before anything runs. NCCL has no way to release ranks waiting
/// for a failed one, so `on_failure(rank, reason)` decides what happens then (the CLI prints
/// the error and exits the process).
pub fn run_on_gpus(
    gpus: usize,
    options: &DataParallel,
    build: ModelBuilder,
    inputs: &RunInputs,
    on_step: StepCallback,
    on_failure: &(dyn Fn(usize, &str) + Sync),
) -> Result<Vec<RunOutput>> {
    options.validate()?;
    let bad = |reason: String| Error::InvalidSetting {
        setting: "gpus",
        value: gpus.to_string(),
        reason,
    };
    if gpus == 0 {
        return Err(bad("a run needs at least one GPU".into()));
    }
    let devices = (0..gpus)
        .map(|i| CudaDevice::open(i).map_err(|e| bad(format!("GPU {i} cannot be used: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    if !nccl_present() {
        return Err(bad(
            "libnccl (NCCL 2) is not installed or not on the library path".into()
        ));
    }
    let comms = NcclCollective::for_devices(&devices)?;
    let failures: Vec<_> = (0..gpus)
        .map(|rank| move |reason: &str| on_failure(rank, reason))
        .collect();
    let seats: Vec<Seat> = comms
        .iter()
        .zip(&failures)
        .enumerate()
        .map(|(rank, (c, on_failure))| Seat {
            collective: c,
            device: DeviceChoice::Cuda(rank),
            on_failure,
        })
        .collect();
    run_seats(&seats, options, build, inputs, on_step)
}
