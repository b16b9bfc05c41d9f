//! Column blocks of activations, wherever they live: a fused projection's output split into
//! its parts (Q, K, V) and their gradients joined back, through the `copy_columns` op.

use crate::dispatch::{Backend, ColumnCopy, Values};
use crate::error::Result;
use crate::tensor::Tensor;

/// `src` `[rows, sum(widths)]` as one `[rows, width]` tensor per part, where `src` lives.
pub(crate) fn split_columns<const N: usize>(
    backend: &Backend,
    src: Values,
    rows: usize,
    widths: [usize; N],
) -> Result<[Tensor; N]> {
    let total: usize = widths.iter().sum();
    let mut parts = Vec::with_capacity(N);
    let mut first = 0;
    for width in widths {
        parts.push(take_columns(backend, src, rows, total, first, width)?);
        first += width;
    }
    Ok(parts.try_into().expect("one tensor per width"))
}

/// Columns `first..first + width` of `src` `[rows, src_cols]` as a new `[rows, width]` tensor,
/// where `src` lives.
pub(crate) fn take_columns(
    backend: &Backend,
    src: Values,
    rows: usize,
    src_cols: usize,
    first: usize,
    width: usize,
) -> Result<Tensor> {
    let mut part = backend.output_at(src.device(), rows, width)?;
    let copy = ColumnCopy {
        rows,
        width,
        a_cols: src_cols,
        a_first: first,
        out_cols: width,
        out_first: 0,
    };
    backend.kernels().copy_columns(src, part.values_mut(), copy)?;
    Ok(part)
}

/// `part` `[rows, width]` written into columns `first..first + width` of `dst`
/// `[rows, dst_cols]`, where `dst` lives.
pub(crate) fn put_columns(backend: &Backend, part: Values, width: usize, dst: &mut Tensor, first: usize) -> Result<()> {
    let (rows, dst_cols) = dst.shape();
    let copy = ColumnCopy {
        rows,
        width,
        a_cols: width,
        a_first: 0,
        out_cols: dst_cols,
        out_first: first,
    };
    backend.kernels().copy_columns(part, dst.values_mut(), copy)
}

/// The inverse of [`split_columns`]: the parts side by side in each row, where the first lives.
pub(crate) fn join_columns<const N: usize>(backend: &Backend, parts: [&Tensor; N]) -> Result<Tensor> {
    let rows = parts[0].rows();
    let total = parts.iter().map(|p| p.cols()).sum();
    // Unspecified contents, each copy writing its own columns of every row: all written after
    // the last (nothing reads it before).
    let mut joined = backend.output_like(parts[0], rows, total)?;
    let mut first = 0;
    for part in parts {
        put_columns(backend, part.values(), part.cols(), &mut joined, first)?;
        first += part.cols();
    }
    Ok(joined)
}
