//! The FP8 casts of a linear layer per recipe, and the statistics of each cast.
//!
//! Every cast makes both copies a GEMM pair needs: the row-wise one (K-major for
//! the forward or dgrad GEMM) and the column-wise one, stored transposed (K-major
//! for dgrad or wgrad), from one read of the high-precision source (fused
//! cast + transpose for per-tensor scales, both block copies from the source).

use crate::amp::Fp8Recipe;
use crate::error::Result;
use crate::format::{Fp8Format, decode_e8m0};
use crate::quantize::{ScaleRule, amax, quantize_1x128, quantize_block_128x128, quantize_mxfp8, quantize_per_tensor};
use crate::scaling::{BlockDims, Fp8TensorStats, TensorRole};
use crate::tensor::{QuantizedMatrix, QuantizedTensor, Scales};

/// One cast: both copies, the amax of the source and the scale it multiplied by.
pub(crate) struct Cast {
    pub tensor: QuantizedTensor,
    pub amax: f32,
    /// The per-tensor scale itself (delayed: the slot's; current: the one computed from the
    /// amax), never derived back from `scale_inv`, whose reciprocal may be one ulp off.
    /// Block recipes: the largest block scale, `1 / smallest scale_inv`.
    pub scale: f32,
}

/// Casts `[rows, cols]` in `role`; `delayed_scale` is the slot's scale under delayed scaling.
pub(crate) fn cast(
    recipe: &Fp8Recipe,
    role: TensorRole,
    src: &[f32],
    rows: usize,
    cols: usize,
    delayed_scale: f32,
) -> Result<Cast> {
    let (tensor, amax, scale) = match recipe {
        Fp8Recipe::Delayed(r) => {
            let (tensor, amax) = quantize_per_tensor(src, rows, cols, r.format.for_role(role), delayed_scale, true)?;
            (tensor, amax, delayed_scale)
        }
        Fp8Recipe::Current(r) => {
            // `quantize_current`, with the scale kept for the statistics.
            let rule = ScaleRule::current(r, role);
            rule.validate()?;
            let scale = rule.scale(amax(src));
            let (tensor, amax) = quantize_per_tensor(src, rows, cols, rule.format, scale, true)?;
            (tensor, amax, scale)
        }
        Fp8Recipe::Block(r) => {
            let rule = ScaleRule::block(r, role);
            let tensor = match r.block_for(role) {
                BlockDims::Rows1x128 => quantize_1x128(src, rows, cols, &rule, true)?,
                BlockDims::Tiles128x128 => quantize_block_128x128(src, rows, cols, &rule, true)?,
            };
            let scale = largest_scale(tensor.rowwise().scales());
            (tensor, amax(src), scale)
        }
        Fp8Recipe::Mxfp8(r) => {
            let format = crate::scaling::RecipeFormat::from(r.format).for_role(role);
            let tensor = quantize_mxfp8(src, rows, cols, format, true)?;
            let scale = largest_scale(tensor.rowwise().scales());
            (tensor, amax(src), scale)
        }
    };
    Ok(Cast { tensor, amax, scale })
}

/// The transposed copy of a cast (always made by [`cast`]).
pub(crate) fn columnwise(tensor: &QuantizedTensor) -> &QuantizedMatrix {
    tensor
        .columnwise()
        .expect("fp8_cast::cast always makes the column-wise copy")
}

/// `scale_inv` of element `(r, c)` of a copy with `cols` columns.
fn element_scale_inv(scales: &Scales, r: usize, c: usize, cols: usize) -> f32 {
    match scales {
        Scales::PerTensor(s) => *s,
        Scales::Block1x128(s) => s[r * cols.div_ceil(128) + c / 128],
        Scales::Block128x128(s) => s[(r / 128) * cols.div_ceil(128) + c / 128],
        Scales::Mxfp8(e) => decode_e8m0(e[r * cols.div_ceil(32) + c / 32]),
    }
}

/// The largest scale a copy used (the per-tensor one, or the largest block scale).
fn largest_scale(scales: &Scales) -> f32 {
    let smallest_inv = match scales {
        Scales::PerTensor(s) => *s,
        Scales::Block1x128(s) | Scales::Block128x128(s) => s.iter().copied().fold(f32::INFINITY, f32::min),
        Scales::Mxfp8(e) => e.iter().map(|&e| decode_e8m0(e)).fold(f32::INFINITY, f32::min),
    };
    1.0 / smallest_inv
}

/// Counts that make up the statistics of one tensor.
#[derive(Default)]
struct Counts {
    saturated: u64,
    underflow: u64,
    nonzero: u64,
    nonfinite: u64,
}

impl Counts {
    fn finish(self, name: String, format: Fp8Format, amax: f32, scale: f32, total: usize) -> Fp8TensorStats {
        Fp8TensorStats {
            name,
            format: format.name().to_string(),
            amax,
            scale,
            saturated: self.saturated as f64 / total.max(1) as f64,
            underflow: self.underflow as f64 / self.nonzero.max(1) as f64,
            nonfinite: self.nonfinite,
        }
    }
}

/// Statistics of a cast: an element is saturated when its scaled magnitude exceeds the
/// format's max finite value, flushed when it is non-zero but its code decodes to zero.
pub(crate) fn cast_stats(name: String, src: &[f32], cast: &Cast) -> Fp8TensorStats {
    let q = cast.tensor.rowwise();
    let format = cast.tensor.format();
    let (cols, max) = (q.cols(), format.max_finite());
    let table = format.decode_table();
    let mut counts = Counts::default();
    for (i, (&x, &code)) in src.iter().zip(q.data()).enumerate() {
        if !x.is_finite() {
            counts.nonfinite += 1;
            continue;
        }
        if x != 0.0 {
            counts.nonzero += 1;
            if table[code as usize] == 0.0 {
                counts.underflow += 1;
            }
        }
        // |x| * scale > max  <=>  |x| > max * scale_inv (scale_inv is a power of two or 1/scale).
        if x.abs() > max * element_scale_inv(q.scales(), i / cols.max(1), i % cols.max(1), cols) {
            counts.saturated += 1;
        }
    }
    counts.finish(name, format, cast.amax, cast.scale, src.len())
}

/// Statistics of a tensor that stays in high precision (a GEMM output): what a
/// per-tensor cast with `scale` would do to it.
pub(crate) fn uncast_stats(name: String, values: &[f32], format: Fp8Format, amax: f32, scale: f32) -> Fp8TensorStats {
    let (max, half_min) = (format.max_finite(), format.decode(1) * 0.5);
    let mut counts = Counts::default();
    for &x in values {
        if !x.is_finite() {
            counts.nonfinite += 1;
            continue;
        }
        let scaled = (x * scale).abs();
        if x != 0.0 {
            counts.nonzero += 1;
            if scaled <= half_min {
                counts.underflow += 1;
            }
        }
        if scaled > max {
            counts.saturated += 1;
        }
    }
    counts.finish(name, format, amax, scale, values.len())
}

/// Bytes of one quantized copy: codes plus scales.
pub(crate) fn matrix_bytes(m: &QuantizedMatrix) -> usize {
    m.data().len()
        + match m.scales() {
            Scales::PerTensor(_) => 4,
            Scales::Block1x128(s) | Scales::Block128x128(s) => 4 * s.len(),
            Scales::Mxfp8(e) => e.len(),
        }
}

/// Bytes of a quantized tensor: both copies.
pub(crate) fn tensor_bytes(tensor: &QuantizedTensor) -> usize {
    matrix_bytes(tensor.rowwise()) + tensor.columnwise().map_or(0, matrix_bytes)
}
