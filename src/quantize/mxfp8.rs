//! MXFP8 quantization (`docs/numerics.md`, MXFP8): one E8M0 exponent per 32 consecutive
//! elements, rounded up so no element of a block exceeds the format's max;
//! data `cast_sat(x * 2^(127-e))`. The column-wise copy (32x1 blocks of `X`,
//! stored as 1x32 blocks of `X^T`) is quantized from the high-precision source.

use super::blocks::{self, BlockRule};
use super::check_len;
use crate::convert::HighPrecision;
use crate::error::Result;
use crate::format::Fp8Format;
use crate::scaling::mxfp8::{data_scale, mxfp8_scale_exponent};
use crate::tensor::{QuantizedMatrix, QuantizedTensor, Scales};

/// Elements per scaling block.
pub const BLOCK: usize = crate::tensor::MXFP8_BLOCK;

struct E8m0Rule(Fp8Format);

impl BlockRule for E8m0Rule {
    type Stored = u8;

    fn format(&self) -> Fp8Format {
        self.0
    }

    fn scale(&self, amax: f32) -> (f32, u8) {
        // amax comes from the fmaxf reduction, never NaN, so e != 0xFF and the
        // multiplier is a finite power of two in [2^-127, 2^127].
        let e = mxfp8_scale_exponent(amax, self.0);
        (data_scale(e), e)
    }
}

/// Row-wise MXFP8 copy: `dst` `[rows, cols]` codes, `e8m0` `[rows, ceil(cols/32)]`.
pub fn quantize_mxfp8_rowwise<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    dst: &mut [u8],
    e8m0: &mut [u8],
) -> Result<()> {
    check_len("mxfp8 source", src.len(), rows, cols)?;
    check_len("mxfp8 codes", dst.len(), rows, cols)?;
    check_len("mxfp8 scales", e8m0.len(), rows, cols.div_ceil(BLOCK))?;
    blocks::quantize_rowwise(src, rows, cols, BLOCK, &E8m0Rule(format), dst, e8m0)
}

/// Column-wise MXFP8 copy: `dst` `[cols, rows]` codes, `e8m0` `[cols, ceil(rows/32)]`.
pub fn quantize_mxfp8_columnwise<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    dst: &mut [u8],
    e8m0: &mut [u8],
) -> Result<()> {
    check_len("mxfp8 source", src.len(), rows, cols)?;
    check_len("mxfp8 column-wise codes", dst.len(), cols, rows)?;
    check_len("mxfp8 column-wise scales", e8m0.len(), cols, rows.div_ceil(BLOCK))?;
    blocks::quantize_columnwise(src, rows, cols, BLOCK, &E8m0Rule(format), dst, e8m0)
}

/// Quantizes `[rows, cols]` to MXFP8, and the column-wise copy too if asked.
pub fn quantize_mxfp8<T: HighPrecision>(
    src: &[T],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    columnwise: bool,
) -> Result<QuantizedTensor> {
    check_len("mxfp8 source", src.len(), rows, cols)?;
    let mut data = vec![0u8; src.len()];
    let mut e8m0 = vec![0u8; rows * cols.div_ceil(BLOCK)];
    quantize_mxfp8_rowwise(src, rows, cols, format, &mut data, &mut e8m0)?;
    let rowwise = QuantizedMatrix::new(data, rows, cols, Scales::Mxfp8(e8m0))?;
    let columnwise = if columnwise {
        let mut data = vec![0u8; src.len()];
        let mut e8m0 = vec![0u8; cols * rows.div_ceil(BLOCK)];
        quantize_mxfp8_columnwise(src, rows, cols, format, &mut data, &mut e8m0)?;
        Some(QuantizedMatrix::new(data, cols, rows, Scales::Mxfp8(e8m0))?)
    } else {
        None
    };
    QuantizedTensor::new(format, rowwise, columnwise)
}
