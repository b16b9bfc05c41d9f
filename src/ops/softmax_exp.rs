//! `exp` of f32 inputs for the attention softmax, computed in f64 and rounded once to f32,
//! so that it is correctly rounded except within about 4e-9 ulp of a rounding midpoint
//! (`docs/numerics.md`, Attention), and vectorized (libm's scalar `expf` was the largest
//! part of the attention core).
//!
//! One algorithm, every operation of it in f64 with fused multiply-adds (each exactly
//! rounded), so the scalar definition ([`exp`]) and the 8-lane AVX-512 loop give the same
//! bits on every machine:
//! * clamp `x` to `[-110, 90]` (`e^-110` rounds to 0 in f32, `e^90` overflows; NaN passes);
//! * `k = round(x 16 / ln 2)` by adding `1.5 * 2^52`, `r = x - k c_hi - k c_lo` with
//!   `c_hi + c_lo = ln 2 / 16` to 106 bits, so `|r| <= ln 2 / 32 = 0.0217`;
//! * `e^r = 1 + q`, `q = r (1 + r/2! + r^2/3! + ... + r^6/7!)` (Taylor, truncation error
//!   `r^8 / 8! < 1.3e-18`);
//! * `e^x = s + s q` with `s = 2^(k / 16)` = `T[k mod 16] * 2^floor(k / 16)` (T: the 16 values
//!   `2^(j / 16)` correctly rounded to f64, built into the exponent bits), then `as f32`.

/// Inputs below this give 0: `e^-110 = 1.7e-48` is far below half the smallest f32
/// subnormal (`2^-150 = e^-103.97`), and `k / 16` stays well inside f64's exponent range.
const LO: f64 = -110.0;
/// Inputs above this give `+inf`: `e^90 = 1.2e39` is past `f32::MAX = e^88.72`.
const HI: f64 = 90.0;
/// Adding it rounds a value below `2^51` to an integer (ties to even) and leaves that integer
/// in the low mantissa bits.
const SHIFTER: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
/// `16 / ln 2`: only picks `k` (its rounding moves `x 16 / ln 2` by under 1e-12 for
/// `|x| <= 110`, so `|r|` stays within `ln 2 / 32` to that).
const INV_STEP: f64 = 23.083_120_654_223_414;
/// `ln 2 / 16` in two parts: `C_HI` is its f64 rounding, `C_LO` the rest (to 106 bits).
const C_HI: f64 = 0.043_321_698_784_996_58;
const C_LO: f64 = 1.449_404_258_653_937_2e-18;
/// Taylor coefficients of `q(r) / r = 1 + r/2! + ... + r^6/7!`, highest first (Horner).
const P: [f64; 7] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
    1.0,
];
/// `2^(j / 16)`, j = 0..16, correctly rounded to f64 (bit patterns; computed to 80 digits).
const T: [u64; 16] = [
    0x3ff0_0000_0000_0000,
    0x3ff0_b558_6cf9_890f,
    0x3ff1_72b8_3c7d_517b,
    0x3ff2_387a_6e75_6238,
    0x3ff3_06fe_0a31_b715,
    0x3ff3_dea6_4c12_3422,
    0x3ff4_bfda_d536_2a27,
    0x3ff5_ab07_dd48_5429,
    0x3ff6_a09e_667f_3bcd,
    0x3ff7_a114_73eb_0187,
    0x3ff8_ace5_422a_a0db,
    0x3ff9_c491_82a3_f090,
    0x3ffa_e89f_995a_d3ad,
    0x3ffc_199b_dd85_529c,
    0x3ffd_5818_dcfb_a487,
    0x3ffe_a4af_a2a4_90da,
];

/// `e^x` rounded to f32 (module docs): correctly rounded but within ~4e-9 ulp of a midpoint,
/// `+inf` above 88.72, 0 far enough below -87.3 (f32 subnormals kept), NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = f64::from(x);
    // A NaN stays NaN (and flows through to the result).
    let xc = x.clamp(LO, HI);
    let shifted = xc.mul_add(INV_STEP, SHIFTER);
    let kf = shifted - SHIFTER;
    let r = (-kf).mul_add(C_HI, xc);
    let r = (-kf).mul_add(C_LO, r);
    let k = shifted.to_bits().wrapping_sub(SHIFTER.to_bits()) as i64;
    // 2^(k/16): the table value's exponent field plus floor(k / 16) (in -159..=130).
    let s = f64::from_bits(T[(k & 15) as usize].wrapping_add(((k >> 4) as u64) << 52));
    let p = P[1..].iter().fold(P[0], |p, &c| p.mul_add(r, c));
    s.mul_add(p * r, s) as f32
}

/// `xs[i] = exp(xs[i] - shift)`, the difference in f32: 16 values at a time where the CPU has
/// AVX-512F, else value by value (the same bits).
pub(crate) fn exp_shifted(xs: &mut [f32], shift: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, all `avx512::exp_shifted` requires.
            unsafe { avx512::exp_shifted(xs, shift) };
            return;
        }
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA, all `exp_shifted_fma` requires.
            unsafe { exp_shifted_fma(xs, shift) };
            return;
        }
    }
    xs.iter_mut().for_each(|x| *x = exp(*x - shift));
}

/// The scalar loop with `mul_add` as an instruction (without the feature it is a libm call).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn exp_shifted_fma(xs: &mut [f32], shift: f32) {
    xs.iter_mut().for_each(|x| *x = exp(*x - shift));
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{C_HI, C_LO, HI, INV_STEP, LO, P, SHIFTER, T};

    /// [`super::exp`] on 8 lanes, operation for operation (the unrounded `e^x` in f64).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp8(x: __m512d) -> __m512d {
        // max/min return their second operand when one is NaN: a NaN x passes, as in `exp`.
        let xc = _mm512_min_pd(_mm512_set1_pd(HI), _mm512_max_pd(_mm512_set1_pd(LO), x));
        let shifter = _mm512_set1_pd(SHIFTER);
        let shifted = _mm512_fmadd_pd(xc, _mm512_set1_pd(INV_STEP), shifter);
        let kf = _mm512_sub_pd(shifted, shifter);
        // fnmadd is -(a b) + c, rounded once: `(-kf).mul_add(c, x)`.
        let r = _mm512_fnmadd_pd(kf, _mm512_set1_pd(C_HI), xc);
        let r = _mm512_fnmadd_pd(kf, _mm512_set1_pd(C_LO), r);
        let k = _mm512_sub_epi64(_mm512_castpd_si512(shifted), _mm512_castpd_si512(shifter));
        // Index bits 0..3 pick T[k mod 16] from the two 8-entry halves.
        let t_lo = _mm512_set_epi64(
            T[7] as i64,
            T[6] as i64,
            T[5] as i64,
            T[4] as i64,
            T[3] as i64,
            T[2] as i64,
            T[1] as i64,
            T[0] as i64,
        );
        let t_hi = _mm512_set_epi64(
            T[15] as i64,
            T[14] as i64,
            T[13] as i64,
            T[12] as i64,
            T[11] as i64,
            T[10] as i64,
            T[9] as i64,
            T[8] as i64,
        );
        let t = _mm512_permutex2var_epi64(t_lo, k, t_hi);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<52>(_mm512_srai_epi64::<4>(k))));
        let mut p = _mm512_set1_pd(P[0]);
        for &c in &P[1..] {
            p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c));
        }
        _mm512_fmadd_pd(s, _mm512_mul_pd(p, r), s)
    }

    /// [`super::exp_shifted`], 16 values per step (the last step masked).
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp_shifted(xs: &mut [f32], shift: f32) {
        let shift = _mm512_set1_ps(shift);
        for chunk in xs.chunks_mut(16) {
            let mask: __mmask16 = if chunk.len() == 16 { !0 } else { (1 << chunk.len()) - 1 };
            // SAFETY: the mask selects the chunk's `len` values; masked-off lanes are not read.
            let x = unsafe { _mm512_maskz_loadu_ps(mask, chunk.as_ptr()) };
            let d = _mm512_castps_pd(_mm512_sub_ps(x, shift));
            let lo = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_castpd512_pd256(d)));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(d)));
            // `as f32`: round to nearest even (the default rounding mode), subnormals kept.
            let (lo, hi) = (_mm512_cvtpd_ps(exp8(lo)), _mm512_cvtpd_ps(exp8(hi)));
            let y = _mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi));
            // SAFETY: as for the load, only the chunk's `len` values are written.
            unsafe { _mm512_mask_storeu_ps(chunk.as_mut_ptr(), mask, _mm512_castpd_ps(y)) };
        }
    }
}

#[cfg(test)]
#[path = "softmax_exp_tests.rs"]
mod tests;
