//! 128x128 block quantization (`docs/numerics.md`, block scaling, weights): one scale per 128x128 tile,
//! the current-scaling formula on the tile's amax.
//!
//! A tile's scale is the same whichever way the tile is read, so the
//! column-wise copy is the transpose of the row-wise codes (bit-identical to
//! quantizing `X^T` from the source) with the transposed scale grid.

use rayon::prelude::*;

use super::amax::amax_serial;
use super::{ScaleRule, check_len, transpose_codes};
use crate::convert::{self, HighPrecision};
use crate::error::Result;
use crate::format::Overflow;
use crate::tensor::{QuantizedMatrix, QuantizedTensor, Scales};

/// Tile edge.
pub const BLOCK: usize = 128;

/// Row-wise 128x128 copy: `dst` `[rows, cols]` codes, `scale_inv`
/// `[ceil(rows/128), ceil(cols/128)]`. Bands of 128 rows run in parallel; each
/// tile is read twice (amax, then cast) while it sits in L2 (64 KB of f32).
pub fn quantize_128x128<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    rule: &ScaleRule,
    dst: &mut [u8],
    scale_inv: &mut [f32],
) -> Result<()> {
    rule.validate()?;
    check_len("128x128 source", src.len(), rows, cols)?;
    check_len("128x128 codes", dst.len(), rows, cols)?;
    let tile_cols = cols.div_ceil(BLOCK);
    check_len("128x128 scale_inv", scale_inv.len(), rows.div_ceil(BLOCK), tile_cols)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    src.par_chunks(BLOCK * cols)
        .zip(dst.par_chunks_mut(BLOCK * cols))
        .zip(scale_inv.par_chunks_mut(tile_cols))
        .try_for_each(|((src, dst), scale_inv)| {
            for (c, scale_inv) in scale_inv.iter_mut().enumerate() {
                let c0 = c * BLOCK;
                let width = BLOCK.min(cols - c0);
                let segments = || src.chunks(cols).map(|row| &row[c0..c0 + width]);
                let amax = segments().map(amax_serial).fold(0.0f32, f32::max);
                let scale = rule.scale(amax);
                for (segment, out) in segments().zip(dst.chunks_mut(cols)) {
                    convert::quantize(
                        segment,
                        &mut out[c0..c0 + width],
                        rule.format,
                        scale,
                        Overflow::Saturate,
                    )?;
                }
                *scale_inv = 1.0 / scale;
            }
            Ok(())
        })
}

/// Quantizes `[rows, cols]` with 128x128 tiles, and the column-wise copy too if asked.
pub fn quantize_block_128x128<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    rule: &ScaleRule,
    columnwise: bool,
) -> Result<QuantizedTensor> {
    check_len("128x128 source", src.len(), rows, cols)?;
    let (tile_rows, tile_cols) = (rows.div_ceil(BLOCK), cols.div_ceil(BLOCK));
    let mut data = vec![0u8; src.len()];
    let mut scale_inv = vec![0.0f32; tile_rows * tile_cols];
    quantize_128x128(src, rows, cols, rule, &mut data, &mut scale_inv)?;
    let columnwise = if columnwise {
        let mut transposed = vec![0u8; data.len()];
        transpose_codes(&data, rows, cols, &mut transposed)?;
        let mut grid = vec![0.0f32; scale_inv.len()];
        for (i, row) in scale_inv.chunks(tile_cols.max(1)).enumerate() {
            for (j, &s) in row.iter().enumerate() {
                grid[j * tile_rows + i] = s;
            }
        }
        Some(QuantizedMatrix::new(
            transposed,
            cols,
            rows,
            Scales::Block128x128(grid),
        )?)
    } else {
        None
    };
    let rowwise = QuantizedMatrix::new(data, rows, cols, Scales::Block128x128(scale_inv))?;
    QuantizedTensor::new(rule.format, rowwise, columnwise)
}
