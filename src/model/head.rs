//! The tied output head: `logits = h E^T` with the token embedding `E [vocab, hidden]`,
//! in the compute dtype (inputs converted like a linear layer's, f32 accumulation, f32 logits
//! for the loss).

use crate::dispatch::Kernels;
use crate::error::Result;
use crate::gemm::{GemmParams, Output};
use crate::tensor::Dtype;

/// `h [rows, hidden]`, `table [vocab, hidden]` -> logits `[rows, vocab]`.
pub(super) fn forward(
    kernels: &dyn Kernels,
    h: &[f32],
    table: &[f32],
    rows: usize,
    hidden: usize,
    dtype: Dtype,
) -> Result<Vec<f32>> {
    let vocab = table.len() / hidden.max(1);
    let (h, e) = (kernels.convert(dtype, h)?, kernels.convert(dtype, table)?);
    let mut logits = vec![0.0; rows * vocab];
    kernels.gemm(
        &h.operand(rows, hidden)?,
        &e.operand(vocab, hidden)?,
        Output::F32(&mut logits),
        &GemmParams::default(),
    )?;
    Ok(logits)
}

/// Returns dh `[rows, hidden]` and accumulates `dtable += dlogits^T h` (skipped for a frozen
/// table, `None`).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    kernels: &dyn Kernels,
    dlogits: &[f32],
    h: &[f32],
    table: &[f32],
    rows: usize,
    hidden: usize,
    dtype: Dtype,
    dtable: Option<&mut [f32]>,
) -> Result<Vec<f32>> {
    let vocab = table.len() / hidden.max(1);
    let dl = kernels.convert(dtype, dlogits)?;
    let e_t = kernels.convert_transposed(dtype, table, vocab, hidden)?;
    let mut dh = vec![0.0; rows * hidden];
    kernels.gemm(
        &dl.operand(rows, vocab)?,
        &e_t.operand(hidden, vocab)?,
        Output::F32(&mut dh),
        &GemmParams::default(),
    )?;
    let Some(dtable) = dtable else {
        dtype.round_slice(&mut dh);
        return Ok(dh);
    };
    let dl_t = kernels.convert_transposed(dtype, dlogits, rows, vocab)?;
    let h_t = kernels.convert_transposed(dtype, h, rows, hidden)?;
    kernels.gemm(
        &dl_t.operand(vocab, rows)?,
        &h_t.operand(hidden, rows)?,
        Output::F32(dtable),
        &GemmParams {
            beta: 1.0,
            ..GemmParams::default()
        },
    )?;
    dtype.round_slice(&mut dh);
    Ok(dh)
}
