//! `fp8 train --world-size N` on the CPU: N ranks as N threads of this process, each with its
//! own model, optimizer (or optimizer shard), loss scaler and memory ledger, joined by a
//! [`cpu_group`]. Rank 0 runs on the calling thread (it reports progress, writes the metrics
//! and the checkpoint); the others on scoped threads.

use std::path::Path;

use crate::amp::Precision;
use crate::data::Dataset;
use crate::device::{Device, DeviceChoice};
use crate::dist::cpu_group::{AbortOnDrop, cpu_group};
use crate::dist::{DataParallel, Parallel};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::train::metrics::StepMetrics;
use crate::train::session::{RunConfig, RunControl, RunOutput, StepCallback, run_model};

/// Builds one rank's model (every rank builds the same one: same config, same seed).
pub type ModelBuilder<'a> = &'a (dyn Fn() -> Result<Box<dyn LanguageModel>> + Sync);

/// Trains on `world_size` CPU ranks; returns every rank's output, by rank. `config.batch` and
/// `config.micro_batches` are the step's totals over all ranks (`micro_batches` a multiple of
/// `world_size`); `on_step` sees rank 0's metrics. The first failing rank's error is returned
/// (the others stop at their next collective).
#[allow(clippy::too_many_arguments)]
pub fn run_data_parallel(
    world_size: usize,
    options: &DataParallel,
    build: ModelBuilder,
    precision: &Precision,
    config: &RunConfig,
    data: &Dataset,
    dir: &Path,
    control: RunControl,
    on_step: StepCallback,
) -> Result<Vec<RunOutput>> {
    options.validate()?;
    let group = cpu_group(world_size)?;
    let rank_run = |rank: usize, on_step: StepCallback| -> Result<RunOutput> {
        let handle = &group[rank];
        let guard = AbortOnDrop::new(handle);
        let device = Device::select(DeviceChoice::Cpu)?;
        let mut model = build()?;
        let parallel = Parallel {
            collective: handle,
            options: options.clone(),
        };
        let control = RunControl {
            parallel: Some(&parallel),
            ..control
        };
        let output = run_model(model.as_mut(), &device, precision, config, data, dir, control, on_step);
        if output.is_ok() {
            guard.disarm();
        }
        output
    };
    let results: Vec<Result<RunOutput>> = std::thread::scope(|s| {
        let others: Vec<_> = (1..world_size)
            .map(|rank| {
                let rank_run = &rank_run;
                s.spawn(move || rank_run(rank, &mut |_: &StepMetrics| {}))
            })
            .collect();
        let mut results = vec![rank_run(0, on_step)];
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
