//! Launchers of `cuda/attention.cu`: the causal attention core, forward and
//! backward, a simple correct fused kernel (one block per query row forward
//! and for dq, one per key row for dk/dv; scores of a row in shared memory).
//! Twins: `ops::attention_forward/backward`, with the probabilities rounded to
//! the compute dtype at the same point (`docs/numerics.md`, Attention); within
//! the reduction bound for f32, the dtype's tolerance for bf16/fp16. Unless
//! `FP8_CUDA_ATTENTION_MMA=0`, the tensor-core kernels of `cuda/attention_mma.cu`
//! run instead where they apply (bf16/fp16, head_dim a multiple of 16 up to 128,
//! sm_80+, a passed self-check: [`super::attention_mma::route`]); the simple
//! kernels stay the fallback.

use super::attention_mma;
use super::attention_simple::{base_params, simple_backward, simple_forward};
use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::op_args::{check_len, elements};
use crate::error::Result;
use crate::memory::MemoryCategory;
use crate::ops::AttentionShape;
// The twin's own test: an empty batch does nothing, heads without features are an error.
use crate::ops::attention::nothing_to_do;
use crate::tensor::Dtype;

/// `(tokens * hidden, batch * heads * seq)`: the lengths of q/k/v/out and of lse.
fn lengths(kernel: &'static str, shape: &AttentionShape) -> Result<(usize, usize)> {
    let tokens = elements(kernel, shape.batch, shape.seq)?;
    let hidden = elements(kernel, shape.heads, shape.head_dim)?;
    Ok((
        elements(kernel, tokens, hidden)?,
        elements(kernel, tokens, shape.heads)?,
    ))
}

impl CudaDevice {
    /// Causal attention forward: `out` (rounded to `dtype`) and `lse [batch, heads, seq]`.
    /// Twin of `ops::attention_forward`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_forward(
        &self,
        q: &DeviceBuffer<f32>,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        shape: AttentionShape,
        softmax_scale: f32,
        dtype: Dtype,
        out: &mut DeviceBuffer<f32>,
        lse: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "attention_forward";
        let (n, stats) = lengths(K, &shape)?;
        for (what, len) in [("q", q.len()), ("k", k.len()), ("v", v.len()), ("out", out.len())] {
            check_len(K, what, len, n)?;
        }
        check_len(K, "lse", lse.len(), stats)?;
        if nothing_to_do(&shape)? {
            return Ok(());
        }
        let mut p = base_params(K, &shape, softmax_scale, dtype)?;
        p.q = q.address(self);
        p.k = k.address(self);
        p.v = v.address(self);
        p.out = out.address_mut(self);
        p.lse = lse.address_mut(self);
        if let Some(variant) = attention_mma::route(self, &shape, dtype, &p) {
            return attention_mma::forward(self, &shape, variant, p);
        }
        simple_forward(self, K, &shape, p)
    }

    /// Causal attention backward from the forward's `out` and `lse`: overwrites `dq`, `dk`, `dv`
    /// (rounded to `dtype`). Twin of `ops::attention_backward`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        dout: &DeviceBuffer<f32>,
        q: &DeviceBuffer<f32>,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        out: &DeviceBuffer<f32>,
        lse: &DeviceBuffer<f32>,
        shape: AttentionShape,
        softmax_scale: f32,
        dtype: Dtype,
        dq: &mut DeviceBuffer<f32>,
        dk: &mut DeviceBuffer<f32>,
        dv: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "attention_backward";
        let (n, stats) = lengths(K, &shape)?;
        for (what, len) in [
            ("dout", dout.len()),
            ("q", q.len()),
            ("k", k.len()),
            ("v", v.len()),
            ("out", out.len()),
            ("dq", dq.len()),
            ("dk", dk.len()),
            ("dv", dv.len()),
        ] {
            check_len(K, what, len, n)?;
        }
        check_len(K, "lse", lse.len(), stats)?;
        if nothing_to_do(&shape)? {
            return Ok(());
        }
        let mut delta = self.alloc_zeros::<f32>(stats, MemoryCategory::Workspace)?;
        let mut p = base_params(K, &shape, softmax_scale, dtype)?;
        p.q = q.address(self);
        p.k = k.address(self);
        p.v = v.address(self);
        p.out = out.address(self);
        p.lse = lse.address(self);
        p.dout = dout.address(self);
        p.delta = delta.address_mut(self);
        p.dq = dq.address_mut(self);
        p.dk = dk.address_mut(self);
        p.dv = dv.address_mut(self);
        if let Some(variant) = attention_mma::route(self, &shape, dtype, &p) {
            return attention_mma::backward(self, &shape, variant, p);
        }
        simple_backward(self, K, &shape, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn shape(batch: usize, seq: usize, heads: usize, head_dim: usize) -> AttentionShape {
        AttentionShape::new(batch, seq, heads, head_dim)
    }

    #[test]
    fn empty_batches_do_nothing_and_featureless_heads_are_the_twins_error() {
        assert!(nothing_to_do(&shape(0, 4, 2, 8)).unwrap());
        assert!(!nothing_to_do(&shape(1, 4, 2, 8)).unwrap());
        assert!(nothing_to_do(&shape(1, 4, 2, 0)).is_err());
        assert_eq!(lengths("a", &shape(2, 3, 4, 5)).unwrap(), (2 * 3 * 4 * 5, 2 * 3 * 4));
    }
}
