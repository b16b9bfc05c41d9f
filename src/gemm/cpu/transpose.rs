//! A cache-blocked transpose of the decoded B operand, so the f32 GEMM crate
//! finds it N-contiguous.
//!
//! Why: the crate packs the operand that runs along the output's rows (B, for
//! our row-major outputs) into 64-row panels before its micro-kernel reads it.
//! From a K-major B that packing gathers one element from each of 64 rows per
//! step of K (64 lines `4 K` bytes apart, which for K = 1024 all fall in one
//! L1 set), scalar, once per tile row band. From an N-contiguous B it copies 64
//! consecutive values per step. Transposing once here costs one pass over B in
//! 32 x 32 tiles; with the in-place f32 outputs (`cpu.rs`) the forward
//! GEMMs went from 0.66-0.78x to 0.89-0.94x the crate's own speed on a K-major B
//! (docs/benchmarks.md, round 4). Every FP8 operand is
//! K-major, so FP8 GEMMs take this route in both passes.
//!
//! Same bits: packing only moves values, the micro-kernel's sums do not depend
//! on where its operands come from (`kernel.rs` tests), except on the shapes
//! that [`super::layout_free`] excludes, which the caller keeps K-major.

use rayon::prelude::*;

/// Tile edge: a 32 x 32 f32 tile (4 KiB) is gathered on the stack from 32 source row
/// segments, then written as 32 destination row segments, so neither side strides
/// through 32 lines that share an L1 set.
const TILE: usize = 32;
/// Elements from which bands of destination rows run in parallel (below ~64 K elements,
/// ~30 us of copying, a second thread costs more than it saves).
const PARALLEL_MIN: usize = 1 << 16;

/// `dst[c * rows + r] = src[r * cols + c]`: the `[cols, rows]` transpose of the row-major
/// `[rows, cols]` matrix `src`. Both slices hold `rows * cols` values (checked by the caller).
pub(super) fn transpose_into(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    transpose_tiles(src, rows, cols, dst, |dst, column| {
        // A whole tile row as one fixed-size copy: vector moves, not a memcpy call.
        match (
            <&mut [f32; TILE]>::try_from(&mut *dst),
            <&[f32; TILE]>::try_from(column),
        ) {
            (Ok(whole), Ok(column)) => *whole = *column,
            _ => dst.copy_from_slice(column),
        }
    });
}

/// The tile walk of every CPU transpose (this one and the transposing dtype conversion):
/// for each `TILE x TILE` tile of the row-major `[rows, cols]` matrix `src`, `write(d, column)`
/// stores one column of the tile (`column[i] = src[(r0 + i) * cols + c]`) into the segment
/// `d = dst[c * rows + r0..][..column.len()]` of the `[cols, rows]` transpose. Both slices hold
/// `rows * cols` values (checked by the callers).
pub(crate) fn transpose_tiles<S: Copy + Default + Sync, T: Send>(
    src: &[S],
    rows: usize,
    cols: usize,
    dst: &mut [T],
    write: impl Fn(&mut [T], &[S]) + Sync,
) {
    debug_assert!(src.len() == rows * cols && dst.len() == rows * cols);
    if rows == 0 || cols == 0 {
        return;
    }
    // One band: destination rows `c0..c0 + TILE` (source columns), all source rows.
    let band = |(b, dst): (usize, &mut [T])| {
        let c0 = b * TILE;
        let width = TILE.min(cols - c0);
        let mut tile = [[S::default(); TILE]; TILE];
        for r0 in (0..rows).step_by(TILE) {
            let height = TILE.min(rows - r0);
            for (r, row) in src[r0 * cols..(r0 + height) * cols].chunks_exact(cols).enumerate() {
                for (column, &v) in tile.iter_mut().zip(&row[c0..c0 + width]) {
                    column[r] = v;
                }
            }
            for (column, dst_row) in tile.iter().zip(dst.chunks_exact_mut(rows)) {
                write(&mut dst_row[r0..r0 + height], &column[..height]);
            }
        }
    };
    if src.len() >= PARALLEL_MIN {
        dst.par_chunks_mut(TILE * rows).enumerate().for_each(band);
    } else {
        dst.chunks_mut(TILE * rows).enumerate().for_each(band);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_transpose_matches_the_definition() {
        // Ragged tiles on both edges, one row, one column, and a parallel size.
        for (rows, cols) in [(1, 1), (1, 70), (70, 1), (33, 65), (64, 32), (300, 257)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 7.0).collect();
            let mut dst = vec![f32::NAN; rows * cols];
            transpose_into(&src, rows, cols, &mut dst);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        dst[c * rows + r].to_bits(),
                        src[r * cols + c].to_bits(),
                        "{rows}x{cols} ({r}, {c})"
                    );
                }
            }
        }
    }
}
