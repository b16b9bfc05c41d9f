//! The tied output head: `logits = h E^T` with the token embedding `E [vocab, hidden]`,
//! in the compute dtype (inputs rounded, f32 accumulation, f32 logits for the loss).

use crate::error::Result;
use crate::gemm::{GemmParams, Mat, Operand, Output, cpu};
use crate::ops::Dtype;

fn rounded(values: &[f32], dtype: Dtype) -> Vec<f32> {
    let mut out = values.to_vec();
    dtype.round_slice(&mut out);
    out
}

fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; src.len()];
    for (r, row) in src.chunks_exact(cols.max(1)).enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}

/// `h [rows, hidden]`, `table [vocab, hidden]` -> logits `[rows, vocab]`.
pub(super) fn forward(h: &[f32], table: &[f32], rows: usize, hidden: usize, dtype: Dtype) -> Result<Vec<f32>> {
    let vocab = table.len() / hidden.max(1);
    let (h, e) = (rounded(h, dtype), rounded(table, dtype));
    let mut logits = vec![0.0; rows * vocab];
    cpu::gemm(
        &Operand::F32(Mat::new(&h, rows, hidden)?),
        &Operand::F32(Mat::new(&e, vocab, hidden)?),
        Output::F32(&mut logits),
        &GemmParams::default(),
    )?;
    Ok(logits)
}

/// Returns dh `[rows, hidden]` and accumulates `dtable += dlogits^T h`.
pub(super) fn backward(
    dlogits: &[f32],
    h: &[f32],
    table: &[f32],
    rows: usize,
    hidden: usize,
    dtype: Dtype,
    dtable: &mut [f32],
) -> Result<Vec<f32>> {
    let vocab = table.len() / hidden.max(1);
    let dl = rounded(dlogits, dtype);
    let e_t = transpose(&rounded(table, dtype), vocab, hidden);
    let mut dh = vec![0.0; rows * hidden];
    cpu::gemm(
        &Operand::F32(Mat::new(&dl, rows, vocab)?),
        &Operand::F32(Mat::new(&e_t, hidden, vocab)?),
        Output::F32(&mut dh),
        &GemmParams::default(),
    )?;
    let dl_t = transpose(&dl, rows, vocab);
    let h_t = transpose(&rounded(h, dtype), rows, hidden);
    cpu::gemm(
        &Operand::F32(Mat::new(&dl_t, vocab, rows)?),
        &Operand::F32(Mat::new(&h_t, hidden, rows)?),
        Output::F32(dtable),
        &GemmParams {
            beta: 1.0,
            ..GemmParams::default()
        },
    )?;
    dtype.round_slice(&mut dh);
    Ok(dh)
}
