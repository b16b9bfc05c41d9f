//! LayerNorm and RMSNorm over the last dimension, forward and backward, in f32.
//!
//! Each of `rows` rows holds `cols` features. With `zero_centered` the weight
//! applied is `1 + gamma` (gamma initialised at zero, so weight decay pulls the
//! weight towards one); its gradient is the same as the plain gamma's.

use rayon::prelude::*;

use super::check::{len, rows_per_task};
use crate::error::Result;

/// `rows` rows of `cols` features each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormShape {
    /// Number of rows (tokens).
    pub rows: usize,
    /// Features per row (the normalised dimension).
    pub cols: usize,
}

#[inline]
fn weight(gamma: f32, zero_centered: bool) -> f32 {
    if zero_centered { 1.0 + gamma } else { gamma }
}

/// Divisor of the row means; an empty row has mean 0 and variance 0 rather than 0/0.
#[inline]
fn inv_n(cols: usize) -> f32 {
    1.0 / cols.max(1) as f32
}

/// Rows whose sums run interleaved in [`row_sums`]: one row's chain of dependent adds waits
/// ~4 cycles per add, 8 independent chains keep the adders busy.
const LANES: usize = 8;

/// `out[r] = init + term(r, 0) + term(r, 1) + ... + term(r, cols - 1)`, added left to right,
/// for every row `r < out.len()`. The chains of [`LANES`] rows advance side by side, each in its
/// own order, so every sum has the bits of summing its row alone.
#[inline(always)]
fn row_sums(cols: usize, init: f32, term: impl Fn(usize, usize) -> f32, out: &mut [f32]) {
    let first = out.len() / LANES * LANES;
    for (g, sums) in out.chunks_exact_mut(LANES).enumerate() {
        let mut acc = [init; LANES];
        for j in 0..cols {
            for (lane, a) in acc.iter_mut().enumerate() {
                *a += term(g * LANES + lane, j);
            }
        }
        sums.copy_from_slice(&acc);
    }
    for (r, sum) in out.iter_mut().enumerate().skip(first) {
        *sum = (0..cols).fold(init, |acc, j| acc + term(r, j));
    }
}

/// LayerNorm: `y = (x - mean) * rstd * w + beta` with `rstd = 1 / sqrt(var + eps)`, the
/// biased variance over the row, `w = gamma` (or `1 + gamma` when `zero_centered`).
///
/// Saves `mean` and `rstd` per row (`rows` each) for the backward.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    shape: NormShape,
    eps: f32,
    zero_centered: bool,
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
) -> Result<()> {
    let NormShape { rows, cols } = shape;
    len("layernorm input x", rows, cols, x.len())?;
    len("layernorm gamma", 1, cols, gamma.len())?;
    len("layernorm beta", 1, cols, beta.len())?;
    len("layernorm output y", rows, cols, y.len())?;
    len("layernorm saved mean", rows, 1, mean.len())?;
    len("layernorm saved rstd", rows, 1, rstd.len())?;
    if rows == 0 || cols == 0 {
        mean.fill(0.0);
        rstd.fill(1.0 / eps.sqrt());
        return Ok(());
    }
    let block = rows_per_task(cols);
    let inv = inv_n(cols);
    y.par_chunks_mut(block * cols)
        .zip(x.par_chunks(block * cols))
        .zip(mean.par_chunks_mut(block).zip(rstd.par_chunks_mut(block)))
        .for_each(|((yb, xb), (mb, rb))| {
            // Two passes (mean, then squared deviations): no cancellation for rows far from zero.
            row_sums(cols, -0.0, |r, j| xb[r * cols + j], mb);
            mb.iter_mut().for_each(|m| *m *= inv);
            let mb = &*mb;
            row_sums(
                cols,
                -0.0,
                |r, j| (xb[r * cols + j] - mb[r]) * (xb[r * cols + j] - mb[r]),
                rb,
            );
            rb.iter_mut().for_each(|r| *r = 1.0 / (*r * inv + eps).sqrt());
            for (((yr, xr), &mu), &rs) in yb.chunks_mut(cols).zip(xb.chunks(cols)).zip(mb).zip(&*rb) {
                for (((yv, &xv), &g), &b) in yr.iter_mut().zip(xr).zip(gamma).zip(beta) {
                    *yv = (xv - mu) * rs * weight(g, zero_centered) + b;
                }
            }
        });
    Ok(())
}

/// LayerNorm backward from the saved `mean` and `rstd`. With `xhat = (x - mean) * rstd`
/// and `g = dy * w`:
/// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` (overwritten),
/// `dgamma += sum_rows dy * xhat`, `dbeta += sum_rows dy` (accumulated).
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    shape: NormShape,
    zero_centered: bool,
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) -> Result<()> {
    let NormShape { rows, cols } = shape;
    len("layernorm output gradient dy", rows, cols, dy.len())?;
    len("layernorm input x", rows, cols, x.len())?;
    len("layernorm gamma", 1, cols, gamma.len())?;
    len("layernorm saved mean", rows, 1, mean.len())?;
    len("layernorm saved rstd", rows, 1, rstd.len())?;
    len("layernorm input gradient dx", rows, cols, dx.len())?;
    len("layernorm dgamma", 1, cols, dgamma.len())?;
    len("layernorm dbeta", 1, cols, dbeta.len())?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let block = rows_per_task(cols);
    let inv = inv_n(cols);
    let w: Vec<f32> = gamma.iter().map(|&g| weight(g, zero_centered)).collect();
    // One (dgamma, dbeta) partial per block of rows, summed in block order below.
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(block * cols)
        .zip(dy.par_chunks(block * cols).zip(x.par_chunks(block * cols)))
        .zip(mean.par_chunks(block).zip(rstd.par_chunks(block)))
        .map(|((dxb, (dyb, xb)), (mb, rb))| {
            let mut part = vec![0.0f32; 2 * cols];
            let (pg, pb) = part.split_at_mut(cols);
            // The two sums of every row first (rows interleaved), then one pass per row.
            let xhat = |r: usize, j: usize| (xb[r * cols + j] - mb[r]) * rb[r];
            let mut sums = vec![0.0f32; 2 * mb.len()];
            let (sum_g, sum_gx) = sums.split_at_mut(mb.len());
            row_sums(cols, 0.0, |r, j| dyb[r * cols + j] * w[j], sum_g);
            row_sums(cols, 0.0, |r, j| dyb[r * cols + j] * w[j] * xhat(r, j), sum_gx);
            for (r, (dxr, dyr)) in dxb.chunks_mut(cols).zip(dyb.chunks(cols)).enumerate() {
                let (mean_g, mean_gx) = (sum_g[r] * inv, sum_gx[r] * inv);
                let (xr, mu, rs) = (&xb[r * cols..][..cols], mb[r], rb[r]);
                for (j, (dxv, (&d, &xv))) in dxr.iter_mut().zip(dyr.iter().zip(xr)).enumerate() {
                    let xhat = (xv - mu) * rs;
                    pg[j] += d * xhat;
                    pb[j] += d;
                    let g = d * w[j];
                    *dxv = rs * (g - mean_g - xhat * mean_gx);
                }
            }
            part
        })
        .collect();
    for part in &partials {
        let (pg, pb) = part.split_at(cols);
        dgamma.iter_mut().zip(pg).for_each(|(a, p)| *a += p);
        dbeta.iter_mut().zip(pb).for_each(|(a, p)| *a += p);
    }
    Ok(())
}

/// RMSNorm: `y = x * rstd * w` with `rstd = 1 / sqrt(mean(x^2) + eps)`, `w = gamma`
/// (or `1 + gamma` when `zero_centered`). Saves `rstd` per row for the backward.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_forward(
    x: &[f32],
    gamma: &[f32],
    shape: NormShape,
    eps: f32,
    zero_centered: bool,
    y: &mut [f32],
    rstd: &mut [f32],
) -> Result<()> {
    let NormShape { rows, cols } = shape;
    len("rmsnorm input x", rows, cols, x.len())?;
    len("rmsnorm gamma", 1, cols, gamma.len())?;
    len("rmsnorm output y", rows, cols, y.len())?;
    len("rmsnorm saved rstd", rows, 1, rstd.len())?;
    if rows == 0 || cols == 0 {
        rstd.fill(1.0 / eps.sqrt());
        return Ok(());
    }
    let block = rows_per_task(cols);
    let inv = inv_n(cols);
    y.par_chunks_mut(block * cols)
        .zip(x.par_chunks(block * cols))
        .zip(rstd.par_chunks_mut(block))
        .for_each(|((yb, xb), rb)| {
            row_sums(cols, -0.0, |r, j| xb[r * cols + j] * xb[r * cols + j], rb);
            rb.iter_mut().for_each(|r| *r = 1.0 / (*r * inv + eps).sqrt());
            for ((yr, xr), &rs) in yb.chunks_mut(cols).zip(xb.chunks(cols)).zip(&*rb) {
                for ((yv, &xv), &g) in yr.iter_mut().zip(xr).zip(gamma) {
                    *yv = xv * rs * weight(g, zero_centered);
                }
            }
        });
    Ok(())
}

/// RMSNorm backward from the saved `rstd`. With `xhat = x * rstd` and `g = dy * w`:
/// `dx = rstd * (g - xhat * mean(g * xhat))` (overwritten), `dgamma += sum_rows dy * xhat`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    rstd: &[f32],
    shape: NormShape,
    zero_centered: bool,
    dx: &mut [f32],
    dgamma: &mut [f32],
) -> Result<()> {
    let NormShape { rows, cols } = shape;
    len("rmsnorm output gradient dy", rows, cols, dy.len())?;
    len("rmsnorm input x", rows, cols, x.len())?;
    len("rmsnorm gamma", 1, cols, gamma.len())?;
    len("rmsnorm saved rstd", rows, 1, rstd.len())?;
    len("rmsnorm input gradient dx", rows, cols, dx.len())?;
    len("rmsnorm dgamma", 1, cols, dgamma.len())?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let block = rows_per_task(cols);
    let inv = inv_n(cols);
    let w: Vec<f32> = gamma.iter().map(|&g| weight(g, zero_centered)).collect();
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(block * cols)
        .zip(dy.par_chunks(block * cols).zip(x.par_chunks(block * cols)))
        .zip(rstd.par_chunks(block))
        .map(|((dxb, (dyb, xb)), rb)| {
            let mut pg = vec![0.0f32; cols];
            let mut sum_gx = vec![0.0f32; rb.len()];
            row_sums(
                cols,
                0.0,
                |r, j| dyb[r * cols + j] * w[j] * (xb[r * cols + j] * rb[r]),
                &mut sum_gx,
            );
            for (((dxr, dyr), xr), (&rs, &sum_gx)) in dxb
                .chunks_mut(cols)
                .zip(dyb.chunks(cols))
                .zip(xb.chunks(cols))
                .zip(rb.iter().zip(&sum_gx))
            {
                let mean_gx = sum_gx * inv;
                for (j, (dxv, (&d, &xv))) in dxr.iter_mut().zip(dyr.iter().zip(xr)).enumerate() {
                    let xhat = xv * rs;
                    pg[j] += d * xhat;
                    let g = d * w[j];
                    *dxv = rs * (g - xv * rs * mean_gx);
                }
            }
            pg
        })
        .collect();
    for pg in &partials {
        dgamma.iter_mut().zip(pg).for_each(|(a, p)| *a += p);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit patterns of `v` (NaN payloads included).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Values over many binades with zeros of both signs, an all -0 row, and a row with inf/NaN.
    fn input(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut x: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let h = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                let u = h as f32 / (1u64 << 24) as f32 - 0.5;
                u * 2f32.powi((i % 13) as i32 - 6) + if i % 7 == 0 { 3.0 } else { 0.0 }
            })
            .collect();
        if rows > 2 && cols > 1 {
            x[cols..2 * cols].fill(-0.0);
            x[2 * cols] = f32::INFINITY;
            x[2 * cols + 1] = f32::NAN;
        }
        x
    }

    /// One row at a time, each sum a plain left-to-right chain: the definition the interleaved
    /// sums must reproduce bit for bit.
    fn layernorm_rowwise(x: &[f32], g: &[f32], b: &[f32], cols: usize, zc: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (mut y, mut means, mut rstds) = (vec![0.0; x.len()], vec![], vec![]);
        for (yr, xr) in y.chunks_mut(cols).zip(x.chunks(cols)) {
            let inv = inv_n(cols);
            let mu = xr.iter().sum::<f32>() * inv;
            let var = xr.iter().map(|&v| (v - mu) * (v - mu)).sum::<f32>() * inv;
            let rs = 1.0 / (var + 1e-5).sqrt();
            for (((yv, &xv), &gv), &bv) in yr.iter_mut().zip(xr).zip(g).zip(b) {
                *yv = (xv - mu) * rs * weight(gv, zc) + bv;
            }
            means.push(mu);
            rstds.push(rs);
        }
        (y, means, rstds)
    }

    fn layernorm_backward_rowwise(
        dy: &[f32],
        x: &[f32],
        g: &[f32],
        saved: (&[f32], &[f32]),
        cols: usize,
        zc: bool,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; cols], vec![0.0; cols]);
        let inv = inv_n(cols);
        for (r, (dxr, (dyr, xr))) in dx.chunks_mut(cols).zip(dy.chunks(cols).zip(x.chunks(cols))).enumerate() {
            let (mu, rs) = (saved.0[r], saved.1[r]);
            let (mut sum_g, mut sum_gx) = (0.0f32, 0.0f32);
            for (j, (&d, &xv)) in dyr.iter().zip(xr).enumerate() {
                let xhat = (xv - mu) * rs;
                let gv = d * weight(g[j], zc);
                sum_g += gv;
                sum_gx += gv * xhat;
                dg[j] += d * xhat;
                db[j] += d;
            }
            for (j, (dxv, (&d, &xv))) in dxr.iter_mut().zip(dyr.iter().zip(xr)).enumerate() {
                let xhat = (xv - mu) * rs;
                *dxv = rs * (d * weight(g[j], zc) - sum_g * inv - xhat * (sum_gx * inv));
            }
        }
        (dx, dg, db)
    }

    fn rmsnorm_rowwise(x: &[f32], g: &[f32], cols: usize, zc: bool) -> (Vec<f32>, Vec<f32>) {
        let (mut y, mut rstds) = (vec![0.0; x.len()], vec![]);
        for (yr, xr) in y.chunks_mut(cols).zip(x.chunks(cols)) {
            let rs = 1.0 / (xr.iter().map(|&v| v * v).sum::<f32>() * inv_n(cols) + 1e-5).sqrt();
            for ((yv, &xv), &gv) in yr.iter_mut().zip(xr).zip(g) {
                *yv = xv * rs * weight(gv, zc);
            }
            rstds.push(rs);
        }
        (y, rstds)
    }

    fn rmsnorm_backward_rowwise(
        dy: &[f32],
        x: &[f32],
        g: &[f32],
        rstds: &[f32],
        cols: usize,
        zc: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let (mut dx, mut dg) = (vec![0.0; x.len()], vec![0.0; cols]);
        for (r, (dxr, (dyr, xr))) in dx.chunks_mut(cols).zip(dy.chunks(cols).zip(x.chunks(cols))).enumerate() {
            let rs = rstds[r];
            let mut sum_gx = 0.0f32;
            for (j, (&d, &xv)) in dyr.iter().zip(xr).enumerate() {
                sum_gx += d * weight(g[j], zc) * (xv * rs);
                dg[j] += d * (xv * rs);
            }
            for (j, (dxv, (&d, &xv))) in dxr.iter_mut().zip(dyr.iter().zip(xr)).enumerate() {
                *dxv = rs * (d * weight(g[j], zc) - xv * rs * (sum_gx * inv_n(cols)));
            }
        }
        (dx, dg)
    }

    /// Row counts around the interleaved groups (8) up to one parallel block (`rows_per_task`),
    /// widths from 1 to past a vector: every output, saved value and gradient has the bits of
    /// the row-at-a-time definition (one block, so the parameter gradients too).
    #[test]
    fn interleaved_row_sums_keep_the_bits_of_one_row_at_a_time() {
        for cols in [1, 3, 17, 64, 256] {
            let rows_list: Vec<usize> = (1..=20).chain([rows_per_task(cols).min(300) - 1]).collect();
            for rows in rows_list {
                let shape = NormShape { rows, cols };
                let x = input(rows, cols, 1);
                let dy = input(rows, cols, 2);
                let g = input(1, cols, 3);
                let b = input(1, cols, 4);
                for zc in [false, true] {
                    let ctx = format!("{rows}x{cols} zero_centered {zc}");
                    let (want_y, want_m, want_r) = layernorm_rowwise(&x, &g, &b, cols, zc);
                    let (mut y, mut m, mut r) = (vec![0.0; x.len()], vec![0.0; rows], vec![0.0; rows]);
                    layernorm_forward(&x, &g, &b, shape, 1e-5, zc, &mut y, &mut m, &mut r).unwrap();
                    assert_eq!(bits(&y), bits(&want_y), "layernorm y {ctx}");
                    assert_eq!(bits(&m), bits(&want_m), "layernorm mean {ctx}");
                    assert_eq!(bits(&r), bits(&want_r), "layernorm rstd {ctx}");
                    let (want_dx, want_dg, want_db) = layernorm_backward_rowwise(&dy, &x, &g, (&m, &r), cols, zc);
                    let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; cols], vec![0.0; cols]);
                    layernorm_backward(&dy, &x, &g, &m, &r, shape, zc, &mut dx, &mut dg, &mut db).unwrap();
                    assert_eq!(bits(&dx), bits(&want_dx), "layernorm dx {ctx}");
                    assert_eq!(bits(&dg), bits(&want_dg), "layernorm dgamma {ctx}");
                    assert_eq!(bits(&db), bits(&want_db), "layernorm dbeta {ctx}");

                    let (want_y, want_r) = rmsnorm_rowwise(&x, &g, cols, zc);
                    rmsnorm_forward(&x, &g, shape, 1e-5, zc, &mut y, &mut r).unwrap();
                    assert_eq!(bits(&y), bits(&want_y), "rmsnorm y {ctx}");
                    assert_eq!(bits(&r), bits(&want_r), "rmsnorm rstd {ctx}");
                    let (want_dx, want_dg) = rmsnorm_backward_rowwise(&dy, &x, &g, &r, cols, zc);
                    let mut dg = vec![0.0; cols];
                    rmsnorm_backward(&dy, &x, &g, &r, shape, zc, &mut dx, &mut dg).unwrap();
                    assert_eq!(bits(&dx), bits(&want_dx), "rmsnorm dx {ctx}");
                    assert_eq!(bits(&dg), bits(&want_dg), "rmsnorm dgamma {ctx}");
                }
            }
        }
    }
}
