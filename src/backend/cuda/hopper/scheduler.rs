//! The persistent tile order of the Hopper GEMM: which output tile a CTA
//! computes at each step. The same formula as `tile_coords` in
//! `cuda/gemm_wgmma_sm90.cu`; the tests here are its CPU check.
//!
//! Tiles are numbered `0..m_blocks * n_blocks` and visited in groups of
//! `group_m` m-blocks: inside a group the m-block changes fastest, then the
//! n-block, so the ~132 tiles in flight at once touch about `group_m` row
//! panels of A and `132 / group_m` column panels of B (both stay in L2),
//! instead of one row panel and all of B (row-major order). CTA `c` of `ctas`
//! computes tiles `c, c + ctas, c + 2 ctas, ...`.

use crate::error::{Error, Result};

/// The tile grid of one GEMM and its grouped (L2-friendly) order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileGrid {
    m_blocks: u32,
    n_blocks: u32,
    group_m: u32,
}

fn args(detail: String) -> Error {
    Error::KernelArgs {
        kernel: "gemm_wgmma",
        detail,
    }
}

impl TileGrid {
    /// The grid of `block_m x block_n` tiles over an `m x n` output, visited in groups of `group_m` m-blocks.
    ///
    /// Refuses shapes whose tile count or group span overflow the kernel's 32-bit tile arithmetic.
    pub fn new(m: usize, n: usize, block_m: usize, block_n: usize, group_m: usize) -> Result<Self> {
        if block_m == 0 || block_n == 0 || group_m == 0 {
            return Err(args(format!(
                "tile {block_m}x{block_n} with group_m {group_m}: all must be >= 1"
            )));
        }
        let m_blocks = m.div_ceil(block_m);
        let n_blocks = n.div_ceil(block_n);
        // The kernel computes tile, group_m * n_blocks and the CTA stride in u32, and the grid is at most 2^31-1.
        let tiles = m_blocks.checked_mul(n_blocks).filter(|&t| t <= i32::MAX as usize);
        let span = group_m.checked_mul(n_blocks).filter(|&s| s <= u32::MAX as usize);
        match (tiles, span) {
            (Some(_), Some(_)) => Ok(TileGrid {
                m_blocks: m_blocks as u32,
                n_blocks: n_blocks as u32,
                group_m: group_m as u32,
            }),
            _ => Err(args(format!(
                "{m}x{n} output in {block_m}x{block_n} tiles (group_m {group_m}) exceeds the 2^31 tile limit"
            ))),
        }
    }

    /// Tile rows (`ceil(m / block_m)`).
    pub fn m_blocks(&self) -> u32 {
        self.m_blocks
    }

    /// Tile columns (`ceil(n / block_n)`).
    pub fn n_blocks(&self) -> u32 {
        self.n_blocks
    }

    /// m-blocks per rasterization group.
    pub fn group_m(&self) -> u32 {
        self.group_m
    }

    /// Number of tiles.
    pub fn tiles(&self) -> u32 {
        self.m_blocks * self.n_blocks
    }

    /// `(m_block, n_block)` of tile number `tile` (< `tiles()`), exactly as the kernel computes it.
    pub fn coords(&self, tile: u32) -> (u32, u32) {
        let per_group = self.group_m * self.n_blocks;
        let group = tile / per_group;
        let first_m = group * self.group_m;
        let rows = (self.m_blocks - first_m).min(self.group_m);
        let in_group = tile - group * per_group;
        (first_m + in_group % rows, in_group / rows)
    }

    /// The tiles CTA `cta` of `ctas` computes, in its order.
    pub fn cta_tiles(&self, cta: u32, ctas: u32) -> impl Iterator<Item = u32> + use<> {
        let tiles = self.tiles();
        (cta..tiles).step_by(ctas.max(1) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Shapes around tile edges and ragged ones, in tiles of 128 x block_n.
    const SHAPES: &[(usize, usize)] = &[
        (1, 1),
        (128, 128),
        (129, 127),
        (1000, 3000),
        (8192, 8192),
        (4096, 2112),
        (64, 2112),
        (128, 7168),
        (4096, 24576),
        (3000, 100),
    ];

    #[test]
    fn every_tile_exactly_once_for_every_group_size() {
        for &(m, n) in SHAPES {
            for block_n in [128, 256] {
                for group_m in [1, 2, 3, 5, 8, 11, 16, 64, 1000] {
                    let grid = TileGrid::new(m, n, 128, block_n, group_m).unwrap();
                    let (mb, nb) = (m.div_ceil(128) as u32, n.div_ceil(block_n) as u32);
                    assert_eq!(grid.tiles(), mb * nb);
                    let mut seen = HashSet::new();
                    for t in 0..grid.tiles() {
                        let (i, j) = grid.coords(t);
                        assert!(
                            i < mb && j < nb,
                            "{m}x{n} g{group_m}: tile {t} -> ({i},{j}) outside {mb}x{nb}"
                        );
                        assert!(seen.insert((i, j)), "{m}x{n} g{group_m}: ({i},{j}) twice");
                    }
                }
            }
        }
    }

    #[test]
    fn ctas_partition_the_tiles() {
        let grid = TileGrid::new(4096, 2112, 128, 128, 8).unwrap();
        for ctas in [1, 7, 132, 544, 1000] {
            let mut count = vec![0u32; grid.tiles() as usize];
            for cta in 0..ctas {
                for t in grid.cta_tiles(cta, ctas) {
                    count[t as usize] += 1;
                }
            }
            assert!(count.iter().all(|&c| c == 1), "{ctas} CTAs");
        }
    }

    #[test]
    fn group_of_one_is_row_major_and_one_whole_group_is_column_major() {
        // group_m = 1: tile t is (t / n_blocks, t % n_blocks), the plain row-major order.
        let grid = TileGrid::new(1000, 3000, 128, 128, 1).unwrap();
        let nb = grid.n_blocks();
        for t in 0..grid.tiles() {
            assert_eq!(grid.coords(t), (t / nb, t % nb));
        }
        // group_m >= m_blocks: one group, m fastest (column-major over tiles).
        let grid = TileGrid::new(1000, 3000, 128, 128, 64).unwrap();
        let mb = grid.m_blocks();
        for t in 0..grid.tiles() {
            assert_eq!(grid.coords(t), (t % mb, t / mb));
        }
    }

    /// Distinct A row panels + B column panels among `window` consecutive tiles (what one wave reads).
    fn panels(grid: &TileGrid, window: u32) -> usize {
        let (mut rows, mut cols) = (HashSet::new(), HashSet::new());
        for t in 0..window.min(grid.tiles()) {
            let (i, j) = grid.coords(t);
            rows.insert(i);
            cols.insert(j);
        }
        rows.len() + cols.len()
    }

    #[test]
    fn grouping_shrinks_the_panels_a_wave_touches() {
        // 8192^3 in 128x256 tiles, 132 tiles in flight: row-major order touches 5 row panels
        // and all 32 column panels; groups of 16 touch 16 + 9.
        let row_major = TileGrid::new(8192, 8192, 128, 256, 1).unwrap();
        let grouped = TileGrid::new(8192, 8192, 128, 256, 16).unwrap();
        assert!(panels(&grouped, 132) < panels(&row_major, 132));
    }

    #[test]
    fn refuses_zero_sizes_and_overflow() {
        assert!(TileGrid::new(10, 10, 128, 128, 0).is_err());
        assert!(TileGrid::new(10, 10, 0, 128, 1).is_err());
        assert!(TileGrid::new(1 << 40, 1 << 40, 128, 128, 1).is_err());
        let empty = TileGrid::new(0, 5, 128, 128, 4).unwrap();
        assert_eq!(empty.tiles(), 0);
        assert_eq!(empty.cta_tiles(0, 132).count(), 0);
    }
}
