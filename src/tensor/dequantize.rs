//! FP8 -> f32/bf16/f16: `f32(q) * scale_inv` of the element's block, rounded
//! to the destination type.

use rayon::prelude::*;

use super::{MXFP8_BLOCK, check_len, rows_per_task};
use super::{QuantizedMatrix, Scales};
use crate::convert::{self, HighPrecision};
use crate::error::{Error, Result};
use crate::format::{Fp8Format, decode_e8m0};

/// Elements per parallel chunk of a per-tensor dequantize.
const CHUNK: usize = 1 << 16;

/// `dst[i] = decode(src[i]) * scale_inv`. Chunks run in parallel.
pub fn dequantize_per_tensor<T: HighPrecision>(
    src: &[u8],
    format: Fp8Format,
    scale_inv: f32,
    dst: &mut [T],
) -> Result<()> {
    if src.is_empty() {
        // Same checks as a non-empty call (lengths, scale_inv).
        return convert::dequantize(src, dst, format, scale_inv);
    }
    if src.len() != dst.len() {
        return Err(Error::LengthMismatch {
            what: "dequantize",
            src: src.len(),
            dst: dst.len(),
        });
    }
    src.par_chunks(CHUNK)
        .zip(dst.par_chunks_mut(CHUNK))
        .try_for_each(|(src, dst)| convert::dequantize(src, dst, format, scale_inv))
}

/// Dequantizes one run with a block's scale; a NaN scale (E8M0 code 0xFF)
/// decodes every element to NaN, as `q * NaN` would.
fn dequantize_run<T: HighPrecision>(src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) -> Result<()> {
    if scale_inv.is_nan() {
        dst.fill(T::from_f32(f32::NAN));
        Ok(())
    } else {
        convert::dequantize(src, dst, format, scale_inv)
    }
}

/// `[rows, cols]` codes with one scale per `block_rows x block_cols` block;
/// `scale_of(i)` gives the scale_inv of block `i` of the row-major grid
/// `[ceil(rows/block_rows), ceil(cols/block_cols)]`.
fn dequantize_grid<T: HighPrecision>(
    src: &[u8],
    rows: usize,
    cols: usize,
    (block_rows, block_cols): (usize, usize),
    format: Fp8Format,
    scale_of: impl Fn(usize) -> f32 + Sync,
    dst: &mut [T],
) -> Result<()> {
    check_len("dequantize source", src.len(), rows, cols)?;
    check_len("dequantize destination", dst.len(), rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let grid_cols = cols.div_ceil(block_cols);
    let task_rows = rows_per_task(cols);
    src.par_chunks(task_rows * cols)
        .zip(dst.par_chunks_mut(task_rows * cols))
        .enumerate()
        .try_for_each(|(task, (src, dst))| {
            for (i, (row, out)) in src.chunks(cols).zip(dst.chunks_mut(cols)).enumerate() {
                let grid_row = (task * task_rows + i) / block_rows;
                for (c, (codes, values)) in row.chunks(block_cols).zip(out.chunks_mut(block_cols)).enumerate() {
                    dequantize_run(codes, values, format, scale_of(grid_row * grid_cols + c))?;
                }
            }
            Ok(())
        })
}

/// Block-scaled codes (`block_rows x block_cols` blocks, f32 `scale_inv` in the
/// compact row-major grid) back to high precision.
pub fn dequantize_blocks<T: HighPrecision>(
    src: &[u8],
    rows: usize,
    cols: usize,
    block: (usize, usize),
    format: Fp8Format,
    scale_inv: &[f32],
    dst: &mut [T],
) -> Result<()> {
    check_len(
        "dequantize scale_inv",
        scale_inv.len(),
        rows.div_ceil(block.0),
        cols.div_ceil(block.1),
    )?;
    dequantize_grid(src, rows, cols, block, format, |i| scale_inv[i], dst)
}

/// MXFP8 codes with `[rows, ceil(cols/32)]` E8M0 scales back to high precision:
/// `f32(q) * 2^(e-127)`.
pub fn dequantize_mxfp8<T: HighPrecision>(
    src: &[u8],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    e8m0: &[u8],
    dst: &mut [T],
) -> Result<()> {
    let block = (1, MXFP8_BLOCK);
    check_len("dequantize e8m0", e8m0.len(), rows, cols.div_ceil(block.1))?;
    dequantize_grid(src, rows, cols, block, format, |i| decode_e8m0(e8m0[i]), dst)
}

/// Dequantizes one copy of a quantized tensor into `dst` (`rows * cols` values).
pub(crate) fn dequantize_matrix<T: HighPrecision>(
    matrix: &QuantizedMatrix,
    format: Fp8Format,
    dst: &mut [T],
) -> Result<()> {
    let (src, rows, cols) = (matrix.data(), matrix.rows(), matrix.cols());
    let kind = matrix.scale_kind();
    match matrix.scales() {
        Scales::PerTensor(scale_inv) => dequantize_per_tensor(src, format, *scale_inv, dst),
        Scales::Block1x128(scale_inv) | Scales::Block128x128(scale_inv) => {
            let block = kind.block_shape().unwrap_or((1, 1));
            dequantize_blocks(src, rows, cols, block, format, scale_inv, dst)
        }
        Scales::Mxfp8(e8m0) => dequantize_mxfp8(src, rows, cols, format, e8m0, dst),
    }
}
