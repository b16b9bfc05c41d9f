//! `docs/numerics.md`, MXFP8: the E8M0 exponent of an MXFP8 block, rounded UP to a power of two.
//!
//! This is TransformerEngine's rule and Blackwell's `cvt.rp.satfinite.ue8m0`,
//! not the OCP MX rule (`floor(log2(amax)) - emax`). Rounding up guarantees
//! `amax * 2^(127-e) <= fp8_max` (up to the f32 rounding of `amax / fp8_max`,
//! which the FP8 cast absorbs), so no element of a block saturates; the OCP
//! floor rule can push the block amax up to almost 2x over the max and clip it.
//! `format::encode_e8m0` rounds to *nearest* and is not used here.

use crate::format::Fp8Format;

/// `1 / fp8_max` rounded to f32: the spec multiplies by it rather than divide.
pub fn max_reciprocal(format: Fp8Format) -> f32 {
    1.0 / format.max_finite()
}

/// The biased E8M0 exponent `e` for a block with `amax`: `v = amax * (1/fp8_max)`,
/// then the exponent bits of `v`, plus one if any mantissa bit is set, except
/// that 0xFE is never incremented and a subnormal `v` with mantissa <= 0x400000
/// stays at 0. NaN -> 0xFF, inf -> 0xFE, 0 -> 0.
///
/// ```
/// use fp8_engine::format::Fp8Format;
/// use fp8_engine::scaling::mxfp8_scale_exponent;
///
/// assert_eq!(mxfp8_scale_exponent(448.0, Fp8Format::E4M3), 127); // scale 2^0
/// assert_eq!(mxfp8_scale_exponent(449.0, Fp8Format::E4M3), 128); // rounded up to 2^1
/// ```
pub fn mxfp8_scale_exponent(amax: f32, format: Fp8Format) -> u8 {
    let v = amax * max_reciprocal(format);
    if v.is_nan() {
        return 0xFF;
    }
    if v.is_infinite() {
        return 0xFE;
    }
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let exponent = ((bits >> 23) & 0xFF) as u8;
    let mantissa = bits & 0x7F_FFFF;
    let subnormal_at_most_half = exponent == 0 && mantissa <= 0x40_0000;
    if mantissa != 0 && exponent != 0xFE && !subnormal_at_most_half {
        exponent + 1
    } else {
        exponent
    }
}

/// `2^(127 - e)`, the factor the data is multiplied by before the cast; NaN
/// for e = 0xFF. Exact: 2^-127 and 2^127 are both f32 values.
pub fn data_scale(e: u8) -> f32 {
    match e {
        0xFF => f32::NAN,
        // 2^127 (e = 0) down to 2^-127 (e = 254, an f32 subnormal).
        254 => f32::from_bits(0x0040_0000),
        e => f32::from_bits((254 - e as u32) << 23),
    }
}

/// `2^(e - 127)`, the factor dequantization multiplies by (same as `format::decode_e8m0`).
pub fn scale_inv(e: u8) -> f32 {
    crate::format::decode_e8m0(e)
}
