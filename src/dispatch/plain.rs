//! A matrix in a plain compute dtype (f32, bf16, fp16): the GEMM operand of the
//! non-FP8 precisions, made by the dtype conversion op.

use std::sync::Arc;

use half::{bf16, f16};

use crate::error::Result;
use crate::gemm::cpu::transpose_tiles;
use crate::gemm::{Mat, Operand};
use crate::tensor::scratch;
use crate::tensor::{DeviceMirror, Dtype};

/// A plain matrix in a compute dtype. A 16-bit one made on a GPU may keep its device copy
/// there (`Mirror`), which that GPU's GEMMs read instead of uploading the host values.
#[derive(Clone, Debug)]
pub(crate) enum PlainMat {
    F32(Vec<f32>),
    Bf16(Vec<bf16>, Mirror),
    F16(Vec<f16>, Mirror),
}

/// The device copy of a 16-bit [`PlainMat`]'s values, as stored, if a GPU kept one.
pub(crate) type Mirror = Option<Arc<DeviceMirror>>;

impl PlainMat {
    /// `src` converted to `dtype` (round to nearest even).
    pub(crate) fn new(dtype: Dtype, src: &[f32]) -> Self {
        match dtype {
            Dtype::F32 => PlainMat::F32(scratch::copy_of(src)),
            Dtype::Bf16 => {
                let mut values = vec![bf16::ZERO; src.len()];
                crate::tensor::bf16_from_f32_slice(src, &mut values);
                PlainMat::Bf16(values, None)
            }
            Dtype::F16 => PlainMat::F16(src.iter().map(|&x| f16::from_f32(x)).collect(), None),
        }
    }

    /// The transpose of `[rows, cols]` `src`, in `dtype`: the same values as converting
    /// [`transpose`]'s result, in one cache-tiled pass.
    pub(crate) fn transposed(dtype: Dtype, src: &[f32], rows: usize, cols: usize) -> Self {
        match dtype {
            Dtype::F32 => PlainMat::F32(transpose_map(src, rows, cols, |x| x)),
            Dtype::Bf16 => PlainMat::Bf16(transpose_map(src, rows, cols, crate::tensor::bf16_of), None),
            Dtype::F16 => PlainMat::F16(transpose_map(src, rows, cols, f16::from_f32), None),
        }
    }

    pub(crate) fn operand(&self, rows: usize, cols: usize) -> Result<Operand<'_>> {
        Ok(match self {
            PlainMat::F32(d) => Operand::F32(Mat::new(d, rows, cols)?),
            PlainMat::Bf16(d, m) => Operand::Bf16(Mat::new(d, rows, cols)?.with_mirror(m.as_ref())),
            PlainMat::F16(d, m) => Operand::F16(Mat::new(d, rows, cols)?.with_mirror(m.as_ref())),
        })
    }

    /// The `rows x cols` transpose of this `cols x rows` matrix as a GEMM operand, read in place.
    pub(crate) fn operand_transposed(&self, rows: usize, cols: usize) -> Result<Operand<'_>> {
        Ok(match self {
            PlainMat::F32(d) => Operand::F32(Mat::transposed(d, rows, cols)?),
            PlainMat::Bf16(d, m) => Operand::Bf16(Mat::transposed(d, rows, cols)?.with_mirror(m.as_ref())),
            PlainMat::F16(d, m) => Operand::F16(Mat::transposed(d, rows, cols)?.with_mirror(m.as_ref())),
        })
    }

    /// Every element widened to f64 (exact for each dtype), for comparing two results.
    pub(crate) fn widened(&self) -> Vec<f64> {
        match self {
            PlainMat::F32(d) => d.iter().map(|&v| v as f64).collect(),
            PlainMat::Bf16(d, _) => d.iter().map(|v| v.to_f64()).collect(),
            PlainMat::F16(d, _) => d.iter().map(|v| v.to_f64()).collect(),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            PlainMat::F32(d) => 4 * d.len(),
            PlainMat::Bf16(d, _) => 2 * d.len(),
            PlainMat::F16(d, _) => 2 * d.len(),
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
#[cfg(test)]
fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    transpose_map(src, rows, cols, |x| x)
}

/// `out[c * rows + r] = f(src[r * cols + c])`: the `[cols, rows]` transpose of a row-major
/// `[rows, cols]` matrix, element by element through `f`, in the GEMM's cache-blocked tiles
/// (`gemm::cpu::transpose_tiles`).
fn transpose_map<T: Copy + Default + Send>(
    src: &[f32],
    rows: usize,
    cols: usize,
    f: impl Fn(f32) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); src.len()];
    if src.len() == rows * cols {
        transpose_tiles(src, rows, cols, &mut out, |dst, column| {
            for (d, &v) in dst.iter_mut().zip(column) {
                *d = f(v);
            }
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element-by-element definition the tiled transpose must match.
    fn naive(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut out = vec![0.0; src.len()];
        for r in 0..rows {
            for c in 0..cols {
                out[c * rows + r] = src[r * cols + c];
            }
        }
        out
    }

    #[test]
    fn tiled_transposes_match_the_definition() {
        // Ragged tiles at both edges, one tile, single rows/columns, and a parallel size.
        for (rows, cols) in [(1, 1), (1, 70), (70, 1), (33, 65), (32, 32), (100, 37), (300, 260)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
            let want = naive(&src, rows, cols);
            assert_eq!(transpose(&src, rows, cols), want, "{rows}x{cols}");
            let PlainMat::Bf16(b, _) = PlainMat::transposed(Dtype::Bf16, &src, rows, cols) else {
                panic!("bf16 transpose is not bf16");
            };
            let want_bf16: Vec<bf16> = want.iter().map(|&x| bf16::from_f32(x)).collect();
            assert_eq!(b, want_bf16, "bf16 {rows}x{cols}");
            let PlainMat::F16(h, _) = PlainMat::transposed(Dtype::F16, &src, rows, cols) else {
                panic!("f16 transpose is not f16");
            };
            let want_f16: Vec<f16> = want.iter().map(|&x| f16::from_f32(x)).collect();
            assert_eq!(h, want_f16, "f16 {rows}x{cols}");
        }
    }
}
