//! Staged arms of the model's ends and the trainer's ops: embedding gather and
//! scatter-add, cross-entropy, AdamW, sum of squares, unscale + finite check
//! (launchers in `backend::cuda::{embedding, loss, optim}`).

use super::staged;
use crate::dispatch::{AdamWStep, CudaKernels};
use crate::error::Result;

pub(crate) fn embedding_forward(
    k: &CudaKernels,
    ids: &[u32],
    table: &[f32],
    dim: usize,
    out: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (table_d, mut out_d) = (s.up(table)?, s.scratch(out.len())?);
    s.device().embedding_forward(ids, &table_d, dim, &mut out_d)?;
    s.down(&out_d, out)
}

pub(crate) fn embedding_backward(
    k: &CudaKernels,
    ids: &[u32],
    dout: &[f32],
    dim: usize,
    dtable: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (dout_d, mut dtable_d) = (s.up(dout)?, s.up(dtable)?);
    s.device().embedding_backward(ids, &dout_d, dim, &mut dtable_d)?;
    s.down(&dtable_d, dtable)
}

pub(crate) fn cross_entropy_forward(
    k: &CudaKernels,
    logits: &[f32],
    targets: &[u32],
    vocab: usize,
    ignore: u32,
    lse: &mut [f32],
) -> Result<f32> {
    let s = staged(k)?;
    let (logits_d, mut lse_d, mut loss_d) = (s.up(logits)?, s.scratch(lse.len())?, s.scratch::<f32>(1)?);
    s.device()
        .cross_entropy_forward(&logits_d, targets, vocab, ignore, &mut lse_d, &mut loss_d)?;
    s.down(&lse_d, lse)?;
    Ok(s.down_vec(&loss_d)?[0])
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn cross_entropy_backward(
    k: &CudaKernels,
    logits: &[f32],
    targets: &[u32],
    vocab: usize,
    ignore: u32,
    lse: &[f32],
    dloss: f32,
    dlogits: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (logits_d, lse_d) = (s.up(logits)?, s.up(lse)?);
    // Rows of ignored targets are written as 0 by the kernel; an empty batch writes nothing.
    let mut dlogits_d = s.zeros(dlogits.len())?;
    s.device()
        .cross_entropy_backward(&logits_d, targets, vocab, ignore, &lse_d, dloss, &mut dlogits_d)?;
    s.down(&dlogits_d, dlogits)
}

pub(crate) fn adamw(
    k: &CudaKernels,
    value: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    step: &AdamWStep,
) -> Result<()> {
    let s = staged(k)?;
    let (mut value_d, grad_d, mut m_d, mut v_d) = (s.up(value)?, s.up(grad)?, s.up(m)?, s.up(v)?);
    s.device()
        .adamw_update(&mut value_d, &grad_d, &mut m_d, &mut v_d, step)?;
    s.down(&value_d, value)?;
    s.down(&m_d, m)?;
    s.down(&v_d, v)
}

pub(crate) fn sum_squares(k: &CudaKernels, values: &[f32]) -> Result<f64> {
    let s = staged(k)?;
    let values_d = s.up(values)?;
    s.device().sum_squares(&values_d)
}

pub(crate) fn unscale_and_check(k: &CudaKernels, values: &mut [f32], inv_scale: f32) -> Result<bool> {
    let s = staged(k)?;
    let mut values_d = s.up(values)?;
    let finite = s.device().unscale_and_check(&mut values_d, inv_scale)?;
    s.down(&values_d, values)?;
    Ok(finite)
}
