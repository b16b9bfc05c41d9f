//! `LayerNormLinear`: a norm whose output goes straight into a linear layer's cast.

use super::init::child_seed;
use super::linear::Linear;
use super::linears::VisitLinears;
use super::norm::{Norm, NormConfig};
use super::param::{Module, Parameter};
use super::replay::Replay;
use crate::amp::Precision;
use crate::dispatch::Backend;
use crate::error::Result;
use crate::scaling::DelayedSlot;
use crate::scaling::Fp8TensorStats;
use crate::tensor::DeviceKind;
use crate::tensor::Tensor;

/// `Y = Linear(Norm(X))`. Under FP8 the f32 norm output is cast to E4M3 directly (the
/// fused norm + cast of TE), never stored in bf16; under the other precisions it is
/// rounded to the compute dtype first. Parameters: `name.norm.*`, `name.linear.*`.
pub struct LayerNormLinear {
    name: String,
    norm: Norm,
    linear: Linear,
    fused_cast: bool,
    replay: Replay,
}

impl LayerNormLinear {
    /// Norm over `in_features`, then a linear layer to `out_features`. `recompute`: forward keeps only
    /// its input and backward recomputes the rest.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
        norm: NormConfig,
        recompute: bool,
        precision: &Precision,
        seed: u64,
    ) -> Result<Self> {
        Ok(LayerNormLinear {
            name: name.to_string(),
            norm: Norm::new(&format!("{name}.norm"), in_features, norm, precision)?,
            linear: Linear::new(
                &format!("{name}.linear"),
                in_features,
                out_features,
                bias,
                precision,
                child_seed(seed, 1),
            )?,
            fused_cast: precision.is_fp8(),
            replay: Replay::new(recompute),
        })
    }

    /// The linear part.
    pub fn linear(&self) -> &Linear {
        &self.linear
    }

    /// `x` `[tokens, in]` -> `[tokens, out]`.
    pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        let y = self.run(x, false)?;
        if self.replay.enabled() {
            self.clear_saved();
            self.replay.keep(x, x.rows(), 1);
        }
        Ok(y)
    }

    pub(crate) fn run(&mut self, x: &Tensor, replay: bool) -> Result<Tensor> {
        let normed = if self.fused_cast {
            self.norm.forward_f32(x)?
        } else {
            self.norm.forward(x)?
        };
        self.linear.forward_owned(normed, replay)
    }

    /// dX; accumulates the parameter gradients.
    pub fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        if let Some(kept) = self.replay.take(&self.name)? {
            self.run(&kept.x, true)?;
        }
        let dn = self.linear.backward(dy)?;
        self.norm.backward(&dn)
    }

    pub(crate) fn clear_saved(&mut self) {
        self.norm.clear_saved();
        self.linear.clear_saved();
        self.replay.clear();
    }
}

impl Module for LayerNormLinear {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.norm.visit(f);
        self.linear.visit_parameters(f);
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        self.norm.set_backend(Backend::on(device));
        self.linear.to_device(device)
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.norm.check_against_cpu(on);
        self.linear.check_against_cpu(on);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.linear.visit_fp8_slots(f);
    }

    fn saved_activation_bytes(&self) -> usize {
        self.replay.bytes(self.dtype_bytes()) + self.norm.saved_bytes() + self.linear.saved_activation_bytes()
    }

    fn weight_cache_bytes(&self) -> usize {
        self.linear.weight_cache_bytes()
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.linear.collect_fp8_stats(out);
    }
}

impl VisitLinears for LayerNormLinear {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        f(&mut self.linear);
    }
}

impl LayerNormLinear {
    fn dtype_bytes(&self) -> usize {
        self.linear.precision().compute_dtype().bytes()
    }
}
