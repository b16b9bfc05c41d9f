//! Elementwise and column ops of the layers: the residual add and the bias gradient.

use super::check::len;
use crate::error::{Error, Result};
use crate::tensor::Dtype;
use crate::tensor::scratch;

/// `x + f` elementwise, rounded to `dtype` (the residual connection of a transformer layer).
pub fn residual_add(x: &[f32], f: &[f32], dtype: Dtype) -> Result<Vec<f32>> {
    len("residual branch f", 1, x.len(), f.len())?;
    let mut sum = scratch::empty_with_room(x.len());
    sum.extend(x.iter().zip(f).map(|(a, b)| a + b));
    dtype.round_slice(&mut sum);
    Ok(sum)
}

/// [`residual_add`] into `out` (every value overwritten).
pub fn residual_add_into(x: &[f32], f: &[f32], dtype: Dtype, out: &mut [f32]) -> Result<()> {
    len("residual branch f", 1, x.len(), f.len())?;
    len("residual sum", 1, x.len(), out.len())?;
    out.iter_mut().zip(x.iter().zip(f)).for_each(|(o, (a, b))| *o = a + b);
    dtype.round_slice(out);
    Ok(())
}

/// A range of `width` columns copied between two row-major matrices of `rows` rows: columns
/// `a_first..a_first + width` of `a` `[rows, a_cols]` into columns `out_first..` of `out`
/// `[rows, out_cols]` (the attention's split of its fused QKV output, and the join of the
/// gradients). The other columns of `out` keep their values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnCopy {
    pub rows: usize,
    pub width: usize,
    pub a_cols: usize,
    pub a_first: usize,
    pub out_cols: usize,
    pub out_first: usize,
}

impl ColumnCopy {
    /// Checks both ranges against their matrices and the lengths against the shapes.
    pub fn check(&self, a_len: usize, out_len: usize) -> Result<()> {
        let inside = |first: usize, cols: usize| first.checked_add(self.width).is_some_and(|end| end <= cols);
        if !inside(self.a_first, self.a_cols) || !inside(self.out_first, self.out_cols) {
            return Err(Error::InvalidShape {
                what: "column copy",
                reason: format!(
                    "{} columns from {} of {} into {} of {}: a range runs past its matrix",
                    self.width, self.a_first, self.a_cols, self.out_first, self.out_cols
                ),
            });
        }
        len("column copy source", self.rows, self.a_cols, a_len)?;
        len("column copy destination", self.rows, self.out_cols, out_len)
    }
}

/// `values *= factor`, each product rounded to f32 once (a LoRA update's `alpha / r`).
pub fn multiply(values: &mut [f32], factor: f32) -> Result<()> {
    values.iter_mut().for_each(|v| *v *= factor);
    Ok(())
}

/// [`ColumnCopy`] on the host.
pub fn copy_columns(a: &[f32], out: &mut [f32], copy: ColumnCopy) -> Result<()> {
    copy.check(a.len(), out.len())?;
    if copy.width == 0 {
        return Ok(());
    }
    for (src, dst) in a.chunks(copy.a_cols).zip(out.chunks_mut(copy.out_cols)) {
        dst[copy.out_first..copy.out_first + copy.width].copy_from_slice(&src[copy.a_first..copy.a_first + copy.width]);
    }
    Ok(())
}

/// `sums[c] += sum over rows of x[r, c]`, rows in order (a bias gradient from `dy [rows, cols]`).
pub fn column_sum_accumulate(x: &[f32], cols: usize, sums: &mut [f32]) -> Result<()> {
    len("column sums", 1, cols, sums.len())?;
    len("column-summed input", x.len() / cols.max(1), cols, x.len())?;
    for row in x.chunks(cols.max(1)) {
        sums.iter_mut().zip(row).for_each(|(s, &v)| *s += v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_copy_moves_its_range_and_keeps_the_other_columns() {
        // a: 2 x 5 = [0..5; 10..15]; columns 1..4 into columns 0..3 of a 2 x 4 matrix of -1.
        let a: Vec<f32> = [0.0, 1.0, 2.0, 3.0, 4.0, 10.0, 11.0, 12.0, 13.0, 14.0].to_vec();
        let mut out = vec![-1.0; 8];
        let copy = ColumnCopy {
            rows: 2,
            width: 3,
            a_cols: 5,
            a_first: 1,
            out_cols: 4,
            out_first: 0,
        };
        copy_columns(&a, &mut out, copy).unwrap();
        assert_eq!(out, vec![1.0, 2.0, 3.0, -1.0, 11.0, 12.0, 13.0, -1.0]);
        // A range past either matrix, or a wrong length, is an error that writes nothing.
        let before = out.clone();
        for bad in [
            ColumnCopy { a_first: 3, ..copy },
            ColumnCopy { out_first: 2, ..copy },
            ColumnCopy { rows: 3, ..copy },
            ColumnCopy {
                a_first: usize::MAX,
                ..copy
            },
        ] {
            assert!(copy_columns(&a, &mut out, bad).is_err(), "{bad:?}");
        }
        assert_eq!(out, before);
    }
}
