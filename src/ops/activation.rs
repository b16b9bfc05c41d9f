//! Elementwise activations of the MLP: GELU (tanh approximation) and SwiGLU, in f32.

use rayon::prelude::*;

use super::check::len;
use crate::error::Result;

/// sqrt(2 / pi), the tanh-GELU's input scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh-GELU.
const GELU_CUBIC: f32 = 0.044_715;
/// Elements per parallel task (~ 64 KiB of f32): below it, threads cost more than the math.
const CHUNK: usize = 16 * 1024;

/// GELU, tanh approximation (GPT-2, Transformer Engine's "gelu"; not the erf form):
/// `y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_forward(x: &[f32], y: &mut [f32]) -> Result<()> {
    len("gelu output y", x.len(), 1, y.len())?;
    y.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(yc, xc)| {
        for (yv, &v) in yc.iter_mut().zip(xc) {
            let t = (SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)).tanh();
            *yv = 0.5 * v * (1.0 + t);
        }
    });
    Ok(())
}

/// Backward of [`gelu_forward`]: `dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))`
/// with `t` the forward's tanh; recomputed from `x`, nothing else is saved.
pub fn gelu_backward(dy: &[f32], x: &[f32], dx: &mut [f32]) -> Result<()> {
    len("gelu output gradient dy", x.len(), 1, dy.len())?;
    len("gelu input gradient dx", x.len(), 1, dx.len())?;
    dx.par_chunks_mut(CHUNK)
        .zip(dy.par_chunks(CHUNK).zip(x.par_chunks(CHUNK)))
        .for_each(|(dc, (gc, xc))| {
            for (d, (&g, &v)) in dc.iter_mut().zip(gc.iter().zip(xc)) {
                let v2 = v * v;
                let t = (SQRT_2_OVER_PI * (v + GELU_CUBIC * v2 * v)).tanh();
                let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * v2);
                *d = g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * dinner);
            }
        });
    Ok(())
}

#[inline]
fn sigmoid(v: f32) -> f32 {
    // exp(-v) overflows to inf for v < -88: 1 / inf = 0, the right limit.
    1.0 / (1.0 + (-v).exp())
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
                for (j, &d) in gr.iter().enumerate() {
                    let (g, u) = (gate[j], up[j]);
                    let s = sigmoid(g);
                    dgate[j] = d * u * s * (1.0 + g * (1.0 - s));
                    dup[j] = d * g * s;
                }
            }
        });
    Ok(())
}
