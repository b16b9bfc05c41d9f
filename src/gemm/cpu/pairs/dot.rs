//! The pair-order chunk sum on AVX512-BF16's `VDPBF16PS`: for CPUs with that instruction and
//! no AMX (AMD Zen 4 and later), twice the products per instruction of the f32 FMAs of
//! [`super::portable`], with the same bits.
//!
//! `VDPBF16PS` adds two bf16 products to each f32 lane: first the product of the lane's high
//! halves, then that of its low halves, each rounded to f32 as an FMA would round it (Intel's
//! pseudocode, with inputs and outputs flushed; measured bit for bit on Zen 4, and checked at
//! first use by [`self_check`]). The pair order's chains are the even and the odd K of a block
//! of 32, each in K order, so one instruction can take two consecutive terms of one chain if
//! the earlier sits in the high half: the strips are packed in that order (`KOrder::Dot` of
//! `pairs.rs`).
//! Per step `s` of a block (K `4s..4s + 4`) and chain `q` (0 even, 1 odd), the 32-bit word
//! holds K `4s + 2 + q` in its low half and K `4s + q` in its high half. Flushing never fires
//! for the operands `pairs.rs` lets through (FP8 sums, bf16 within the guard). [`chunk_model`]
//! spells the instruction out in scalar code, so the reordering is tested on every CPU.

use super::{BLOCK, EDGE};

/// Whether this CPU has AVX512-BF16 (and AVX-512F).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`chunk`] in scalar code, one `VDPBF16PS` lane at a time: the high halves' product, then
/// the low halves', each one FMA rounding (the products of bf16 values are exact in f32, so
/// `acc + a * b` rounds once). The definition the tests hold the packing to on every CPU.
#[cfg(test)]
pub(super) fn chunk_model(a: &[u16], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    let widen = super::portable::widen_one;
    c.fill(0.0);
    for kb in 0..blocks {
        let (a_block, b_block) = (&a[kb * BLOCK..][..BLOCK], &b[kb * BLOCK..][..BLOCK]);
        for row in 0..EDGE {
            for col in 0..EDGE {
                let half = &b_block[col / 16 * BLOCK / 2..][..BLOCK / 2];
                let mut chains = [0.0f32; 2];
                for s in 0..EDGE / 4 {
                    for (q, acc) in chains.iter_mut().enumerate() {
                        let a_word = &a_block[row * EDGE + 4 * s + 2 * q..][..2];
                        let b_word = &half[((2 * s + q) * 16 + col % 16) * 2..][..2];
                        *acc += widen(a_word[1]) * widen(b_word[1]);
                        *acc += widen(a_word[0]) * widen(b_word[0]);
                    }
                }
                c[row * EDGE + col] += chains[0] + chains[1];
            }
        }
    }
}

/// `c = ` the chunk sums of `blocks` K blocks of the reordered strips `a` and `b`: 4 rows x
/// all 32 columns at a time, so that each broadcast word of A serves two instructions (8 rows
/// x 16 columns reached 69% of the instruction's peak in a micro-benchmark on Zen 4, this shape
/// 91%: the broadcasts' loads bounded the former).
///
/// # Safety
/// [`available`] returned true; `a` and `b` hold at least `blocks * BLOCK` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn chunk(a: &[u16], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
    use std::arch::x86_64::*;
    /// Rows per register group: 4 rows x 2 halves x (even, odd) accumulators.
    const GROUP: usize = 4;
    /// The 16 bf16 pairs at `p` (B) as the instruction's operand.
    #[inline(always)]
    unsafe fn pairs(p: *const u16) -> __m512bh {
        // SAFETY: the caller's pointer to 32 values; the bits are reinterpreted, not converted.
        unsafe { std::mem::transmute(_mm512_loadu_si512(p.cast())) }
    }
    /// The 32-bit word at `p` (A) in every lane.
    #[inline(always)]
    unsafe fn word(p: *const u16) -> __m512bh {
        // SAFETY: the caller's pointer to 2 values.
        unsafe { std::mem::transmute(_mm512_set1_epi32(p.cast::<i32>().read_unaligned())) }
    }
    c.fill(0.0);
    for kb in 0..blocks {
        // SAFETY (every pointer below): the caller's lengths; a block's rows are 32 values
        // (A), and each of its two halves is 16 pair rows of 32 values (B).
        let a_block = unsafe { a.as_ptr().add(kb * BLOCK) };
        let halves = unsafe { [b.as_ptr().add(kb * BLOCK), b.as_ptr().add(kb * BLOCK + BLOCK / 2)] };
        for g in 0..EDGE / GROUP {
            let rows = unsafe { a_block.add(g * GROUP * EDGE) };
            // [row][half]
            let mut e = [[_mm512_setzero_ps(); 2]; GROUP];
            let mut o = [[_mm512_setzero_ps(); 2]; GROUP];
            for s in 0..EDGE / 4 {
                let be = unsafe { [pairs(halves[0].add(2 * s * EDGE)), pairs(halves[1].add(2 * s * EDGE))] };
                let bo = unsafe {
                    [
                        pairs(halves[0].add((2 * s + 1) * EDGE)),
                        pairs(halves[1].add((2 * s + 1) * EDGE)),
                    ]
                };
                for r in 0..GROUP {
                    let at = unsafe { rows.add(r * EDGE + 4 * s) };
                    let (we, wo) = unsafe { (word(at), word(at.add(2))) };
                    for h in 0..2 {
                        e[r][h] = _mm512_dpbf16_ps(e[r][h], we, be[h]);
                        o[r][h] = _mm512_dpbf16_ps(o[r][h], wo, bo[h]);
                    }
                }
            }
            for r in 0..GROUP {
                for h in 0..2 {
                    let out = &mut c[(g * GROUP + r) * EDGE + h * 16..][..16];
                    // SAFETY: `out` holds 16 f32.
                    unsafe {
                        let sum = _mm512_add_ps(_mm512_loadu_ps(out.as_ptr()), _mm512_add_ps(e[r][h], o[r][h]));
                        _mm512_storeu_ps(out.as_mut_ptr(), sum);
                    }
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn chunk(_: &[u16], _: &[u16], _: usize, _: &mut [f32; BLOCK]) {
    unreachable!("VDPBF16PS is x86-64 only; `available` is false elsewhere")
}

/// The first difference between this kernel and the portable one (`pairs.rs`,
/// `check_against_portable`: both on strips from the GEMM's own packers); `None` if none.
pub(super) fn self_check() -> Option<String> {
    super::check_against_portable(super::Kernel::Dot, |a, b, blocks, c| {
        // SAFETY: only called where `available()` held; both strips hold `blocks` blocks.
        unsafe { chunk(a, b, blocks, c) }
    })
}
