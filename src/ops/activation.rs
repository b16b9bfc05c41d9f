//! Elementwise activations of the MLP: GELU (tanh approximation) and SwiGLU, in f32, through
//! the vectorizable [`fast_exp`](super::fast_exp) (`docs/numerics.md`, Activations).

use rayon::prelude::*;

use super::check::len;
use super::fast_exp::{exp, sigmoid};
use crate::error::Result;

/// sqrt(2 / pi), the tanh-GELU's input scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh-GELU.
const GELU_CUBIC: f32 = 0.044_715;
/// Elements per parallel task (~ 64 KiB of f32): below it, threads cost more than the math.
const CHUNK: usize = 16 * 1024;

/// The tanh-GELU's `tanh` argument, `sqrt(2/pi) (x + 0.044715 x^3)`.
#[inline(always)]
fn gelu_inner(v: f32) -> f32 {
    SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)
}

/// GELU, tanh approximation (GPT-2, Transformer Engine's "gelu"; not the erf form):
/// `y = 0.5 x (1 + tanh(u))`, `u = sqrt(2/pi) (x + 0.044715 x^3)`, computed as the equal
/// `y = x sigmoid(2u)`: one exponential, and no `1 + tanh` cancellation for negative `x`.
pub fn gelu_forward(x: &[f32], y: &mut [f32]) -> Result<()> {
    len("gelu output y", x.len(), 1, y.len())?;
    y.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(yc, xc)| {
        for (yv, &v) in yc.iter_mut().zip(xc) {
            *yv = v * sigmoid(2.0 * gelu_inner(v));
        }
    });
    Ok(())
}

/// Backward of [`gelu_forward`]: with `s = sigmoid(2u)` (so `0.5 (1 + tanh u) = s` and
/// `0.5 (1 - tanh^2 u) = 2 s (1 - s)`), `dx = dy (s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2))`;
/// recomputed from `x`, nothing else is saved.
pub fn gelu_backward(dy: &[f32], x: &[f32], dx: &mut [f32]) -> Result<()> {
    len("gelu output gradient dy", x.len(), 1, dy.len())?;
    len("gelu input gradient dx", x.len(), 1, dx.len())?;
    dx.par_chunks_mut(CHUNK)
        .zip(dy.par_chunks(CHUNK).zip(x.par_chunks(CHUNK)))
        .for_each(|(dc, (gc, xc))| {
            for (d, (&g, &v)) in dc.iter_mut().zip(gc.iter().zip(xc)) {
                let e = exp(-2.0 * gelu_inner(v));
                let s = 1.0 / (1.0 + e);
                // 1 - s as e s where s is near 1 (the subtraction would cancel); for e > 1
                // (s < 1/2) the subtraction is accurate and avoids inf * 0 when e = inf.
                let one_minus_s = if e > 1.0 { 1.0 - s } else { e * s };
                let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * v * v);
                *d = g * (s + 2.0 * v * s * one_minus_s * dinner);
            }
        });
    Ok(())
}

/// Rows per parallel task for a row width of `cols` (~16 K outputs per task).
fn swiglu_rows_per_task(cols: usize) -> usize {
    (CHUNK / cols.max(1)).max(1)
}

/// SwiGLU: `x` is `[rows, 2 * cols]`, the first `cols` of each row the gate, the last `cols` the
/// up projection; `y [rows, cols] = silu(gate) * up` with `silu(g) = g * sigmoid(g)`.
pub fn swiglu_forward(x: &[f32], rows: usize, cols: usize, y: &mut [f32]) -> Result<()> {
    let width = super::check::elements("swiglu input x", cols, 2)?;
    len("swiglu input x", rows, width, x.len())?;
    len("swiglu output y", rows, cols, y.len())?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let block = swiglu_rows_per_task(cols);
    y.par_chunks_mut(block * cols)
        .zip(x.par_chunks(block * width))
        .for_each(|(yb, xb)| {
            for (yr, xr) in yb.chunks_mut(cols).zip(xb.chunks(width)) {
                let (gate, up) = xr.split_at(cols);
                for ((yv, &g), &u) in yr.iter_mut().zip(gate).zip(up) {
                    *yv = g * sigmoid(g) * u;
                }
            }
        });
    Ok(())
}

/// Backward of [`swiglu_forward`]: `dx [rows, 2 * cols]` (overwritten) holds
/// `dgate = dy * up * s (1 + g (1 - s))` with `s = sigmoid(g)`, then `dup = dy * silu(g)`.
pub fn swiglu_backward(dy: &[f32], x: &[f32], rows: usize, cols: usize, dx: &mut [f32]) -> Result<()> {
    let width = super::check::elements("swiglu input x", cols, 2)?;
    len("swiglu output gradient dy", rows, cols, dy.len())?;
    len("swiglu input x", rows, width, x.len())?;
    len("swiglu input gradient dx", rows, width, dx.len())?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let block = swiglu_rows_per_task(cols);
    dx.par_chunks_mut(block * width)
        .zip(dy.par_chunks(block * cols).zip(x.par_chunks(block * width)))
        .for_each(|(db, (gb, xb))| {
            for (dr, (gr, xr)) in db.chunks_mut(width).zip(gb.chunks(cols).zip(xb.chunks(width))) {
                let (gate, up) = xr.split_at(cols);
                let (dgate, dup) = dr.split_at_mut(cols);
                let outs = dgate.iter_mut().zip(dup.iter_mut());
                for ((dg, du), ((&d, &g), &u)) in outs.zip(gr.iter().zip(gate).zip(up)) {
                    let s = sigmoid(g);
                    *dg = d * u * s * (1.0 + g * (1.0 - s));
                    *du = d * g * s;
                }
            }
        });
    Ok(())
}
