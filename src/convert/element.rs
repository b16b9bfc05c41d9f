//! The high-precision element types a quantizer reads and a dequantizer writes.

use half::{bf16, f16};

/// f32, bf16 or f16: converts to f32 exactly and back with round-to-nearest-even.
pub trait HighPrecision: Copy + Send + Sync + 'static {
    /// Name used in messages and bench ids.
    const NAME: &'static str;
    /// Exact widening.
    fn to_f32(self) -> f32;
    /// Round-to-nearest-even narrowing (the `half` crate's, NaN kept).
    fn from_f32(x: f32) -> Self;
}

impl HighPrecision for f32 {
    const NAME: &'static str = "f32";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl HighPrecision for bf16 {
    const NAME: &'static str = "bf16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl HighPrecision for f16 {
    const NAME: &'static str = "f16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}
