//! `exp(x - shift)` over a slice with the bits of the C library's `expf` (what `f32::exp`
//! calls), 8 lanes at a time: the softmax of the attention core spent more time in scalar
//! `expf` calls than in its products.
//!
//! The vector path repeats, lane by lane, the operations of glibc's `expf` as built for CPUs
//! with FMA (its `__expf_fma`, the one glibc picks on every AVX-512 CPU): in f64,
//! `kd = fma(x, 32 / ln 2, 1.5 * 2^52)`, `r = 32 / ln 2 * x - (kd - 1.5 * 2^52)` (one FMA),
//! `s = T[k % 32] + (k << 47)` as bits, `y = fma(fma(r, C0, C1), r * r, fma(r, C2, 1)) * s`,
//! rounded to f32 once. Inputs with `|x| >= 88` (overflow, underflow, inf, NaN), where glibc
//! branches, go through `f32::exp` itself; a slice's last values are padded to a full
//! vector. Whether the vector path gives this machine's `f32::exp` bits is checked once per
//! process on a sample of inputs (glibc's build could change); if not, every value goes
//! through `f32::exp`. The test below compares all 2^32 inputs.

use std::sync::OnceLock;

/// `xs[i] = exp(xs[i] - shift)`, the bits of `(xs[i] - shift).exp()`.
pub(super) fn exp_shifted(xs: &mut [f32], shift: f32) {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    {
        if vector_matches_libm() {
            // SAFETY: `vector_matches_libm` is true only where the CPU has AVX-512F.
            let done = unsafe { avx512::exp_shifted(xs, shift) };
            // The tail (up to 7 values) in one more vector, padded with `shift` (exp(0) = 1).
            let tail = &mut xs[done..];
            if !tail.is_empty() {
                let mut pad = [shift; 8];
                pad[..tail.len()].copy_from_slice(tail);
                // SAFETY: as above.
                unsafe { avx512::exp_shifted(&mut pad, shift) };
                tail.copy_from_slice(&pad[..tail.len()]);
            }
            return;
        }
    }
    scalar(xs, shift)
}

fn scalar(xs: &mut [f32], shift: f32) {
    xs.iter_mut().for_each(|x| *x = (*x - shift).exp());
}

/// True when the CPU has AVX-512F and the vector path agrees with `f32::exp` on a sample
/// of inputs spanning its whole range (decided once).
fn vector_matches_libm() -> bool {
    static MATCHES: OnceLock<bool> = OnceLock::new();
    *MATCHES.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                return false;
            }
            // Every 65537th bit pattern (64 K values, ~0.3 ms): all exponents, both signs,
            // NaN and inf included.
            let sample: Vec<f32> = (0..=u32::MAX / 65537).map(|i| f32::from_bits(i * 65537)).collect();
            let mut got = sample.clone();
            // SAFETY: AVX-512F checked just above.
            let done = unsafe { avx512::exp_shifted(&mut got, 0.0) };
            sample[..done]
                .iter()
                .zip(&got)
                .all(|(x, g)| x.exp().to_bits() == g.to_bits() || (x.is_nan() && g.is_nan()))
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
        {
            false
        }
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod avx512 {
    use std::arch::x86_64::*;

    /// glibc's `__exp2f_data.tab`: `bits(2^(i/32)) - (i << 47)`.
    const TABLE: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];
    /// 32 / ln 2, 1.5 * 2^52 and the cubic's coefficients (glibc's `invln2_scaled`, `shift`,
    /// `poly_scaled`), as bits.
    const INV_LN2_N: u64 = 0x40471547652b82fe;
    const SHIFT: u64 = 0x4338000000000000;
    const C: [u64; 3] = [0x3ebc6af84b912394, 0x3f2ebfce50fac4f3, 0x3f962e42ff0c52d6];
    /// `|x|` bits from which glibc leaves the main path (88.0).
    const SPECIAL_ABS: i32 = 0x42b0_0000;

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn table(i: usize) -> __m512d {
        _mm512_castsi512_pd(_mm512_set_epi64(
            TABLE[i + 7] as i64,
            TABLE[i + 6] as i64,
            TABLE[i + 5] as i64,
            TABLE[i + 4] as i64,
            TABLE[i + 3] as i64,
            TABLE[i + 2] as i64,
            TABLE[i + 1] as i64,
            TABLE[i] as i64,
        ))
    }

    /// `exp(x - shift)` in place for the first `8 * (len / 8)` values, returning that count;
    /// lanes glibc treats specially are recomputed with `f32::exp`.
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp_shifted(xs: &mut [f32], shift: f32) -> usize {
        let n = xs.len() / 8 * 8;
        let t: [__m512d; 4] = std::array::from_fn(|q| table(8 * q));
        let f = |bits: u64| _mm512_set1_pd(f64::from_bits(bits));
        let (inv, sh, one) = (f(INV_LN2_N), f(SHIFT), _mm512_set1_pd(1.0));
        let (c0, c1, c2) = (f(C[0]), f(C[1]), f(C[2]));
        let shift_v = _mm256_set1_ps(shift);
        for chunk in xs[..n].chunks_exact_mut(8) {
            let d8: &mut [f32; 8] = chunk.try_into().expect("chunks of 8");
            let s8 = *d8;
            // SAFETY: `s8` holds 8 values (unaligned load).
            let x = _mm256_sub_ps(unsafe { _mm256_loadu_ps(s8.as_ptr()) }, shift_v);
            let xd = _mm512_cvtps_pd(x);
            let kd_shifted = _mm512_fmadd_pd(xd, inv, sh);
            let ki = _mm512_castpd_si512(kd_shifted);
            let kd = _mm512_sub_pd(kd_shifted, sh);
            let r = _mm512_fmsub_pd(inv, xd, kd);
            // T[k % 32] from the 4 table registers: bit 3 picks within a pair, bit 4 the pair.
            let lo = _mm512_permutex2var_pd(t[0], ki, t[1]);
            let hi = _mm512_permutex2var_pd(t[2], ki, t[3]);
            let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
            let tab = _mm512_castpd_si512(_mm512_mask_blend_pd(upper, lo, hi));
            let s = _mm512_castsi512_pd(_mm512_add_epi64(tab, _mm512_slli_epi64::<47>(ki)));
            let z = _mm512_fmadd_pd(r, c0, c1);
            let r2 = _mm512_mul_pd(r, r);
            let y = _mm512_fmadd_pd(r, c2, one);
            let y = _mm512_mul_pd(_mm512_fmadd_pd(z, r2, y), s);
            let out = _mm512_cvtpd_ps(y);
            // SAFETY: `d8` holds 8 values (unaligned store).
            unsafe { _mm256_storeu_ps(d8.as_mut_ptr(), out) };
            // |x| >= 88, inf and NaN: glibc's own branch.
            let abs = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff));
            let special = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(SPECIAL_ABS - 1));
            if _mm256_movemask_ps(_mm256_castsi256_ps(special)) != 0 {
                for (d, &s) in d8.iter_mut().zip(&s8) {
                    let x = s - shift;
                    if x.to_bits() & 0x7fff_ffff >= SPECIAL_ABS as u32 {
                        *d = x.exp();
                    }
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::*;

    /// All 2^32 inputs against `f32::exp`, then a shift applied first and a slice with a tail.
    #[test]
    fn every_input_gives_libms_bits() {
        if !vector_matches_libm() {
            eprintln!("the vector path is off here (no AVX-512F, not glibc, or other bits)");
            return;
        }
        let bad = (0..1u64 << 16)
            .into_par_iter()
            .map(|hi| {
                let src: Vec<f32> = (0..1u32 << 16)
                    .map(|lo| f32::from_bits(((hi as u32) << 16) | lo))
                    .collect();
                let mut got = src.clone();
                exp_shifted(&mut got, 0.0);
                src.iter()
                    .zip(&got)
                    .filter(|(x, g)| x.exp().to_bits() != g.to_bits() && !(x.is_nan() && g.is_nan()))
                    .count()
            })
            .sum::<usize>();
        assert_eq!(bad, 0, "inputs whose exp differs from f32::exp");
        let src: Vec<f32> = (0..1003).map(|i| i as f32 * 0.37 - 150.0).collect(); // a 3-value tail
        let mut got = src.clone();
        exp_shifted(&mut got, 2.5);
        for (x, g) in src.iter().zip(&got) {
            assert_eq!((x - 2.5).exp().to_bits(), g.to_bits(), "{x}");
        }
    }
}
