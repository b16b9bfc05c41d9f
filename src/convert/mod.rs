//! Slice conversions for the hot paths: high precision -> FP8 with a scale and
//! a fused amax, and FP8 -> high precision with a scale.
//!
//! `q = cast(x * scale)` with round-to-nearest-even; the amax is `max |x|` of
//! the *unscaled* input with `fmaxf` semantics (NaN ignored, inf kept).
//! Dequantization is `f32(q) * scale_inv`, rounded to the destination type.

mod element;
pub mod scalar;

pub use element::HighPrecision;

use crate::error::{Error, Result};
use crate::format::{Fp8Format, Overflow};

fn check_lengths(what: &'static str, src: usize, dst: usize) -> Result<()> {
    if src == dst {
        Ok(())
    } else {
        Err(Error::LengthMismatch { what, src, dst })
    }
}

fn check_scale(value: f32) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidScale { value })
    }
}

/// Quantizes `src` into `dst` as `cast(x * scale)`; returns the amax of `src`.
///
/// ```
/// use fp8_engine::convert::quantize;
/// use fp8_engine::format::{Fp8Format, Overflow};
///
/// let x = [1.0f32, -2.5, 1000.0];
/// let mut q = [0u8; 3];
/// let amax = quantize(&x, &mut q, Fp8Format::E4M3, 0.5, Overflow::Saturate)?;
/// assert_eq!(amax, 1000.0);
/// assert_eq!(Fp8Format::E4M3.decode(q[2]), 448.0);
/// # Ok::<(), fp8_engine::Error>(())
/// ```
pub fn quantize<T: HighPrecision>(
    src: &[T],
    dst: &mut [u8],
    format: Fp8Format,
    scale: f32,
    overflow: Overflow,
) -> Result<f32> {
    check_lengths("quantize", src.len(), dst.len())?;
    check_scale(scale)?;
    Ok(scalar::quantize(src, dst, format, scale, overflow))
}

/// Dequantizes `src` into `dst` as `decode(q) * scale_inv`.
pub fn dequantize<T: HighPrecision>(src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) -> Result<()> {
    check_lengths("dequantize", src.len(), dst.len())?;
    check_scale(scale_inv)?;
    scalar::dequantize(src, dst, format, scale_inv);
    Ok(())
}
