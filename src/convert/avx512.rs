//! AVX-512 kernels, 16 f32 lanes per register, mask registers for the blends.
//! The same lane-wise algorithm as `avx2.rs`, whose FP8 -> f16 step and final
//! reductions are reused as they are. Tails go through the scalar path.
//!
//! Only avx512f instructions are used (plus AVX2/F16C on 256-bit halves); the
//! path also requires avx512bw, as every AVX-512 CPU worth targeting has it.
//! `Isa::best` self-checks these kernels against the scalar path before use.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::avx2::{ROUND_NEAREST, codes_to_f16, f16_factor, horizontal_max};
use super::encode_params::EncodeParams;
use super::{HighPrecision, scalar};
use crate::format::{Fp8Format, Overflow};

/// Elements per quantize step: four registers, four 16-byte stores.
const QUANTIZE_STEP: usize = 64;
/// Elements per dequantize step: two 16-byte loads, two registers.
const DEQUANTIZE_STEP: usize = 32;

const ABS_MASK: i32 = 0x7FFF_FFFF;
const INF_BITS: i32 = 0x7F80_0000;

/// Element types with an exact 16-lane widening load and a `half`-exact narrowing store.
pub(super) trait Lanes16: HighPrecision {
    /// Loads 16 elements as f32: the exact value, NaN stays a NaN (payload free).
    ///
    /// # Safety
    /// `p` is valid for reading 16 elements and the CPU has AVX-512F, AVX2 and F16C.
    unsafe fn load16(p: *const Self) -> __m512;

    /// Rounds 16 f32 to nearest even, as `Self::from_f32` does, and stores them.
    ///
    /// # Safety
    /// `p` is valid for writing 16 elements and the CPU has AVX-512F, AVX2 and F16C.
    unsafe fn store16(p: *mut Self, v: __m512);
}

impl Lanes16 for f32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees 16 readable elements.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn store16(p: *mut f32, v: __m512) {
        // SAFETY: the caller guarantees 16 writable elements.
        unsafe { _mm512_storeu_ps(p, v) }
    }
}

impl Lanes16 for bf16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn load16(p: *const bf16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable elements (32 bytes).
        let raw = unsafe { _mm256_loadu_si256(p.cast()) };
        // bf16 is the top half of an f32.
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn store16(p: *mut bf16, v: __m512) {
        let halves = _mm512_cvtepi32_epi16(f32_to_bf16_bits(v)); // truncates each lane to its low 16 bits
        // SAFETY: the caller guarantees 16 writable elements (32 bytes).
        unsafe { _mm256_storeu_si256(p.cast(), halves) }
    }
}

impl Lanes16 for f16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable elements (32 bytes).
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn store16(p: *mut f16, v: __m512) {
        let halves = _mm512_cvtps_ph::<ROUND_NEAREST>(v);
        // SAFETY: the caller guarantees 16 writable elements (32 bytes).
        unsafe { _mm256_storeu_si256(p.cast(), halves) }
    }
}

/// f32 -> bf16 bits in the low half of each lane, like `half::bf16::from_f32`
/// (see `avx2::f32_to_bf16_bits`).
#[inline]
#[target_feature(enable = "avx512f")]
fn f32_to_bf16_bits(v: __m512) -> __m512i {
    let bits = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let carried = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
    let rounded = _mm512_srli_epi32::<16>(carried);
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(0x40));
    let abs = _mm512_and_si512(bits, _mm512_set1_epi32(ABS_MASK));
    let is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(INF_BITS));
    // mask_blend(k, a, b) takes b where k is set.
    _mm512_mask_blend_epi32(is_nan, rounded, quiet)
}

/// `EncodeParams` splatted: the lane-wise twin of `Fp8Spec::encode`.
#[derive(Clone, Copy)]
struct Encoder {
    shift: __m512i,
    rebias: __m512i,
    round: __m512i,
    max_code: __m512i,
    overflow_code: __m512i,
    nan_code: __m512i,
    min_normal_bits: __m512i,
    magic: __m512,
    magic_bits: __m512i,
}

impl Encoder {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new(p: &EncodeParams) -> Self {
        let splat = |x: u32| _mm512_set1_epi32(x as i32);
        Encoder {
            shift: splat(p.shift),
            rebias: splat(p.rebias),
            round: splat(p.round),
            max_code: splat(p.max_code),
            overflow_code: splat(p.overflow_code),
            nan_code: splat(p.nan_code),
            min_normal_bits: splat(p.min_normal_bits),
            magic: _mm512_set1_ps(p.subnormal_magic),
            magic_bits: splat(p.subnormal_magic.to_bits()),
        }
    }

    /// 16 f32 -> 16 codes, one per 32-bit lane (see `avx2::Encoder::encode`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn encode(&self, y: __m512) -> __m512i {
        let bits = _mm512_castps_si512(y);
        let abs = _mm512_and_si512(bits, _mm512_set1_epi32(ABS_MASK));
        let sign = _mm512_and_si512(_mm512_srli_epi32::<24>(bits), _mm512_set1_epi32(0x80));
        let odd = _mm512_and_si512(_mm512_srlv_epi32(abs, self.shift), _mm512_set1_epi32(1));
        let rebiased = _mm512_add_epi32(_mm512_sub_epi32(abs, self.rebias), self.round);
        let normal = _mm512_srlv_epi32(_mm512_add_epi32(rebiased, odd), self.shift);
        let rounded = _mm512_add_ps(_mm512_castsi512_ps(abs), self.magic);
        let subnormal = _mm512_sub_epi32(_mm512_castps_si512(rounded), self.magic_bits);
        let is_overflow = _mm512_cmpgt_epi32_mask(normal, self.max_code);
        let is_subnormal = _mm512_cmpgt_epi32_mask(self.min_normal_bits, abs);
        let is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(INF_BITS));
        // mask_blend(k, a, b) takes b where k is set; same order as the AVX2 blends.
        let mag = _mm512_mask_blend_epi32(is_overflow, normal, self.overflow_code);
        let mag = _mm512_mask_blend_epi32(is_subnormal, mag, subnormal);
        let mag = _mm512_mask_blend_epi32(is_nan, mag, self.nan_code);
        _mm512_or_si512(mag, sign)
    }
}

/// Largest lane, through the AVX2 reduction. The accumulator holds no NaN.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn horizontal_max16(v: __m512) -> f32 {
    let low = _mm512_castps512_ps256(v);
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    horizontal_max(_mm256_max_ps(low, high))
}

/// `dst[i] = encode(src[i] * scale)`; returns `max |src[i]|`, NaN ignored.
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
pub(super) fn quantize<T: Lanes16>(
    src: &[T],
    dst: &mut [u8],
    format: Fp8Format,
    scale: f32,
    overflow: Overflow,
) -> f32 {
    let encoder = Encoder::new(&EncodeParams::new(format, overflow));
    let scale_v = _mm512_set1_ps(scale);
    let mut amax = _mm512_setzero_ps();
    let mut src_steps = src.chunks_exact(QUANTIZE_STEP);
    let mut dst_steps = dst.chunks_exact_mut(QUANTIZE_STEP);
    for (s, d) in (&mut src_steps).zip(&mut dst_steps) {
        for i in 0..QUANTIZE_STEP / 16 {
            // SAFETY: `s` holds 64 elements, so 16 from 16 * i (i < 4) are in bounds.
            let x = unsafe { T::load16(s.as_ptr().add(16 * i)) };
            // vmaxps returns its second operand when either is NaN: NaN inputs leave amax as it was.
            amax = _mm512_max_ps(_mm512_abs_ps(x), amax);
            let codes = _mm512_cvtepi32_epi8(encoder.encode(_mm512_mul_ps(x, scale_v))); // codes are 0..=255
            // SAFETY: `d` holds 64 bytes, so 16 from 16 * i (i < 4) are in bounds.
            unsafe { _mm_storeu_si128(d.as_mut_ptr().add(16 * i).cast(), codes) };
        }
    }
    let tail_amax = scalar::quantize(
        src_steps.remainder(),
        dst_steps.into_remainder(),
        format,
        scale,
        overflow,
    );
    horizontal_max16(amax).max(tail_amax)
}

/// `dst[i] = T::from_f32(decode(src[i]) * scale_inv)`.
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
pub(super) fn dequantize<T: Lanes16>(src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) {
    match format {
        Fp8Format::E4M3 => dequantize_format::<T, true>(src, dst, scale_inv),
        Fp8Format::E5M2 => dequantize_format::<T, false>(src, dst, scale_inv),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
fn dequantize_format<T: Lanes16, const E4M3: bool>(src: &[u8], dst: &mut [T], scale_inv: f32) {
    let factor = _mm512_set1_ps(f16_factor(E4M3));
    let scale_inv_v = _mm512_set1_ps(scale_inv);
    let mut src_steps = src.chunks_exact(DEQUANTIZE_STEP);
    let mut dst_steps = dst.chunks_exact_mut(DEQUANTIZE_STEP);
    for (s, d) in (&mut src_steps).zip(&mut dst_steps) {
        for i in 0..DEQUANTIZE_STEP / 16 {
            // SAFETY: `s` holds 32 bytes, so 16 from 16 * i (i < 2) are in bounds.
            let codes = unsafe { _mm_loadu_si128(s.as_ptr().add(16 * i).cast()) };
            let mut value = _mm512_cvtph_ps(codes_to_f16::<E4M3>(codes));
            if E4M3 {
                value = _mm512_mul_ps(value, factor); // exact: a power of two on a normal f32
            }
            let scaled = _mm512_mul_ps(value, scale_inv_v);
            // SAFETY: `d` holds 32 elements, so 16 from 16 * i (i < 2) are in bounds.
            unsafe { T::store16(d.as_mut_ptr().add(16 * i), scaled) };
        }
    }
    let format = if E4M3 { Fp8Format::E4M3 } else { Fp8Format::E5M2 };
    scalar::dequantize(src_steps.remainder(), dst_steps.into_remainder(), format, scale_inv);
}
