//! Rotary position embeddings in the Hugging Face "rotate half" convention,
//! forward and backward, on the CPU.
//!
//! For a head vector `x` of width `d` whose first `r` (the rotary width) features rotate,
//! at position `p`, with `h = r / 2`:
//! `x'[i]     = x[i] cos(p f_i) - x[i+h] sin(p f_i)`,
//! `x'[i + h] = x[i+h] cos(p f_i) + x[i] sin(p f_i)` for `i < h`, `x'[r..d] = x[r..d]`.
//! The frequencies `f_i = theta^(-2i/r)`, optionally rescaled (linear, llama3), and the
//! angles `p * f_i` are computed in f32 exactly as transformers does, because at long
//! positions the f32 rounding of the angle is the dominant difference between
//! implementations; cos and sin of that f32 angle are then taken in f64 and rounded once.
//! Backward applies the transposed rotation (the same formula with `-sin`).

use rayon::prelude::*;

use super::check::{elements, len};
use crate::error::{Error, Result};

/// How the frequencies are rescaled for long contexts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeFrequencyScaling {
    /// Plain frequencies.
    None,
    /// Every frequency divided by `factor`.
    Linear {
        /// Divisor.
        factor: f32,
    },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f32,
        /// Wavelengths above `original_max / low_freq_factor` are divided by `factor`.
        low_freq_factor: f32,
        /// Wavelengths below `original_max / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: f32,
    },
}

/// `cos` and `sin` of every (position, frequency) pair up to a maximum position.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    rotary_dim: usize,
    positions: usize,
    /// `[positions, rotary_dim / 2]`.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The rotary frequencies `f_i`, `i < rotary_dim / 2`, in f32 as transformers computes them:
/// `1 / theta^(2i / rotary_dim)`, then the scaling.
pub fn inv_freq(theta: f32, rotary_dim: usize, scaling: RopeFrequencyScaling) -> Vec<f32> {
    let base: Vec<f32> = (0..rotary_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32))
        .collect();
    match scaling {
        RopeFrequencyScaling::None => base,
        RopeFrequencyScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeFrequencyScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: original,
        } => {
            let low_wavelen = original / low_freq_factor;
            let high_wavelen = original / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen > low_wavelen {
                        f / factor
                    } else if wavelen < high_wavelen {
                        f
                    } else {
                        let smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

impl RopeTable {
    /// The table for positions `0..positions` of frequencies `inv_freq` (rotary width `2 * inv_freq.len()`).
    pub fn new(inv_freq: &[f32], positions: usize) -> Self {
        let half = inv_freq.len();
        let mut cos = vec![0f32; positions * half];
        let mut sin = vec![0f32; positions * half];
        for p in 0..positions {
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = f64::from(p as f32 * f);
                cos[p * half + i] = angle.cos() as f32;
                sin[p * half + i] = angle.sin() as f32;
            }
        }
        RopeTable {
            rotary_dim: 2 * half,
            positions,
            cos,
            sin,
        }
    }

    /// Positions the table covers.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Features of each head that rotate.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// `(cos, sin)` of positions `first .. first + count`, `[count, rotary_dim / 2]` each (the
    /// rows a device kernel needs); `None` past the table.
    pub fn rows(&self, first: usize, count: usize) -> Option<(&[f32], &[f32])> {
        let half = self.rotary_dim / 2;
        let range = first.checked_mul(half)?..first.checked_add(count)?.checked_mul(half)?;
        Some((self.cos.get(range.clone())?, self.sin.get(range)?))
    }
}

/// Shape of a rotary application: `rows` tokens of `heads` heads of `head_dim`, token `r` at
/// position `first_position + r % seq` (sequences of `seq` tokens; a KV-cache step passes
/// `seq = 1` and the cache length as `first_position`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeShape {
    /// Tokens (`batch * seq`).
    pub rows: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Heads per token.
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Position of each sequence's first token.
    pub first_position: usize,
}

/// The argument check of both backends: returns the row width `heads * head_dim`.
pub(crate) fn check(x_len: usize, shape: &RopeShape, table: &RopeTable) -> Result<usize> {
    let width = elements("rope width (heads x head_dim)", shape.heads, shape.head_dim)?;
    len("rope x", shape.rows, width, x_len)?;
    if table.rotary_dim > shape.head_dim || shape.seq == 0 {
        return Err(Error::InvalidShape {
            what: "rope",
            reason: format!(
                "rotary width {} exceeds head_dim {}, or seq {} is zero",
                table.rotary_dim, shape.head_dim, shape.seq
            ),
        });
    }
    let last = shape
        .first_position
        .saturating_add(shape.seq.min(shape.rows.max(1)) - 1);
    if shape.rows > 0 && last >= table.positions {
        return Err(Error::InvalidShape {
            what: "rope",
            reason: format!("position {last} is past the table's {} positions", table.positions),
        });
    }
    Ok(width)
}

fn rotate(x: &mut [f32], shape: &RopeShape, table: &RopeTable, sign: f32) -> Result<()> {
    let width = check(x.len(), shape, table)?;
    if width == 0 {
        return Ok(());
    }
    let half = table.rotary_dim / 2;
    x.par_chunks_mut(width).enumerate().for_each(|(row, token)| {
        let p = shape.first_position + row % shape.seq;
        let (cos, sin) = (&table.cos[p * half..][..half], &table.sin[p * half..][..half]);
        for head in token.chunks_mut(shape.head_dim) {
            let (a, b) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (x1, x2, c, s) = (a[i], b[i], cos[i], sign * sin[i]);
                a[i] = x1 * c - x2 * s;
                b[i] = x2 * c + x1 * s;
            }
        }
    });
    Ok(())
}

/// Rotates `x` (`[rows, heads * head_dim]`) in place.
pub fn rope_forward(x: &mut [f32], shape: &RopeShape, table: &RopeTable) -> Result<()> {
    rotate(x, shape, table, 1.0)
}

/// Turns the gradient of the rotated values into the gradient of the inputs, in place (the
/// transposed rotation: the rotation by the negative angle).
pub fn rope_backward(dx: &mut [f32], shape: &RopeShape, table: &RopeTable) -> Result<()> {
    rotate(dx, shape, table, -1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// An f64 rotation straight from the rotate-half formula.
    fn reference(x: &[f32], shape: &RopeShape, inv: &[f32]) -> Vec<f64> {
        let half = inv.len();
        let width = shape.heads * shape.head_dim;
        let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        for row in 0..shape.rows {
            let p = (shape.first_position + row % shape.seq) as f32;
            for h in 0..shape.heads {
                let base = row * width + h * shape.head_dim;
                let v: Vec<f64> = x[base..base + shape.head_dim].iter().map(|&a| f64::from(a)).collect();
                let rotated_half: Vec<f64> = (0..2 * half)
                    .map(|i| if i < half { -v[i + half] } else { v[i - half] })
                    .collect();
                for i in 0..2 * half {
                    let angle = f64::from(p * inv[i % half]);
                    out[base + i] = v[i] * angle.cos() + rotated_half[i] * angle.sin();
                }
            }
        }
        out
    }

    #[test]
    fn forward_matches_f64_rotate_half_and_backward_inverts_it() {
        let inv = inv_freq(10000.0, 12, RopeFrequencyScaling::None);
        let table = RopeTable::new(&inv, 64);
        let shape = RopeShape {
            rows: 2 * 20,
            seq: 20,
            heads: 3,
            head_dim: 16,
            first_position: 5,
        };
        let x = data(shape.rows * 48, 7);
        let mut y = x.clone();
        rope_forward(&mut y, &shape, &table).unwrap();
        let want = reference(&x, &shape, &inv);
        for (i, (&got, &w)) in y.iter().zip(&want).enumerate() {
            // Two f32 products and a sum of values below 1.42: a few ulps of 1.
            assert!(
                (f64::from(got) - w).abs() <= 4.0 * f64::from(f32::EPSILON),
                "{i}: {got} vs {w}"
            );
            if i % 16 >= 12 {
                assert_eq!(got, x[i], "features past the rotary width pass through");
            }
        }
        // The backward of a rotation is its transpose: <R x, g> == <x, R^T g> (in f64).
        let g = data(x.len(), 99);
        let mut rtg = g.clone();
        rope_backward(&mut rtg, &shape, &table).unwrap();
        let lhs: f64 = y.iter().zip(&g).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
        let rhs: f64 = x.iter().zip(&rtg).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
        assert!((lhs - rhs).abs() < 1e-4 * lhs.abs().max(1.0), "{lhs} vs {rhs}");
        rope_backward(&mut y, &shape, &table).unwrap();
        assert!(y.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-6));
    }

    #[test]
    fn llama3_scaling_follows_its_three_regimes() {
        let (factor, low, high, original) = (8.0f32, 1.0f32, 4.0f32, 8192.0f32);
        let scaling = RopeFrequencyScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: original,
        };
        let base = inv_freq(500000.0, 128, RopeFrequencyScaling::None);
        let scaled = inv_freq(500000.0, 128, scaling);
        let (mut kept, mut divided, mut blended) = (0, 0, 0);
        for (&b, &s) in base.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f64::consts::PI / f64::from(b);
            if wavelen < f64::from(original / high) {
                assert_eq!(s, b);
                kept += 1;
            } else if wavelen > f64::from(original / low) {
                assert_eq!(s, b / factor);
                divided += 1;
            } else {
                let t = (f64::from(original) / wavelen - 1.0) / 3.0;
                let want = (1.0 - t) * f64::from(b) / 8.0 + t * f64::from(b);
                assert!((f64::from(s) - want).abs() <= 1e-6 * want, "{s} vs {want}");
                assert!(s < b && s > b / factor);
                blended += 1;
            }
        }
        assert!(kept > 0 && divided > 0 && blended > 0, "{kept} {divided} {blended}");
        let linear = inv_freq(10000.0, 8, RopeFrequencyScaling::Linear { factor: 4.0 });
        let plain = inv_freq(10000.0, 8, RopeFrequencyScaling::None);
        assert!(linear.iter().zip(&plain).all(|(l, p)| *l == p / 4.0));
        assert_eq!(plain[0], 1.0);
        assert!((f64::from(plain[1]) - 10000f64.powf(-0.25)).abs() < 1e-7);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let table = RopeTable::new(&inv_freq(10000.0, 8, RopeFrequencyScaling::None), 16);
        let mut x = vec![0.0; 4 * 8];
        let shape = RopeShape {
            rows: 4,
            seq: 4,
            heads: 1,
            head_dim: 8,
            first_position: 13,
        };
        assert!(
            rope_forward(&mut x, &shape, &table)
                .unwrap_err()
                .to_string()
                .contains("position 16")
        );
        let shape = RopeShape {
            rows: 4,
            seq: 4,
            heads: 1,
            head_dim: 4,
            first_position: 0,
        };
        assert!(rope_forward(&mut x[..16], &shape, &table).is_err());
        let shape = RopeShape {
            rows: 4,
            seq: 4,
            heads: 2,
            head_dim: 8,
            first_position: 0,
        };
        assert!(rope_forward(&mut x, &shape, &table).is_err());
    }
}
