//! The engine shared by the 1x128 and MXFP8 quantizers: one scale per block of
//! consecutive elements along a row, and the column-wise copy (blocks of `X^T`)
//! built from the high-precision source through small transposed tiles.

use rayon::prelude::*;

use super::amax::amax_serial;
use crate::convert::{self, HighPrecision};
use crate::error::Result;
use crate::format::{Fp8Format, Overflow};

/// Columns of one column-wise task: its rows are read in runs of 512
/// elements (2 KB of f32, long enough for the hardware prefetcher), and its
/// scratch tile (512 x 128 f32, 256 KB) stays in L2.
const TASK_COLS: usize = 512;

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
/// the high-precision source.
///
/// One task per `block` rows x [`TASK_COLS`] columns, in parallel: it copies
/// its rows, read whole, into a transposed scratch tile and quantizes the
/// scratch rows, which are contiguous. (Walking down a 32-column band instead
/// read each source row as a separate DRAM miss: 1.7x slower, measured.) Its
/// outputs, one block of each of its columns of `X^T`, are disjoint from every
/// other task's, so each task gets them as its own `&mut` pieces.
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
    let groups = cols.div_ceil(TASK_COLS);
    // pieces[b * groups + g][jj] = (dst[j][block b], scales[j][b]) for column j = g * TASK_COLS + jj.
    let mut pieces: Vec<Vec<(&mut [u8], &mut R::Stored)>> =
        (0..blocks * groups).map(|_| Vec::with_capacity(TASK_COLS)).collect();
    for (j, (column, column_scales)) in dst.chunks_mut(rows).zip(scales.chunks_mut(blocks)).enumerate() {
        for (b, piece) in column.chunks_mut(block).zip(column_scales.iter_mut()).enumerate() {
            pieces[b * groups + j / TASK_COLS].push(piece);
        }
    }
    // One scratch tile per worker, reused: a fresh 256 KB allocation per task
    // would be fresh pages, each one a page fault.
    let scratch = || Vec::<T>::new();
    pieces
        .into_par_iter()
        .enumerate()
        .try_for_each_init(scratch, |tile, (task, mut outs)| {
            let (b, g) = (task / groups, task % groups);
            let (r0, j_start) = (b * block, g * TASK_COLS);
            let height = block.min(rows - r0);
            let band = &src[r0 * cols..(r0 + height) * cols];
            let width = outs.len();
            // tile[jj][i] = src[r0 + i][j_start + jj], rows read whole (prefetch-friendly).
            tile.resize(width * height, T::from_f32(0.0));
            for (i, src_row) in band.chunks_exact(cols).enumerate() {
                for (jj, &x) in src_row[j_start..j_start + width].iter().enumerate() {
                    tile[jj * height + i] = x;
                }
            }
            for (run, (out, stored)) in tile.chunks_exact(height).zip(outs.iter_mut()) {
                quantize_run(run, out, std::slice::from_mut(*stored), block, rule)?;
            }
            Ok(())
        })
}
