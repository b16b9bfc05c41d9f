//! LoRA adapters: `y = W x + (alpha / r) B (A dropout(x))` added to a slice of a frozen
//! [`super::Linear`]'s outputs.
//!
//! A layer that fuses several projections (q/k/v, gate/up) carries one adapter per projection,
//! each on its own row range of the fused output, as PEFT keeps one `lora_A`/`lora_B` pair per
//! module. `A` `[r, in]` starts Kaiming-uniform with PEFT's `a = sqrt(5)`, which is
//! `U(-1/sqrt(in), 1/sqrt(in))`; `B` `[out, r]` starts at zero, so a fresh adapter changes
//! nothing. Both are f32 masters; their two GEMMs run in the layer's precision through the same
//! [`LinearGemms`] as every other linear layer (FP8 needs `r` to be a multiple of 16).
//! Dropout masks come from the adapter's seed and its count of training forwards, so a run is
//! reproducible and a recompute replays the same mask.

use super::columns::{put_columns, take_columns};
use super::init::{SplitMix64, child_seed};
use super::linear_gemms::LinearGemms;
use super::param::Parameter;
use crate::amp::Precision;
use crate::dispatch::{Backend, Values};
use crate::error::{Error, Result};
use crate::ops::DropoutMask;
use crate::scaling::{DelayedSlot, Fp8TensorStats};
use crate::tensor::{Dtype, Tensor};

/// Rank, scale and dropout shared by every adapter of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraSettings {
    /// Rank `r` (inner dimension of `B A`).
    pub rank: usize,
    /// `alpha`: the update is scaled by `alpha / r`.
    pub alpha: f32,
    /// Probability that an input feature is zeroed before `A` (training forwards only).
    pub dropout: f32,
}

impl LoraSettings {
    /// Checks rank > 0, finite alpha and dropout in `[0, 1)`.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting: &'static str, value: String, reason: &str| {
            Err(Error::InvalidSetting {
                setting,
                value,
                reason: reason.into(),
            })
        };
        if self.rank == 0 {
            return bad("lora-rank", "0".into(), "the rank must be at least 1");
        }
        if !self.alpha.is_finite() {
            return bad("lora-alpha", self.alpha.to_string(), "must be finite");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("lora-dropout", self.dropout.to_string(), "must be in [0, 1)");
        }
        Ok(())
    }

    /// `alpha / r` in f64 (the merge uses it as is, the forward rounds it to f32 once).
    pub fn scale_f64(&self) -> f64 {
        self.alpha as f64 / self.rank as f64
    }
}

/// One adapter on output rows `offset..offset + out` of its layer.
pub struct LoraAdapter {
    module: String,
    offset: usize,
    out: usize,
    in_features: usize,
    settings: LoraSettings,
    a: Parameter,
    b: Parameter,
    gemm_a: LinearGemms,
    gemm_b: LinearGemms,
    dtype: Dtype,
    seed: u64,
    /// Training forwards run so far: the dropout mask of forward `n` is drawn from `(seed, n)`.
    forwards: u64,
    /// Whether dropout applies (training); evaluation turns it off.
    dropout_active: bool,
    /// The dropout mask of the last training forward (its multipliers are computed where they
    /// are used: `ops::dropout`), which its backward applies again.
    mask: Option<DropoutMask>,
}

impl LoraAdapter {
    /// An adapter named `module` (its parameters are `module.lora_A.weight` `[r, in]` and
    /// `module.lora_B.weight` `[out, r]`) on rows `offset..offset + out` of a layer with
    /// `in_features` inputs.
    pub fn new(
        module: &str,
        offset: usize,
        out: usize,
        in_features: usize,
        settings: &LoraSettings,
        precision: &Precision,
        seed: u64,
    ) -> Result<Self> {
        settings.validate()?;
        let r = settings.rank;
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        let mut rng = SplitMix64::new(child_seed(seed, 1));
        let a_init = (0..r * in_features)
            .map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * bound)
            .map(|v| v as f32)
            .collect();
        Ok(LoraAdapter {
            module: module.to_string(),
            offset,
            out,
            in_features,
            settings: *settings,
            a: Parameter::new(format!("{module}.lora_A.weight"), &[r, in_features], a_init)?,
            b: Parameter::new(format!("{module}.lora_B.weight"), &[out, r], vec![0.0; out * r])?,
            gemm_a: LinearGemms::new(&format!("{module}.lora_A"), in_features, r, precision)?,
            gemm_b: LinearGemms::new(&format!("{module}.lora_B"), r, out, precision)?,
            dtype: precision.compute_dtype(),
            seed: child_seed(seed, 2),
            forwards: 0,
            dropout_active: true,
            mask: None,
        })
    }

    /// The module name, e.g. `model.layers.0.self_attn.q_proj`.
    pub fn module(&self) -> &str {
        &self.module
    }

    /// First output row of the layer this adapter adds to, and how many rows.
    pub fn rows(&self) -> (usize, usize) {
        (self.offset, self.out)
    }

    /// `A` `[r, in]`.
    pub fn a(&self) -> &Parameter {
        &self.a
    }

    /// `B` `[out, r]`.
    pub fn b(&self) -> &Parameter {
        &self.b
    }

    /// Rank, alpha, dropout.
    pub fn settings(&self) -> &LoraSettings {
        &self.settings
    }

    /// Training forwards run so far (the dropout mask of the next one is drawn from this + 1).
    pub fn training_forwards(&self) -> u64 {
        self.forwards
    }

    /// Sets the count of training forwards run so far, so that a resumed run draws the masks the
    /// uninterrupted run would have drawn next (one forward per micro-batch of each step).
    pub fn set_training_forwards(&mut self, forwards: u64) {
        self.forwards = forwards;
    }

    pub(crate) fn set_dropout_active(&mut self, on: bool) {
        self.dropout_active = on;
    }

    pub(crate) fn set_backend(&mut self, backend: crate::dispatch::Backend) {
        self.gemm_a.set_backend(backend.clone());
        self.gemm_b.set_backend(backend);
    }

    pub(crate) fn check_against_cpu(&mut self, on: bool) {
        self.gemm_a.check_against_cpu(on);
        self.gemm_b.check_against_cpu(on);
    }

    /// The dropout mask of training forward `n`: the stream of `(seed, n)`.
    fn mask_of(&self, n: u64) -> Result<DropoutMask> {
        DropoutMask::new(child_seed(self.seed, n), self.settings.dropout)
    }

    /// Adds `(alpha / r) B (A dropout(x))` to columns `offset..offset + out` of every row of `y`
    /// (`[rows, y_cols]`, already rounded to the compute dtype), rounding the sum again, through
    /// the ops on `x` and `y` wherever they live. A training forward with dropout draws a new
    /// mask (a replay, the recompute of a forward, draws that forward's again).
    pub(crate) fn forward_add_on(
        &mut self,
        backend: &Backend,
        x: Values,
        rows: usize,
        y: &mut Tensor,
        replay: bool,
    ) -> Result<()> {
        self.mask = None;
        // A and B live where `x` does, as a linear's weight (`Parameter::value_where`): their
        // casts read them there and the optimizer's arenas update them in place.
        for p in [&mut self.a, &mut self.b] {
            p.value_where(backend, x.device(), self.dtype)?;
        }
        let dropped = match self.dropout_active && self.settings.dropout > 0.0 {
            true => {
                // A replay redraws its forward's mask; a new forward counts once its mask is made.
                let n = if replay { self.forwards } else { self.forwards + 1 };
                let mask = self.mask_of(n)?;
                let mut d = backend.output_at(x.device(), rows, self.in_features)?;
                backend.kernels().dropout(x, mask, self.dtype, d.values_mut())?;
                (self.forwards, self.mask) = (n, Some(mask));
                Some(d)
            }
            false => None,
        };
        let x = dropped.as_ref().map_or(x, Tensor::values);
        let h = self.gemm_a.forward(x, rows, &self.a, None, replay)?;
        if let Some(d) = dropped {
            d.recycle();
        }
        let mut u = self.gemm_b.forward(h.values(), rows, &self.b, None, replay)?;
        h.recycle();
        let kernels = backend.kernels();
        kernels.multiply(u.values_mut(), self.settings.scale_f64() as f32)?;
        add_columns(backend, &u, y, self.offset, self.dtype)?;
        u.recycle();
        Ok(())
    }

    /// Accumulates dA and dB from `dy` (`[rows, dy_cols]`, the layer's output gradient) where it
    /// lives (`Parameter::grad_where`) and adds this adapter's share to `dx` `[rows, in]`,
    /// through the forward's dropout mask if it drew one, rounding it again: through the ops, on
    /// `dy` and `dx` wherever they live.
    pub(crate) fn backward_add_on(
        &mut self,
        backend: &Backend,
        dy: Values,
        dy_cols: usize,
        dx: &mut Tensor,
    ) -> Result<()> {
        let rows = dy.len() / dy_cols.max(1);
        let kernels = backend.kernels();
        let mut du = take_columns(backend, dy, rows, dy_cols, self.offset, self.out)?;
        kernels.multiply(du.values_mut(), self.settings.scale_f64() as f32)?;
        kernels.round(du.values_mut(), self.dtype)?;
        for p in [&mut self.a, &mut self.b] {
            p.grad_where(backend, dy.device(), self.dtype)?;
        }
        let dh = self
            .gemm_b
            .backward(du.values(), None, self.b.trainable_grad_values(), None)?;
        du.recycle();
        let dxd = self
            .gemm_a
            .backward(dh.values(), None, self.a.trainable_grad_values(), None)?;
        dh.recycle();
        match self.mask.take() {
            Some(mask) => kernels.dropout_add(dxd.values(), mask, self.dtype, dx.values_mut())?,
            None => add_columns(backend, &dxd, dx, 0, self.dtype)?,
        }
        dxd.recycle();
        Ok(())
    }

    /// `W + (alpha / r) B A` for this adapter's rows of `weight` (`[layer out, in]`, f32): each
    /// value is `W + s * sum_k B[o,k] A[k,i]` computed in f64 (products of two f32 are exact in
    /// f64; the sum runs over `k` ascending; `s = alpha / r` in f64) and rounded to f32 once.
    pub fn merge_into(&self, weight: &mut [f32]) {
        let (r, inp, s) = (self.settings.rank, self.in_features, self.settings.scale_f64());
        let (a, b) = (self.a.value(), self.b.value());
        for o in 0..self.out {
            let row = &mut weight[(self.offset + o) * inp..(self.offset + o + 1) * inp];
            for (i, w) in row.iter_mut().enumerate() {
                let delta: f64 = (0..r).map(|k| b[o * r + k] as f64 * a[k * inp + i] as f64).sum();
                *w = (*w as f64 + s * delta) as f32;
            }
        }
    }

    pub(crate) fn clear_saved(&mut self) {
        self.gemm_a.clear_saved();
        self.gemm_b.clear_saved();
        self.mask = None;
    }

    pub(crate) fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        f(&mut self.a);
        f(&mut self.b);
    }

    pub(crate) fn visit_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.gemm_a.visit_slots(f);
        self.gemm_b.visit_slots(f);
    }

    /// Calls `f` on the adapter's two GEMM sets (A's, then B's).
    pub(crate) fn visit_gemms(&mut self, f: &mut dyn FnMut(&mut LinearGemms)) {
        f(&mut self.gemm_a);
        f(&mut self.gemm_b);
    }

    pub(crate) fn saved_bytes(&self) -> usize {
        self.gemm_a.saved_bytes() + self.gemm_b.saved_bytes() + self.mask.map_or(0, |_| size_of::<DropoutMask>())
    }

    pub(crate) fn weight_cache_bytes(&self) -> usize {
        self.gemm_a.weight_cache_bytes() + self.gemm_b.weight_cache_bytes()
    }

    pub(crate) fn collect_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.gemm_a.collect_stats(out);
        self.gemm_b.collect_stats(out);
    }
}

/// `y[:, first..first + n] = round(y[:, first..first + n] + f)` for `f` `[rows, n]` and `y`
/// `[rows, y_cols]` wherever they live, as `dtype.round(y + f)` per element.
fn add_columns(backend: &Backend, f: &Tensor, y: &mut Tensor, first: usize, dtype: Dtype) -> Result<()> {
    let kernels = backend.kernels();
    let (rows, n, y_cols) = (f.rows(), f.cols(), y.cols());
    let mut sum = backend.output_at(y.device(), rows, n)?;
    if n == y_cols {
        kernels.residual_add(y.values(), f.values(), dtype, sum.values_mut())?;
        std::mem::replace(y, sum).recycle();
        return Ok(());
    }
    let part = take_columns(backend, y.values(), rows, y_cols, first, n)?;
    kernels.residual_add(part.values(), f.values(), dtype, sum.values_mut())?;
    put_columns(backend, sum.values(), n, y, first)?;
    part.recycle();
    sum.recycle();
    Ok(())
}
