//! The optimizer one rank of a run holds: the whole AdamW, or its ZeRO-1 shard
//! ([`crate::train::zero1`]). Checkpoints always hold the whole state, written once, by rank 0.

use std::path::Path;

use super::adamw::AdamW;
use super::checkpoint::{TrainProgress, save_checkpoint};
use crate::amp::loss_scaler::DynamicLossScaler;
use crate::dispatch::Backend;
use crate::dist::Collective;
use crate::error::Result;
use crate::memory::MemoryCategory;
use crate::model::LanguageModel;
use crate::train::zero1::Zero1AdamW;

/// AdamW, whole or sharded over the ranks.
pub(crate) enum RankOptimizer {
    Whole(AdamW),
    Sharded(Zero1AdamW),
}

impl RankOptimizer {
    /// `full` as it is (ZeRO stage 0) or this rank's shard of it (stage 1, with the linear
    /// weights' f32 masters sharded where their compute copies can be gathered from slices).
    pub(crate) fn new(
        full: AdamW,
        zero: u8,
        model: &mut dyn LanguageModel,
        collective: &dyn Collective,
    ) -> Result<Self> {
        Ok(match zero {
            0 => {
                let mut full = full;
                full.prepare(model)?;
                RankOptimizer::Whole(full)
            }
            _ => RankOptimizer::Sharded(Zero1AdamW::from_full(&full, model, collective, true)?),
        })
    }

    /// f32 master values this rank does not hold (sharded masters).
    pub(crate) fn master_values_not_held(&self) -> usize {
        match self {
            RankOptimizer::Whole(_) => 0,
            RankOptimizer::Sharded(zero) => zero.master_values_not_held(),
        }
    }

    /// Gives `model` its whole f32 masters back (sharded masters: gathered from the ranks), so
    /// that the model a run hands back is whole. Every rank of the group must call it, once the
    /// optimizer is done.
    pub(crate) fn unshard_masters(&self, model: &mut dyn LanguageModel, collective: &dyn Collective) -> Result<()> {
        match self {
            RankOptimizer::Whole(_) => Ok(()),
            RankOptimizer::Sharded(zero) => zero.unshard_masters(model, collective),
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        match self {
            RankOptimizer::Whole(adamw) => adamw.backend(),
            RankOptimizer::Sharded(zero) => zero.backend(),
        }
    }

    /// Bytes the optimizer's device arenas book in the device's ledger under `category` (the
    /// masters, gradients and moments of a whole AdamW on a GPU; 0 elsewhere).
    pub(crate) fn device_bytes(&self, category: MemoryCategory) -> u64 {
        match self {
            RankOptimizer::Whole(adamw) => adamw.device_bytes(category),
            RankOptimizer::Sharded(_) => 0,
        }
    }

    /// The whole AdamW (None for a ZeRO-1 shard).
    pub(crate) fn whole_mut(&mut self) -> Option<&mut AdamW> {
        match self {
            RankOptimizer::Whole(adamw) => Some(adamw),
            RankOptimizer::Sharded(_) => None,
        }
    }

    /// Bytes of optimizer state this rank holds.
    pub(crate) fn state_bytes(&self) -> usize {
        match self {
            RankOptimizer::Whole(adamw) => adamw.state_bytes(),
            RankOptimizer::Sharded(zero) => zero.state_bytes(),
        }
    }

    /// One update of `model` (sharded: the owned values, then an all-gather of all of them), right
    /// after `step::check_and_clip_with` found the gradients finite (a whole AdamW on device
    /// arenas takes the gradients checked and clipped there).
    pub(crate) fn step(&mut self, model: &mut dyn LanguageModel, lr: f32, collective: &dyn Collective) -> Result<()> {
        match self {
            RankOptimizer::Whole(adamw) => adamw.step_checked(model, lr),
            RankOptimizer::Sharded(zero) => zero.step(model, lr, collective),
        }
    }

    /// Writes the checkpoint with the whole optimizer state and the whole f32 masters: every
    /// rank takes part in gathering a sharded state, rank 0 alone writes the file.
    pub(crate) fn save(
        &self,
        path: &Path,
        model: &mut dyn LanguageModel,
        scaler: &DynamicLossScaler,
        progress: &TrainProgress,
        collective: &dyn Collective,
    ) -> Result<()> {
        let write = |model: &mut dyn LanguageModel, whole: &AdamW| match collective.rank() {
            0 => save_checkpoint(path, model, whole, scaler, progress),
            _ => Ok(()),
        };
        match self {
            RankOptimizer::Whole(adamw) => write(model, adamw),
            RankOptimizer::Sharded(zero) => {
                let whole = zero.to_full(model, collective)?;
                zero.with_whole_masters(model, collective, |model| write(model, &whole))
            }
        }
    }
}
