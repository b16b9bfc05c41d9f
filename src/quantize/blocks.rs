//! The engine shared by the 1x128 and MXFP8 quantizers: one scale per block of
//! consecutive elements along a row, and the column-wise copy (blocks of `X^T`)
//! built from the high-precision source through small transposed tiles.

use rayon::prelude::*;

use super::amax::amax_serial;
use crate::convert::{self, HighPrecision};
use crate::error::Result;
use crate::format::{Fp8Format, Overflow};

/// Columns of the source per column-wise task: 32 f32 are two cache lines per
/// source row, and a 32 x 128 tile of f32 (16 KB) stays in L1.
const COL_BAND: usize = 32;

/// What a block's amax turns into: the multiplier the data is cast with and
/// the scale value stored for the block.
pub(crate) trait BlockRule: Sync {
    /// The stored scale (f32 `scale_inv`, or an E8M0 code).
    type Stored: Copy + Send + Sync;
    /// The data format.
    fn format(&self) -> Fp8Format;
    /// `(scale, stored)` for a block with `amax`.
    fn scale(&self, amax: f32) -> (f32, Self::Stored);
}

/// Quantizes one contiguous run `src` into `dst` block by block, writing one
/// stored scale per block (the last block may be short).
pub(crate) fn quantize_run<T: HighPrecision, R: BlockRule>(
    src: &[T],
    dst: &mut [u8],
    scales: &mut [R::Stored],
    block: usize,
    rule: &R,
) -> Result<()> {
    for ((segment, out), stored) in src.chunks(block).zip(dst.chunks_mut(block)).zip(scales.iter_mut()) {
        let (scale, value) = rule.scale(amax_serial(segment));
        convert::quantize(segment, out, rule.format(), scale, Overflow::Saturate)?;
        *stored = value;
    }
    Ok(())
}

/// Row-wise block quantization of a `[rows, cols]` matrix; `scales` is
/// `[rows, ceil(cols/block)]`. Rows run in parallel.
pub(crate) fn quantize_rowwise<T: HighPrecision, R: BlockRule>(
    src: &[T],
    rows: usize,
    cols: usize,
    block: usize,
    rule: &R,
    dst: &mut [u8],
    scales: &mut [R::Stored],
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let blocks = cols.div_ceil(block);
    let task_rows = super::rows_per_task(cols);
    src.par_chunks(task_rows * cols)
        .zip(dst.par_chunks_mut(task_rows * cols))
        .zip(scales.par_chunks_mut(task_rows * blocks))
        .try_for_each(|((src, dst), scales)| {
            for ((row, out), row_scales) in src
                .chunks(cols)
                .zip(dst.chunks_mut(cols))
                .zip(scales.chunks_mut(blocks))
            {
                quantize_run(row, out, row_scales, block, rule)?;
            }
            Ok(())
        })
}

/// Column-wise block quantization: `dst` is `[cols, rows]` (the codes of
/// `X^T`) and `scales` `[cols, ceil(rows/block)]`, every block quantized from
/// the high-precision source. Bands of [`COL_BAND`] source columns run in
/// parallel; each copies a `block x band` tile into a transposed scratch tile
/// and quantizes its rows, which are contiguous there.
pub(crate) fn quantize_columnwise<T: HighPrecision, R: BlockRule>(
    src: &[T],
    rows: usize,
    cols: usize,
    block: usize,
    rule: &R,
    dst: &mut [u8],
    scales: &mut [R::Stored],
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let blocks = rows.div_ceil(block);
    dst.par_chunks_mut(COL_BAND * rows)
        .zip(scales.par_chunks_mut(COL_BAND * blocks))
        .enumerate()
        .try_for_each(|(band, (dst, scales))| {
            let j0 = band * COL_BAND;
            let width = COL_BAND.min(cols - j0);
            let mut tile = vec![T::from_f32(0.0); width * block];
            for b in 0..blocks {
                let r0 = b * block;
                let height = block.min(rows - r0);
                // tile[jj][i] = src[r0 + i][j0 + jj]
                for i in 0..height {
                    let src_row = &src[(r0 + i) * cols + j0..][..width];
                    for (jj, &x) in src_row.iter().enumerate() {
                        tile[jj * height + i] = x;
                    }
                }
                for jj in 0..width {
                    let run = &tile[jj * height..][..height];
                    let out = &mut dst[jj * rows + r0..][..height];
                    let stored = &mut scales[jj * blocks + b..][..1];
                    quantize_run(run, out, stored, block, rule)?;
                }
            }
            Ok(())
        })
}
