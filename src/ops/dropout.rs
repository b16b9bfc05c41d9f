//! Inverted dropout with a counter-based mask (LoRA's `dropout(x)`): element `i`'s multiplier
//! comes from output `i` of a SplitMix64 stream (`SplitMix64::nth`), so it is computed where it
//! is needed (a host loop, a GPU thread) and never stored: a layer keeps the 24-byte
//! [`DropoutMask`] between forward and backward instead of 4 bytes an element, and a GPU draws
//! the same mask as the host.

use rayon::prelude::*;

use super::check::len;
use crate::data::rng::SplitMix64;
use crate::error::{Error, Result};
use crate::tensor::Dtype;

/// Elements per parallel task.
const CHUNK: usize = 16 * 1024;

/// One forward's mask: element `i` is dropped (multiplier 0) when the top 53 bits of output `i`
/// of the stream of `state`, as a fraction of 2^53, fall under `p`, else scaled by `keep`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    state: u64,
    p: f64,
    keep: f32,
}

impl DropoutMask {
    /// The mask of stream `state` dropping with probability `p` in `[0, 1)`; kept values are
    /// scaled by `1 / (1 - p)` (rounded once to f32).
    pub fn new(state: u64, p: f32) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::InvalidSetting {
                setting: "dropout",
                value: p.to_string(),
                reason: "must be in [0, 1)".into(),
            });
        }
        let p = p as f64;
        Ok(DropoutMask {
            state,
            p,
            keep: (1.0 / (1.0 - p)) as f32,
        })
    }

    /// The stream's counter before element 0.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// The drop probability, widened from the setting.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// The multiplier of a kept value, `1 / (1 - p)` rounded once to f32.
    pub fn keep(&self) -> f32 {
        self.keep
    }

    /// The multiplier of element `i`: 0 or `keep`.
    pub fn multiplier(&self, i: u64) -> f32 {
        let u = (SplitMix64::nth(self.state, i) >> 11) as f64 / (1u64 << 53) as f64;
        if u < self.p { 0.0 } else { self.keep }
    }
}

/// `out = x * mask`, each product rounded to `dtype` (every value overwritten).
pub fn dropout(x: &[f32], mask: DropoutMask, dtype: Dtype, out: &mut [f32]) -> Result<()> {
    len("dropout output", 1, x.len(), out.len())?;
    each(out, x, |o, v, m| *o = dtype.round(v * m), mask);
    Ok(())
}

/// `out = out + g * mask`, each sum rounded to `dtype` (an input gradient through dropout added
/// to the one already there).
pub fn dropout_add(g: &[f32], mask: DropoutMask, dtype: Dtype, out: &mut [f32]) -> Result<()> {
    len("dropout gradient", 1, g.len(), out.len())?;
    each(out, g, |o, v, m| *o = dtype.round(*o + v * m), mask);
    Ok(())
}

/// `f(out[i], src[i], multiplier(i))` for every `i`, in parallel chunks (each element on its
/// own, so the thread count changes nothing).
fn each(out: &mut [f32], src: &[f32], f: impl Fn(&mut f32, f32, f32) + Sync, mask: DropoutMask) {
    out.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, s))| {
            let first = (c * CHUNK) as u64;
            for (k, (o, &v)) in o.iter_mut().zip(s).enumerate() {
                f(o, v, mask.multiplier(first + k as u64));
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask LoRA drew before: a sequential SplitMix64 stream from `state`.
    fn sequential(state: u64, p: f32, n: usize) -> Vec<f32> {
        let (p, keep) = (p as f64, (1.0 / (1.0 - p as f64)) as f32);
        let mut rng = SplitMix64::new(state);
        (0..n)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                if u < p { 0.0 } else { keep }
            })
            .collect()
    }

    #[test]
    fn the_counter_mask_is_the_sequential_stream() {
        for (state, p) in [(0u64, 0.1f32), (0xdead_beef, 0.5), (u64::MAX, 0.05), (7, 0.0)] {
            let mask = DropoutMask::new(state, p).unwrap();
            let n = 3 * CHUNK + 17;
            let got: Vec<f32> = (0..n as u64).map(|i| mask.multiplier(i)).collect();
            assert_eq!(got, sequential(state, p, n), "state {state} p {p}");
        }
    }

    #[test]
    fn dropout_scales_kept_values_and_zeroes_dropped_ones_with_their_sign() {
        let n = 2 * CHUNK + 5;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0 - 0.5).collect();
        let mask = DropoutMask::new(42, 0.3).unwrap();
        let mut out = vec![f32::NAN; n];
        dropout(&x, mask, Dtype::Bf16, &mut out).unwrap();
        let m = sequential(42, 0.3, n);
        let dropped = m.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
        assert!((dropped - 0.3).abs() < 0.02, "dropped share {dropped}");
        for i in 0..n {
            let want = Dtype::Bf16.round(x[i] * m[i]);
            assert_eq!(out[i].to_bits(), want.to_bits(), "element {i}");
        }
        // A negative value dropped is -0 (the product's sign), as the host loop gave.
        let neg = (0..n).find(|&i| m[i] == 0.0 && x[i] < 0.0).unwrap();
        assert!(out[neg] == 0.0 && out[neg].is_sign_negative());

        let mut acc: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let before = acc.clone();
        dropout_add(&x, mask, Dtype::F16, &mut acc).unwrap();
        for i in 0..n {
            let want = Dtype::F16.round(before[i] + x[i] * m[i]);
            assert_eq!(acc[i].to_bits(), want.to_bits(), "element {i}");
        }
    }

    #[test]
    fn bad_probabilities_and_lengths_are_errors() {
        assert!(DropoutMask::new(1, 1.0).is_err());
        assert!(DropoutMask::new(1, -0.1).is_err());
        assert!(DropoutMask::new(1, f32::NAN).is_err());
        let mask = DropoutMask::new(1, 0.5).unwrap();
        assert!(dropout(&[1.0; 3], mask, Dtype::F32, &mut [0.0; 2]).is_err());
        assert!(dropout_add(&[1.0; 3], mask, Dtype::F32, &mut [0.0; 4]).is_err());
    }
}
