//! Elementwise and column ops of the layers: the residual add and the bias gradient.

use rayon::prelude::*;

use super::check::len;
use crate::error::Result;
use crate::tensor::Dtype;

/// Elements per parallel task (~64 KiB of f32): below it, threads cost more than the math.
const CHUNK: usize = 16 * 1024;

/// `x + f` elementwise, rounded to `dtype` (the residual connection of a transformer layer).
pub fn residual_add(x: &[f32], f: &[f32], dtype: Dtype) -> Result<Vec<f32>> {
    len("residual branch f", 1, x.len(), f.len())?;
    let mut sum = vec![0.0f32; x.len()];
    let add = |(s, (xc, fc)): (&mut [f32], (&[f32], &[f32]))| {
        s.iter_mut().zip(xc.iter().zip(fc)).for_each(|(s, (a, b))| *s = a + b);
        dtype.round_slice(s);
    };
    // Elementwise: chunks in parallel give the bits of one pass.
    if x.len() <= CHUNK {
        add((&mut sum, (x, f)));
    } else {
        sum.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(f.par_chunks(CHUNK)))
            .for_each(add);
    }
    Ok(sum)
}

/// `sums[c] += sum over rows of x[r, c]`, rows in order (a bias gradient from `dy [rows, cols]`).
/// Bands of columns run in parallel, each summing its columns over all rows in order: every
/// column's additions are the serial ones.
pub fn column_sum_accumulate(x: &[f32], cols: usize, sums: &mut [f32]) -> Result<()> {
    len("column sums", 1, cols, sums.len())?;
    len("column-summed input", x.len() / cols.max(1), cols, x.len())?;
    let cols = cols.max(1);
    let band_sums = |c0: usize, s: &mut [f32]| {
        for row in x.chunks(cols) {
            s.iter_mut().zip(&row[c0..]).for_each(|(s, &v)| *s += v);
        }
    };
    if x.len() < 4 * CHUNK {
        band_sums(0, sums);
    } else {
        sums.par_chunks_mut(COLUMN_BAND)
            .enumerate()
            .for_each(|(i, s)| band_sums(i * COLUMN_BAND, s));
    }
    Ok(())
}

/// Columns per parallel task of [`column_sum_accumulate`]: 64 f32 are one 256-byte run of
/// each row, long enough for whole cache lines and vectors.
const COLUMN_BAND: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// The banded, parallel sums are the serial row-by-row sums, bit for bit.
    #[test]
    fn column_bands_give_the_serial_sums() {
        for (rows, cols) in [(1, 1), (3, 5), (1024, 256), (333, 200), (70, 1030)] {
            let x: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
            let start: Vec<f32> = (0..cols).map(|c| c as f32 * 0.5).collect();
            let mut want = start.clone();
            for row in x.chunks(cols) {
                want.iter_mut().zip(row).for_each(|(s, &v)| *s += v);
            }
            let mut got = start;
            column_sum_accumulate(&x, cols, &mut got).unwrap();
            assert!(
                got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                "{rows}x{cols}"
            );
        }
    }

    /// The chunked residual add is the elementwise definition, rounded to the dtype.
    #[test]
    fn parallel_residual_add_is_elementwise() {
        let n = 3 * CHUNK + 17;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let f: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 1e-3).collect();
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let got = residual_add(&x, &f, dtype).unwrap();
            let mut want: Vec<f32> = x.iter().zip(&f).map(|(a, b)| a + b).collect();
            dtype.round_slice(&mut want);
            assert!(
                got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                "{dtype:?}"
            );
        }
    }
}
