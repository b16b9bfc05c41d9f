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
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(yc, xc)| widest::gelu_forward(yc, xc));
    Ok(())
}

/// [`gelu_forward`] on one chunk, for the compiler to vectorize at the caller's width.
#[inline(always)]
fn gelu_forward_chunk(yc: &mut [f32], xc: &[f32]) {
    for (yv, &v) in yc.iter_mut().zip(xc) {
        *yv = v * sigmoid(2.0 * gelu_inner(v));
    }
}

/// Backward of [`gelu_forward`]: with `s = sigmoid(2u)` (so `0.5 (1 + tanh u) = s` and
/// `0.5 (1 - tanh^2 u) = 2 s (1 - s)`), `dx = dy (s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2))`;
/// recomputed from `x`, nothing else is saved.
pub fn gelu_backward(dy: &[f32], x: &[f32], dx: &mut [f32]) -> Result<()> {
    len("gelu output gradient dy", x.len(), 1, dy.len())?;
    len("gelu input gradient dx", x.len(), 1, dx.len())?;
    dx.par_chunks_mut(CHUNK)
        .zip(dy.par_chunks(CHUNK).zip(x.par_chunks(CHUNK)))
        .for_each(|(dc, (gc, xc))| widest::gelu_backward(dc, gc, xc));
    Ok(())
}

/// [`gelu_backward`] on one chunk, for the compiler to vectorize at the caller's width.
#[inline(always)]
fn gelu_backward_chunk(dc: &mut [f32], gc: &[f32], xc: &[f32]) {
    for (d, (&g, &v)) in dc.iter_mut().zip(gc.iter().zip(xc)) {
        let e = exp(-2.0 * gelu_inner(v));
        let s = 1.0 / (1.0 + e);
        // 1 - s as e s where s is near 1 (the subtraction would cancel); for e > 1
        // (s < 1/2) the subtraction is accurate and avoids inf * 0 when e = inf.
        let one_minus_s = if e > 1.0 { 1.0 - s } else { e * s };
        let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * v * v);
        *d = g * (s + 2.0 * v * s * one_minus_s * dinner);
    }
}

/// The GELU chunks compiled for the widest vectors the CPU has: the default x86-64 target
/// vectorizes them 4 lanes wide (SSE2); AVX2 gives 8 lanes, AVX-512F 16. The chunks use only
/// IEEE multiplies, adds, divides, compares and integer bit moves, which Rust never fuses or
/// approximates, so every width gives the bits of the scalar definition (tested below).
mod widest {
    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::super::{gelu_backward_chunk, gelu_forward_chunk};

        #[target_feature(enable = "avx512f")]
        pub(super) fn gelu_forward_avx512(yc: &mut [f32], xc: &[f32]) {
            gelu_forward_chunk(yc, xc)
        }

        #[target_feature(enable = "avx2")]
        pub(super) fn gelu_forward_avx2(yc: &mut [f32], xc: &[f32]) {
            gelu_forward_chunk(yc, xc)
        }

        #[target_feature(enable = "avx512f")]
        pub(super) fn gelu_backward_avx512(dc: &mut [f32], gc: &[f32], xc: &[f32]) {
            gelu_backward_chunk(dc, gc, xc)
        }

        #[target_feature(enable = "avx2")]
        pub(super) fn gelu_backward_avx2(dc: &mut [f32], gc: &[f32], xc: &[f32]) {
            gelu_backward_chunk(dc, gc, xc)
        }
    }

    pub(super) fn gelu_forward(yc: &mut [f32], xc: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above), all the function requires.
                return unsafe { x86::gelu_forward_avx512(yc, xc) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above), all the function requires.
                return unsafe { x86::gelu_forward_avx2(yc, xc) };
            }
        }
        super::gelu_forward_chunk(yc, xc)
    }

    pub(super) fn gelu_backward(dc: &mut [f32], gc: &[f32], xc: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above), all the function requires.
                return unsafe { x86::gelu_backward_avx512(dc, gc, xc) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above), all the function requires.
                return unsafe { x86::gelu_backward_avx2(dc, gc, xc) };
            }
        }
        super::gelu_backward_chunk(dc, gc, xc)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar definition, one element at a time through a function the compiler cannot
    /// vectorize across elements.
    #[inline(never)]
    fn one_forward(v: f32) -> f32 {
        let mut y = [0.0f32];
        gelu_forward_chunk(&mut y, &[v]);
        y[0]
    }

    #[inline(never)]
    fn one_backward(g: f32, v: f32) -> f32 {
        let mut d = [0.0f32];
        gelu_backward_chunk(&mut d, &[g], &[v]);
        d[0]
    }

    /// The wide chunks give the scalar bits: every 4099th f32 bit pattern (both signs, NaN,
    /// inf, subnormals), odd lengths for the vector tails.
    #[test]
    fn wide_gelu_gives_the_scalar_bits() {
        let x: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|i| f32::from_bits(i.wrapping_mul(4099)))
            .collect();
        let g: Vec<f32> = x.iter().map(|v| 1.0 + v.to_bits() as f32 * 1e-9).collect();
        for n in [x.len(), 1, 15, 17, 1001] {
            let (x, g) = (&x[x.len() - n..], &g[g.len() - n..]);
            let (mut y, mut d) = (vec![0.0f32; n], vec![0.0f32; n]);
            widest::gelu_forward(&mut y, x);
            widest::gelu_backward(&mut d, g, x);
            for i in 0..n {
                assert_eq!(y[i].to_bits(), one_forward(x[i]).to_bits(), "forward at {}", x[i]);
                assert_eq!(
                    d[i].to_bits(),
                    one_backward(g[i], x[i]).to_bits(),
                    "backward at {}",
                    x[i]
                );
            }
        }
    }
}
