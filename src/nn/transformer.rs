//! `TransformerLayer`: pre-norm attention and MLP blocks with residuals.

use super::attention::MultiheadAttention;
use super::init::child_seed;
use super::linear::Linear;
use super::linears::VisitLinears;
use super::mlp::{Activation, LayerNormMLP};
use super::norm::{NormConfig, NormKind};
use super::param::{Module, Parameter};
use super::replay::Replay;
use crate::amp::Precision;
use crate::dispatch::Backend;
use crate::error::Result;
use crate::scaling::DelayedSlot;
use crate::scaling::Fp8TensorStats;
use crate::tensor::Tensor;
use crate::tensor::{DeviceKind, Dtype};

/// Shape and options of a [`TransformerLayer`].
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Model width.
    pub hidden: usize,
    /// Attention heads (`hidden % heads == 0`).
    pub heads: usize,
    /// MLP hidden units.
    pub ffn_hidden: usize,
    /// MLP activation.
    pub activation: Activation,
    /// Norm before attention and before the MLP.
    pub norm: NormKind,
    /// Norm epsilon.
    pub eps: f32,
    /// Zero-centred gamma in both norms.
    pub zero_centered_gamma: bool,
    /// Biases in every linear layer.
    pub bias: bool,
    /// Activation recompute: forward keeps only the layer input, backward recomputes the rest.
    pub recompute: bool,
}

impl Default for TransformerConfig {
    fn default() -> Self {
        TransformerConfig {
            hidden: 256,
            heads: 4,
            ffn_hidden: 1024,
            activation: Activation::Gelu,
            norm: NormKind::LayerNorm,
            eps: 1e-5,
            zero_centered_gamma: false,
            bias: true,
            recompute: false,
        }
    }
}

impl TransformerConfig {
    fn norm_config(&self) -> NormConfig {
        NormConfig {
            kind: self.norm,
            eps: self.eps,
            zero_centered_gamma: self.zero_centered_gamma,
        }
    }
}

/// `h = x + attn(norm1(x)); y = h + mlp(norm2(h))` over `[batch * seq, hidden]`.
/// Parameters: `name.attn.qkv.norm.*`, `name.attn.qkv.linear.*`, `name.attn.proj.*`,
/// `name.mlp.norm.*`, `name.mlp.fc1.*`, `name.mlp.fc2.*`. Residual sums in f32, stored
/// in the compute dtype.
pub struct TransformerLayer {
    name: String,
    config: TransformerConfig,
    dtype: Dtype,
    attn: MultiheadAttention,
    mlp: LayerNormMLP,
    replay: Replay,
    /// Where its ops run.
    backend: Backend,
}

impl TransformerLayer {
    /// A layer with parameters drawn from `seed`.
    pub fn new(name: &str, config: &TransformerConfig, precision: &Precision, seed: u64) -> Result<Self> {
        let norm = config.norm_config();
        Ok(TransformerLayer {
            name: name.to_string(),
            config: config.clone(),
            dtype: precision.compute_dtype(),
            attn: MultiheadAttention::new(
                &format!("{name}.attn"),
                config.hidden,
                config.heads,
                config.bias,
                Some(norm),
                false,
                precision,
                child_seed(seed, 1),
            )?,
            mlp: LayerNormMLP::new(
                &format!("{name}.mlp"),
                config.hidden,
                config.ffn_hidden,
                config.activation,
                config.bias,
                norm,
                false,
                precision,
                child_seed(seed, 2),
            )?,
            replay: Replay::new(config.recompute),
            backend: Backend::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// `x` `[batch * seq, hidden]` -> `[batch * seq, hidden]`.
    /// The output lives where `x` does. On a GPU (unless `FP8_CUDA_RESIDENT=0`), a host `x` goes up
    /// once, every op between reads and writes device tensors, and the output comes back down
    /// (a device `x` stays there either way).
    pub fn forward(&mut self, x: &Tensor, batch: usize, seq: usize) -> Result<Tensor> {
        self.backend.clone().resident_boundary(x, |x| {
            let y = self.run(x, batch, seq, false)?;
            if self.replay.enabled() {
                self.clear_saved();
                self.replay.keep(x, batch, seq);
            }
            Ok(y)
        })
    }

    fn run(&mut self, x: &Tensor, batch: usize, seq: usize, replay: bool) -> Result<Tensor> {
        let a = self.attn.run(x, batch, seq, replay)?;
        let h = self.residual(x, &a)?;
        a.recycle();
        let m = self.mlp.run(&h, replay)?;
        let y = self.residual(&h, &m);
        h.recycle();
        m.recycle();
        y
    }

    fn residual(&self, x: &Tensor, f: &Tensor) -> Result<Tensor> {
        let mut sum = self.backend.output_like(x, x.rows(), x.cols())?;
        self.backend
            .kernels()
            .residual_add(x.values(), f.values(), self.dtype, sum.values_mut())?;
        Ok(sum)
    }

    /// Drops what the last forward kept for backward (after an evaluation-only forward).
    pub fn clear_saved(&mut self) {
        self.attn.clear_saved();
        self.mlp.clear_saved();
        self.replay.clear();
    }

    /// dX, where `dy` lives (uploaded and brought back as in [`Self::forward`]); accumulates
    /// every parameter gradient.
    pub fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        if let Some(kept) = self.replay.take(&self.name)? {
            self.run(&kept.x, kept.batch, kept.seq, true)?;
        }
        dy.expect(&self.name, "output gradient", None, self.config.hidden)?;
        self.backend.clone().resident_boundary(dy, |dy| {
            let dm = self.mlp.backward(dy)?;
            let dh = self.residual(dy, &dm)?;
            dm.recycle();
            let da = self.attn.backward(&dh)?;
            let dx = self.residual(&dh, &da)?;
            dh.recycle();
            da.recycle();
            Ok(dx)
        })
    }
}

impl Module for TransformerLayer {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.attn.visit_parameters(f);
        self.mlp.visit_parameters(f);
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        self.backend = Backend::on(device);
        self.attn.to_device(device)?;
        self.mlp.to_device(device)
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, &self.name);
        self.attn.check_against_cpu(on);
        self.mlp.check_against_cpu(on);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.attn.visit_fp8_slots(f);
        self.mlp.visit_fp8_slots(f);
    }

    fn saved_activation_bytes(&self) -> usize {
        self.replay.bytes(self.dtype.bytes()) + self.attn.saved_activation_bytes() + self.mlp.saved_activation_bytes()
    }

    fn weight_cache_bytes(&self) -> usize {
        self.attn.weight_cache_bytes() + self.mlp.weight_cache_bytes()
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.attn.collect_fp8_stats(out);
        self.mlp.collect_fp8_stats(out);
    }
}

impl VisitLinears for TransformerLayer {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        self.attn.visit_linears(f);
        self.mlp.visit_linears(f);
    }
}
