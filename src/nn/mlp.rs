//! `LayerNormMLP`: norm, up projection, activation, down projection.

use super::init::child_seed;
use super::linear::Linear;
use super::linears::VisitLinears;
use super::no_forward;
use super::norm::{Norm, NormConfig};
use super::param::{Module, Parameter};
use super::replay::Replay;
use crate::amp::Precision;
use crate::dispatch::Backend;
use crate::error::Result;
use crate::scaling::DelayedSlot;
use crate::scaling::Fp8TensorStats;
use crate::tensor::Tensor;
use crate::tensor::scratch;
use crate::tensor::{DeviceKind, Dtype};

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activation {
    /// GELU (tanh form): `fc1` is `[ffn, hidden]`.
    #[default]
    Gelu,
    /// SwiGLU `silu(a) * b`: `fc1` is `[2 ffn, hidden]` (gate `a` first, then `b`).
    SwiGlu,
}

/// `Y = fc2(act(fc1(Norm(X))))` with `fc1: hidden -> ffn` (`2 ffn` for SwiGLU) and
/// `fc2: ffn -> hidden`. The norm output feeds fc1's cast directly under FP8; the
/// activation runs in f32 on the dtype-rounded fc1 output and is rounded again.
/// Parameters: `name.norm.*`, `name.fc1.*`, `name.fc2.*`.
pub struct LayerNormMLP {
    name: String,
    norm: Norm,
    fc1: Linear,
    fc2: Linear,
    activation: Activation,
    ffn: usize,
    dtype: Dtype,
    fused_cast: bool,
    replay: Replay,
    /// fc1's output (the activation's input), for the activation's backward.
    pre_activation: Option<Tensor>,
    /// The activation gradient's buffer from the last backward, for the next forward's
    /// activation output: glibc hands freed 4 MiB buffers back to the kernel, so fresh ones
    /// fault in every page again each step (docs/benchmarks.md, round 4). One buffer, taken
    /// at the forward's first use, so the forward's peak memory stays what it was (a second
    /// one would sit idle through the forward). Not counted by the memory ledger.
    spare: Option<Vec<f32>>,
    /// Where its ops run.
    backend: Backend,
}

impl LayerNormMLP {
    /// An MLP block over `hidden` features with `ffn` hidden units.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        hidden: usize,
        ffn: usize,
        activation: Activation,
        bias: bool,
        norm: NormConfig,
        recompute: bool,
        precision: &Precision,
        seed: u64,
    ) -> Result<Self> {
        let fc1_out = match activation {
            Activation::Gelu => ffn,
            Activation::SwiGlu => 2 * ffn,
        };
        Ok(LayerNormMLP {
            name: name.to_string(),
            norm: Norm::new(&format!("{name}.norm"), hidden, norm, precision)?,
            fc1: Linear::new(
                &format!("{name}.fc1"),
                hidden,
                fc1_out,
                bias,
                precision,
                child_seed(seed, 1),
            )?,
            fc2: Linear::new(
                &format!("{name}.fc2"),
                ffn,
                hidden,
                bias,
                precision,
                child_seed(seed, 2),
            )?,
            activation,
            ffn,
            dtype: precision.compute_dtype(),
            fused_cast: precision.is_fp8(),
            replay: Replay::new(recompute),
            pre_activation: None,
            spare: None,
            backend: Backend::default(),
        })
    }

    /// `x` `[tokens, hidden]` -> `[tokens, hidden]`.
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
        let a = self.fc1.forward_owned(normed, replay)?;
        let mut g = self.output_like(&a, a.rows(), self.ffn)?;
        match self.activation {
            Activation::Gelu => self.backend.kernels().gelu_forward(a.values(), g.values_mut())?,
            Activation::SwiGlu => {
                self.backend
                    .kernels()
                    .swiglu_forward(a.values(), a.rows(), self.ffn, g.values_mut())?
            }
        }
        self.backend.kernels().round(g.values_mut(), self.dtype)?;
        self.pre_activation = Some(a);
        self.fc2.forward_owned(g, replay)
    }

    /// dX; accumulates the parameter gradients.
    pub fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        if let Some(kept) = self.replay.take(&self.name)? {
            self.run(&kept.x, true)?;
        }
        let dg = self.fc2.backward(dy)?;
        let a = self.pre_activation.take().ok_or_else(|| no_forward(&self.name))?;
        let mut da = self.output_like(&dg, a.rows(), a.cols())?;
        match self.activation {
            Activation::Gelu => self
                .backend
                .kernels()
                .gelu_backward(dg.values(), a.values(), da.values_mut())?,
            Activation::SwiGlu => {
                self.backend
                    .kernels()
                    .swiglu_backward(dg.values(), a.values(), a.rows(), self.ffn, da.values_mut())?
            }
        }
        self.backend.kernels().round(da.values_mut(), self.dtype)?;
        a.recycle();
        dg.recycle();
        let dn = self.fc1.backward(&da)?;
        if da.device() == DeviceKind::Cpu {
            self.spare = Some(da.into_data());
        }
        self.norm.backward(&dn)
    }

    /// A `[rows, cols]` activation output or gradient where `like` lives: on the host in the
    /// spare buffer if it is left ([`Self::buffer`]), on a GPU a new array (the kernels write
    /// every element).
    fn output_like(&mut self, like: &Tensor, rows: usize, cols: usize) -> Result<Tensor> {
        match like.device() {
            DeviceKind::Cpu => Tensor::new(self.buffer(rows * cols), rows, cols),
            DeviceKind::Cuda(_) => self.backend.output_like(like, rows, cols),
        }
    }

    /// `len` values for an activation output or gradient, in the spare buffer if it is left
    /// (else a recycled one, `tensor::scratch`). Its contents are unspecified: both callers'
    /// kernels overwrite every element.
    fn buffer(&mut self, len: usize) -> Vec<f32> {
        match self.spare.take() {
            Some(values) if values.len() == len => values,
            other => {
                other.into_iter().for_each(scratch::recycle);
                scratch::overwritten(len)
            }
        }
    }

    pub(crate) fn clear_saved(&mut self) {
        self.norm.clear_saved();
        self.fc1.clear_saved();
        self.fc2.clear_saved();
        self.pre_activation = None;
        self.replay.clear();
    }
}

impl Module for LayerNormMLP {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.norm.visit(f);
        self.fc1.visit_parameters(f);
        self.fc2.visit_parameters(f);
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        self.backend = Backend::on(device);
        self.norm.set_backend(self.backend.clone());
        self.fc1.to_device(device)?;
        self.fc2.to_device(device)
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, &self.name);
        self.norm.check_against_cpu(on);
        self.fc1.check_against_cpu(on);
        self.fc2.check_against_cpu(on);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.fc1.visit_fp8_slots(f);
        self.fc2.visit_fp8_slots(f);
    }

    fn saved_activation_bytes(&self) -> usize {
        self.replay.bytes(self.dtype.bytes())
            + self.pre_activation.as_ref().map_or(0, |t| t.len() * self.dtype.bytes())
            + self.norm.saved_bytes()
            + self.fc1.saved_activation_bytes()
            + self.fc2.saved_activation_bytes()
    }

    fn weight_cache_bytes(&self) -> usize {
        self.fc1.weight_cache_bytes() + self.fc2.weight_cache_bytes()
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.fc1.collect_fp8_stats(out);
        self.fc2.collect_fp8_stats(out);
    }
}

impl VisitLinears for LayerNormMLP {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        f(&mut self.fc1);
        f(&mut self.fc2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(rows: usize, cols: usize, seed: f32) -> Tensor {
        let data = (0..rows * cols).map(|i| (i as f32 * seed).sin()).collect();
        Tensor::new(data, rows, cols).unwrap()
    }

    /// Everything a step produces: the output, dX and every parameter gradient, as bits.
    fn step(mlp: &mut LayerNormMLP, x: &Tensor, dy: &Tensor) -> Vec<u32> {
        mlp.visit_parameters(&mut |p| p.zero_grad());
        let mut bits: Vec<u32> = mlp.forward(x).unwrap().data().iter().map(|v| v.to_bits()).collect();
        bits.extend(mlp.backward(dy).unwrap().data().iter().map(|v| v.to_bits()));
        mlp.visit_parameters(&mut |p| bits.extend(p.grad().iter().map(|v| v.to_bits())));
        bits
    }

    /// A step on the buffers a previous step left (holding its values) gives the bits of a
    /// fresh layer's step, for both activations, in f32 and bf16.
    #[test]
    fn reused_activation_buffers_give_a_fresh_layers_bits() {
        let (tokens, hidden, ffn) = (24, 16, 40);
        for activation in [Activation::Gelu, Activation::SwiGlu] {
            for precision in [Precision::Fp32, Precision::Bf16] {
                let layer = || {
                    let norm = NormConfig::default();
                    LayerNormMLP::new("mlp", hidden, ffn, activation, true, norm, false, &precision, 3).unwrap()
                };
                let (x1, dy1) = (values(tokens, hidden, 0.37), values(tokens, hidden, 0.91));
                let (x2, dy2) = (values(tokens, hidden, 0.53), values(tokens, hidden, 0.29));
                let mut used = layer();
                step(&mut used, &x1, &dy1);
                assert!(used.spare.is_some(), "the backward keeps its gradient's buffer");
                let reused = step(&mut used, &x2, &dy2);
                assert_eq!(reused, step(&mut layer(), &x2, &dy2), "{activation:?} {precision:?}");
            }
        }
    }
}
