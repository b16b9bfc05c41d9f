//! Elementwise and column ops of the layers: the residual add and the bias gradient.

use super::check::len;
use crate::error::Result;
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

/// `sums[c] += sum over rows of x[r, c]`, rows in order (a bias gradient from `dy [rows, cols]`).
pub fn column_sum_accumulate(x: &[f32], cols: usize, sums: &mut [f32]) -> Result<()> {
    len("column sums", 1, cols, sums.len())?;
    len("column-summed input", x.len() / cols.max(1), cols, x.len())?;
    for row in x.chunks(cols.max(1)) {
        sums.iter_mut().zip(row).for_each(|(s, &v)| *s += v);
    }
    Ok(())
}
