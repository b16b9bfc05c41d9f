//! Automatic mixed precision: which precision a model trains in, and the
//! dynamic loss scaler that fp16 needs.
//!
//! * [`Precision`]: `Fp32`, `Bf16`, `Fp16` (with dynamic loss scaling, done by the
//!   training loop) or `Fp8(recipe)`.
//! * [`PrecisionChoice`]: what the user asked for, `auto` or a fixed precision.
//! * [`resolve`]: turns a choice into a precision for a device, with the reason.
//!   The GPU capability table is [`crate::device::PrecisionPolicy`]; this module
//!   only maps it onto precisions.
//! * [`loss_scaler::DynamicLossScaler`]: the scaler of `docs/training.md` (2^16, x2, x0.5, 2000 steps).

pub mod loss_scaler;
mod precision;

pub use precision::{Fp8Recipe, Precision, PrecisionChoice, resolve};
