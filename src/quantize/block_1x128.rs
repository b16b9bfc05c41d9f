//! 1x128 block quantization (`docs/numerics.md`, block scaling, activations and gradients): one scale
//! per row per 128 consecutive elements, the current-scaling formula on each
//! block's amax. The row-wise and column-wise copies are both quantized from
//! the high-precision source, never one from the other.

use super::blocks::{self, BlockRule};
use super::{ScaleRule, check_len};
use crate::convert::HighPrecision;
use crate::error::Result;
use crate::format::Fp8Format;
use crate::tensor::{QuantizedMatrix, QuantizedTensor, Scales};

/// Block length along the reduction dimension.
pub const BLOCK: usize = 128;

impl BlockRule for ScaleRule {
    type Stored = f32;

    fn format(&self) -> Fp8Format {
        self.format
    }

    fn scale(&self, amax: f32) -> (f32, f32) {
        let scale = ScaleRule::scale(self, amax);
        (scale, 1.0 / scale)
    }
}

/// Row-wise 1x128 copy: `dst` `[rows, cols]` codes, `scale_inv` `[rows, ceil(cols/128)]`.
pub fn quantize_1x128_rowwise<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    rule: &ScaleRule,
    dst: &mut [u8],
    scale_inv: &mut [f32],
) -> Result<()> {
    rule.validate()?;
    check_len("1x128 source", src.len(), rows, cols)?;
    check_len("1x128 codes", dst.len(), rows, cols)?;
    check_len("1x128 scale_inv", scale_inv.len(), rows, cols.div_ceil(BLOCK))?;
    blocks::quantize_rowwise(src, rows, cols, BLOCK, rule, dst, scale_inv)
}

/// Column-wise 1x128 copy (1x128 blocks of `X^T`, i.e. 128x1 blocks of `X`):
/// `dst` `[cols, rows]` codes, `scale_inv` `[cols, ceil(rows/128)]`.
pub fn quantize_1x128_columnwise<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    rule: &ScaleRule,
    dst: &mut [u8],
    scale_inv: &mut [f32],
) -> Result<()> {
    rule.validate()?;
    check_len("1x128 source", src.len(), rows, cols)?;
    check_len("1x128 column-wise codes", dst.len(), cols, rows)?;
    check_len(
        "1x128 column-wise scale_inv",
        scale_inv.len(),
        cols,
        rows.div_ceil(BLOCK),
    )?;
    blocks::quantize_columnwise(src, rows, cols, BLOCK, rule, dst, scale_inv)
}

/// Quantizes `[rows, cols]` with 1x128 blocks, and the column-wise copy too if asked.
pub fn quantize_1x128<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    rule: &ScaleRule,
    columnwise: bool,
) -> Result<QuantizedTensor> {
    check_len("1x128 source", src.len(), rows, cols)?;
    let mut data = vec![0u8; src.len()];
    let mut scale_inv = vec![0.0f32; rows * cols.div_ceil(BLOCK)];
    quantize_1x128_rowwise(src, rows, cols, rule, &mut data, &mut scale_inv)?;
    let rowwise = QuantizedMatrix::new(data, rows, cols, Scales::Block1x128(scale_inv))?;
    let columnwise = if columnwise {
        let mut data = vec![0u8; src.len()];
        let mut scale_inv = vec![0.0f32; cols * rows.div_ceil(BLOCK)];
        quantize_1x128_columnwise(src, rows, cols, rule, &mut data, &mut scale_inv)?;
        Some(QuantizedMatrix::new(data, cols, rows, Scales::Block1x128(scale_inv))?)
    } else {
        None
    };
    QuantizedTensor::new(rule.format, rowwise, columnwise)
}
