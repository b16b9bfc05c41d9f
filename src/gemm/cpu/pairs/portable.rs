//! The pair-order chunk sum of one 32 x 32 output block in plain f32 arithmetic: the definition
//! the AMX kernel is checked against, and the kernel of every CPU without AMX.
//!
//! `e + a * b` rounds once, like the tile unit's FMA: the product of two FP8 (or, within the
//! guard of `pairs.rs`, bf16) values is exact, so a fused multiply-add gives the same bits.
//! Three bodies, picked at run time: the generic one (multiply, then add), and ones in AVX-512
//! ([`chunk_avx512`]) and AVX2 ([`chunk_avx2`]) FMA registers: the same sums in the same order,
//! only wider and fused.
//!
//! A comes as f32 (its packed bf16 strip widened once, [`widen`]: each A strip meets every B
//! strip), B as the packed bf16 pairs the tile unit reads: one 512-bit load of a pair row holds
//! 16 columns' (even, odd) K, and a shift and a mask make them f32 in registers.

use super::{BLOCK, EDGE};

/// Half of a block's columns: one 16 x 16 tile of the AMX kernel.
const HALF: usize = 16;

#[inline(always)]
fn widen_one(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `out = ` the f32 values of the bf16 bits `bits` (exact; a loop the compiler vectorizes).
pub(super) fn widen(bits: &[u16], out: &mut [f32]) {
    assert_eq!(bits.len(), out.len(), "widen: lengths");
    out.iter_mut().zip(bits).for_each(|(o, &b)| *o = widen_one(b));
}

/// `c = ` the chunk sums of `blocks` K blocks (module docs of `pairs.rs`): `a` a packed A strip
/// widened to f32, `b` a packed B strip.
pub(super) fn chunk(a: &[f32], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    assert!(
        a.len() >= blocks * BLOCK && b.len() >= blocks * BLOCK,
        "portable: short strips"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX-512F and FMA (checked just above); the lengths were checked.
            unsafe { chunk_avx512(a, b, blocks, c) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above); the lengths were checked.
            unsafe { chunk_avx2(a, b, blocks, c) };
            return;
        }
    }
    chunk_body(a, b, blocks, c);
}

fn chunk_body(a: &[f32], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    c.fill(0.0);
    for kb in 0..blocks {
        let a_block = &a[kb * BLOCK..][..BLOCK];
        let b_block = &b[kb * BLOCK..][..BLOCK];
        for h in 0..2 {
            let (even, odd) = b_half(b_block, h);
            for (row, a_row) in a_block.chunks_exact(EDGE).enumerate() {
                let mut e = [0.0f32; HALF];
                let mut o = [0.0f32; HALF];
                for p in 0..HALF {
                    let (ae, ao) = (a_row[2 * p], a_row[2 * p + 1]);
                    for col in 0..HALF {
                        e[col] += ae * even[p][col];
                        o[col] += ao * odd[p][col];
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

/// Half `h` of a packed B block as f32, even and odd K apart: `[pair][column]` each.
#[inline(always)]
fn b_half(b_block: &[u16], h: usize) -> ([[f32; HALF]; HALF], [[f32; HALF]; HALF]) {
    let mut even = [[0.0f32; HALF]; HALF];
    let mut odd = [[0.0f32; HALF]; HALF];
    let tile = &b_block[h * HALF * EDGE..][..HALF * EDGE];
    for (p, pairs) in tile.chunks_exact(EDGE).enumerate() {
        for col in 0..HALF {
            even[p][col] = widen_one(pairs[2 * col]);
            odd[p][col] = widen_one(pairs[2 * col + 1]);
        }
    }
    (even, odd)
}

/// Rows of A per register group: 8 rows x (even, odd) is 16 accumulator vectors.
#[cfg(target_arch = "x86_64")]
const GROUP: usize = 8;

/// [`chunk_body`] in AVX-512 registers: 8 rows of a 16-column half at a time. Per pair, one
/// load of B (shifted and masked into its even and odd f32 vectors) serves 16 FMAs, each with a
/// broadcast of A from memory. The same FMA chains per element, so the same bits.
///
/// # Safety
/// The CPU has AVX-512F and FMA; `a` and `b` hold `blocks` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn chunk_avx512(a: &[f32], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    use std::arch::x86_64::*;
    c.fill(0.0);
    let high = _mm512_set1_epi32(0xFFFF_0000_u32 as i32);
    for kb in 0..blocks {
        // SAFETY (all loads below): the caller's lengths; a block's rows are 32 f32 (A) and
        // a half is 16 pairs of 32 bf16 (B).
        let a_block = unsafe { a.as_ptr().add(kb * BLOCK) };
        let b_block = unsafe { b.as_ptr().add(kb * BLOCK) };
        for h in 0..2 {
            let half = unsafe { b_block.add(h * BLOCK / 2) };
            for g in 0..EDGE / GROUP {
                let rows = unsafe { a_block.add(g * GROUP * EDGE) };
                let mut e = [_mm512_setzero_ps(); GROUP];
                let mut o = [_mm512_setzero_ps(); GROUP];
                for p in 0..HALF {
                    // Lane c of the load: column c's even K in its low 16 bits, odd K in its high.
                    let pair = unsafe { _mm512_loadu_si512(half.add(p * EDGE).cast()) };
                    let be = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pair));
                    let bo = _mm512_castsi512_ps(_mm512_and_si512(pair, high));
                    for r in 0..GROUP {
                        let row = unsafe { rows.add(r * EDGE + 2 * p) };
                        e[r] = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *row }), be, e[r]);
                        o[r] = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *row.add(1) }), bo, o[r]);
                    }
                }
                for r in 0..GROUP {
                    let out = &mut c[(g * GROUP + r) * EDGE + h * HALF..][..HALF];
                    // SAFETY: `out` holds 16 f32.
                    unsafe {
                        let sum = _mm512_add_ps(_mm512_loadu_ps(out.as_ptr()), _mm512_add_ps(e[r], o[r]));
                        _mm512_storeu_ps(out.as_mut_ptr(), sum);
                    }
                }
            }
        }
    }
}

/// [`chunk_body`] in AVX2 registers (CPUs, or virtual machines, without AVX-512): 4 rows of an
/// 8-column quarter at a time, 8 accumulators of the 16 registers. Per pair, one 256-bit load of
/// B (8 columns' even and odd K, shifted and masked) serves 8 FMAs. Same chains, same bits.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` and `b` hold `blocks` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_avx2(a: &[f32], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    use std::arch::x86_64::*;
    /// Rows per register group and columns per vector.
    const ROWS: usize = 4;
    const LANES: usize = 8;
    c.fill(0.0);
    let high = _mm256_set1_epi32(0xFFFF_0000_u32 as i32);
    for kb in 0..blocks {
        // SAFETY (all loads below): the caller's lengths; a block's rows are 32 f32 (A) and a
        // half is 16 pairs of 32 bf16 (B), of which a quarter reads 16 at an offset of 0 or 16.
        let a_block = unsafe { a.as_ptr().add(kb * BLOCK) };
        let b_block = unsafe { b.as_ptr().add(kb * BLOCK) };
        for quarter in 0..EDGE / LANES {
            let (h, part) = (quarter / 2, quarter % 2);
            let cols = unsafe { b_block.add(h * BLOCK / 2 + part * 2 * LANES) };
            for g in 0..EDGE / ROWS {
                let rows = unsafe { a_block.add(g * ROWS * EDGE) };
                let mut e = [_mm256_setzero_ps(); ROWS];
                let mut o = [_mm256_setzero_ps(); ROWS];
                for p in 0..HALF {
                    let pair = unsafe { _mm256_loadu_si256(cols.add(p * EDGE).cast()) };
                    let be = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pair));
                    let bo = _mm256_castsi256_ps(_mm256_and_si256(pair, high));
                    for r in 0..ROWS {
                        let row = unsafe { rows.add(r * EDGE + 2 * p) };
                        e[r] = _mm256_fmadd_ps(_mm256_set1_ps(unsafe { *row }), be, e[r]);
                        o[r] = _mm256_fmadd_ps(_mm256_set1_ps(unsafe { *row.add(1) }), bo, o[r]);
                    }
                }
                for r in 0..ROWS {
                    let out = &mut c[(g * ROWS + r) * EDGE + quarter * LANES..][..LANES];
                    // SAFETY: `out` holds 8 f32.
                    unsafe {
                        let sum = _mm256_add_ps(_mm256_loadu_ps(out.as_ptr()), _mm256_add_ps(e[r], o[r]));
                        _mm256_storeu_ps(out.as_mut_ptr(), sum);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default-target body (multiply, then add) and the run-time-picked one (AVX-512 FMA
    /// registers where the CPU has them) give the same bits.
    #[test]
    fn every_compiled_body_gives_the_same_bits() {
        let mut rng = super::super::XorShift(0x9E37_79B9_7F4A_7C15);
        // bf16 values of 4-bit significands over 2^-20..2^20, both signs, some zeros.
        let mut value = || -> u16 {
            let r = rng.next();
            if r.is_multiple_of(11) {
                return 0;
            }
            let exponent = 107 + (r >> 8) % 40;
            ((r as u16 & 1) << 15) | ((exponent as u16) << 7) | ((r >> 32) as u16 & 0x70)
        };
        for blocks in [1, 3, 4] {
            let a: Vec<u16> = (0..blocks * BLOCK).map(|_| value()).collect();
            let b: Vec<u16> = (0..blocks * BLOCK).map(|_| value()).collect();
            let mut a_wide = vec![0.0f32; a.len()];
            widen(&a, &mut a_wide);
            let (mut generic, mut picked) = ([0.0f32; BLOCK], [0.0f32; BLOCK]);
            chunk_body(&a_wide, &b, blocks, &mut generic);
            chunk(&a_wide, &b, blocks, &mut picked);
            let bad = (0..BLOCK).find(|&i| generic[i].to_bits() != picked[i].to_bits());
            assert_eq!(bad, None, "{blocks} blocks");
            // The AVX2 body, which `chunk` passes over on AVX-512 CPUs.
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                let mut avx2 = [0.0f32; BLOCK];
                // SAFETY: the CPU has AVX2 and FMA; both strips hold `blocks` blocks.
                unsafe { chunk_avx2(&a_wide, &b, blocks, &mut avx2) };
                let bad = (0..BLOCK).find(|&i| generic[i].to_bits() != avx2[i].to_bits());
                assert_eq!(bad, None, "AVX2, {blocks} blocks");
            }
        }
    }

    /// Widening gives `half`'s value of every one of the 2^16 bf16 codes (NaNs stay NaN, with
    /// their sign).
    #[test]
    fn widen_is_the_bf16_value() {
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let mut out = vec![0.0f32; bits.len()];
        widen(&bits, &mut out);
        for (&b, w) in bits.iter().zip(&out) {
            let want = half::bf16::from_bits(b).to_f32();
            if want.is_nan() {
                assert!(
                    w.is_nan() && w.is_sign_negative() == want.is_sign_negative(),
                    "{b:#06x}"
                );
            } else {
                assert_eq!(w.to_bits(), want.to_bits(), "{b:#06x}");
            }
        }
    }
}
