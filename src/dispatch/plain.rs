//! A matrix in a plain compute dtype (f32, bf16, fp16): the GEMM operand of the
//! non-FP8 precisions, made by the dtype conversion op.

use half::{bf16, f16};

use crate::error::Result;
use crate::gemm::{Mat, Operand};
use crate::tensor::Dtype;

/// A plain matrix in a compute dtype.
#[derive(Clone, Debug)]
pub(crate) enum PlainMat {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl PlainMat {
    /// `src` converted to `dtype` (round to nearest even).
    pub(crate) fn new(dtype: Dtype, src: &[f32]) -> Self {
        match dtype {
            Dtype::F32 => PlainMat::F32(src.to_vec()),
            Dtype::Bf16 => PlainMat::Bf16(src.iter().map(|&x| bf16::from_f32(x)).collect()),
            Dtype::F16 => PlainMat::F16(src.iter().map(|&x| f16::from_f32(x)).collect()),
        }
    }

    /// The transpose of `[rows, cols]` `src`, in `dtype`.
    pub(crate) fn transposed(dtype: Dtype, src: &[f32], rows: usize, cols: usize) -> Self {
        PlainMat::new(dtype, &transpose(src, rows, cols))
    }

    pub(crate) fn operand(&self, rows: usize, cols: usize) -> Result<Operand<'_>> {
        Ok(match self {
            PlainMat::F32(d) => Operand::F32(Mat::new(d, rows, cols)?),
            PlainMat::Bf16(d) => Operand::Bf16(Mat::new(d, rows, cols)?),
            PlainMat::F16(d) => Operand::F16(Mat::new(d, rows, cols)?),
        })
    }

    /// Every element widened to f64 (exact for each dtype), for comparing two results.
    pub(crate) fn widened(&self) -> Vec<f64> {
        match self {
            PlainMat::F32(d) => d.iter().map(|&v| v as f64).collect(),
            PlainMat::Bf16(d) => d.iter().map(|v| v.to_f64()).collect(),
            PlainMat::F16(d) => d.iter().map(|v| v.to_f64()).collect(),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            PlainMat::F32(d) => 4 * d.len(),
            PlainMat::Bf16(d) => 2 * d.len(),
            PlainMat::F16(d) => 2 * d.len(),
        }
    }
}

/// `src` converted to `dtype` (the CPU dtype conversion op).
pub(crate) fn convert(dtype: Dtype, src: &[f32]) -> Result<PlainMat> {
    Ok(PlainMat::new(dtype, src))
}

/// The transpose of `[rows, cols]` `src` in `dtype` (the CPU transposing conversion op).
pub(crate) fn convert_transposed(dtype: Dtype, src: &[f32], rows: usize, cols: usize) -> Result<PlainMat> {
    Ok(PlainMat::transposed(dtype, src, rows, cols))
}

/// `[cols, rows]` transpose of a row-major `[rows, cols]` matrix.
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; src.len()];
    for (r, row) in src.chunks(cols.max(1)).enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}
