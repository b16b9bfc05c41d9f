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
        for i0 in (0..rows).step_by(TILE) {
            let height = TILE.min(rows - i0);
            for jj in 0..width {
                let out = &mut dst[jj * rows + i0..][..height];
                for (i, q) in out.iter_mut().enumerate() {
                    *q = src[(i0 + i) * cols + j0 + jj];
                }
            }
        }
    });
    Ok(())
}
