//! Tile shape, ring depth, rasterization group and grid size of the Hopper
//! GEMM per problem shape.
//!
//! A CTA computes one 128 x BLOCK_N tile at a time, in time proportional to
//! BLOCK_N (for a given K), and the persistent grid runs `min(tiles, SMs)`
//! CTAs. The GEMM takes `waves = ceil(tiles / SMs)` tile-times, so its cost in
//! units of a 128 x 128 tile is `waves * BLOCK_N / 128`: that is the wave
//! quantisation the heuristic minimises. On a tie the wider tile wins (it reads
//! A once per 256 columns instead of 128: less shared-memory and L2 traffic per
//! FLOP). Small-M shapes (a single m-block) end up on 128-wide tiles because
//! twice the tiles keep twice the SMs busy in the single wave.
//!
//! The ring depth follows the tile: 6 stages of 32 KiB (128-wide) or 4 of
//! 48 KiB (256-wide), both about 192 KiB of the 227 KiB of shared memory.
//! The group size makes the tiles in flight cover a square-ish patch of the
//! output: `g` m-blocks by `ctas / g` n-blocks with `128 g ~ BLOCK_N ctas / g`,
//! so `g = sqrt(ctas * BLOCK_N / 128)`, clamped to `[1, m_blocks]`.
//!
//! | shape (M x N x K)    | BLOCK_N | tiles | waves on 132 SMs | group_m |
//! |----------------------|---------|-------|------------------|---------|
//! | 8192 x 8192 x 8192   | 256     | 2048  | 16 (97%)         | 16      |
//! | 4096 x 7168 x 16384  | 256     | 896   | 7 (97%)          | 16      |
//! | 4096 x 4096 x 7168   | 256     | 512   | 4 (97%)          | 16      |
//! | 4096 x 2112 x 7168   | 128     | 544   | 5 (82%)          | 11      |
//! | 4096 x 24576 x 1536  | 128     | 6144  | 47 (99%)         | 11      |
//! | 128 x 7168 x 16384   | 128     | 56    | 1 (42%)          | 1       |
//! | 64 x 2112 x 7168     | 128     | 17    | 1 (13%)          | 1       |
//!
//! The last two are far from filling the GPU: they need split-K (not
//! implemented), see `docs/hopper-gemm.md`.

use super::scheduler::TileGrid;
use crate::backend::cuda::params::{FP8_WGMMA_BLOCK_M, FP8_WGMMA_STAGES_N128, FP8_WGMMA_STAGES_N256};
use crate::error::Result;

/// SMs of an H100/H200 SXM, the default the llm-suite table is computed for.
pub const H100_SMS: u32 = 132;

/// Output tile widths the kernel is compiled for.
pub const BLOCK_NS: [u32; 2] = [128, 256];

/// What the launcher runs for one problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// Output tile width (tile height is always 128).
    pub block_n: u32,
    /// Depth of the shared-memory ring.
    pub stages: u32,
    /// m-blocks per rasterization group (see [`super::scheduler`]).
    pub group_m: u32,
    /// Persistent CTAs: `min(tiles, SMs)`, at least 1.
    pub ctas: u32,
    /// Number of 128 x block_n tiles.
    pub tiles: u32,
}

impl TileConfig {
    /// Rounds of tiles the persistent grid needs.
    pub fn waves(&self, sms: u32) -> u32 {
        self.tiles.div_ceil(sms.max(1))
    }

    /// Busy share of `waves * sms` tile slots (1.0: no tail).
    pub fn wave_efficiency(&self, sms: u32) -> f64 {
        let slots = self.waves(sms) as f64 * sms.max(1) as f64;
        if slots == 0.0 { 1.0 } else { self.tiles as f64 / slots }
    }

    /// The cost the heuristic minimises: waves x tile time, in 128 x 128 tile-times.
    pub fn cost(&self, sms: u32) -> u64 {
        self.waves(sms) as u64 * (self.block_n / 128) as u64
    }
}

/// Ring depth compiled for `block_n` (`FP8_WGMMA_STAGES_N*` of the header).
pub fn stages_for(block_n: u32) -> u32 {
    if block_n == 128 {
        FP8_WGMMA_STAGES_N128
    } else {
        FP8_WGMMA_STAGES_N256
    }
}

/// The configuration for tile width `block_n` on an `m x n` output with `sms` SMs.
pub fn config_for(m: usize, n: usize, block_n: u32, sms: u32) -> Result<TileConfig> {
    let m_blocks = m.div_ceil(FP8_WGMMA_BLOCK_M as usize);
    let probe = TileGrid::new(m, n, FP8_WGMMA_BLOCK_M as usize, block_n as usize, 1)?;
    let tiles = probe.tiles();
    let ctas = tiles.min(sms.max(1)).max(1);
    let ideal = ((ctas as f64) * (block_n as f64) / FP8_WGMMA_BLOCK_M as f64)
        .sqrt()
        .round() as usize;
    let group_m = ideal.clamp(1, m_blocks.max(1));
    // Re-validate with the chosen group (its span group_m * n_blocks must fit u32).
    TileGrid::new(m, n, FP8_WGMMA_BLOCK_M as usize, block_n as usize, group_m)?;
    Ok(TileConfig {
        block_n,
        stages: stages_for(block_n),
        group_m: group_m as u32,
        ctas,
        tiles,
    })
}

/// The tile configuration for an `m x n` output on a GPU with `sms` SMs (K does
/// not change the choice: every tile walks all of K).
pub fn choose(m: usize, n: usize, sms: u32) -> Result<TileConfig> {
    let mut best: Option<TileConfig> = None;
    for block_n in BLOCK_NS {
        let c = config_for(m, n, block_n, sms)?;
        // `<=`: on equal cost the later (wider) tile wins.
        if best.is_none_or(|b| c.cost(sms) <= b.cost(sms)) {
            best = Some(c);
        }
    }
    Ok(best.expect("BLOCK_NS is not empty"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The llm suite of `fp8 bench gemm` with the tile width worked out by hand
    /// (waves x width): e.g. 4096 x 2112: 128-wide 544 tiles = 5 waves x 1 = 5,
    /// 256-wide 288 tiles = 3 waves x 2 = 6, so 128.
    const LLM: &[(usize, usize, usize, u32)] = &[
        (8192, 8192, 8192, 256),
        (4096, 7168, 16384, 256),
        (4096, 4096, 7168, 256),
        (4096, 2112, 7168, 128),
        (4096, 24576, 1536, 128),
        (128, 7168, 16384, 128),
        (64, 2112, 7168, 128),
    ];

    #[test]
    fn llm_suite_tile_widths() {
        for &(m, n, k, block_n) in LLM {
            let c = choose(m, n, H100_SMS).unwrap();
            assert_eq!(c.block_n, block_n, "{m}x{n}x{k}: {c:?}");
            assert_eq!(c.stages, stages_for(block_n));
        }
    }

    #[test]
    fn choice_is_never_worse_than_the_alternative() {
        for m in [1, 64, 127, 128, 129, 1000, 4096, 8192, 20000] {
            for n in [1, 100, 128, 255, 256, 257, 2112, 7168, 24576] {
                for sms in [1, 78, 114, 132] {
                    let c = choose(m, n, sms).unwrap();
                    for block_n in BLOCK_NS {
                        let other = config_for(m, n, block_n, sms).unwrap();
                        assert!(c.cost(sms) <= other.cost(sms), "{m}x{n} on {sms}: {c:?} vs {other:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn grid_and_group_bounds() {
        for &(m, n, _, _) in LLM {
            let c = choose(m, n, H100_SMS).unwrap();
            assert!(c.ctas >= 1 && c.ctas <= H100_SMS && c.ctas <= c.tiles, "{c:?}");
            assert_eq!(c.tiles, (m.div_ceil(128) * n.div_ceil(c.block_n as usize)) as u32);
            assert!(c.group_m >= 1 && c.group_m as usize <= m.div_ceil(128).max(1), "{c:?}");
            // A full wave covers a patch within 2x of square (in elements) when M has room.
            if c.tiles >= H100_SMS && m.div_ceil(128) >= 16 {
                let rows = 128.0 * c.group_m as f64;
                let cols = c.block_n as f64 * (H100_SMS as f64 / c.group_m as f64);
                assert!(rows / cols < 2.0 && cols / rows < 2.0, "{m}x{n}: {rows} x {cols}");
            }
        }
    }

    #[test]
    fn wave_accounting() {
        let c = choose(4096, 2112, H100_SMS).unwrap();
        assert_eq!((c.tiles, c.waves(H100_SMS)), (544, 5));
        assert!((c.wave_efficiency(H100_SMS) - 544.0 / 660.0).abs() < 1e-12);
        let tiny = choose(64, 2112, H100_SMS).unwrap();
        assert_eq!((tiny.tiles, tiny.ctas, tiny.group_m), (17, 17, 1));
    }

    #[test]
    fn empty_output_still_has_one_cta_and_no_tiles() {
        let c = choose(0, 100, H100_SMS).unwrap();
        assert_eq!(c.tiles, 0);
        assert_eq!(c.waves(H100_SMS), 0);
    }
}
