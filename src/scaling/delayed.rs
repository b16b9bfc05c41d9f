//! `docs/numerics.md`, delayed scaling: one delayed-scaling slot, its amax history and its update.
//!
//! Step N casts with the scale derived from amaxes up to step N-1; the first
//! step uses 1.0. `history[0]` collects the running step's amax; the update
//! rolls it into the window and recomputes the scale.

use serde::{Deserialize, Serialize};

use super::recipe::{AmaxComputeAlgo, DelayedScaling};
use crate::format::Fp8Format;

/// Scale, scale_inv and amax history of one delayed-scaled tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DelayedSlot {
    /// The scale the next cast multiplies by.
    #[serde(with = "super::exact_f32")]
    pub scale: f32,
    /// `1/scale` as written by the last cast (it lags `scale` until the next cast).
    #[serde(with = "super::exact_f32")]
    pub scale_inv: f32,
    /// `history[0]`: this step's amax so far; `history[1..]`: earlier steps, oldest first.
    #[serde(with = "super::exact_f32::vec")]
    pub history: Vec<f32>,
}

impl DelayedSlot {
    /// Scale 1.0 and a history of `len` zeros (`len >= 1`, checked by
    /// [`DelayedScaling::validate`]; a zero is raised to 1 here).
    pub fn new(len: usize) -> Self {
        DelayedSlot {
            scale: 1.0,
            scale_inv: 1.0,
            history: vec![0.0; len.max(1)],
        }
    }

    /// This step's amax so far (`history[0]`).
    pub fn current_amax(&self) -> f32 {
        self.history[0]
    }

    /// Accumulates one cast's amax into `history[0]` with `fmaxf` semantics,
    /// as the cast kernels' atomic max does (a NaN amax is ignored).
    pub fn record_amax(&mut self, amax: f32) {
        self.history[0] = self.history[0].max(amax);
    }

    /// What a cast with [`Self::scale`] leaves behind (`docs/numerics.md`, delayed scaling, step 6): its amax
    /// accumulated into `history[0]` and `scale_inv = 1/scale` (correctly rounded).
    pub fn record_cast(&mut self, amax: f32) {
        self.record_amax(amax);
        self.scale_inv = 1.0 / self.scale;
    }

    /// Overwrites `history[0]` (a cross-group reduction's result, or a replayed trace).
    pub fn set_current_amax(&mut self, amax: f32) {
        self.history[0] = amax;
    }

    /// The delayed-scaling update of `docs/numerics.md`, steps 1-5, for a tensor of `format`.
    pub fn update(&mut self, recipe: &DelayedScaling, format: Fp8Format) {
        update_in_place(&mut self.scale, &mut self.history, recipe, format);
    }
}

/// [`DelayedSlot::update`] on a slot's scale and history wherever they are stored (a slot
/// bank keeps them in shared vectors). `history` must not be empty.
pub(crate) fn update_in_place(scale: &mut f32, history: &mut [f32], recipe: &DelayedScaling, format: Fp8Format) {
    let last = history[0];
    // A slot whose tensor was not cast this step keeps everything (NaN != 0, so NaN rolls in).
    if last == 0.0 {
        return;
    }
    let amax = match recipe.amax_compute_algo {
        // f32::max ignores a NaN operand, so the fold is NaN only if every entry is.
        AmaxComputeAlgo::Max => history[1..].iter().fold(last, |acc, &h| acc.max(h)),
        AmaxComputeAlgo::MostRecent => last,
    };
    // Drop the oldest entry (history[1]), append `last`, clear slot 0.
    let len = history.len();
    if len > 1 {
        history.copy_within(2.., 1);
        history[len - 1] = last;
    }
    history[0] = 0.0;
    if amax.is_finite() && amax > 0.0 {
        let next = recipe.scaled_max(format) / amax;
        // A tiny amax gives inf; the largest finite scale is the closest usable value.
        *scale = if next.is_infinite() { f32::MAX } else { next };
    }
}
