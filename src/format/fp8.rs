//! E4M3 ("fn", OCP) and E5M2: encode f32 -> code with round-to-nearest-even,
//! decode code -> f32 exactly. The bit tricks here are the scalar reference
//! that the SIMD paths in `convert` must match bit for bit.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// What a cast does with a value whose rounded magnitude is above max finite.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Overflow {
    /// Clamp to +-max finite, +-inf included; NaN stays NaN. This is CUDA's
    /// `cvt.rn.satfinite` and every quantizer's default.
    #[default]
    Saturate,
    /// OCP overflow: E5M2 goes to +-inf, E4M3 (no inf) to NaN, as numpy's ml_dtypes does.
    NonSaturating,
}

/// The two FP8 data formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 1/4/3, bias 7, max 448, no inf: forward tensors (activations, weights).
    E4M3,
    /// 1/5/2, bias 15, max 57344, with inf: backward tensors (gradients).
    E5M2,
}

/// Bit-level description of one FP8 format, enough to encode and decode it.
#[derive(Debug)]
pub(crate) struct Fp8Spec {
    pub man_bits: u32,
    pub bias: i32,
    /// Largest finite positive code.
    pub max_code: u8,
    /// Magnitude code of a non-saturated overflow: E4M3 NaN (0x7F), E5M2 inf (0x7C).
    pub overflow_code: u8,
    /// Magnitude code the encoder gives NaN inputs.
    pub nan_code: u8,
    /// E5M2 has infinities (0x7C/0xFC); E4M3 spends that code on finite values.
    pub has_inf: bool,
    /// f32 bits of the smallest normal value.
    pub min_normal_bits: u32,
    /// f32 bits of 2^(emax+1): from here on a magnitude overflows whatever the rounding.
    pub overflow_bits: u32,
    /// 2^k whose f32 ulp is the format's subnormal step: adding it makes the
    /// FPU round a subnormal to nearest-even for us.
    pub subnormal_magic: f32,
}

pub(crate) const E4M3_SPEC: Fp8Spec = Fp8Spec {
    man_bits: 3,
    bias: 7,
    max_code: 0x7E,
    overflow_code: 0x7F,
    nan_code: 0x7F,
    has_inf: false,
    min_normal_bits: (127 - 6) << 23, // 2^-6
    overflow_bits: (127 + 9) << 23,   // 512
    subnormal_magic: 16384.0,         // ulp(2^14) = 2^-9, the E4M3 subnormal step
};

pub(crate) const E5M2_SPEC: Fp8Spec = Fp8Spec {
    man_bits: 2,
    bias: 15,
    max_code: 0x7B,
    overflow_code: 0x7C,
    nan_code: 0x7F,
    has_inf: true,
    min_normal_bits: (127 - 14) << 23, // 2^-14
    overflow_bits: (127 + 16) << 23,   // 65536
    subnormal_magic: 128.0,            // ulp(2^7) = 2^-16, the E5M2 subnormal step
};

impl Fp8Spec {
    #[inline(always)]
    const fn overflowed(&self, overflow: Overflow) -> u8 {
        match overflow {
            Overflow::Saturate => self.max_code,
            Overflow::NonSaturating => self.overflow_code,
        }
    }

    /// Whether a magnitude code (sign bit clear) is a NaN.
    #[inline(always)]
    pub(crate) const fn is_nan_magnitude(&self, mag: u8) -> bool {
        mag > self.max_code && !(self.has_inf && mag == self.overflow_code)
    }

    /// f32 -> code, round to nearest even, subnormals kept, -0 kept.
    #[inline(always)]
    pub(crate) fn encode(&self, x: f32, overflow: Overflow) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let abs = bits & 0x7FFF_FFFF;
        let mag = if abs > 0x7F80_0000 {
            self.nan_code
        } else if abs >= self.overflow_bits {
            self.overflowed(overflow) // +-inf lands here too
        } else if abs < self.min_normal_bits {
            let rounded = f32::from_bits(abs) + self.subnormal_magic;
            (rounded.to_bits() - self.subnormal_magic.to_bits()) as u8
        } else {
            // Re-bias the exponent, then add half an ulp minus one plus the
            // lowest kept bit: the carry implements ties-to-even.
            let shift = 23 - self.man_bits;
            let odd = (abs >> shift) & 1;
            let rebiased = abs - (((127 - self.bias) as u32) << 23);
            let code = (rebiased + (1 << (shift - 1)) - 1 + odd) >> shift;
            if code > self.max_code as u32 {
                self.overflowed(overflow)
            } else {
                code as u8
            }
        };
        mag | sign
    }

    /// code -> f32, exact for every code.
    pub(crate) const fn decode(&self, code: u8) -> f32 {
        let mag = code & 0x7F;
        let value = if self.is_nan_magnitude(mag) {
            f32::NAN
        } else if self.has_inf && mag == self.overflow_code {
            f32::INFINITY
        } else {
            let exp = (mag >> self.man_bits) as i32;
            let man = (mag & ((1 << self.man_bits) - 1)) as u32;
            if exp == 0 {
                // man * 2^(1 - bias - man_bits), exact in f32.
                let step = f32::from_bits(((128 - self.bias - self.man_bits as i32) as u32) << 23);
                man as f32 * step
            } else {
                f32::from_bits((((exp - self.bias + 127) as u32) << 23) | (man << (23 - self.man_bits)))
            }
        };
        if code & 0x80 != 0 { -value } else { value }
    }

    const fn decode_table(&self) -> [f32; 256] {
        let mut table = [0.0f32; 256];
        let mut code = 0;
        while code < 256 {
            table[code] = self.decode(code as u8);
            code += 1;
        }
        table
    }
}

/// Every E4M3 code decoded, for table-driven paths.
pub(crate) static E4M3_TO_F32: [f32; 256] = E4M3_SPEC.decode_table();
/// Every E5M2 code decoded, for table-driven paths.
pub(crate) static E5M2_TO_F32: [f32; 256] = E5M2_SPEC.decode_table();

impl Fp8Format {
    /// Both formats, E4M3 first.
    pub const ALL: [Fp8Format; 2] = [Fp8Format::E4M3, Fp8Format::E5M2];

    pub(crate) const fn spec(self) -> &'static Fp8Spec {
        match self {
            Fp8Format::E4M3 => &E4M3_SPEC,
            Fp8Format::E5M2 => &E5M2_SPEC,
        }
    }

    /// Lower-case name, as the command line spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        }
    }

    /// Largest finite value: 448 (E4M3) or 57344 (E5M2).
    pub const fn max_finite(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    /// f32 -> code, round to nearest even.
    #[inline]
    pub fn encode(self, x: f32, overflow: Overflow) -> u8 {
        match self {
            Fp8Format::E4M3 => E4M3_SPEC.encode(x, overflow),
            Fp8Format::E5M2 => E5M2_SPEC.encode(x, overflow),
        }
    }

    /// code -> f32, exact.
    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        self.decode_table()[code as usize]
    }

    /// All 256 codes decoded.
    pub fn decode_table(self) -> &'static [f32; 256] {
        match self {
            Fp8Format::E4M3 => &E4M3_TO_F32,
            Fp8Format::E5M2 => &E5M2_TO_F32,
        }
    }

    /// Whether `code` is a NaN in this format.
    pub const fn is_nan(self, code: u8) -> bool {
        self.spec().is_nan_magnitude(code & 0x7F)
    }

    /// Whether `code` is +-inf (never for E4M3).
    pub const fn is_infinite(self, code: u8) -> bool {
        let spec = self.spec();
        spec.has_inf && code & 0x7F == spec.overflow_code
    }
}

impl fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fp8Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "e4m3" | "e4m3fn" => Ok(Fp8Format::E4M3),
            "e5m2" => Ok(Fp8Format::E5M2),
            _ => Err(Error::UnknownFormat {
                name: s.to_string(),
                expected: "e4m3, e5m2",
            }),
        }
    }
}

/// One scalar newtype per format: the storage type users hold in their own code.
macro_rules! fp8_scalar {
    ($(#[$doc:meta])* $name:ident, $format:expr, $float8:ty) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name(u8);

        impl $name {
            /// The format this type stores.
            pub const FORMAT: Fp8Format = $format;
            /// Largest finite value.
            pub const MAX: $name = $name($format.spec().max_code);
            /// Most negative finite value.
            pub const MIN: $name = $name($format.spec().max_code | 0x80);
            /// Smallest positive normal value.
            pub const MIN_POSITIVE: $name = $name(1 << $format.spec().man_bits);
            /// Smallest positive subnormal value.
            pub const MIN_POSITIVE_SUBNORMAL: $name = $name(1);
            /// Difference between 1.0 and the next value up.
            pub const EPSILON: $name = $name((($format.spec().bias - $format.spec().man_bits as i32) as u8) << $format.spec().man_bits);
            /// The NaN the encoder produces.
            pub const NAN: $name = $name($format.spec().nan_code);
            /// Positive zero.
            pub const ZERO: $name = $name(0);

            /// Wraps a raw code.
            pub const fn from_bits(bits: u8) -> Self {
                $name(bits)
            }
            /// The raw code.
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            /// Saturating round-to-nearest-even cast.
            pub fn from_f32(x: f32) -> Self {
                $name($format.encode(x, Overflow::Saturate))
            }
            /// Round-to-nearest-even cast with the chosen overflow behaviour.
            pub fn from_f32_with(x: f32, overflow: Overflow) -> Self {
                $name($format.encode(x, overflow))
            }
            /// Exact value.
            pub fn to_f32(self) -> f32 {
                $format.decode(self.0)
            }
            /// Whether this is a NaN.
            pub const fn is_nan(self) -> bool {
                $format.is_nan(self.0)
            }
            /// Whether this is +-inf.
            pub const fn is_infinite(self) -> bool {
                $format.is_infinite(self.0)
            }
            /// Neither NaN nor inf.
            pub const fn is_finite(self) -> bool {
                !self.is_nan() && !self.is_infinite()
            }
            /// Nonzero with a zero exponent field.
            pub const fn is_subnormal(self) -> bool {
                let mag = self.0 & 0x7F;
                mag != 0 && mag >> $format.spec().man_bits == 0
            }
        }

        impl From<$name> for f32 {
            fn from(x: $name) -> f32 {
                x.to_f32()
            }
        }

        /// Interop with the `float8` crate (and so with `cudarc`/`candle`): same bits.
        impl From<$name> for $float8 {
            fn from(x: $name) -> $float8 {
                <$float8>::from_bits(x.0)
            }
        }

        impl From<$float8> for $name {
            fn from(x: $float8) -> $name {
                $name(x.to_bits())
            }
        }
    };
}

fp8_scalar!(
    /// An E4M3 ("fn") value: 1 sign, 4 exponent, 3 mantissa bits, bias 7, max 448, no inf.
    E4M3,
    Fp8Format::E4M3,
    float8::F8E4M3
);
fp8_scalar!(
    /// An E5M2 value: 1 sign, 5 exponent, 2 mantissa bits, bias 15, max 57344, with inf.
    E5M2,
    Fp8Format::E5M2,
    float8::F8E5M2
);

impl E5M2 {
    /// Positive infinity.
    pub const INFINITY: E5M2 = E5M2(0x7C);
    /// Negative infinity.
    pub const NEG_INFINITY: E5M2 = E5M2(0xFC);
}
