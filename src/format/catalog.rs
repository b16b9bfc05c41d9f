//! Every format behind one run-time value, for tables, tools and tests.
//! Hot paths use `Fp8Format` or the slice conversions in `convert` instead.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use super::e8m0::{decode_e8m0, encode_e8m0};
use super::limits::{BF16_LIMITS, E4M3_LIMITS, E5M2_LIMITS, E8M0_LIMITS, FP16_LIMITS, FormatLimits};
use super::{Fp8Format, Overflow};
use crate::error::Error;

/// Any number format the engine stores: the two FP8 data formats, the E8M0
/// scale format, and the 16-bit formats of the fallback policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    E4M3,
    E5M2,
    E8M0,
    Bf16,
    Fp16,
}

impl Format {
    /// All formats, in table order.
    pub const ALL: [Format; 5] = [Format::E4M3, Format::E5M2, Format::E8M0, Format::Bf16, Format::Fp16];

    /// Lower-case name, as the command line spells it.
    pub const fn name(self) -> &'static str {
        self.limits().name
    }

    /// Limits and special encodings.
    pub const fn limits(self) -> &'static FormatLimits {
        match self {
            Format::E4M3 => &E4M3_LIMITS,
            Format::E5M2 => &E5M2_LIMITS,
            Format::E8M0 => &E8M0_LIMITS,
            Format::Bf16 => &BF16_LIMITS,
            Format::Fp16 => &FP16_LIMITS,
        }
    }

    /// Storage width in bits (8 or 16).
    pub const fn storage_bits(self) -> u32 {
        let l = self.limits();
        let bits = l.sign_bits + l.exponent_bits + l.mantissa_bits;
        if bits <= 8 { 8 } else { 16 }
    }

    /// How many distinct codes there are.
    pub const fn code_count(self) -> u32 {
        1 << self.storage_bits()
    }

    /// The FP8 data format, if this is one.
    pub const fn fp8(self) -> Option<Fp8Format> {
        match self {
            Format::E4M3 => Some(Fp8Format::E4M3),
            Format::E5M2 => Some(Fp8Format::E5M2),
            _ => None,
        }
    }

    /// f32 -> code, round to nearest even. For bf16/fp16, `Saturate` clamps an
    /// overflow (and inf) to +-max finite like `cvt.rn.satfinite`; otherwise
    /// they overflow to inf as IEEE does.
    pub fn encode(self, x: f32, overflow: Overflow) -> u16 {
        let ieee16 = |code: u16| -> u16 {
            let limits = self.limits();
            let is_inf = limits.infinity.is_some_and(|(pos, neg)| code == pos || code == neg);
            if is_inf && overflow == Overflow::Saturate {
                (code & 0x8000) | limits.max_finite_code
            } else {
                code
            }
        };
        match self {
            Format::E4M3 | Format::E5M2 => self.fp8().map_or(0, |f| f.encode(x, overflow)) as u16,
            Format::E8M0 => encode_e8m0(x, overflow) as u16,
            Format::Bf16 => ieee16(bf16::from_f32(x).to_bits()),
            Format::Fp16 => ieee16(f16::from_f32(x).to_bits()),
        }
    }

    /// code -> f32, exact. Codes beyond the format's width are masked.
    pub fn decode(self, code: u16) -> f32 {
        match self {
            Format::E4M3 => Fp8Format::E4M3.decode(code as u8),
            Format::E5M2 => Fp8Format::E5M2.decode(code as u8),
            Format::E8M0 => decode_e8m0(code as u8),
            Format::Bf16 => bf16::from_bits(code).to_f32(),
            Format::Fp16 => f16::from_bits(code).to_f32(),
        }
    }

    /// Whether `code` is one of the format's NaN encodings.
    pub fn is_nan_code(self, code: u16) -> bool {
        self.limits().nan.iter().any(|&(lo, hi)| (lo..=hi).contains(&code))
    }

    /// The representable values just below and just above the value of `code`
    /// (infinities count; NaN has no neighbours). A search over every code:
    /// meant for tools, not hot paths.
    pub fn neighbours(self, code: u16) -> (Option<f32>, Option<f32>) {
        let value = self.decode(code);
        if value.is_nan() {
            return (None, None);
        }
        let mut below: Option<f32> = None;
        let mut above: Option<f32> = None;
        for other in 0..self.code_count() {
            let v = self.decode(other as u16);
            if v < value && below.is_none_or(|b| v > b) {
                below = Some(v);
            }
            if v > value && above.is_none_or(|a| v < a) {
                above = Some(v);
            }
        }
        (below, above)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "e4m3" | "e4m3fn" => Ok(Format::E4M3),
            "e5m2" => Ok(Format::E5M2),
            "e8m0" => Ok(Format::E8M0),
            "bf16" | "bfloat16" => Ok(Format::Bf16),
            "fp16" | "f16" | "half" => Ok(Format::Fp16),
            _ => Err(Error::UnknownFormat {
                name: s.to_string(),
                expected: "e4m3, e5m2, e8m0, bf16, fp16",
            }),
        }
    }
}
