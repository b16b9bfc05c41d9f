//! Per-tensor FP8 statistics of one step, cheap enough to leave on: what the
//! quantizer saw (amax), what it used (scale), and what the format did to the
//! values (saturated, flushed to zero, non-finite).

use serde::{Deserialize, Serialize};

/// Statistics of one FP8 tensor slot (e.g. `layers.0.mlp.fc1.input`) for one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fp8TensorStats {
    /// Slot name: the layer's name, a dot, the role (`input`, `weight`, `output_grad`, ...).
    pub name: String,
    /// `e4m3` or `e5m2`.
    pub format: String,
    /// max |x| this step observed (NaN if a NaN was seen).
    pub amax: f32,
    /// The scale this step's cast multiplied by (for block recipes: the largest block scale).
    pub scale: f32,
    /// Share of elements that were clamped to the format's max finite value.
    pub saturated: f64,
    /// Share of non-zero elements that became zero.
    pub underflow: f64,
    /// Count of inf/NaN elements in the input.
    pub nonfinite: u64,
}
