//! Cache-tiled transpose of FP8 codes.

use rayon::prelude::*;

use super::check_len;
use crate::error::Result;

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
    for (i, row) in rows.chunks_exact(stride).enumerate() {
        for (column, &q) in tile.iter_mut().zip(&row[j0..j0 + width]) {
            column[i] = q;
        }
    }
    for (jj, column) in tile.iter().enumerate().take(width) {
        write(jj, &column[..height]);
    }
}
