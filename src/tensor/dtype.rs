//! The storage dtype of activations on the CPU backend.
//!
//! The CPU backend keeps activations as f32 values but rounds them to the dtype a
//! GPU would store them in (bf16 under the bf16 and FP8 policies, fp16 under the
//! fp16 policy), so both backends see the same numbers.

use std::fmt;
use std::str::FromStr;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Storage dtype of activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE single precision: rounding is the identity.
    F32,
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    Bf16,
    /// IEEE half precision (5 exponent bits, 10 mantissa bits).
    F16,
}

/// Slices longer than this are rounded in parallel (below it, thread wake-up costs more than the work).
const PARALLEL_MIN: usize = 1 << 16;
/// Stack buffer for the f16 round trip: converts in SIMD-friendly batches without allocating.
const F16_BATCH: usize = 256;

impl Dtype {
    /// `x` rounded to this dtype (round to nearest even) and widened back to f32; identity for F32.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::Bf16 => bf16::from_f32(x).to_f32(),
            Dtype::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// Rounds every element in place, as [`Dtype::round`] does.
    pub fn round_slice(self, xs: &mut [f32]) {
        if self == Dtype::F32 {
            return;
        }
        if xs.len() >= PARALLEL_MIN {
            xs.par_chunks_mut(PARALLEL_MIN / 4).for_each(|c| self.round_serial(c));
        } else {
            self.round_serial(xs);
        }
    }

    fn round_serial(self, xs: &mut [f32]) {
        match self {
            Dtype::F32 => {}
            Dtype::Bf16 => widest::round_bf16(xs),
            Dtype::F16 => {
                // half's slice conversions use F16C when the CPU has it.
                let mut buf = [f16::ZERO; F16_BATCH];
                for chunk in xs.chunks_mut(F16_BATCH) {
                    let b = &mut buf[..chunk.len()];
                    b.convert_from_f32_slice(chunk);
                    b.convert_to_f32_slice(chunk);
                }
            }
        }
    }

    /// `"f32"`, `"bf16"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// Bytes per stored element (for memory accounting).
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

/// f32 -> bf16 -> f32 with round to nearest even, written branch-free so the loop vectorises;
/// NaN stays NaN (quiet bit set, as `half` does).
#[inline]
fn round_bf16_bits(x: f32) -> f32 {
    let b = x.to_bits();
    // Adding 0x7fff plus the lowest kept bit rounds the dropped 16 bits to nearest, ties to even.
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    f32::from_bits(if nan { (b | 0x0040_0000) & 0xffff_0000 } else { rounded })
}

/// `x` as bf16: `half`'s `bf16::from_f32` bit for bit, branch-free (vectorizes).
#[inline(always)]
pub(crate) fn bf16_of(x: f32) -> bf16 {
    bf16::from_bits((round_bf16_bits(x).to_bits() >> 16) as u16)
}

/// `dst[i]` = `src[i]` as bf16 (round to nearest even, NaN quieted: `half`'s `bf16::from_f32`
/// bit for bit), vectorized like the rounding below, in parallel for long slices.
pub(crate) fn bf16_from_f32_slice(src: &[f32], dst: &mut [bf16]) {
    #[inline(always)]
    fn run(src: &[f32], dst: &mut [bf16]) {
        dst.iter_mut().zip(src).for_each(|(d, &x)| *d = bf16_of(x));
    }
    fn serial(src: &[f32], dst: &mut [bf16]) {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            fn wide(src: &[f32], dst: &mut [bf16]) {
                run(src, dst)
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above).
                return unsafe { wide(src, dst) };
            }
        }
        run(src, dst)
    }
    if src.len() >= PARALLEL_MIN {
        dst.par_chunks_mut(PARALLEL_MIN / 4)
            .zip(src.par_chunks(PARALLEL_MIN / 4))
            .for_each(|(d, s)| serial(s, d));
    } else {
        serial(src, dst);
    }
}

/// [`round_bf16_bits`] over a slice, for the compiler to vectorize at the caller's width.
#[inline(always)]
fn round_bf16_run(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x = round_bf16_bits(*x));
}

/// The bf16 rounding loop compiled for AVX-512F or AVX2 where the CPU has them (the default
/// x86-64 target vectorizes it 4 lanes wide). Integer bit operations only: every width gives
/// the bits of [`round_bf16_bits`] (tested below).
mod widest {
    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::super::round_bf16_run;

        #[target_feature(enable = "avx512f")]
        pub(super) fn round_bf16_avx512(xs: &mut [f32]) {
            round_bf16_run(xs)
        }

        #[target_feature(enable = "avx2")]
        pub(super) fn round_bf16_avx2(xs: &mut [f32]) {
            round_bf16_run(xs)
        }
    }

    pub(super) fn round_bf16(xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above), all the function requires.
                return unsafe { x86::round_bf16_avx512(xs) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above), all the function requires.
                return unsafe { x86::round_bf16_avx2(xs) };
            }
        }
        super::round_bf16_run(xs)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" => Ok(Dtype::F32),
            "bf16" => Ok(Dtype::Bf16),
            "f16" | "fp16" => Ok(Dtype::F16),
            _ => Err(Error::UnknownFormat {
                name: s.to_string(),
                expected: "f32, bf16, f16",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit patterns spread over the whole f32 range, plus the specials and rounding ties.
    fn samples() -> Vec<f32> {
        let mut v: Vec<f32> = (0..200_000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(0x9E37_79B9) ^ (i >> 3)))
            .collect();
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
        ]);
        // Exact bf16 ties (dropped half == 0x8000) with even and odd kept bits.
        v.extend([0x3f80_8000u32, 0x3f81_8000, 0x7f7f_8000, 0x0000_8000].map(f32::from_bits));
        v
    }

    #[test]
    fn slice_conversion_to_bf16_matches_the_half_crate_bit_for_bit() {
        let mut src = samples();
        src.extend([f32::from_bits(0xffc1_2345), f32::from_bits(0x7f80_0001), -f32::NAN]);
        // Long enough for the parallel path too.
        let src: Vec<f32> = src.iter().cycle().take(src.len() * 2).copied().collect();
        let mut got = vec![bf16::ZERO; src.len()];
        bf16_from_f32_slice(&src, &mut got);
        for (x, g) in src.iter().zip(&got) {
            assert_eq!(g.to_bits(), bf16::from_f32(*x).to_bits(), "{x:e} ({:#x})", x.to_bits());
        }
    }

    #[test]
    fn slice_rounding_matches_the_half_crate_bit_for_bit() {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let src = samples();
            let mut got = src.clone();
            dtype.round_slice(&mut got);
            for (x, g) in src.iter().zip(&got) {
                let want = dtype.round(*x);
                assert!(
                    want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                    "{dtype}: {x:e} ({:#x}) -> {g:e}, half gives {want:e}",
                    x.to_bits()
                );
            }
        }
    }

    #[test]
    fn f32_is_identity_and_names_round_trip() {
        let mut xs = samples();
        let before: Vec<u32> = xs.iter().map(|x| x.to_bits()).collect();
        Dtype::F32.round_slice(&mut xs);
        assert!(xs.iter().zip(&before).all(|(x, b)| x.to_bits() == *b));
        for d in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{}\"", d.name()));
        }
        assert!("fp8".parse::<Dtype>().is_err());
    }
}
