//! The optimizer-side ops of a training step: the AdamW update of one
//! parameter, the sum of squares behind gradient norms, and the unscale +
//! finite check of dynamic loss scaling.

use rayon::prelude::*;

use super::check::len;
use crate::error::Result;

/// Elements per parallel task of the AdamW update (~64 KiB of each of its four arrays).
const ADAMW_CHUNK: usize = 16 * 1024;

/// The per-step constants of one AdamW update (`train::adamw` computes them once per step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// `1 - lr * weight_decay` (1 for parameters that are not decayed).
    pub decay: f32,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
    /// `sqrt(1 - beta2^t)`.
    pub bc2_sqrt: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// `1 - beta1`.
    pub c1: f32,
    /// `1 - beta2`.
    pub c2: f32,
    /// Denominator epsilon.
    pub eps: f32,
}

/// Decoupled weight decay then the Adam step, element by element in f32.
pub fn adamw_update(value: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWStep) -> Result<()> {
    let n = value.len();
    len("AdamW gradient", 1, n, grad.len())?;
    len("AdamW first moment", 1, n, m.len())?;
    len("AdamW second moment", 1, n, v.len())?;
    // Element by element: chunks in parallel give the serial bits. A small parameter (a
    // bias, a norm's scale) stays on this thread: handing it to the pool costs more.
    if n <= ADAMW_CHUNK {
        adamw_chunk(value, grad, m, v, s);
        return Ok(());
    }
    value
        .par_chunks_mut(ADAMW_CHUNK)
        .zip(grad.par_chunks(ADAMW_CHUNK))
        .zip(m.par_chunks_mut(ADAMW_CHUNK).zip(v.par_chunks_mut(ADAMW_CHUNK)))
        .for_each(|((value, grad), (m, v))| adamw_chunk(value, grad, m, v, s));
    Ok(())
}

fn adamw_chunk(value: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWStep) {
    for (((value, &g), m), v) in value.iter_mut().zip(grad).zip(m).zip(v) {
        let w = *value * s.decay;
        *m = *m * s.beta1 + g * s.c1;
        *v = *v * s.beta2 + (g * g) * s.c2;
        let denom = v.sqrt() / s.bc2_sqrt + s.eps;
        *value = w - s.step_size * (*m / denom);
    }
}

/// `sum x^2` in f64, in order.
pub fn sum_of_squares(values: &[f32]) -> f64 {
    values.iter().map(|&x| (x as f64) * (x as f64)).sum()
}

/// `x *= inv_scale` for every value; whether all results are finite (every value is scaled,
/// also after a non-finite one).
pub fn unscale_and_check(values: &mut [f32], inv_scale: f32) -> bool {
    let mut finite = true;
    for g in values {
        *g *= inv_scale;
        finite &= g.is_finite();
    }
    finite
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked, parallel update is the element-by-element definition, bit for bit, for
    /// sizes below, at and across the chunk size.
    #[test]
    fn parallel_adamw_is_the_elementwise_update() {
        let s = AdamWStep {
            decay: 1.0 - 1e-3 * 0.1,
            step_size: 1e-3 / (1.0 - 0.9f32.powi(3)),
            bc2_sqrt: (1.0 - 0.999f32.powi(3)).sqrt(),
            beta1: 0.9,
            beta2: 0.999,
            c1: 0.1,
            c2: 0.001,
            eps: 1e-8,
        };
        for n in [1, ADAMW_CHUNK, ADAMW_CHUNK + 1, 3 * ADAMW_CHUNK + 17] {
            let init = |seed: f32| (0..n).map(|i| (i as f32 * seed).sin()).collect::<Vec<f32>>();
            let grad = init(0.37);
            let (mut value, mut m, mut v) = (
                init(0.11),
                init(0.23),
                init(0.05).iter().map(|x| x * x).collect::<Vec<f32>>(),
            );
            let (mut want_value, mut want_m, mut want_v) = (value.clone(), m.clone(), v.clone());
            for i in 0..n {
                let g = grad[i];
                let w = want_value[i] * s.decay;
                want_m[i] = want_m[i] * s.beta1 + g * s.c1;
                want_v[i] = want_v[i] * s.beta2 + (g * g) * s.c2;
                let denom = want_v[i].sqrt() / s.bc2_sqrt + s.eps;
                want_value[i] = w - s.step_size * (want_m[i] / denom);
            }
            adamw_update(&mut value, &grad, &mut m, &mut v, &s).unwrap();
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same(&value, &want_value) && same(&m, &want_m) && same(&v, &want_v),
                "n {n}"
            );
        }
    }
}
