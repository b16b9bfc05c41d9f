//! Cache-tiled transpose of FP8 codes.

use rayon::prelude::*;

use super::check_len;
use crate::error::{Error, Result};
use crate::tensor::{QuantizedMatrix, Scales};

/// Tile edge: a 64x64 tile of bytes touches 64 source lines and 64
/// destination lines, well inside L1.
pub(crate) const TILE: usize = 64;

/// `dst[j][i] = src[i][j]` for a `[rows, cols]` byte matrix; `dst` is `[cols, rows]`.
/// Bands of destination rows run in parallel.
pub fn transpose_codes(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) -> Result<()> {
    check_len("transpose source", src.len(), rows, cols)?;
    check_len("transpose destination", dst.len(), cols, rows)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    dst.par_chunks_mut(TILE * rows).enumerate().for_each(|(band, dst)| {
        let j0 = band * TILE;
        let width = TILE.min(cols - j0);
        let mut tile = [[0u8; TILE]; TILE];
        for i0 in (0..rows).step_by(TILE) {
            let height = TILE.min(rows - i0);
            let band_rows = &src[i0 * cols..(i0 + height) * cols];
            transpose_tile(band_rows, cols, j0, width, &mut tile, |jj, column| {
                dst[jj * rows + i0..][..height].copy_from_slice(column)
            });
        }
    });
    Ok(())
}

/// Edge of the 128x128 scale blocks.
const SCALE_BLOCK: usize = 128;

/// The exact transpose `[cols, rows]` of a quantized `[rows, cols]` matrix (a frozen FP8
/// weight's `W^T`): codes transposed, a 128x128 scale grid transposed, a per-tensor scale
/// unchanged. Row-block layouts (1x128, MXFP8) have no exact transpose and are refused.
pub fn transpose_matrix(m: &QuantizedMatrix) -> Result<QuantizedMatrix> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut codes = vec![0u8; rows * cols];
    transpose_codes(m.data(), rows, cols, &mut codes)?;
    QuantizedMatrix::new(codes, cols, rows, transposed_scales(m)?)
}

/// The scales of [`transpose_matrix`]'s result.
pub fn transposed_scales(m: &QuantizedMatrix) -> Result<Scales> {
    let (rows, cols) = (m.rows(), m.cols());
    match m.scales() {
        Scales::PerTensor(s) => Ok(Scales::PerTensor(*s)),
        Scales::Block128x128(s) => {
            let (tr, tc) = (rows.div_ceil(SCALE_BLOCK), cols.div_ceil(SCALE_BLOCK));
            Ok(Scales::Block128x128(
                (0..tc * tr).map(|i| s[(i % tr) * tc + i / tr]).collect(),
            ))
        }
        other => Err(Error::InvalidTensor {
            name: "transposed FP8 matrix".into(),
            reason: format!(
                "{:?} scales have no exact transpose (per-tensor and 128x128 do)",
                other.kind()
            ),
        }),
    }
}

/// Transposes the `height x width` tile at column `j0` of `rows` (row-major,
/// `height = rows.len() / stride` rows of `stride` bytes) through a stack tile:
/// reads run along source rows, writes along destination rows, and the
/// scattered accesses stay inside 4 KB of L1. `write(jj, column)` receives
/// destination row `jj` of the tile (`height` bytes).
pub(crate) fn transpose_tile(
    rows: &[u8],
    stride: usize,
    j0: usize,
    width: usize,
    tile: &mut [[u8; TILE]; TILE],
    mut write: impl FnMut(usize, &[u8]),
) {
    let height = rows.len() / stride;
    // Whole 16 x 16 blocks in registers (x86-64), the ragged right and bottom edges by element.
    let (whole_i, whole_j) = match cfg!(target_arch = "x86_64") {
        true => (height / BLOCK * BLOCK, width / BLOCK * BLOCK),
        false => (0, 0),
    };
    #[cfg(target_arch = "x86_64")]
    for i0 in (0..whole_i).step_by(BLOCK) {
        for jj0 in (0..whole_j).step_by(BLOCK) {
            sse2::block(rows, stride, i0, j0 + jj0, &mut tile[jj0..jj0 + BLOCK], i0);
        }
    }
    for (i, row) in rows.chunks_exact(stride).enumerate() {
        let first = if i < whole_i { whole_j } else { 0 };
        for (column, &q) in tile[first..].iter_mut().zip(&row[j0 + first..j0 + width]) {
            column[i] = q;
        }
    }
    for (jj, column) in tile.iter().enumerate().take(width) {
        write(jj, &column[..height]);
    }
}

/// Edge of the blocks transposed in registers: 16 bytes, one SSE2 register per row.
const BLOCK: usize = 16;

/// 16 x 16 byte transposes with SSE2 (part of every x86-64 CPU, so no run-time check).
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128, _mm_unpackhi_epi8, _mm_unpacklo_epi8};

    use super::{BLOCK, TILE};

    /// `out[c][at + r] = rows[(i0 + r) * stride + j + c]` for r, c < 16.
    ///
    /// Each round interleaves register p with register p + 8 byte by byte (low halves into
    /// register 2p, high halves into 2p + 1). Writing an element's place as the 8 bits (register,
    /// byte), a round rotates them left by one, so four rounds swap register and byte: row i,
    /// column j lands in register j, byte i.
    pub(super) fn block(rows: &[u8], stride: usize, i0: usize, j: usize, out: &mut [[u8; TILE]], at: usize) {
        let mut r: [__m128i; BLOCK] = std::array::from_fn(|k| {
            let src: &[u8; BLOCK] = rows[(i0 + k) * stride + j..][..BLOCK].try_into().expect("16 bytes");
            // SAFETY: `src` is 16 readable bytes; loadu has no alignment requirement.
            unsafe { _mm_loadu_si128(src.as_ptr().cast()) }
        });
        for _ in 0..4 {
            r = std::array::from_fn(|k| {
                let (a, b) = (r[k / 2], r[k / 2 + BLOCK / 2]);
                // SAFETY: SSE2 is part of the x86-64 baseline, so every x86-64 CPU has it.
                unsafe {
                    match k % 2 {
                        0 => _mm_unpacklo_epi8(a, b),
                        _ => _mm_unpackhi_epi8(a, b),
                    }
                }
            });
        }
        for (column, v) in out.iter_mut().zip(r) {
            let dst: &mut [u8; BLOCK] = (&mut column[at..at + BLOCK]).try_into().expect("16 bytes");
            // SAFETY: `dst` is 16 writable bytes; storeu has no alignment requirement.
            unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), v) };
        }
    }
}
