//! Transformer layers with forward and backward on the CPU reference backend,
//! and the parameter type the training stack updates.

mod param;

pub use param::{Module, Parameter};
