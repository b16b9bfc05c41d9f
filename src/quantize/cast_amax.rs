//! Per-tensor cast with a fused amax: `q = cast_sat(x * scale)`, amax of the
//! unscaled input (delayed and current scaling).

use rayon::prelude::*;

use super::{ScaleRule, amax, cast_transpose_amax, check_len, check_scale};
use crate::convert::{self, HighPrecision};
use crate::error::{Error, Result};
use crate::format::{Fp8Format, Overflow};
use crate::tensor::{QuantizedMatrix, QuantizedTensor, Scales};

/// Elements per parallel chunk (256 KB of f32).
const CHUNK: usize = 1 << 16;

/// `dst[i] = cast_sat(src[i] * scale)`; returns `max |src[i]|`. Chunks run in parallel.
pub fn cast_amax<T: HighPrecision>(src: &[T], dst: &mut [u8], format: Fp8Format, scale: f32) -> Result<f32> {
    if src.len() != dst.len() {
        return Err(Error::LengthMismatch {
            what: "cast_amax",
            src: src.len(),
            dst: dst.len(),
        });
    }
    check_scale(scale)?;
    src.par_chunks(CHUNK)
        .zip(dst.par_chunks_mut(CHUNK))
        .map(|(src, dst)| convert::quantize(src, dst, format, scale, Overflow::Saturate))
        .try_reduce(|| 0.0, |a, b| Ok(a.max(b)))
}

/// Quantizes `[rows, cols]` with a given per-tensor `scale` (delayed scaling),
/// plus the column-wise copy if asked (fused cast + transpose). Returns the
/// tensor and the amax to record in the scaling state.
pub fn quantize_per_tensor<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    scale: f32,
    columnwise: bool,
) -> Result<(QuantizedTensor, f32)> {
    check_len("per-tensor source", src.len(), rows, cols)?;
    let mut data = vec![0u8; src.len()];
    let (amax, columnwise) = if columnwise {
        let mut transposed = vec![0u8; src.len()];
        let amax = cast_transpose_amax(src, rows, cols, format, scale, &mut data, &mut transposed)?;
        let copy = QuantizedMatrix::new(transposed, cols, rows, Scales::PerTensor(1.0 / scale))?;
        (amax, Some(copy))
    } else {
        (cast_amax(src, &mut data, format, scale)?, None)
    };
    let rowwise = QuantizedMatrix::new(data, rows, cols, Scales::PerTensor(1.0 / scale))?;
    Ok((QuantizedTensor::new(format, rowwise, columnwise)?, amax))
}

/// Current scaling: reads the tensor twice, once for the amax and once for
/// the cast with `rule.scale(amax)`. Returns the tensor and its amax.
pub fn quantize_current<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    rule: &ScaleRule,
    columnwise: bool,
) -> Result<(QuantizedTensor, f32)> {
    rule.validate()?;
    check_len("per-tensor source", src.len(), rows, cols)?;
    let scale = rule.scale(amax(src));
    quantize_per_tensor(src, rows, cols, rule.format, scale, columnwise)
}
