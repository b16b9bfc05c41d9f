//! The pair-order chunk sum of one 32 x 32 output block in plain f32 arithmetic: the definition
//! the AMX and `VDPBF16PS` kernels are checked against, and the kernel of every CPU without
//! either.
//!
//! `e + a * b` rounds once, like the tile unit's FMA: the product of two FP8 (or, within the
//! guard of `pairs.rs`, bf16) values is exact, so a fused multiply-add gives the same bits.
//! Three bodies, picked at run time: the generic one (multiply, then add), and ones in AVX-512
//! ([`chunk_avx512`]) and AVX2 ([`chunk_avx2`]) FMA registers, both [`chunk_lanes`] at their
//! vector width: the same sums in the same order, only wider and fused.
//!
//! A comes as f32 (its packed bf16 strip widened once, [`widen`]: each A strip meets every B
//! strip), B as the packed bf16 pairs the tile unit reads: one 512-bit load of a pair row holds
//! 16 columns' (even, odd) K, and a shift and a mask make them f32 in registers.

use super::{BLOCK, EDGE};

/// Half of a block's columns: one 16 x 16 tile of the AMX kernel.
const HALF: usize = 16;

/// The f32 value of bf16 bits (exact).
#[inline(always)]
pub(super) fn widen_one(bits: u16) -> f32 {
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

/// One vector width of the FMA bodies: its f32 vector and the few operations they use. Every
/// operation is `unsafe`: it runs that width's instructions, which only a body compiled for them
/// on a CPU that has them may call.
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    /// f32 lanes per vector.
    const LANES: usize;
    /// Rows of A per register group: `ROWS x (even, odd)` accumulators.
    const ROWS: usize;
    unsafe fn zero() -> Self;
    /// The even and odd K of `LANES` columns of a packed pair row at `at`, widened to f32: lane
    /// `c` of the load holds column `c`'s even K in its low 16 bits and odd K in its high.
    unsafe fn pairs(at: *const u16) -> (Self, Self);
    unsafe fn splat(x: f32) -> Self;
    /// `a * b + c`, one rounding.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `out[..LANES] += e + o`.
    unsafe fn add_sum_to(out: *mut f32, e: Self, o: Self);
}

#[cfg(target_arch = "x86_64")]
mod lanes {
    use std::arch::x86_64::*;

    /// 16 lanes (AVX-512F + FMA): 8 rows x 16 columns at a time, 16 accumulators.
    #[derive(Clone, Copy)]
    pub(super) struct Z(__m512);

    // SAFETY (every function): only called from `chunk_lanes` in a body compiled with
    // AVX-512F and FMA, on a CPU that has them; pointers are the caller's.
    impl super::Lanes for Z {
        const LANES: usize = 16;
        const ROWS: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Z(unsafe { _mm512_setzero_ps() })
        }
        #[inline(always)]
        unsafe fn pairs(at: *const u16) -> (Self, Self) {
            unsafe {
                let pair = _mm512_loadu_si512(at.cast());
                let high = _mm512_set1_epi32(0xFFFF_0000_u32 as i32);
                (
                    Z(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(pair))),
                    Z(_mm512_castsi512_ps(_mm512_and_si512(pair, high))),
                )
            }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Z(unsafe { _mm512_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Z(unsafe { _mm512_fmadd_ps(a.0, b.0, c.0) })
        }
        #[inline(always)]
        unsafe fn add_sum_to(out: *mut f32, e: Self, o: Self) {
            unsafe { _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), _mm512_add_ps(e.0, o.0))) }
        }
    }

    /// 8 lanes (AVX2 + FMA; CPUs and virtual machines without AVX-512): 4 rows x 8 columns at
    /// a time, 8 of the 16 registers as accumulators.
    #[derive(Clone, Copy)]
    pub(super) struct Y(__m256);

    // SAFETY (every function): only called from `chunk_lanes` in a body compiled with AVX2
    // and FMA, on a CPU that has them; pointers are the caller's.
    impl super::Lanes for Y {
        const LANES: usize = 8;
        const ROWS: usize = 4;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Y(unsafe { _mm256_setzero_ps() })
        }
        #[inline(always)]
        unsafe fn pairs(at: *const u16) -> (Self, Self) {
            unsafe {
                let pair = _mm256_loadu_si256(at.cast());
                let high = _mm256_set1_epi32(0xFFFF_0000_u32 as i32);
                (
                    Y(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(pair))),
                    Y(_mm256_castsi256_ps(_mm256_and_si256(pair, high))),
                )
            }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Y(unsafe { _mm256_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Y(unsafe { _mm256_fmadd_ps(a.0, b.0, c.0) })
        }
        #[inline(always)]
        unsafe fn add_sum_to(out: *mut f32, e: Self, o: Self) {
            unsafe { _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), _mm256_add_ps(e.0, o.0))) }
        }
    }
}

/// [`chunk_body`] in vector registers of `V::LANES` columns: `V::ROWS` rows of a column group
/// at a time. Per pair, one load of B (shifted and masked into its even and odd f32 vectors)
/// serves `2 x ROWS` FMAs, each with a broadcast of A from memory. The same FMA chains per
/// element, so the same bits.
///
/// # Safety
/// Called from a body compiled with `V`'s instructions; `a` and `b` hold `blocks` blocks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn chunk_lanes<V: Lanes>(a: &[f32], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    /// Accumulators of one register group, at most 8 rows.
    const MAX_ROWS: usize = 8;
    c.fill(0.0);
    for kb in 0..blocks {
        // SAFETY (every pointer below): the caller's lengths; a block's rows are 32 f32 (A),
        // and each half of its B is 16 pair rows of 32 bf16, of which a column group reads
        // `2 LANES` at an offset of a multiple of `2 LANES`.
        let a_block = unsafe { a.as_ptr().add(kb * BLOCK) };
        let b_block = unsafe { b.as_ptr().add(kb * BLOCK) };
        for group in 0..EDGE / V::LANES {
            let first = group * V::LANES;
            let cols = unsafe { b_block.add(first / HALF * BLOCK / 2 + first % HALF * 2) };
            for g in 0..EDGE / V::ROWS {
                let rows = unsafe { a_block.add(g * V::ROWS * EDGE) };
                let mut e = [unsafe { V::zero() }; MAX_ROWS];
                let mut o = [unsafe { V::zero() }; MAX_ROWS];
                for p in 0..HALF {
                    let (be, bo) = unsafe { V::pairs(cols.add(p * EDGE)) };
                    for r in 0..V::ROWS {
                        let row = unsafe { rows.add(r * EDGE + 2 * p) };
                        // SAFETY: the caller's instructions; `row` holds the pair.
                        unsafe {
                            e[r] = V::fma(V::splat(*row), be, e[r]);
                            o[r] = V::fma(V::splat(*row.add(1)), bo, o[r]);
                        }
                    }
                }
                for r in 0..V::ROWS {
                    let out = &mut c[(g * V::ROWS + r) * EDGE + first..][..V::LANES];
                    // SAFETY: `out` holds `LANES` f32.
                    unsafe { V::add_sum_to(out.as_mut_ptr(), e[r], o[r]) };
                }
            }
        }
    }
}

/// [`chunk_lanes`] in AVX-512 registers.
///
/// # Safety
/// The CPU has AVX-512F and FMA; `a` and `b` hold `blocks` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn chunk_avx512(a: &[f32], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    // SAFETY: the caller's.
    unsafe { chunk_lanes::<lanes::Z>(a, b, blocks, c) }
}

/// [`chunk_lanes`] in AVX2 registers.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` and `b` hold `blocks` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_avx2(a: &[f32], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    // SAFETY: the caller's.
    unsafe { chunk_lanes::<lanes::Y>(a, b, blocks, c) }
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
