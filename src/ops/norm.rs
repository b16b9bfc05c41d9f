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
            for (((yr, xr), m), r) in yb.chunks_mut(cols).zip(xb.chunks(cols)).zip(mb).zip(rb) {
                // Two passes (mean, then squared deviations): no cancellation for rows far from zero.
                let mu = xr.iter().sum::<f32>() * inv;
                let var = xr.iter().map(|&v| (v - mu) * (v - mu)).sum::<f32>() * inv;
                let rs = 1.0 / (var + eps).sqrt();
                for (((yv, &xv), &g), &b) in yr.iter_mut().zip(xr).zip(gamma).zip(beta) {
                    *yv = (xv - mu) * rs * weight(g, zero_centered) + b;
                }
                *m = mu;
                *r = rs;
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
    // One (dgamma, dbeta) partial per block of rows, summed in block order below.
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(block * cols)
        .zip(dy.par_chunks(block * cols).zip(x.par_chunks(block * cols)))
        .zip(mean.par_chunks(block).zip(rstd.par_chunks(block)))
        .map(|((dxb, (dyb, xb)), (mb, rb))| {
            let mut part = vec![0.0f32; 2 * cols];
            let (pg, pb) = part.split_at_mut(cols);
            for ((((dxr, dyr), xr), &mu), &rs) in dxb
                .chunks_mut(cols)
                .zip(dyb.chunks(cols))
                .zip(xb.chunks(cols))
                .zip(mb)
                .zip(rb)
            {
                let mut sum_g = 0.0f32;
                let mut sum_gx = 0.0f32;
                for (j, (&d, &xv)) in dyr.iter().zip(xr).enumerate() {
                    let xhat = (xv - mu) * rs;
                    let g = d * weight(gamma[j], zero_centered);
                    sum_g += g;
                    sum_gx += g * xhat;
                    pg[j] += d * xhat;
                    pb[j] += d;
                }
                let (mean_g, mean_gx) = (sum_g * inv, sum_gx * inv);
                for (j, (dxv, (&d, &xv))) in dxr.iter_mut().zip(dyr.iter().zip(xr)).enumerate() {
                    let xhat = (xv - mu) * rs;
                    let g = d * weight(gamma[j], zero_centered);
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
            for ((yr, xr), r) in yb.chunks_mut(cols).zip(xb.chunks(cols)).zip(rb) {
                let ms = xr.iter().map(|&v| v * v).sum::<f32>() * inv;
                let rs = 1.0 / (ms + eps).sqrt();
                for ((yv, &xv), &g) in yr.iter_mut().zip(xr).zip(gamma) {
                    *yv = xv * rs * weight(g, zero_centered);
                }
                *r = rs;
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
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(block * cols)
        .zip(dy.par_chunks(block * cols).zip(x.par_chunks(block * cols)))
        .zip(rstd.par_chunks(block))
        .map(|((dxb, (dyb, xb)), rb)| {
            let mut pg = vec![0.0f32; cols];
            for (((dxr, dyr), xr), &rs) in dxb.chunks_mut(cols).zip(dyb.chunks(cols)).zip(xb.chunks(cols)).zip(rb) {
                let mut sum_gx = 0.0f32;
                for (j, (&d, &xv)) in dyr.iter().zip(xr).enumerate() {
                    let xhat = xv * rs;
                    sum_gx += d * weight(gamma[j], zero_centered) * xhat;
                    pg[j] += d * xhat;
                }
                let mean_gx = sum_gx * inv;
                for (j, (dxv, (&d, &xv))) in dxr.iter_mut().zip(dyr.iter().zip(xr)).enumerate() {
                    let g = d * weight(gamma[j], zero_centered);
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
