//! The limits of every format, owned by this crate (the `float8` crate's
//! constants are wrong in 0.7) and tested against the codecs exhaustively.

/// The facts `torch.finfo` gives, plus the special encodings, for one format.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FormatLimits {
    pub name: &'static str,
    pub sign_bits: u32,
    pub exponent_bits: u32,
    pub mantissa_bits: u32,
    pub bias: i32,
    /// Largest finite value.
    pub max_finite: f64,
    /// Code of the largest finite value.
    pub max_finite_code: u16,
    /// Smallest positive normal value.
    pub min_normal: f64,
    /// Smallest positive subnormal value (none for E8M0).
    pub min_subnormal: Option<f64>,
    /// Distance from 1.0 to the next value (none for E8M0, which has no mantissa).
    pub epsilon: Option<f64>,
    /// The encodings of +inf and -inf, if the format has them.
    pub infinity: Option<(u16, u16)>,
    /// Every NaN encoding, as inclusive ranges of codes.
    pub nan: &'static [(u16, u16)],
}

/// 2^e as f64, exact for the normal range.
const fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

pub const E4M3_LIMITS: FormatLimits = FormatLimits {
    name: "e4m3",
    sign_bits: 1,
    exponent_bits: 4,
    mantissa_bits: 3,
    bias: 7,
    max_finite: 448.0,
    max_finite_code: 0x7E,
    min_normal: pow2(-6),
    min_subnormal: Some(pow2(-9)),
    epsilon: Some(pow2(-3)),
    infinity: None,
    nan: &[(0x7F, 0x7F), (0xFF, 0xFF)],
};

pub const E5M2_LIMITS: FormatLimits = FormatLimits {
    name: "e5m2",
    sign_bits: 1,
    exponent_bits: 5,
    mantissa_bits: 2,
    bias: 15,
    max_finite: 57344.0,
    max_finite_code: 0x7B,
    min_normal: pow2(-14),
    min_subnormal: Some(pow2(-16)),
    epsilon: Some(pow2(-2)),
    infinity: Some((0x7C, 0xFC)),
    nan: &[(0x7D, 0x7F), (0xFD, 0xFF)],
};

pub const E8M0_LIMITS: FormatLimits = FormatLimits {
    name: "e8m0",
    sign_bits: 0,
    exponent_bits: 8,
    mantissa_bits: 0,
    bias: 127,
    max_finite: pow2(127),
    max_finite_code: 0xFE,
    min_normal: pow2(-127),
    min_subnormal: None,
    epsilon: None,
    infinity: None,
    nan: &[(0xFF, 0xFF)],
};

pub const BF16_LIMITS: FormatLimits = FormatLimits {
    name: "bf16",
    sign_bits: 1,
    exponent_bits: 8,
    mantissa_bits: 7,
    bias: 127,
    max_finite: (pow2(128) - pow2(120)), // (2 - 2^-7) * 2^127
    max_finite_code: 0x7F7F,
    min_normal: pow2(-126),
    min_subnormal: Some(pow2(-133)),
    epsilon: Some(pow2(-7)),
    infinity: Some((0x7F80, 0xFF80)),
    nan: &[(0x7F81, 0x7FFF), (0xFF81, 0xFFFF)],
};

pub const FP16_LIMITS: FormatLimits = FormatLimits {
    name: "fp16",
    sign_bits: 1,
    exponent_bits: 5,
    mantissa_bits: 10,
    bias: 15,
    max_finite: 65504.0,
    max_finite_code: 0x7BFF,
    min_normal: pow2(-14),
    min_subnormal: Some(pow2(-24)),
    epsilon: Some(pow2(-10)),
    infinity: Some((0x7C00, 0xFC00)),
    nan: &[(0x7C01, 0x7FFF), (0xFC01, 0xFFFF)],
};
