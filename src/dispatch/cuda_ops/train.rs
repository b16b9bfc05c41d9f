//! Staged arms of the model's ends and the trainer's ops: embedding gather and
//! scatter-add, cross-entropy, AdamW, sum of squares, unscale + finite check
//! (launchers in `backend::cuda::{embedding, loss, optim}`).

use super::resident::staged_for;
use super::staged;
use crate::dispatch::{AdamWStep, CudaKernels, Values, ValuesMut};
use crate::error::Result;

pub(crate) fn embedding_forward(
    k: &CudaKernels,
    ids: &[u32],
    table: Values<'_>,
    dim: usize,
    out: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding_forward";
    let s = staged_for(k, OP, [table.ordinal(), out.ordinal()])?;
    let (table_d, mut out_d) = (s.input(OP, table)?, s.output(OP, out)?);
    s.device().embedding_forward(ids, &table_d, dim, &mut out_d)?;
    out_d.finish(&s)
}

pub(crate) fn embedding_backward(
    k: &CudaKernels,
    ids: &[u32],
    dout: Values<'_>,
    dim: usize,
    dtable: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    let s = staged_for(k, OP, [dout.ordinal(), dtable.ordinal()])?;
    let (dout_d, mut dtable_d) = (s.input(OP, dout)?, s.in_place(OP, dtable)?);
    s.device().embedding_backward(ids, &dout_d, dim, &mut dtable_d)?;
    dtable_d.finish(&s)
}

/// The loss comes back (a 4-byte read: the trainer reports it every micro-batch); the
/// log-sum-exp stays where the caller put it.
pub(crate) fn cross_entropy_forward(
    k: &CudaKernels,
    logits: Values<'_>,
    targets: &[u32],
    vocab: usize,
    ignore: u32,
    lse: ValuesMut<'_>,
) -> Result<f32> {
    const OP: &str = "cross_entropy_forward";
    let s = staged_for(k, OP, [logits.ordinal(), lse.ordinal()])?;
    let (logits_d, mut lse_d, mut loss_d) = (s.input(OP, logits)?, s.output(OP, lse)?, s.scratch::<f32>(1)?);
    s.device()
        .cross_entropy_forward(&logits_d, targets, vocab, ignore, &mut lse_d, &mut loss_d)?;
    lse_d.finish(&s)?;
    Ok(s.down_vec(&loss_d)?[0])
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn cross_entropy_backward(
    k: &CudaKernels,
    logits: Values<'_>,
    targets: &[u32],
    vocab: usize,
    ignore: u32,
    lse: Values<'_>,
    dloss: f32,
    dlogits: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "cross_entropy_backward";
    let s = staged_for(k, OP, [logits.ordinal(), lse.ordinal(), dlogits.ordinal()])?;
    let (logits_d, lse_d) = (s.input(OP, logits)?, s.input(OP, lse)?);
    // Rows of ignored targets are written as 0 by the kernel; an empty batch writes nothing
    // (and has no values).
    let mut dlogits_d = s.output(OP, dlogits)?;
    s.device()
        .cross_entropy_backward(&logits_d, targets, vocab, ignore, &lse_d, dloss, &mut dlogits_d)?;
    dlogits_d.finish(&s)
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
