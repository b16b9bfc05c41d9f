//! The integer constants of `Fp8Spec::encode`, flattened for SIMD encoders,
//! which splat each one into a register once per call.

use crate::format::{Fp8Format, Overflow};

/// One format and overflow mode's encode constants (f32 bit patterns and codes).
#[derive(Clone, Copy, Debug)]
pub(super) struct EncodeParams {
    /// 23 - mantissa bits: how far a re-biased f32 shifts down to a code.
    pub shift: u32,
    /// (127 - bias) << 23: subtracting it re-biases the exponent field.
    pub rebias: u32,
    /// Half an ulp of the code minus one; adding it plus the lowest kept bit rounds to even.
    pub round: u32,
    /// Largest finite magnitude code.
    pub max_code: u32,
    /// Magnitude code of an overflowed value in this mode.
    pub overflow_code: u32,
    /// Magnitude code of a NaN.
    pub nan_code: u32,
    /// f32 bits of the smallest normal value: below it the subnormal path applies.
    pub min_normal_bits: u32,
    /// 2^k whose f32 ulp is the subnormal step.
    pub subnormal_magic: f32,
}

impl EncodeParams {
    pub fn new(format: Fp8Format, overflow: Overflow) -> Self {
        let spec = format.spec();
        let shift = 23 - spec.man_bits;
        EncodeParams {
            shift,
            rebias: ((127 - spec.bias) as u32) << 23,
            round: (1 << (shift - 1)) - 1,
            max_code: spec.max_code as u32,
            overflow_code: match overflow {
                Overflow::Saturate => spec.max_code,
                Overflow::NonSaturating => spec.overflow_code,
            } as u32,
            nan_code: spec.nan_code as u32,
            min_normal_bits: spec.min_normal_bits,
            subnormal_magic: spec.subnormal_magic,
        }
    }
}
