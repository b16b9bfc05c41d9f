//! The pair-order chunk sum of one 32 x 32 output block in plain f32 arithmetic: the definition
//! the AMX kernel is checked against, and the kernel of every CPU without AMX.
//!
//! `e + a * b` rounds once, like the tile unit's FMA: the product of two FP8 (or, within the
//! guard of `pairs.rs`, bf16) values is exact, so a fused multiply-add gives the same bits.
//! Compiled twice, for the default target (multiply, then add) and for AVX-512F with FMA
//! (picked at run time): the same sums in the same order, only wider and fused.

use super::{BLOCK, EDGE};

/// Half of a block's columns: one 16 x 16 tile of the AMX kernel.
const HALF: usize = 16;

#[inline(always)]
fn widen(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `c = ` the chunk sums of `blocks` K blocks (module docs of `pairs.rs`).
pub(super) fn chunk(a: &[u16], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX-512F and FMA (checked just above).
        unsafe { chunk_avx512(a, b, blocks, c) };
        return;
    }
    chunk_body::<false>(a, b, blocks, c);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn chunk_avx512(a: &[u16], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    chunk_body::<true>(a, b, blocks, c);
}

/// `e + a * b`: fused where the CPU has FMA (the product is exact: the same bits).
#[inline(always)]
fn add_product<const FUSED: bool>(e: f32, a: f32, b: f32) -> f32 {
    if FUSED { a.mul_add(b, e) } else { e + a * b }
}

#[inline(always)]
fn chunk_body<const FUSED: bool>(a: &[u16], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    c.fill(0.0);
    for kb in 0..blocks {
        let a_block = &a[kb * BLOCK..][..BLOCK];
        let b_block = &b[kb * BLOCK..][..BLOCK];
        for h in 0..2 {
            // This half's B values, even and odd K apart: `[pair][column]`.
            let mut even = [[0.0f32; HALF]; HALF];
            let mut odd = [[0.0f32; HALF]; HALF];
            let tile = &b_block[h * HALF * EDGE..][..HALF * EDGE];
            for (p, pairs) in tile.chunks_exact(EDGE).enumerate() {
                for col in 0..HALF {
                    even[p][col] = widen(pairs[2 * col]);
                    odd[p][col] = widen(pairs[2 * col + 1]);
                }
            }
            for (row, a_row) in a_block.chunks_exact(EDGE).enumerate() {
                let mut e = [0.0f32; HALF];
                let mut o = [0.0f32; HALF];
                for p in 0..HALF {
                    let (ae, ao) = (widen(a_row[2 * p]), widen(a_row[2 * p + 1]));
                    for col in 0..HALF {
                        e[col] = add_product::<FUSED>(e[col], ae, even[p][col]);
                        o[col] = add_product::<FUSED>(o[col], ao, odd[p][col]);
                    }
                }
                let out = &mut c[row * EDGE + h * HALF..][..HALF];
                for col in 0..HALF {
                    out[col] += e[col] + o[col];
                }
            }
        }
    }
}
