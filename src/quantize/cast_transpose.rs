//! Fused cast + transpose + amax: both copies of a per-tensor-scaled tensor
//! in one pass over the high-precision source (what dgrad and wgrad need).

use rayon::prelude::*;

use super::transpose::{TILE, transpose_tile};
use super::{check_len, check_scale};
use crate::convert::{self, HighPrecision};
use crate::error::Result;
use crate::format::{Fp8Format, Overflow};

/// Writes `dst_rowwise` (`[rows, cols]`) and `dst_columnwise` (`[cols, rows]`)
/// with `cast_sat(x * scale)`; returns `max |x|`.
pub fn cast_transpose_amax<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    scale: f32,
    dst_rowwise: &mut [u8],
    dst_columnwise: &mut [u8],
) -> Result<f32> {
    let seen = |_: &[T], _: &[u8]| ();
    let (amax, ()) = cast_transpose_visit(
        src,
        rows,
        cols,
        format,
        scale,
        dst_rowwise,
        dst_columnwise,
        seen,
        |(), ()| (),
    )?;
    Ok(amax)
}

/// [`cast_transpose_amax`] that also shows every band of rows and its codes to `visit` right
/// after casting them, while both are still in cache (e.g. to count statistics without a second
/// read of the source), and folds the bands' results with `combine` (in no fixed order, so it
/// must be associative and commutative, e.g. integer sums).
///
/// Bands of 64 rows run in parallel: a band's rows are cast into its own
/// slice of the row-wise copy, then transposed tile by tile from there (the
/// band's codes are still in cache) into the band's column range of every row
/// of the column-wise copy. Those ranges are disjoint between bands, so each
/// task gets its own `&mut` pieces.
#[allow(clippy::too_many_arguments)] // the cast's 7 plus the visitor pair
pub(crate) fn cast_transpose_visit<T, S, V, C>(
    src: &[T],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    scale: f32,
    dst_rowwise: &mut [u8],
    dst_columnwise: &mut [u8],
    visit: V,
    combine: C,
) -> Result<(f32, S)>
where
    T: HighPrecision,
    S: Default + Send,
    V: Fn(&[T], &[u8]) -> S + Sync,
    C: Fn(S, S) -> S + Sync,
{
    check_len("cast_transpose source", src.len(), rows, cols)?;
    check_len("cast_transpose row-wise codes", dst_rowwise.len(), rows, cols)?;
    check_len("cast_transpose column-wise codes", dst_columnwise.len(), cols, rows)?;
    check_scale(scale)?;
    if rows == 0 || cols == 0 {
        return Ok((0.0, S::default()));
    }
    // pieces[band][j] = dst_columnwise[j][band rows]: one slice per band per column.
    let bands = rows.div_ceil(TILE);
    let mut pieces: Vec<Vec<&mut [u8]>> = (0..bands).map(|_| Vec::with_capacity(cols)).collect();
    for column in dst_columnwise.chunks_mut(rows) {
        for (band, piece) in column.chunks_mut(TILE).enumerate() {
            pieces[band].push(piece);
        }
    }
    src.par_chunks(TILE * cols)
        .zip(dst_rowwise.par_chunks_mut(TILE * cols))
        .zip(pieces.into_par_iter())
        .map(|((src, dst), mut columns)| {
            let mut amax = 0.0f32;
            for (row, out) in src.chunks(cols).zip(dst.chunks_mut(cols)) {
                amax = amax.max(convert::quantize(row, out, format, scale, Overflow::Saturate)?);
            }
            let seen = visit(src, dst);
            let mut tile = [[0u8; TILE]; TILE];
            for j0 in (0..cols).step_by(TILE) {
                let width = TILE.min(cols - j0);
                let tile_columns = &mut columns[j0..j0 + width];
                transpose_tile(dst, cols, j0, width, &mut tile, |jj, column| {
                    tile_columns[jj].copy_from_slice(column)
                });
            }
            Ok((amax, seen))
        })
        .try_reduce(|| (0.0, S::default()), |a, b| Ok((a.0.max(b.0), combine(a.1, b.1))))
}
