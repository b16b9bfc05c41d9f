//! Causal multi-head self-attention: QKV projection (optionally after a norm),
//! scaled dot-product attention with an f32 softmax, output projection.

use super::columns::{join_columns, split_columns};
use super::init::child_seed;
use super::layernorm_linear::LayerNormLinear;
use super::linear::Linear;
use super::linears::VisitLinears;
use super::no_forward;
use super::norm::NormConfig;
use super::param::{Module, Parameter};
use super::replay::Replay;
use crate::amp::Precision;
use crate::dispatch::{AttentionShape, Backend};
use crate::error::{Error, Result};
use crate::scaling::DelayedSlot;
use crate::scaling::Fp8TensorStats;
use crate::tensor::Tensor;
use crate::tensor::{DeviceKind, Dtype};

/// The QKV projection, with or without its input norm.
enum QkvProjection {
    Plain(Box<Linear>),
    Normed(Box<LayerNormLinear>),
}

/// What attention keeps for backward: q, k, v and the output (compute dtype) and the
/// f32 log-sum-exp per row, so backward never stores the `seq x seq` probabilities.
struct AttentionSaved {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    /// `[batch * heads * seq, 1]`.
    lse: Tensor,
    shape: AttentionShape,
}

/// `Y = proj(attention(split(qkv(X))))` over `[batch * seq, hidden]` tokens, causal
/// within each sequence. The QKV and output projections are [`Linear`] layers
/// (FP8 GEMMs under an FP8 policy, `name.qkv.*` and `name.proj.*`); attention itself
/// runs in the compute dtype with an f32 softmax. `qkv` output columns are `[q | k | v]`,
/// each `heads * head_dim` wide, head-major.
pub struct MultiheadAttention {
    name: String,
    hidden: usize,
    heads: usize,
    dtype: Dtype,
    qkv: QkvProjection,
    proj: Linear,
    replay: Replay,
    saved: Option<AttentionSaved>,
    /// Where its ops run.
    backend: Backend,
}

impl MultiheadAttention {
    /// `heads` heads over `hidden` features (`hidden % heads == 0`); with `input_norm` the QKV
    /// projection is a [`LayerNormLinear`] (pre-norm). `recompute`: backward recomputes everything
    /// from the saved input.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        hidden: usize,
        heads: usize,
        bias: bool,
        input_norm: Option<NormConfig>,
        recompute: bool,
        precision: &Precision,
        seed: u64,
    ) -> Result<Self> {
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(Error::LayerShape {
                layer: name.to_string(),
                detail: format!("hidden {hidden} is not divisible into {heads} heads"),
            });
        }
        let qkv_name = format!("{name}.qkv");
        let qkv = match input_norm {
            None => QkvProjection::Plain(Box::new(Linear::new(
                &qkv_name,
                hidden,
                3 * hidden,
                bias,
                precision,
                child_seed(seed, 1),
            )?)),
            Some(norm) => QkvProjection::Normed(Box::new(LayerNormLinear::new(
                &qkv_name,
                hidden,
                3 * hidden,
                bias,
                norm,
                false,
                precision,
                child_seed(seed, 1),
            )?)),
        };
        Ok(MultiheadAttention {
            name: name.to_string(),
            hidden,
            heads,
            dtype: precision.compute_dtype(),
            qkv,
            proj: Linear::new(
                &format!("{name}.proj"),
                hidden,
                hidden,
                bias,
                precision,
                child_seed(seed, 2),
            )?,
            replay: Replay::new(recompute),
            saved: None,
            backend: Backend::default(),
        })
    }

    /// Heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// `x` `[batch * seq, hidden]` -> `[batch * seq, hidden]`.
    pub fn forward(&mut self, x: &Tensor, batch: usize, seq: usize) -> Result<Tensor> {
        let y = self.run(x, batch, seq, false)?;
        if self.replay.enabled() {
            self.clear_saved();
            self.replay.keep(x, batch, seq);
        }
        Ok(y)
    }

    pub(crate) fn run(&mut self, x: &Tensor, batch: usize, seq: usize, replay: bool) -> Result<Tensor> {
        let tokens = batch.saturating_mul(seq);
        if x.rows() != tokens {
            return Err(Error::LayerShape {
                layer: self.name.clone(),
                detail: format!(
                    "input is {}x{}, batch {batch} x seq {seq} needs {tokens} rows",
                    x.rows(),
                    x.cols()
                ),
            });
        }
        x.expect(&self.name, "input", Some(tokens), self.hidden)?;
        let qkv = match &mut self.qkv {
            QkvProjection::Plain(linear) => linear.forward_pass(x, replay)?,
            QkvProjection::Normed(fused) => fused.run(x, replay)?,
        };
        let h = self.hidden;
        let [q, k, v] = split_columns(&self.backend, qkv.values(), qkv.rows(), [h, h, h])?;
        qkv.recycle();
        let shape = AttentionShape {
            batch,
            seq,
            heads: self.heads,
            head_dim: self.hidden / self.heads,
        };
        // The attention forward writes all of `out` (and `lse`), the backward all of dq, dk, dv.
        let mut out = self.backend.output_like(&q, tokens, self.hidden)?;
        let mut lse = self.backend.output_like(&q, batch * self.heads * seq, 1)?;
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        self.backend.kernels().attention_forward(
            q.values(),
            k.values(),
            v.values(),
            shape,
            scale,
            self.dtype,
            out.values_mut(),
            lse.values_mut(),
        )?;
        self.backend.kernels().round(out.values_mut(), self.dtype)?;
        // The output projection keeps its own copy of `out` for wgrad (the attention backward
        // keeps this one): handed over, so fp32 copies it once, not twice.
        let y = self.proj.forward_owned(out.kept_copy(), replay)?;
        self.saved = Some(AttentionSaved {
            q,
            k,
            v,
            out,
            lse,
            shape,
        });
        Ok(y)
    }

    /// dX; accumulates the parameter gradients.
    pub fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        if let Some(kept) = self.replay.take(&self.name)? {
            self.run(&kept.x, kept.batch, kept.seq, true)?;
        }
        let dout = self.proj.backward(dy)?;
        let s = self.saved.take().ok_or_else(|| no_forward(&self.name))?;
        let (rows, cols) = s.q.shape();
        let mut grads = Vec::with_capacity(3);
        for _ in 0..3 {
            grads.push(self.backend.output_like(&dout, rows, cols)?);
        }
        let [mut dq, mut dk, mut dv]: [Tensor; 3] = grads.try_into().expect("three gradients");
        let scale = 1.0 / (s.shape.head_dim as f32).sqrt();
        self.backend.kernels().attention_backward(
            dout.values(),
            s.q.values(),
            s.k.values(),
            s.v.values(),
            s.out.values(),
            s.lse.values(),
            s.shape,
            scale,
            self.dtype,
            dq.values_mut(),
            dk.values_mut(),
            dv.values_mut(),
        )?;
        let mut dqkv = join_columns(&self.backend, [&dq, &dk, &dv])?;
        for dead in [dout, s.q, s.k, s.v, s.out, s.lse, dq, dk, dv] {
            dead.recycle();
        }
        self.backend.kernels().round(dqkv.values_mut(), self.dtype)?;
        let dx = match &mut self.qkv {
            QkvProjection::Plain(linear) => linear.backward(&dqkv),
            QkvProjection::Normed(fused) => fused.backward(&dqkv),
        };
        dqkv.recycle();
        dx
    }

    pub(crate) fn clear_saved(&mut self) {
        match &mut self.qkv {
            QkvProjection::Plain(linear) => linear.clear_saved(),
            QkvProjection::Normed(fused) => fused.clear_saved(),
        }
        self.proj.clear_saved();
        self.saved = None;
        self.replay.clear();
    }

    fn qkv_module(&mut self) -> &mut dyn Module {
        match &mut self.qkv {
            QkvProjection::Plain(linear) => linear.as_mut(),
            QkvProjection::Normed(fused) => fused.as_mut(),
        }
    }

    fn qkv_ref(&self) -> &dyn Module {
        match &self.qkv {
            QkvProjection::Plain(linear) => linear.as_ref(),
            QkvProjection::Normed(fused) => fused.as_ref(),
        }
    }
}

impl Module for MultiheadAttention {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.qkv_module().visit_parameters(f);
        self.proj.visit_parameters(f);
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        self.backend = Backend::on(device);
        self.qkv_module().to_device(device)?;
        self.proj.to_device(device)
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, &self.name);
        self.qkv_module().check_against_cpu(on);
        self.proj.check_against_cpu(on);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.qkv_module().visit_fp8_slots(f);
        self.proj.visit_fp8_slots(f);
    }

    fn saved_activation_bytes(&self) -> usize {
        let attention = self.saved.as_ref().map_or(0, |s| {
            (s.q.len() + s.k.len() + s.v.len() + s.out.len()) * self.dtype.bytes() + 4 * s.lse.len()
        });
        self.replay.bytes(self.dtype.bytes())
            + attention
            + self.qkv_ref().saved_activation_bytes()
            + self.proj.saved_activation_bytes()
    }

    fn weight_cache_bytes(&self) -> usize {
        self.qkv_ref().weight_cache_bytes() + self.proj.weight_cache_bytes()
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.qkv_ref().collect_fp8_stats(out);
        self.proj.collect_fp8_stats(out);
    }
}

impl VisitLinears for MultiheadAttention {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        match &mut self.qkv {
            QkvProjection::Plain(linear) => f(linear),
            QkvProjection::Normed(fused) => fused.visit_linears(f),
        }
        f(&mut self.proj);
    }
}
