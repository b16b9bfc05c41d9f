//! Splitting the `M x N` output into disjoint tiles that rayon tasks own:
//! each tile is a list of row segments borrowed from the output, so tasks
//! write their results in place without sharing anything.

/// Tile edges start here. Each tile repacks its A and B panels, so every
/// element of A is packed N/512 times and of B M/512 times: at 2048^3 that is
/// 8 passes instead of 16 with 256-wide tiles (measured ~5-10% faster on the
/// 2-core machine of docs/benchmarks.md). The 1 MiB f32 accumulator is
/// touched once per 128 of K (67 MFLOP), so it need not stay in L2.
const TILE: usize = 512;
/// Smallest edge a tile is shrunk to for more parallel tasks.
const MIN_TILE: usize = 64;
/// Tasks per thread wanted before tiles stop shrinking: enough for load
/// balance, few enough that tiles stay big (2 measured ~15% faster than 4 at
/// 512^3 on 2 threads).
const TASKS_PER_THREAD: usize = 2;

/// Tile height and width for an `m x n` output on `threads` threads.
pub(super) fn tile_shape(m: usize, n: usize, threads: usize) -> (usize, usize) {
    let (mut tm, mut tn) = (TILE.min(m.max(1)), TILE.min(n.max(1)));
    let tasks = |tm: usize, tn: usize| m.div_ceil(tm) * n.div_ceil(tn);
    while tasks(tm, tn) < TASKS_PER_THREAD * threads {
        if tn >= tm && tn > MIN_TILE {
            tn /= 2;
        } else if tm > MIN_TILE {
            tm /= 2;
        } else {
            break;
        }
    }
    (tm, tn)
}

/// Height of the row bands of an in-place f32 output (`cpu.rs`): whole rows, halved from
/// [`TILE`] until every thread has [`TASKS_PER_THREAD`] bands or they reach [`MIN_TILE`].
pub(super) fn band_rows(m: usize, threads: usize) -> usize {
    let mut rows = TILE.min(m.max(1));
    while m.div_ceil(rows) < TASKS_PER_THREAD * threads && rows > MIN_TILE {
        rows /= 2;
    }
    rows
}

/// One output tile: rows `i0..i0 + rows.len()`, columns `j0..j0 + width`.
pub(super) struct Tile<'a, T> {
    pub i0: usize,
    pub j0: usize,
    pub width: usize,
    pub rows: Vec<&'a mut [T]>,
}

/// Splits row-major `out` (`n` columns) into `tm x tn` tiles (ragged at the
/// right and bottom edges), in row-of-tiles order.
pub(super) fn split<T>(out: &mut [T], n: usize, tm: usize, tn: usize) -> Vec<Tile<'_, T>> {
    if n == 0 {
        return Vec::new();
    }
    let per_band = n.div_ceil(tn);
    let mut tiles: Vec<Tile<T>> = Vec::new();
    for (i, row) in out.chunks_mut(n).enumerate() {
        if i % tm == 0 {
            tiles.extend((0..per_band).map(|t| Tile {
                i0: i,
                j0: t * tn,
                width: tn.min(n - t * tn),
                rows: Vec::with_capacity(tm),
            }));
        }
        let band = tiles.len() - per_band;
        for (t, segment) in row.chunks_mut(tn).enumerate() {
            tiles[band + t].rows.push(segment);
        }
    }
    tiles
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_the_output_once() {
        for (m, n, tm, tn) in [(5, 7, 2, 3), (4, 4, 4, 4), (1, 9, 8, 2), (9, 1, 2, 8), (0, 3, 2, 2)] {
            let mut out = vec![0u32; m * n];
            for tile in split(&mut out, n, tm, tn) {
                assert!(tile.rows.len() <= tm && tile.width <= tn);
                for (r, row) in tile.rows.into_iter().enumerate() {
                    assert_eq!(row.len(), tile.width);
                    for (c, x) in row.iter_mut().enumerate() {
                        *x += ((tile.i0 + r) * n + tile.j0 + c) as u32 + 1;
                    }
                }
            }
            let expected: Vec<u32> = (1..=(m * n) as u32).collect();
            assert_eq!(out, expected, "{m}x{n} in {tm}x{tn} tiles");
        }
    }

    #[test]
    fn small_outputs_get_several_tiles() {
        assert_eq!(tile_shape(2048, 2048, 2), (512, 512));
        let (tm, tn) = tile_shape(256, 256, 2);
        assert!(256usize.div_ceil(tm) * 256usize.div_ceil(tn) >= 4);
        assert_eq!(tile_shape(1, 1, 2), (1, 1));
        assert_eq!(band_rows(1024, 2), 256);
        assert_eq!(band_rows(100, 2), 50);
        assert_eq!(band_rows(4096, 2), 512);
    }
}
