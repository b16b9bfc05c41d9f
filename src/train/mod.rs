//! The training loop's pieces that do not depend on the layers: they work on
//! [`nn::Module`](crate::nn::Module) / [`nn::Parameter`](crate::nn::Parameter) and plain f32 slices.
//!
//! One step, in order (`docs/training.md`):
//! 1. [`accumulate::accumulate_gradients`]: zero the gradients, run every micro-batch's forward and
//!    backward with the loss divided by the micro-batch count (and multiplied by the loss scale).
//! 2. [`step::apply_gradients`]: unscale and check for inf/NaN ([`crate::amp::loss_scaler`]),
//!    clip by global norm ([`clip`]), update with [`adamw::AdamW`] at the [`schedule`]'s learning
//!    rate, or skip the update on an inf/NaN gradient; then let the scaler grow or back off.
//! 3. Log a [`metrics::StepMetrics`] line; save a [`checkpoint`] now and then; [`memory`] accounting
//!    and [`plot`] of the loss curves at the end.
//!
//! [`session::run`] puts them together around the [`crate::model::DecoderModel`]: it is `fp8 train`'s loop.
//!
//! Data parallelism over a [`crate::dist::Collective`] (`docs/distributed.md`): [`grad_sync`]
//! (bucketed gradient all-reduce; [`grad_overlap`] runs it during backward), [`amax_sync`] (one amax max-reduce per step before the
//! delayed update), [`zero1`] (AdamW moments sharded), [`data_parallel`] (ranks as threads).

pub mod accumulate;
pub mod adamw;
mod adamw_arena;
mod adamw_state;
pub mod amax_sync;
pub mod checkpoint;
pub mod clip;
pub mod data_parallel;
pub mod fp8_stats_reads;
pub mod gpu_preflight;
pub mod grad_overlap;
pub mod grad_sync;
pub mod memory;
pub mod metrics;
pub mod plot;
pub mod preflight;
mod rank_optimizer;
pub mod resume_checks;
pub mod schedule;
pub mod session;
pub mod step;
pub mod zero1;
mod zero1_masters;

#[cfg(test)]
pub(crate) mod test_util;
