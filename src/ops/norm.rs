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

/// Per-row sums, added left to right: `sums.0[r] = init + t(r, 0)[0] + ... + t(r, cols - 1)[0]`
/// and `sums.1[r]` the same over `t(r, j)[1]`, for every row `r < sums.0.len()`, where
/// `t(r, j) = term(a[r][j], b[r][j], col[j], m[r], s[r])` for the `[rows, cols]` matrices `a`,
/// `b`, the per-column values `col` and the per-row values `m`, `s` (read as 0 past their end).
/// The chains of [`LANES`] rows advance side by side, each in its own order, so every sum has
/// the bits of summing its row alone.
#[inline(always)]
fn row_sums(
    cols: usize,
    init: f32,
    (a, b, col): (&[f32], &[f32], &[f32]),
    (m, s): (&[f32], &[f32]),
    term: impl Fn(f32, f32, f32, f32, f32) -> [f32; 2],
    sums: (&mut [f32], &mut [f32]),
) {
    let col = &col[..cols];
    let rows = sums.0.len();
    let per_row = |v: &[f32], r: usize| v.get(r).copied().unwrap_or(0.0);
    let groups = sums.0.chunks_exact_mut(LANES).zip(sums.1.chunks_exact_mut(LANES));
    for (g, (out0, out1)) in groups.enumerate() {
        let r0 = g * LANES;
        let ra: [&[f32]; LANES] = std::array::from_fn(|l| &a[(r0 + l) * cols..][..cols]);
        let rb: [&[f32]; LANES] = std::array::from_fn(|l| &b[(r0 + l) * cols..][..cols]);
        let rm: [f32; LANES] = std::array::from_fn(|l| per_row(m, r0 + l));
        let rs: [f32; LANES] = std::array::from_fn(|l| per_row(s, r0 + l));
        let (mut acc0, mut acc1) = ([init; LANES], [init; LANES]);
        for (j, &c) in col.iter().enumerate() {
            for lane in 0..LANES {
                let [t0, t1] = term(ra[lane][j], rb[lane][j], c, rm[lane], rs[lane]);
                acc0[lane] += t0;
                acc1[lane] += t1;
            }
        }
        out0.copy_from_slice(&acc0);
        out1.copy_from_slice(&acc1);
    }
    for r in rows / LANES * LANES..rows {
        let (ra, rb) = (&a[r * cols..][..cols], &b[r * cols..][..cols]);
        let (rm, rs) = (per_row(m, r), per_row(s, r));
        let (mut acc0, mut acc1) = (init, init);
        for j in 0..cols {
            let [t0, t1] = term(ra[j], rb[j], col[j], rm, rs);
            acc0 += t0;
            acc1 += t1;
        }
        (sums.0[r], sums.1[r]) = (acc0, acc1);
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
            let mut unused = vec![0.0f32; mb.len()];
            row_sums(
                cols,
                -0.0,
                (xb, xb, gamma),
                (&[], &[]),
                |x, _, _, _, _| [x, 0.0],
                (mb, &mut unused),
            );
            mb.iter_mut().for_each(|m| *m *= inv);
            let mb = &*mb;
            let squares = |x: f32, _, _, mu: f32, _| [(x - mu) * (x - mu), 0.0];
            row_sums(cols, -0.0, (xb, xb, gamma), (mb, &[]), squares, (rb, &mut unused));
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
            let mut sums = vec![0.0f32; 2 * mb.len()];
            let (sum_g, sum_gx) = sums.split_at_mut(mb.len());
            let terms = |d: f32, x: f32, w: f32, mu: f32, rs: f32| [d * w, d * w * ((x - mu) * rs)];
            row_sums(cols, 0.0, (dyb, xb, &w), (mb, rb), terms, (sum_g, sum_gx));

            let rows = dxb.chunks_mut(cols).zip(dyb.chunks(cols)).zip(xb.chunks(cols));
            for (r, ((dxr, dyr), xr)) in rows.enumerate() {
                let (mean_g, mean_gx) = (sum_g[r] * inv, sum_gx[r] * inv);
                let (mu, rs) = (mb[r], rb[r]);
                let columns = dyr.iter().zip(xr).zip(&w).zip(pg.iter_mut().zip(pb.iter_mut()));
                for (dxv, (((&d, &xv), &w), (pg, pb))) in dxr.iter_mut().zip(columns) {
                    let xhat = (xv - mu) * rs;
                    *pg += d * xhat;
                    *pb += d;
                    let g = d * w;
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
            let mut unused = vec![0.0f32; rb.len()];
            row_sums(
                cols,
                -0.0,
                (xb, xb, gamma),
                (&[], &[]),
                |x, _, _, _, _| [x * x, 0.0],
                (rb, &mut unused),
            );
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
            let mut unused = vec![0.0f32; rb.len()];
            let terms = |d: f32, x: f32, w: f32, _, rs: f32| [d * w * (x * rs), 0.0];
            row_sums(cols, 0.0, (dyb, xb, &w), (&[], rb), terms, (&mut sum_gx, &mut unused));
            for (((dxr, dyr), xr), (&rs, &sum_gx)) in dxb
                .chunks_mut(cols)
                .zip(dyb.chunks(cols))
                .zip(xb.chunks(cols))
                .zip(rb.iter().zip(&sum_gx))
            {
                let mean_gx = sum_gx * inv;
                let columns = dyr.iter().zip(xr).zip(&w).zip(pg.iter_mut());
                for (dxv, (((&d, &xv), &w), pg)) in dxr.iter_mut().zip(columns) {
                    let xhat = xv * rs;
                    *pg += d * xhat;
                    let g = d * w;
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
