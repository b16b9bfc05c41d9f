//! Transformer layers with forward and backward on the CPU reference backend,
//! and the parameter type the training stack updates.

mod param;
mod stats;

pub use param::{Module, Parameter};
pub use stats::Fp8TensorStats;
