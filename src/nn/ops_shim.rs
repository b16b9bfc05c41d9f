//! TEMPORARY stand-in for `crate::ops` (written by another helper, not merged yet), with the
//! same signatures, so the layers compile and test now. Delete when `src/ops/` lands and point
//! `nn::ops` at `crate::ops`.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use crate::error::{Error, Result};

fn check(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what,
            src: expected,
            dst: got,
        })
    }
}

/// Storage dtype of activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// f32.
    F32,
    /// bf16.
    Bf16,
    /// fp16.
    F16,
}

impl Dtype {
    /// `x` rounded to this dtype (nearest even), as f32.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
            Dtype::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// Rounds every element in place.
    pub fn round_slice(self, xs: &mut [f32]) {
        if self != Dtype::F32 {
            xs.iter_mut().for_each(|x| *x = self.round(*x));
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

pub mod norm {
    //! LayerNorm and RMSNorm over rows, f32.
    use super::check;
    use crate::error::Result;

    /// `rows` vectors of `cols` features.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct NormShape {
        /// Rows.
        pub rows: usize,
        /// Features per row.
        pub cols: usize,
    }

    fn g(gamma: f32, zero_centered: bool) -> f32 {
        if zero_centered { gamma + 1.0 } else { gamma }
    }

    /// LayerNorm forward.
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
        check("layernorm x", x.len(), rows * cols)?;
        check("layernorm y", y.len(), rows * cols)?;
        check("layernorm gamma", gamma.len(), cols)?;
        check("layernorm beta", beta.len(), cols)?;
        check("layernorm mean", mean.len(), rows)?;
        check("layernorm rstd", rstd.len(), rows)?;
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            let m = xr.iter().sum::<f32>() / cols as f32;
            let var = xr.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / cols as f32;
            let rs = 1.0 / (var + eps).sqrt();
            mean[r] = m;
            rstd[r] = rs;
            for c in 0..cols {
                y[r * cols + c] = (xr[c] - m) * rs * g(gamma[c], zero_centered) + beta[c];
            }
        }
        Ok(())
    }

    /// LayerNorm backward; dgamma and dbeta accumulate.
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
        check("layernorm dy", dy.len(), rows * cols)?;
        check("layernorm dx", dx.len(), rows * cols)?;
        for r in 0..rows {
            let (m, rs) = (mean[r], rstd[r]);
            let mut sum_dxhat = 0.0f32;
            let mut sum_dxhat_xhat = 0.0f32;
            for c in 0..cols {
                let i = r * cols + c;
                let xhat = (x[i] - m) * rs;
                let dxhat = dy[i] * g(gamma[c], zero_centered);
                sum_dxhat += dxhat;
                sum_dxhat_xhat += dxhat * xhat;
                dgamma[c] += dy[i] * xhat;
                dbeta[c] += dy[i];
            }
            let n = cols as f32;
            for c in 0..cols {
                let i = r * cols + c;
                let xhat = (x[i] - m) * rs;
                let dxhat = dy[i] * g(gamma[c], zero_centered);
                dx[i] = rs * (dxhat - sum_dxhat / n - xhat * sum_dxhat_xhat / n);
            }
        }
        Ok(())
    }

    /// RMSNorm forward.
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
        check("rmsnorm x", x.len(), rows * cols)?;
        check("rmsnorm y", y.len(), rows * cols)?;
        check("rmsnorm gamma", gamma.len(), cols)?;
        check("rmsnorm rstd", rstd.len(), rows)?;
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / cols as f32;
            let rs = 1.0 / (ms + eps).sqrt();
            rstd[r] = rs;
            for c in 0..cols {
                y[r * cols + c] = xr[c] * rs * g(gamma[c], zero_centered);
            }
        }
        Ok(())
    }

    /// RMSNorm backward; dgamma accumulates.
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
        check("rmsnorm dy", dy.len(), rows * cols)?;
        check("rmsnorm dx", dx.len(), rows * cols)?;
        for r in 0..rows {
            let rs = rstd[r];
            let mut dot = 0.0f32;
            for c in 0..cols {
                let i = r * cols + c;
                dot += dy[i] * g(gamma[c], zero_centered) * x[i] * rs;
                dgamma[c] += dy[i] * x[i] * rs;
            }
            let n = cols as f32;
            for c in 0..cols {
                let i = r * cols + c;
                let xhat = x[i] * rs;
                dx[i] = rs * (dy[i] * g(gamma[c], zero_centered) - xhat * dot / n);
            }
        }
        Ok(())
    }
}

pub mod activation {
    //! GELU (tanh form) and SwiGLU, f32.
    use super::check;
    use crate::error::Result;

    const K: f32 = 0.797_884_6; // sqrt(2/pi)
    const C: f32 = 0.044_715;

    /// `y = gelu(x)`.
    pub fn gelu_forward(x: &[f32], y: &mut [f32]) -> Result<()> {
        check("gelu y", y.len(), x.len())?;
        for (y, &x) in y.iter_mut().zip(x) {
            *y = 0.5 * x * (1.0 + (K * (x + C * x * x * x)).tanh());
        }
        Ok(())
    }

    /// `dx = dy * gelu'(x)`.
    pub fn gelu_backward(dy: &[f32], x: &[f32], dx: &mut [f32]) -> Result<()> {
        check("gelu dy", dy.len(), x.len())?;
        check("gelu dx", dx.len(), x.len())?;
        for i in 0..x.len() {
            let v = x[i];
            let t = (K * (v + C * v * v * v)).tanh();
            let d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * K * (1.0 + 3.0 * C * v * v);
            dx[i] = dy[i] * d;
        }
        Ok(())
    }

    fn silu(a: f32) -> f32 {
        a / (1.0 + (-a).exp())
    }

    /// `y[r, j] = silu(x[r, j]) * x[r, c + j]` for `x` `[rows, 2c]`.
    pub fn swiglu_forward(x: &[f32], rows: usize, c: usize, y: &mut [f32]) -> Result<()> {
        check("swiglu x", x.len(), rows * 2 * c)?;
        check("swiglu y", y.len(), rows * c)?;
        for r in 0..rows {
            for j in 0..c {
                y[r * c + j] = silu(x[r * 2 * c + j]) * x[r * 2 * c + c + j];
            }
        }
        Ok(())
    }

    /// Gradient of [`swiglu_forward`] into `dx` `[rows, 2c]`.
    pub fn swiglu_backward(dy: &[f32], x: &[f32], rows: usize, c: usize, dx: &mut [f32]) -> Result<()> {
        check("swiglu dy", dy.len(), rows * c)?;
        check("swiglu x", x.len(), rows * 2 * c)?;
        check("swiglu dx", dx.len(), rows * 2 * c)?;
        for r in 0..rows {
            for j in 0..c {
                let a = x[r * 2 * c + j];
                let b = x[r * 2 * c + c + j];
                let s = 1.0 / (1.0 + (-a).exp());
                let d = dy[r * c + j];
                dx[r * 2 * c + j] = d * b * (s + a * s * (1.0 - s));
                dx[r * 2 * c + c + j] = d * a * s;
            }
        }
        Ok(())
    }
}

pub mod attention {
    //! Causal scaled dot-product attention with an f32 softmax.
    use super::{Dtype, check};
    use crate::error::Result;

    /// Shape of q/k/v/out: `[batch*seq, heads*head_dim]`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct AttentionShape {
        /// Sequences.
        pub batch: usize,
        /// Tokens per sequence.
        pub seq: usize,
        /// Heads.
        pub heads: usize,
        /// Features per head.
        pub head_dim: usize,
    }

    impl AttentionShape {
        fn len(&self) -> usize {
            self.batch * self.seq * self.heads * self.head_dim
        }
        fn at(&self, b: usize, t: usize, h: usize) -> usize {
            ((b * self.seq + t) * self.heads + h) * self.head_dim
        }
    }

    /// Probabilities of row `i` (keys `0..=i`) of head `h` of sequence `b`, from the saved lse.
    fn probs(q: &[f32], k: &[f32], s: &AttentionShape, b: usize, h: usize, i: usize, scale: f32, lse: f32) -> Vec<f32> {
        let qi = &q[s.at(b, i, h)..s.at(b, i, h) + s.head_dim];
        (0..=i)
            .map(|j| {
                let kj = &k[s.at(b, j, h)..s.at(b, j, h) + s.head_dim];
                let dot: f32 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
                (dot * scale - lse).exp()
            })
            .collect()
    }

    /// `out = softmax(q k^T * scale + causal mask) v`; `lse[b, h, i]` the log-sum-exp of row i.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_forward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: AttentionShape,
        softmax_scale: f32,
        dtype: Dtype,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<()> {
        let s = shape;
        for (what, len) in [("q", q.len()), ("k", k.len()), ("v", v.len()), ("out", out.len())] {
            check(what, len, s.len())?;
        }
        check("lse", lse.len(), s.batch * s.heads * s.seq)?;
        for b in 0..s.batch {
            for h in 0..s.heads {
                for i in 0..s.seq {
                    let qi = &q[s.at(b, i, h)..s.at(b, i, h) + s.head_dim];
                    let scores: Vec<f32> = (0..=i)
                        .map(|j| {
                            let kj = &k[s.at(b, j, h)..s.at(b, j, h) + s.head_dim];
                            qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * softmax_scale
                        })
                        .collect();
                    let m = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let sum: f32 = scores.iter().map(|x| (x - m).exp()).sum();
                    let l = m + sum.ln();
                    lse[(b * s.heads + h) * s.seq + i] = l;
                    let o = &mut out[s.at(b, i, h)..s.at(b, i, h) + s.head_dim];
                    o.fill(0.0);
                    for (j, sc) in scores.iter().enumerate() {
                        let p = dtype.round((sc - l).exp());
                        let vj = &v[s.at(b, j, h)..s.at(b, j, h) + s.head_dim];
                        o.iter_mut().zip(vj).for_each(|(o, v)| *o += p * v);
                    }
                    dtype.round_slice(o);
                }
            }
        }
        Ok(())
    }

    /// Gradients of [`attention_forward`] into dq, dk, dv (overwritten).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        dout: &[f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &[f32],
        lse: &[f32],
        shape: AttentionShape,
        softmax_scale: f32,
        dtype: Dtype,
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) -> Result<()> {
        let s = shape;
        for (what, len) in [
            ("dout", dout.len()),
            ("dq", dq.len()),
            ("dk", dk.len()),
            ("dv", dv.len()),
        ] {
            check(what, len, s.len())?;
        }
        dq.fill(0.0);
        dk.fill(0.0);
        dv.fill(0.0);
        let d = s.head_dim;
        for b in 0..s.batch {
            for h in 0..s.heads {
                for i in 0..s.seq {
                    let l = lse[(b * s.heads + h) * s.seq + i];
                    let p = probs(q, k, &s, b, h, i, softmax_scale, l);
                    let oi = s.at(b, i, h);
                    let do_i = &dout[oi..oi + d];
                    let delta: f32 = do_i.iter().zip(&out[oi..oi + d]).map(|(a, b)| a * b).sum();
                    for (j, &pj) in p.iter().enumerate() {
                        let oj = s.at(b, j, h);
                        let dp: f32 = do_i.iter().zip(&v[oj..oj + d]).map(|(a, b)| a * b).sum();
                        let ds = pj * (dp - delta) * softmax_scale;
                        for c in 0..d {
                            dv[oj + c] += pj * do_i[c];
                            dq[oi + c] += ds * k[oj + c];
                            dk[oj + c] += ds * q[oi + c];
                        }
                    }
                }
            }
        }
        dtype.round_slice(dq);
        dtype.round_slice(dk);
        dtype.round_slice(dv);
        Ok(())
    }
}
