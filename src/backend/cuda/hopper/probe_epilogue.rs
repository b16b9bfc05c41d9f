//! Exact probes of the Hopper GEMM's epilogue, the first run's step 8: alpha,
//! bias, beta, every output dtype, the fused amax, and a NaN input.
//!
//! Each wraps an exact probe of [`super::probe`] (small integers, power-of-two
//! scales) and keeps the epilogue exact too: alpha is a power of two, bias and
//! the old D are small integers, so `alpha * acc + bias + beta * old` is an
//! integer times a power of two below 2^24 and exact in f32 in any order. The
//! output is that value rounded once (bf16/fp16 to nearest even, FP8
//! `cast_sat(v * scale)` with a power-of-two scale), so there is one right
//! answer and the GPU must give it bit for bit; the amax is `max |v|` exactly.
//! A NaN code in one row of A makes that row of D NaN and the amax NaN (any
//! NaN payload is accepted there).

use half::{bf16, f16};

use super::probe::{Probe, first_run_probes};
use crate::format::{Fp8Format, Overflow};

/// The output dtype of an epilogue probe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ProbeOutput {
    /// f32 (the only one that reads the old D when beta != 0).
    F32,
    /// bf16, nearest even.
    Bf16,
    /// fp16, nearest even.
    F16,
    /// FP8 codes `cast_sat(v * scale)`, `scale` a power of two.
    Fp8 {
        /// Output format.
        format: Fp8Format,
        /// Output scale.
        scale: f32,
    },
}

/// One exact GEMM with a non-trivial epilogue.
#[derive(Clone, Debug)]
pub struct EpilogueProbe {
    /// What it isolates, e.g. "8b bias+alpha bf16 N256".
    pub name: String,
    /// The GEMM itself (its `a` already holds the NaN code when `nan_row` is set).
    pub base: Probe,
    /// A power of two.
    pub alpha: f32,
    /// Per-column small integers, or none.
    pub bias: Option<Vec<f32>>,
    /// 0, or a power of two (f32 output only).
    pub beta: f32,
    /// The old D, `m * n` small integers (what an f32 output holds before the launch).
    pub old: Vec<f32>,
    /// The output dtype.
    pub output: ProbeOutput,
    /// The row of A that holds one NaN code.
    pub nan_row: Option<usize>,
}

/// The expected output, bit patterns per dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum ExpectedOutput {
    /// f32 bits.
    F32(Vec<u32>),
    /// bf16 bits.
    Bf16(Vec<u16>),
    /// fp16 bits.
    F16(Vec<u16>),
    /// FP8 codes.
    Fp8(Vec<u8>),
}

impl EpilogueProbe {
    /// The exact f32 result before the output cast (NaN rows included).
    pub fn expected_f32(&self) -> Vec<f32> {
        let p = &self.base;
        let mut d = p.expected();
        for i in 0..p.m {
            for j in 0..p.n {
                let idx = i * p.n + j;
                let mut v = self.alpha as f64 * d[idx] as f64;
                if let Some(bias) = &self.bias {
                    v += bias[j] as f64;
                }
                if self.beta != 0.0 {
                    v += self.beta as f64 * self.old[idx] as f64;
                }
                d[idx] = if self.nan_row == Some(i) { f32::NAN } else { v as f32 };
            }
        }
        d
    }

    /// `max |v|` over the f32 result; NaN when any element is NaN.
    pub fn expected_amax(&self) -> f32 {
        let d = self.expected_f32();
        if d.iter().any(|x| x.is_nan()) {
            return f32::NAN;
        }
        d.iter().fold(0.0f32, |a, &x| a.max(x.abs()))
    }

    /// The output as its dtype's bits: the f32 result rounded once.
    pub fn expected_output(&self) -> ExpectedOutput {
        let d = self.expected_f32();
        match self.output {
            ProbeOutput::F32 => ExpectedOutput::F32(d.iter().map(|x| x.to_bits()).collect()),
            ProbeOutput::Bf16 => ExpectedOutput::Bf16(d.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()),
            ProbeOutput::F16 => ExpectedOutput::F16(d.iter().map(|&x| f16::from_f32(x).to_bits()).collect()),
            ProbeOutput::Fp8 { format, scale } => ExpectedOutput::Fp8(
                d.iter()
                    .map(|&x| format.encode(x * scale, Overflow::Saturate))
                    .collect(),
            ),
        }
    }

    /// Largest `|v|` of a non-NaN element: must stay below 2^24 for exactness.
    pub fn max_magnitude(&self) -> f64 {
        self.expected_f32()
            .iter()
            .filter(|x| !x.is_nan())
            .fold(0.0f64, |a, &x| a.max(x.abs() as f64))
    }
}

/// Small integers in `[-max, max]` from a seed (deterministic, no dependency).
fn small_integers(len: usize, max: i32, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state % (2 * max as u64 + 1)) as i32 - max) as f32
        })
        .collect()
}

/// The base probes the epilogue ones wrap: the single-tile random one (N128)
/// and a ragged one on the 256-wide tile, so both epilogue layouts are hit.
fn bases() -> Vec<Probe> {
    let all = first_run_probes(false);
    let pick = |prefix: &str| {
        all.iter()
            .find(|p| p.name.starts_with(prefix))
            .cloned()
            .unwrap_or_else(|| panic!("no first-run probe named {prefix}*"))
    };
    vec![pick("3c integers 128^3 split=true"), pick("4c ragged 65x257x256 N256")]
}

/// The epilogue probes, in order: alpha, bias, beta (f32), each low-precision
/// output with bias, FP8 outputs (one scale that saturates some values), then
/// a NaN input per output dtype.
pub fn epilogue_probes() -> Vec<EpilogueProbe> {
    use Fp8Format::{E4M3, E5M2};
    let mut v = Vec::new();
    for (b, base) in bases().into_iter().enumerate() {
        let (m, n) = (base.m, base.n);
        let width = if base.name.contains("N256") { "N256" } else { "N128" };
        let seed = 0xE91 + b as u64 * 16;
        let bias = Some(small_integers(n, 8, seed));
        let old = small_integers(m * n, 8, seed + 1);
        let mut add = |what: &str, alpha: f32, bias: Option<Vec<f32>>, beta: f32, output: ProbeOutput| {
            v.push(EpilogueProbe {
                name: format!("8 {what} {m}x{n}x{} {width}", base.k),
                base: base.clone(),
                alpha,
                bias,
                beta,
                old: old.clone(),
                output,
                nan_row: None,
            });
        };
        add("alpha=0.5 f32", 0.5, None, 0.0, ProbeOutput::F32);
        add("bias f32", 1.0, bias.clone(), 0.0, ProbeOutput::F32);
        add("beta=2 f32", 1.0, None, 2.0, ProbeOutput::F32);
        add("alpha=2 bias beta=0.5 f32", 2.0, bias.clone(), 0.5, ProbeOutput::F32);
        add("bias bf16", 1.0, bias.clone(), 0.0, ProbeOutput::Bf16);
        add("alpha=4 bias f16", 4.0, bias.clone(), 0.0, ProbeOutput::F16);
        for (format, scale) in [(E4M3, 1.0f32), (E4M3, 0.0625), (E5M2, 0.25)] {
            let output = ProbeOutput::Fp8 { format, scale };
            add(
                &format!("bias {format:?} scale={scale}"),
                1.0,
                bias.clone(),
                0.0,
                output,
            );
        }
    }
    // NaN propagation: one NaN code in row 3 of A, every output dtype.
    let base = bases().swap_remove(0);
    let nan_code = Fp8Format::E4M3.encode(f32::NAN, Overflow::Saturate);
    for output in [
        ProbeOutput::F32,
        ProbeOutput::Bf16,
        ProbeOutput::F16,
        ProbeOutput::Fp8 {
            format: E4M3,
            scale: 1.0,
        },
    ] {
        let mut nan_base = base.clone();
        nan_base.a[3 * nan_base.k + 17] = nan_code;
        v.push(EpilogueProbe {
            name: format!("8 NaN in A row 3 -> {output:?}"),
            base: nan_base,
            alpha: 1.0,
            bias: None,
            beta: 0.0,
            old: vec![0.0; base.m * base.n],
            output,
            nan_row: Some(3),
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{GemmParams, Operand, Output, cpu};
    use crate::tensor::{QuantizedMatrix, Scales};

    /// The CPU reference's output bits and amax for a probe (per-tensor scales).
    fn cpu_reference(p: &EpilogueProbe) -> (ExpectedOutput, f32) {
        let b = &p.base;
        let qa = QuantizedMatrix::new(b.a.clone(), b.m, b.k, Scales::PerTensor(1.0)).unwrap();
        let qb = QuantizedMatrix::new(b.b.clone(), b.n, b.k, Scales::PerTensor(1.0)).unwrap();
        let (a, bb) = (Operand::Fp8(b.a_format, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
        let params = GemmParams {
            alpha: p.alpha,
            beta: p.beta,
            bias: p.bias.as_deref().map(crate::gemm::Bias::host),
            split_accumulator: b.split,
            report_amax: true,
        };
        let len = b.m * b.n;
        match p.output {
            ProbeOutput::F32 => {
                let mut d = p.old.clone();
                let r = cpu::gemm(&a, &bb, Output::F32(&mut d), &params).unwrap();
                (ExpectedOutput::F32(d.iter().map(|x| x.to_bits()).collect()), r.amax)
            }
            ProbeOutput::Bf16 => {
                let mut d = vec![bf16::ZERO; len];
                let r = cpu::gemm(&a, &bb, Output::Bf16(&mut d), &params).unwrap();
                (ExpectedOutput::Bf16(d.iter().map(|x| x.to_bits()).collect()), r.amax)
            }
            ProbeOutput::F16 => {
                let mut d = vec![f16::ZERO; len];
                let r = cpu::gemm(&a, &bb, Output::F16(&mut d), &params).unwrap();
                (ExpectedOutput::F16(d.iter().map(|x| x.to_bits()).collect()), r.amax)
            }
            ProbeOutput::Fp8 { format, scale } => {
                let mut d = vec![0u8; len];
                let out = Output::Fp8 {
                    codes: &mut d,
                    format,
                    scale,
                };
                let r = cpu::gemm(&a, &bb, out, &params).unwrap();
                (ExpectedOutput::Fp8(d), r.amax)
            }
        }
    }

    /// NaN-aware equality of two outputs: bit-equal, or both NaN.
    fn same(p: &EpilogueProbe, e: &ExpectedOutput, r: &ExpectedOutput) -> Result<(), String> {
        let nan_fp8 = |format: Fp8Format, c: u8| format.decode(c).is_nan();
        let mismatch = match (e, r) {
            (ExpectedOutput::F32(e), ExpectedOutput::F32(r)) => e
                .iter()
                .zip(r)
                .position(|(&x, &y)| x != y && !(f32::from_bits(x).is_nan() && f32::from_bits(y).is_nan())),
            (ExpectedOutput::Bf16(e), ExpectedOutput::Bf16(r)) => e
                .iter()
                .zip(r)
                .position(|(&x, &y)| x != y && !(bf16::from_bits(x).is_nan() && bf16::from_bits(y).is_nan())),
            (ExpectedOutput::F16(e), ExpectedOutput::F16(r)) => e
                .iter()
                .zip(r)
                .position(|(&x, &y)| x != y && !(f16::from_bits(x).is_nan() && f16::from_bits(y).is_nan())),
            (ExpectedOutput::Fp8(e), ExpectedOutput::Fp8(r)) => {
                let ProbeOutput::Fp8 { format, .. } = p.output else {
                    return Err("fp8 bits for a non-fp8 probe".into());
                };
                e.iter()
                    .zip(r)
                    .position(|(&x, &y)| x != y && !(nan_fp8(format, x) && nan_fp8(format, y)))
            }
            _ => return Err("different output dtypes".into()),
        };
        match mismatch {
            Some(i) => Err(format!("{}: element {i} differs", p.name)),
            None => Ok(()),
        }
    }

    #[test]
    fn epilogue_probes_are_exact_and_the_cpu_reference_agrees_bit_for_bit() {
        let probes = epilogue_probes();
        assert!(probes.len() >= 20, "{}", probes.len());
        for p in &probes {
            assert!(
                p.max_magnitude() < (1u64 << 24) as f64,
                "{}: {}",
                p.name,
                p.max_magnitude()
            );
            let (reference, amax) = cpu_reference(p);
            same(p, &p.expected_output(), &reference).unwrap();
            let expected_amax = p.expected_amax();
            assert!(
                expected_amax.to_bits() == amax.to_bits() || (expected_amax.is_nan() && amax.is_nan()),
                "{}: amax {expected_amax} vs cpu {amax}",
                p.name
            );
        }
    }

    #[test]
    fn epilogue_probes_exercise_rounding_saturation_and_nan() {
        let probes = epilogue_probes();
        // bf16 keeps 8 significant bits: some exact values must round, or the probe
        // could not tell a truncating kernel from a rounding one.
        let rounded = probes.iter().filter(|p| p.output == ProbeOutput::Bf16).any(|p| {
            p.expected_f32()
                .iter()
                .any(|&x| !x.is_nan() && bf16::from_f32(x).to_f32() != x)
        });
        assert!(rounded, "no bf16 probe needs rounding");
        // Some FP8 output saturates (|v * scale| above the format's largest finite).
        let saturated = probes.iter().any(|p| match p.output {
            ProbeOutput::Fp8 { format, scale } => p
                .expected_f32()
                .iter()
                .any(|&x| (x * scale).abs() > format.max_finite()),
            _ => false,
        });
        assert!(saturated, "no FP8 probe saturates");
        // Every NaN probe has a NaN amax and a NaN-only row where its NaN is.
        for p in probes.iter().filter(|p| p.nan_row.is_some()) {
            assert!(p.expected_amax().is_nan(), "{}", p.name);
            let d = p.expected_f32();
            let row = p.nan_row.unwrap();
            assert!(d[row * p.base.n..(row + 1) * p.base.n].iter().all(|x| x.is_nan()));
            assert!(d[..row * p.base.n].iter().all(|x| x.is_finite()));
        }
        // Bias and beta really change the result.
        for p in probes.iter().filter(|p| p.bias.is_some() || p.beta != 0.0) {
            let plain = EpilogueProbe {
                bias: None,
                beta: 0.0,
                ..p.clone()
            };
            assert_ne!(plain.expected_f32(), p.expected_f32(), "{}", p.name);
        }
    }
}
