//! The tied output head: `logits = h E^T` with the token embedding `E [vocab, hidden]`,
//! in the compute dtype (inputs converted like a linear layer's, f32 accumulation, f32 logits
//! for the loss).

use crate::dispatch::Kernels;
use crate::error::Result;
use crate::gemm::{GemmParams, Output};
use crate::nn::{Linear, Parameter};
use crate::tensor::{Dtype, Tensor};

/// f32 logits `[rows, vocab]` of the final-norm output: through the untied `head`, or tied to
/// the token embedding `table`.
pub(super) fn logits(
    kernels: &dyn Kernels,
    head: Option<&mut Linear>,
    normed: &Tensor,
    table: &[f32],
    dtype: Dtype,
) -> Result<Vec<f32>> {
    match head {
        Some(head) => Ok(head.forward(normed)?.into_data()),
        None => forward(kernels, normed.data(), table, normed.rows(), normed.cols(), dtype),
    }
}

/// The gradient of the final-norm output from `dlogits` `[rows, vocab]`: through the untied
/// `head`, or through the tied `tokens` table, whose gradient it accumulates unless frozen.
pub(super) fn logits_backward(
    kernels: &dyn Kernels,
    head: Option<&mut Linear>,
    dlogits: Vec<f32>,
    normed: &Tensor,
    tokens: &mut Parameter,
    dtype: Dtype,
) -> Result<Tensor> {
    let (rows, hidden) = (normed.rows(), normed.cols());
    match head {
        Some(head) => {
            let vocab = dlogits.len() / rows.max(1);
            head.backward(&Tensor::new(dlogits, rows, vocab)?)
        }
        None => {
            let frozen = tokens.is_frozen();
            let (table, dtable) = tokens.value_and_grad_mut();
            let dtable = (!frozen).then_some(dtable);
            let dh = backward(kernels, &dlogits, normed.data(), table, rows, hidden, dtype, dtable)?;
            Tensor::new(dh, rows, hidden)
        }
    }
}

/// `h [rows, hidden]`, `table [vocab, hidden]` -> logits `[rows, vocab]`.
fn forward(
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
fn backward(
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
