//! AVX2 + F16C kernels, 8 f32 lanes per register. Each lane does exactly what
//! `Fp8Spec::encode` / the decode table do, so the bits match the scalar path.
//! Tails shorter than one step go through the scalar path.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::encode_params::EncodeParams;
use super::{HighPrecision, scalar};
use crate::format::{Fp8Format, Overflow};

/// Elements per quantize step: four registers packed into one 32-byte store.
const QUANTIZE_STEP: usize = 32;
/// Elements per dequantize step: one 16-byte load feeds two registers.
const DEQUANTIZE_STEP: usize = 16;

/// f32 bit patterns used by several kernels.
const ABS_MASK: i32 = 0x7FFF_FFFF;
const INF_BITS: i32 = 0x7F80_0000;
/// Round to nearest even (not MXCSR's mode): what `half::f16::from_f32` does.
/// F16C's immediate has 3 bits, so no `_MM_FROUND_NO_EXC`; exceptions are masked anyway.
pub(super) const ROUND_NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT;

/// Element types with an exact 8-lane widening load and a `half`-exact narrowing store.
pub(super) trait Lanes8: HighPrecision {
    /// Loads 8 elements as f32: the exact value, NaN stays a NaN (payload free).
    ///
    /// # Safety
    /// `p` is valid for reading 8 elements and the CPU has AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> __m256;

    /// Rounds 8 f32 to nearest even, as `Self::from_f32` does, and stores them.
    ///
    /// # Safety
    /// `p` is valid for writing 8 elements and the CPU has AVX2 and F16C.
    unsafe fn store8(p: *mut Self, v: __m256);
}

impl Lanes8 for f32 {
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn store8(p: *mut f32, v: __m256) {
        // SAFETY: the caller guarantees 8 writable elements.
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

impl Lanes8 for bf16 {
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const bf16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements (16 bytes).
        let raw = unsafe { _mm_loadu_si128(p.cast()) };
        // bf16 is the top half of an f32.
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn store8(p: *mut bf16, v: __m256) {
        let halves = f32_to_bf16_bits(v);
        let packed = _mm_packus_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256::<1>(halves));
        // SAFETY: the caller guarantees 8 writable elements (16 bytes).
        unsafe { _mm_storeu_si128(p.cast(), packed) }
    }
}

impl Lanes8 for f16 {
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements (16 bytes).
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn store8(p: *mut f16, v: __m256) {
        let halves = _mm256_cvtps_ph::<ROUND_NEAREST>(v);
        // SAFETY: the caller guarantees 8 writable elements (16 bytes).
        unsafe { _mm_storeu_si128(p.cast(), halves) }
    }
}

/// f32 -> bf16 bits in the low half of each lane, bit for bit like
/// `half::bf16::from_f32`: NaN keeps its top bits and gets the quiet bit,
/// everything else rounds to nearest even by the carry of `0x7FFF + lsb`.
#[inline]
#[target_feature(enable = "avx2")]
fn f32_to_bf16_bits(v: __m256) -> __m256i {
    let bits = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let carried = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
    let rounded = _mm256_srli_epi32::<16>(carried);
    let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(0x40));
    let abs = _mm256_and_si256(bits, _mm256_set1_epi32(ABS_MASK));
    let is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(INF_BITS));
    _mm256_blendv_epi8(rounded, quiet, is_nan)
}

/// `EncodeParams` splatted: the lane-wise twin of `Fp8Spec::encode`.
#[derive(Clone, Copy)]
struct Encoder {
    shift: __m256i,
    rebias: __m256i,
    round: __m256i,
    max_code: __m256i,
    overflow_code: __m256i,
    nan_code: __m256i,
    min_normal_bits: __m256i,
    magic: __m256,
    magic_bits: __m256i,
}

impl Encoder {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(p: &EncodeParams) -> Self {
        let splat = |x: u32| _mm256_set1_epi32(x as i32);
        Encoder {
            shift: splat(p.shift),
            rebias: splat(p.rebias),
            round: splat(p.round),
            max_code: splat(p.max_code),
            overflow_code: splat(p.overflow_code),
            nan_code: splat(p.nan_code),
            min_normal_bits: splat(p.min_normal_bits),
            magic: _mm256_set1_ps(p.subnormal_magic),
            magic_bits: splat(p.subnormal_magic.to_bits()),
        }
    }

    /// 8 f32 -> 8 codes, one per 32-bit lane. Every branch of the scalar encode
    /// is computed for every lane, then the right one is picked by blends.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn encode(&self, y: __m256) -> __m256i {
        let bits = _mm256_castps_si256(y);
        let abs = _mm256_and_si256(bits, _mm256_set1_epi32(ABS_MASK));
        let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), _mm256_set1_epi32(0x80));
        // Normals: re-bias, then round half to even by the carry of round + lsb.
        // Lanes below the re-bias wrap around; the subnormal blend replaces them.
        let odd = _mm256_and_si256(_mm256_srlv_epi32(abs, self.shift), _mm256_set1_epi32(1));
        let rebiased = _mm256_add_epi32(_mm256_sub_epi32(abs, self.rebias), self.round);
        let normal = _mm256_srlv_epi32(_mm256_add_epi32(rebiased, odd), self.shift);
        // Subnormals: the FPU rounds |y| + magic to the subnormal step.
        let rounded = _mm256_add_ps(_mm256_castsi256_ps(abs), self.magic);
        let subnormal = _mm256_sub_epi32(_mm256_castps_si256(rounded), self.magic_bits);
        // `normal` < 2^12 so signed compares are safe. A code above max covers
        // |y| >= 2^(emax+1) and +-inf too, as the scalar overflow test does.
        let is_overflow = _mm256_cmpgt_epi32(normal, self.max_code);
        let is_subnormal = _mm256_cmpgt_epi32(self.min_normal_bits, abs);
        let is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(INF_BITS));
        let mag = _mm256_blendv_epi8(normal, self.overflow_code, is_overflow);
        let mag = _mm256_blendv_epi8(mag, subnormal, is_subnormal);
        let mag = _mm256_blendv_epi8(mag, self.nan_code, is_nan);
        _mm256_or_si256(mag, sign)
    }
}

/// Four registers of 32-bit codes (0..=255) -> 32 bytes in element order.
#[inline]
#[target_feature(enable = "avx2")]
fn pack_codes(c: [__m256i; 4]) -> __m256i {
    // packs/packus work within 128-bit halves: the bytes come out as dwords
    // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7; one dword permute restores order.
    let ab = _mm256_packs_epi32(c[0], c[1]);
    let cd = _mm256_packs_epi32(c[2], c[3]);
    let bytes = _mm256_packus_epi16(ab, cd);
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Largest lane. The accumulator never holds a NaN, so the order is free.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn horizontal_max(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
    _mm_cvtss_f32(m)
}

/// `dst[i] = encode(src[i] * scale)`; returns `max |src[i]|`, NaN ignored.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn quantize<T: Lanes8>(src: &[T], dst: &mut [u8], format: Fp8Format, scale: f32, overflow: Overflow) -> f32 {
    let encoder = Encoder::new(&EncodeParams::new(format, overflow));
    let scale_v = _mm256_set1_ps(scale);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(ABS_MASK));
    let mut amax = _mm256_setzero_ps();
    let mut src_steps = src.chunks_exact(QUANTIZE_STEP);
    let mut dst_steps = dst.chunks_exact_mut(QUANTIZE_STEP);
    for (s, d) in (&mut src_steps).zip(&mut dst_steps) {
        let mut codes = [_mm256_setzero_si256(); 4];
        for (i, code) in codes.iter_mut().enumerate() {
            // SAFETY: `s` holds 32 elements, so 8 from 8 * i (i < 4) are in bounds.
            let x = unsafe { T::load8(s.as_ptr().add(8 * i)) };
            // maxps returns its second operand when either is NaN: NaN inputs leave amax as it was.
            amax = _mm256_max_ps(_mm256_and_ps(x, abs_mask), amax);
            *code = encoder.encode(_mm256_mul_ps(x, scale_v));
        }
        // SAFETY: `d` holds 32 bytes.
        unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), pack_codes(codes)) };
    }
    let tail_amax = scalar::quantize(
        src_steps.remainder(),
        dst_steps.into_remainder(),
        format,
        scale,
        overflow,
    );
    horizontal_max(amax).max(tail_amax)
}

/// 16 FP8 codes -> 16 f16 bit patterns; the f16 value times `f16_factor(E4M3)`
/// is exactly `decode(code)`, and NaN codes give the f16 NaN 0x7E00 with their
/// sign, which widens to the scalar table's +-0x7FC0_0000.
///
/// E5M2 is the top byte of an f16. E4M3's 7 magnitude bits shifted to f16 bit 7
/// give an f16 with bias 15 instead of 7: 2^8 too small, subnormals included.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn codes_to_f16<const E4M3: bool>(codes: __m128i) -> __m256i {
    let high = _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(codes));
    let sign = _mm256_and_si256(high, _mm256_set1_epi16(i16::MIN));
    let mag = _mm256_and_si256(high, _mm256_set1_epi16(0x7F00));
    let (halves, is_nan) = if E4M3 {
        let halves = _mm256_or_si256(sign, _mm256_srli_epi16::<1>(mag));
        (halves, _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F00)))
    } else {
        (high, _mm256_cmpgt_epi16(mag, _mm256_set1_epi16(0x7C00)))
    };
    let quiet_nan = _mm256_or_si256(sign, _mm256_set1_epi16(0x7E00));
    _mm256_blendv_epi8(halves, quiet_nan, is_nan)
}

/// What the f16 from `codes_to_f16` is multiplied by to give the FP8 value.
pub(super) const fn f16_factor(e4m3: bool) -> f32 {
    if e4m3 { 256.0 } else { 1.0 }
}

/// `dst[i] = T::from_f32(decode(src[i]) * scale_inv)`.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn dequantize<T: Lanes8>(src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) {
    match format {
        Fp8Format::E4M3 => dequantize_format::<T, true>(src, dst, scale_inv),
        Fp8Format::E5M2 => dequantize_format::<T, false>(src, dst, scale_inv),
    }
}

#[target_feature(enable = "avx2,f16c")]
fn dequantize_format<T: Lanes8, const E4M3: bool>(src: &[u8], dst: &mut [T], scale_inv: f32) {
    let factor = _mm256_set1_ps(f16_factor(E4M3));
    let scale_inv_v = _mm256_set1_ps(scale_inv);
    let mut src_steps = src.chunks_exact(DEQUANTIZE_STEP);
    let mut dst_steps = dst.chunks_exact_mut(DEQUANTIZE_STEP);
    for (s, d) in (&mut src_steps).zip(&mut dst_steps) {
        // SAFETY: `s` holds 16 bytes.
        let codes = unsafe { _mm_loadu_si128(s.as_ptr().cast()) };
        let halves = codes_to_f16::<E4M3>(codes);
        for (i, half) in [_mm256_castsi256_si128(halves), _mm256_extracti128_si256::<1>(halves)]
            .into_iter()
            .enumerate()
        {
            let mut value = _mm256_cvtph_ps(half);
            if E4M3 {
                value = _mm256_mul_ps(value, factor); // exact: a power of two on a normal f32
            }
            // NaN lanes are quiet NaNs and pass through the multiply unchanged, as in scalar.
            let scaled = _mm256_mul_ps(value, scale_inv_v);
            // SAFETY: `d` holds 16 elements, so 8 from 8 * i (i < 2) are in bounds.
            unsafe { T::store8(d.as_mut_ptr().add(8 * i), scaled) };
        }
    }
    let format = if E4M3 { Fp8Format::E4M3 } else { Fp8Format::E5M2 };
    scalar::dequantize(src_steps.remainder(), dst_steps.into_remainder(), format, scale_inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
    }

    /// Random f32 bit patterns plus NaNs with many payloads, both signs, and edges.
    fn f32_patterns() -> Vec<u32> {
        let mut state = 0x1234_5678_9ABC_DEF0u64;
        let mut v: Vec<u32> = (0..1 << 16)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u32
            })
            .collect();
        v.extend((0..1u32 << 12).flat_map(|p| [0x7F80_0000 | p << 11 | 1, 0xFF80_0000 | p << 11, 0x7F80_0000 | p]));
        v.extend([
            0,
            0x8000_0000,
            0x7F80_0000,
            0xFF80_0000,
            0x7F7F_FFFF,
            0x0000_8000,
            0x0001_8000,
            0x3F80_8000,
        ]);
        v
    }

    fn check_store<T: Lanes8>(bits_of: impl Fn(T) -> u32) {
        if !has_avx2() {
            return;
        }
        for chunk in f32_patterns().chunks_exact(8) {
            let src: Vec<f32> = chunk.iter().map(|&b| f32::from_bits(b)).collect();
            let mut out = [T::from_f32(0.0); 8];
            // SAFETY: AVX2 and F16C were detected; both buffers hold 8 elements.
            unsafe { T::store8(out.as_mut_ptr(), _mm256_loadu_ps(src.as_ptr())) };
            for (x, y) in src.iter().zip(out) {
                assert_eq!(
                    bits_of(y),
                    bits_of(T::from_f32(*x)),
                    "{} from {:#x}",
                    T::NAME,
                    x.to_bits()
                );
            }
        }
    }

    fn check_load<T: Lanes8>(from_bits: impl Fn(u16) -> T) {
        if !has_avx2() {
            return;
        }
        let all: Vec<T> = (0..=u16::MAX).map(from_bits).collect();
        for chunk in all.chunks_exact(8) {
            let mut out = [0.0f32; 8];
            // SAFETY: AVX2 and F16C were detected; both buffers hold 8 elements.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), T::load8(chunk.as_ptr())) };
            for (x, y) in chunk.iter().zip(out) {
                let want = x.to_f32();
                // NaN payloads may differ (`half` quiets bf16 NaNs); the encoder maps every NaN alike.
                assert!(
                    y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                    "{} {y:?} vs {want:?}",
                    T::NAME
                );
            }
        }
    }

    #[test]
    fn bf16_store_rounds_like_half() {
        check_store::<bf16>(|y| y.to_bits().into());
    }

    #[test]
    fn f16_store_rounds_like_half() {
        check_store::<f16>(|y| y.to_bits().into());
    }

    #[test]
    fn bf16_load_is_exact_for_every_pattern() {
        check_load(bf16::from_bits);
    }

    #[test]
    fn f16_load_is_exact_for_every_pattern() {
        check_load(f16::from_bits);
    }
}
