//! E8M0: the unsigned power-of-two scale of MXFP8. `2^(code - 127)`, 0xFF is
//! NaN, no zero, no sign, no inf.

use super::Overflow;

/// An E8M0 scale: the value `2^(code - 127)`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct E8M0(u8);

/// The one NaN code.
pub(crate) const E8M0_NAN: u8 = 0xFF;
/// The largest code, 2^127.
pub(crate) const E8M0_MAX: u8 = 0xFE;

impl E8M0 {
    /// 2^127.
    pub const MAX: E8M0 = E8M0(E8M0_MAX);
    /// 2^-127, the smallest value.
    pub const MIN: E8M0 = E8M0(0);
    /// 1.0.
    pub const ONE: E8M0 = E8M0(127);
    /// NaN.
    pub const NAN: E8M0 = E8M0(E8M0_NAN);

    /// Wraps a raw code.
    pub const fn from_bits(bits: u8) -> Self {
        E8M0(bits)
    }
    /// The raw code (the biased exponent).
    pub const fn to_bits(self) -> u8 {
        self.0
    }
    /// Exact value.
    pub const fn to_f32(self) -> f32 {
        decode_e8m0(self.0)
    }
    /// Whether this is the NaN code.
    pub const fn is_nan(self) -> bool {
        self.0 == E8M0_NAN
    }
    /// Nearest power of two (saturating); see [`encode_e8m0`].
    pub fn from_f32(x: f32) -> Self {
        E8M0(encode_e8m0(x, Overflow::Saturate))
    }
}

/// code -> 2^(code - 127), exact (2^-127 is an f32 subnormal).
pub const fn decode_e8m0(code: u8) -> f32 {
    match code {
        E8M0_NAN => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        e => f32::from_bits((e as u32) << 23),
    }
}

/// f32 -> nearest power of two by linear distance, ties to the even code.
///
/// * NaN and negative nonzero values (the format has no sign) give NaN.
/// * +-0 and values below 2^-127 give 2^-127 (code 0), the nearest value.
/// * A value that rounds above 2^127, and +inf, give 2^127 when saturating,
///   NaN otherwise (there is no inf).
///
/// The MXFP8 recipe does not use this: it rounds scales *up* (see `scaling`).
pub fn encode_e8m0(x: f32, overflow: Overflow) -> u8 {
    let bits = x.to_bits();
    if x.is_nan() || (bits >> 31 == 1 && x != 0.0) {
        return E8M0_NAN;
    }
    let abs = bits & 0x7FFF_FFFF; // only -0 still has the sign bit here
    let exp = abs >> 23;
    let man = abs & 0x7F_FFFF;
    let code = if exp == 0 {
        // f32 subnormal: between 2^-127 (mantissa 0x40_0000) and 2^-126;
        // the midpoint 0.75 * 2^-126 ties to code 0 (even).
        u32::from(man > 0x60_0000)
    } else if exp == 0xFF {
        255 // +inf: overflow below
    } else {
        // 1.m * 2^(exp-127) lies between codes exp and exp+1; midpoint at m = 0.5.
        let up = man > 0x40_0000 || (man == 0x40_0000 && exp & 1 == 1);
        exp + u32::from(up)
    };
    if code > E8M0_MAX as u32 {
        match overflow {
            Overflow::Saturate => E8M0_MAX,
            Overflow::NonSaturating => E8M0_NAN,
        }
    } else {
        code as u8
    }
}
