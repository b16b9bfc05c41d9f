//! Inputs of `fp8 bench gemm` and its accuracy figures: random matrices,
//! quantized with the library's quantizers, their dequantized copies, and
//! relative Frobenius errors against f64 products on a sample of rows.

use clap::ValueEnum;
use fp8_engine::format::Fp8Format;
use fp8_engine::gemm::{Mat, Operand};
use fp8_engine::quantize::{
    ScaleRule, quantize_1x128_rowwise, quantize_128x128, quantize_current, quantize_mxfp8_rowwise,
};
use fp8_engine::scaling::{BlockScaling, CurrentScaling, TensorRole};
use fp8_engine::tensor::{QuantizedMatrix, Scales};
use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::CliError;

/// Distribution of the unquantized inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dist {
    /// Standard normal.
    Normal,
    /// Uniform in [-1, 1).
    Uniform,
    /// Random sign times e^N(0,1): heavy tails, like activations with outliers.
    Lognormal,
}

/// Precision of one GEMM input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    E4m3,
    E5m2,
    Bf16,
    F16,
    F32,
}

impl InputFormat {
    pub fn name(self) -> &'static str {
        match self {
            InputFormat::E4m3 => "e4m3",
            InputFormat::E5m2 => "e5m2",
            InputFormat::Bf16 => "bf16",
            InputFormat::F16 => "f16",
            InputFormat::F32 => "f32",
        }
    }

    pub fn fp8(self) -> Option<Fp8Format> {
        match self {
            InputFormat::E4m3 => Some(Fp8Format::E4M3),
            InputFormat::E5m2 => Some(Fp8Format::E5M2),
            _ => None,
        }
    }
}

/// How FP8 inputs are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scaling {
    /// One scale per tensor (current scaling).
    Tensor,
    /// A in 1x128 blocks, B in 128x128 tiles (forward / dgrad, DeepSeek-V3 style).
    Block,
    /// A and B in 1x128 blocks (wgrad).
    #[value(name = "block-1x128")]
    Block1x128,
    /// MXFP8: one E8M0 exponent per 32 of K on both sides.
    Mxfp8,
}

impl Scaling {
    pub fn name(self) -> &'static str {
        match self {
            Scaling::Tensor => "tensor",
            Scaling::Block => "block",
            Scaling::Block1x128 => "block-1x128",
            Scaling::Mxfp8 => "mxfp8",
        }
    }
}

/// SplitMix64: a small, fast, seedable generator (the binary has no `rand`).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: 53 random bits.
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller, one of the pair).
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.unit(), self.unit());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Values per independently seeded chunk, so generation runs in parallel and
/// the result does not depend on the thread count.
const CHUNK: usize = 1 << 16;

/// `len` values of `dist`, deterministic in `seed`.
pub fn random(len: usize, dist: Dist, seed: u64) -> Vec<f32> {
    let mut values = vec![0.0f32; len];
    values.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let mut rng = SplitMix(seed ^ (c as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        for x in chunk {
            *x = match dist {
                Dist::Normal => rng.normal(),
                Dist::Uniform => 2.0 * rng.unit() - 1.0,
                Dist::Lognormal => {
                    let sign = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
                    sign * rng.normal().exp()
                }
            } as f32;
        }
    });
    values
}

/// A GEMM input the bench owns.
pub enum OwnedOperand {
    Fp8(Fp8Format, QuantizedMatrix),
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

/// One side of a case: its shape and the operand.
pub struct Input {
    pub rows: usize,
    pub k: usize,
    pub operand: OwnedOperand,
}

/// Which side of the GEMM an input is (block layouts differ).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Input {
    /// Quantizes (or narrows) `x` (`rows x k`) to `format`, FP8 with `scaling`.
    pub fn new(
        x: &[f32],
        rows: usize,
        k: usize,
        format: InputFormat,
        scaling: Scaling,
        side: Side,
    ) -> Result<Self, CliError> {
        let operand = match format.fp8() {
            None => match format {
                InputFormat::Bf16 => OwnedOperand::Bf16(x.par_iter().map(|&v| bf16::from_f32(v)).collect()),
                InputFormat::F16 => OwnedOperand::F16(x.par_iter().map(|&v| f16::from_f32(v)).collect()),
                _ => OwnedOperand::F32(x.to_vec()),
            },
            Some(fp8) => OwnedOperand::Fp8(fp8, quantize(x, rows, k, fp8, scaling, side)?),
        };
        Ok(Input { rows, k, operand })
    }

    /// The operand as the GEMM takes it.
    pub fn view(&self) -> Result<Operand<'_>, CliError> {
        Ok(match &self.operand {
            OwnedOperand::Fp8(format, q) => Operand::Fp8(*format, q),
            OwnedOperand::F32(v) => Operand::F32(Mat::new(v, self.rows, self.k)?),
            OwnedOperand::Bf16(v) => Operand::Bf16(Mat::new(v, self.rows, self.k)?),
            OwnedOperand::F16(v) => Operand::F16(Mat::new(v, self.rows, self.k)?),
        })
    }

    /// Row `r` as the GEMM sees it, in f64: code x scale_inv of its block, exactly.
    pub fn row_f64(&self, r: usize) -> Vec<f64> {
        let k = self.k;
        let span = r * k..(r + 1) * k;
        match &self.operand {
            OwnedOperand::F32(v) => v[span].iter().map(|&x| x as f64).collect(),
            OwnedOperand::Bf16(v) => v[span].iter().map(|x| x.to_f64()).collect(),
            OwnedOperand::F16(v) => v[span].iter().map(|x| x.to_f64()).collect(),
            OwnedOperand::Fp8(format, q) => {
                let table = format.decode_table();
                let codes = &q.data()[span];
                // Compact scale layouts of `docs/numerics.md`, block scaling and MXFP8.
                let scale = |c: usize| -> f64 {
                    match q.scales() {
                        Scales::PerTensor(s) => *s as f64,
                        Scales::Block1x128(s) => s[r * k.div_ceil(128) + c / 128] as f64,
                        Scales::Block128x128(s) => s[(r / 128) * k.div_ceil(128) + c / 128] as f64,
                        Scales::Mxfp8(e) => 2f64.powi(e[r * k.div_ceil(32) + c / 32] as i32 - 127),
                    }
                };
                codes
                    .iter()
                    .enumerate()
                    .map(|(c, &code)| table[code as usize] as f64 * scale(c))
                    .collect()
            }
        }
    }

    /// The whole input dequantized to f32 (what the baseline multiplies).
    pub fn dequantized(&self) -> Vec<f32> {
        (0..self.rows)
            .into_par_iter()
            .flat_map_iter(|r| self.row_f64(r).into_iter().map(|x| x as f32))
            .collect()
    }
}

fn quantize(
    x: &[f32],
    rows: usize,
    k: usize,
    format: Fp8Format,
    scaling: Scaling,
    side: Side,
) -> Result<QuantizedMatrix, CliError> {
    // The recipes' defaults with this operand's format.
    let current = ScaleRule {
        format,
        ..ScaleRule::current(&CurrentScaling::default(), TensorRole::Input)
    };
    let block = ScaleRule {
        format,
        ..ScaleRule::block(&BlockScaling::default(), TensorRole::Input)
    };
    let mut codes = vec![0u8; x.len()];
    let blocks_1x128 = rows * k.div_ceil(128);
    let scales = match (scaling, side) {
        (Scaling::Tensor, _) => return Ok(quantize_current(x, rows, k, &current, false)?.0.into_parts().1),
        (Scaling::Block, Side::B) => {
            let mut s = vec![0.0f32; rows.div_ceil(128) * k.div_ceil(128)];
            quantize_128x128(x, rows, k, &block, &mut codes, &mut s)?;
            Scales::Block128x128(s)
        }
        (Scaling::Block | Scaling::Block1x128, _) => {
            let mut s = vec![0.0f32; blocks_1x128];
            quantize_1x128_rowwise(x, rows, k, &block, &mut codes, &mut s)?;
            Scales::Block1x128(s)
        }
        (Scaling::Mxfp8, _) => {
            let mut e = vec![0u8; rows * k.div_ceil(32)];
            quantize_mxfp8_rowwise(x, rows, k, format, &mut codes, &mut e)?;
            Scales::Mxfp8(e)
        }
    };
    Ok(QuantizedMatrix::new(codes, rows, k, scales)?)
}

/// At most this many output rows enter the f64 references (all rows of smaller outputs).
pub const SAMPLE_ROWS: usize = 64;

/// Evenly spaced rows `0, M/64, 2M/64, ...` (all of them when M <= 64).
pub fn sample_rows(m: usize) -> Vec<usize> {
    if m <= SAMPLE_ROWS {
        (0..m).collect()
    } else {
        (0..SAMPLE_ROWS).map(|i| i * m / SAMPLE_ROWS).collect()
    }
}

/// `alpha * A B^T` in f64 on the sampled rows of A: `[rows.len(), N]`.
/// `a_row(i)` and `b_row(j)` give rows as f64.
pub fn reference_rows(
    rows: &[usize],
    n: usize,
    alpha: f64,
    a_row: impl Fn(usize) -> Vec<f64> + Sync,
    b_row: impl Fn(usize) -> Vec<f64> + Sync,
) -> Vec<f64> {
    let a: Vec<Vec<f64>> = rows.par_iter().map(|&i| a_row(i)).collect();
    // Column j of the sampled result for every j, B decoded once per row.
    let columns: Vec<Vec<f64>> = (0..n)
        .into_par_iter()
        .map(|j| {
            let b = b_row(j);
            a.iter()
                .map(|a| alpha * a.iter().zip(&b).map(|(x, y)| x * y).sum::<f64>())
                .collect()
        })
        .collect();
    let mut out = vec![0.0f64; rows.len() * n];
    for (j, column) in columns.iter().enumerate() {
        for (r, &v) in column.iter().enumerate() {
            out[r * n + j] = v;
        }
    }
    out
}

/// `||got - reference|| / ||reference||` (Frobenius, f64) over the sampled
/// rows; `got` is the full `M x N` output.
pub fn relative_error(got: &[f32], n: usize, rows: &[usize], reference: &[f64]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (r, &i) in rows.iter().enumerate() {
        for (g, &e) in got[i * n..(i + 1) * n].iter().zip(&reference[r * n..(r + 1) * n]) {
            diff += (*g as f64 - e).powi(2);
            norm += e * e;
        }
    }
    (diff / norm).sqrt()
}
