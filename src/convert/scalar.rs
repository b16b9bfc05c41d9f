//! The portable path and the reference every SIMD path must match bit for bit.

use super::HighPrecision;
use crate::format::{Fp8Format, Overflow};

/// `dst[i] = cast(src[i] * scale)`; returns `max |src[i]|` (NaN ignored, inf kept).
pub fn quantize<T: HighPrecision>(src: &[T], dst: &mut [u8], format: Fp8Format, scale: f32, overflow: Overflow) -> f32 {
    let spec = format.spec();
    let mut amax = 0.0f32;
    for (x, q) in src.iter().zip(dst.iter_mut()) {
        let x = x.to_f32();
        amax = amax.max(x.abs());
        *q = spec.encode(x * scale, overflow);
    }
    amax
}

/// `dst[i] = decode(src[i]) * scale_inv`, rounded to `T`.
pub fn dequantize<T: HighPrecision>(src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) {
    let table = format.decode_table();
    for (&q, y) in src.iter().zip(dst.iter_mut()) {
        *y = T::from_f32(table[q as usize] * scale_inv);
    }
}
