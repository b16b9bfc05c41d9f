//! Scaling recipes: how the scale of every FP8 cast is chosen (`docs/numerics.md`, scaling recipes).
//!
//! * [`DelayedScaling`]: per-tensor scale from an amax history, updated once after
//!   forward and once after backward ([`delayed`], [`ScalingState`]).
//! * [`CurrentScaling`]: per-tensor scale from the tensor's own amax ([`current`]).
//! * [`BlockScaling`]: the current-scaling formula per 1x128 or 128x128 block.
//! * [`Mxfp8Scaling`]: one E8M0 power of two per 32 elements, rounded up ([`mxfp8`]).
//!
//! Data flows one way: a recipe decides a scale, a quantizer (`crate::quantize`)
//! uses it; the delayed state is only updated at the end of a pass, never inside
//! a quantizer.

mod bank;
pub mod current;
pub mod delayed;
pub mod exact_f32;
pub mod mxfp8;
mod recipe;
mod state;
mod stats;

pub(crate) use bank::DeviceBank;
pub use bank::SlotBank;
pub use current::current_scale;
pub use delayed::DelayedSlot;
pub use mxfp8::mxfp8_scale_exponent;
pub use recipe::{
    AmaxComputeAlgo, BlockDims, BlockScaling, CurrentScaling, DelayedScaling, MAX_AMAX_HISTORY_LEN, MAX_MARGIN,
    Mxfp8Format, Mxfp8Scaling, Recipe, RecipeFormat, TensorRole,
};
pub use state::{ModuleScaling, ScalingState, fmax_reduce};
pub use stats::Fp8TensorStats;
