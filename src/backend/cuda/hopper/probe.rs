//! Exact probe GEMMs for the first GPU run of the Hopper kernel, in the order
//! that localizes a failure fastest (`docs/gpu-validation.md`): one tile, ring
//! wrap, K tails, ragged M/N, the persistent scheduler, block scales, variants.
//!
//! Every probe is made of small integers (`|a|, |b| <= 4`, fewer where one
//! accumulation span is long) and power-of-two scales, chosen so that every
//! partial sum the tensor core keeps stays at most 2^12 in magnitude: exact in
//! its ~13-bit accumulator however it truncates, and exact in f32 afterwards.
//! So the GPU must match [`Probe::expected`] bit for bit; any difference is a
//! kernel bug, not precision. The wide and multi-tile paths are reached with
//! [`PlanOverride`] (tile width, CTA cap) on shapes small enough to check.

use super::launch::PlanOverride;
use crate::format::{Fp8Format, Overflow};

/// Largest partial-sum magnitude a probe may produce (see the module doc).
pub const EXACT_PARTIAL_LIMIT: f64 = 4096.0;

/// How a probe's scale_inv are laid out (values are powers of two).
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeScales {
    /// One scale_inv of 1 for each operand.
    PerTensor,
    /// A 1x128 `[m, k_blocks]`, B 128x128 `[ceil(n/128), k_blocks]`.
    Block1x128By128x128 {
        /// A's grid.
        a: Vec<f32>,
        /// B's grid.
        b: Vec<f32>,
    },
    /// A 1x128 `[m, k_blocks]`, B 1x128 `[n, k_blocks]`.
    Block1x128By1x128 {
        /// A's grid.
        a: Vec<f32>,
        /// B's grid.
        b: Vec<f32>,
    },
}

/// One exact GEMM `D = A . B^T` (alpha 1, f32 output) with its launch overrides.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Review step and what it isolates, e.g. "4a ring wrap N128 K=768 split".
    pub name: String,
    /// Rows of A and D.
    pub m: usize,
    /// Rows of B, columns of D.
    pub n: usize,
    /// Reduction length (a multiple of 16).
    pub k: usize,
    /// A's format (B is E4M3).
    pub a_format: Fp8Format,
    /// `m * k` codes.
    pub a: Vec<u8>,
    /// `n * k` codes.
    pub b: Vec<u8>,
    /// The scales.
    pub scales: ProbeScales,
    /// Split accumulation (forced for block scales).
    pub split: bool,
    /// Tile width / CTA cap; bounded waits are always on for probes.
    pub tiles: PlanOverride,
}

/// A 64-bit LCG: deterministic probe data without a dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// An integer in `[-max, max]`.
    fn int(&mut self, max: i32) -> i32 {
        (self.next() % (2 * max as u64 + 1)) as i32 - max
    }
}

fn code(format: Fp8Format, v: i32) -> u8 {
    // Integers up to 4 in magnitude are exact in E4M3 and E5M2.
    format.encode(v as f32, Overflow::Saturate)
}

/// The largest `max` in {4, 2, 1} with `max^2 * span <= EXACT_PARTIAL_LIMIT`.
pub fn value_limit(span: usize) -> i32 {
    [4, 2, 1]
        .into_iter()
        .find(|&v| (v * v) as f64 * span as f64 <= EXACT_PARTIAL_LIMIT)
        .unwrap_or(1)
}

impl Probe {
    /// K elements one tensor-core partial sum covers: 128 when split, else all of K.
    pub fn span(&self) -> usize {
        if self.split { 128 } else { self.k }
    }

    fn values(&self, codes: &[u8], format: Fp8Format) -> Vec<f64> {
        codes.iter().map(|&c| format.decode(c) as f64).collect()
    }

    /// `(sA, sB)` of output (i, j) at K-block `kb`.
    fn scale(&self, i: usize, j: usize, kb: usize) -> (f64, f64) {
        let k_blocks = self.k.div_ceil(128);
        match &self.scales {
            ProbeScales::PerTensor => (1.0, 1.0),
            ProbeScales::Block1x128By128x128 { a, b } => {
                (a[i * k_blocks + kb] as f64, b[(j / 128) * k_blocks + kb] as f64)
            }
            ProbeScales::Block1x128By1x128 { a, b } => (a[i * k_blocks + kb] as f64, b[j * k_blocks + kb] as f64),
        }
    }

    /// Largest `sum |a_ik b_jk|` over any output and accumulation span (unscaled):
    /// a bound on every partial sum the tensor core holds.
    pub fn max_partial(&self) -> f64 {
        let (av, bv) = (
            self.values(&self.a, self.a_format),
            self.values(&self.b, Fp8Format::E4M3),
        );
        let span = self.span();
        let mut worst = 0.0f64;
        for i in 0..self.m {
            for j in 0..self.n {
                for k0 in (0..self.k).step_by(span) {
                    let s: f64 = (k0..(k0 + span).min(self.k))
                        .map(|k| (av[i * self.k + k] * bv[j * self.k + k]).abs())
                        .sum();
                    worst = worst.max(s);
                }
            }
        }
        worst
    }

    /// The exact product `sum_kb sA sB sum_k a b`, computed in f64 (exact here) and
    /// rounded once to f32 (exact too: the module doc's bounds keep it in range).
    pub fn expected(&self) -> Vec<f32> {
        let (av, bv) = (
            self.values(&self.a, self.a_format),
            self.values(&self.b, Fp8Format::E4M3),
        );
        let mut d = vec![0.0f32; self.m * self.n];
        for i in 0..self.m {
            for j in 0..self.n {
                let mut total = 0.0f64;
                for kb in 0..self.k.div_ceil(128) {
                    let part: f64 = (kb * 128..((kb + 1) * 128).min(self.k))
                        .map(|k| av[i * self.k + k] * bv[j * self.k + k])
                        .sum();
                    let (sa, sb) = self.scale(i, j, kb);
                    total += part * sa * sb;
                }
                d[i * self.n + j] = total as f32;
            }
        }
        d
    }
}

/// What to fill A with.
#[derive(Clone, Copy)]
enum AFill {
    /// `A[i][k] = 1` iff `k == i`: `D[i][j] = B[j][i]` (swizzle, descriptor, fragment mapping).
    Identity,
    /// Random integers only in `k in [32 s, 32 s + 32)`: the k32 descriptor advance.
    KSlice(usize),
    /// Random integers everywhere.
    Random,
}

/// Builds one probe; values are limited so every partial sum is exact.
#[allow(clippy::too_many_arguments)]
fn probe(
    name: String,
    (m, n, k): (usize, usize, usize),
    a_format: Fp8Format,
    fill: AFill,
    split: bool,
    tiles: PlanOverride,
    scales: fn(usize, usize, usize, &mut Lcg) -> ProbeScales,
    seed: u64,
) -> Probe {
    let mut rng = Lcg(seed);
    let limit = value_limit(if split { 128 } else { k });
    let a = (0..m * k)
        .map(|idx| {
            let (i, kk) = (idx / k, idx % k);
            let v = match fill {
                AFill::Identity => i32::from(kk == i),
                AFill::KSlice(s) if kk / 32 == s => rng.int(limit),
                AFill::KSlice(_) => 0,
                AFill::Random => rng.int(limit),
            };
            code(a_format, v)
        })
        .collect();
    let b = (0..n * k).map(|_| code(Fp8Format::E4M3, rng.int(limit))).collect();
    let scales = scales(m, n, k, &mut rng);
    Probe {
        name,
        m,
        n,
        k,
        a_format,
        a,
        b,
        split: split || scales != ProbeScales::PerTensor,
        scales,
        tiles: PlanOverride {
            bounded_waits: true,
            ..tiles
        },
    }
}

fn per_tensor(_: usize, _: usize, _: usize, _: &mut Lcg) -> ProbeScales {
    ProbeScales::PerTensor
}

fn power_of_two(len: usize, rng: &mut Lcg) -> Vec<f32> {
    // 2^-2..2^2: products of two stay within 2^+-4, so f32 sums of a few K-blocks stay exact.
    (0..len).map(|_| 2f32.powi(rng.int(2))).collect()
}

fn ones_128(m: usize, n: usize, k: usize, _: &mut Lcg) -> ProbeScales {
    let kb = k.div_ceil(128);
    ProbeScales::Block1x128By128x128 {
        a: vec![1.0; m * kb],
        b: vec![1.0; n.div_ceil(128) * kb],
    }
}

fn pow2_128(m: usize, n: usize, k: usize, rng: &mut Lcg) -> ProbeScales {
    let kb = k.div_ceil(128);
    ProbeScales::Block1x128By128x128 {
        a: power_of_two(m * kb, rng),
        b: power_of_two(n.div_ceil(128) * kb, rng),
    }
}

fn ones_1x128(m: usize, n: usize, k: usize, _: &mut Lcg) -> ProbeScales {
    let kb = k.div_ceil(128);
    ProbeScales::Block1x128By1x128 {
        a: vec![1.0; m * kb],
        b: vec![1.0; n * kb],
    }
}

fn pow2_1x128(m: usize, n: usize, k: usize, rng: &mut Lcg) -> ProbeScales {
    let kb = k.div_ceil(128);
    ProbeScales::Block1x128By1x128 {
        a: power_of_two(m * kb, rng),
        b: power_of_two(n * kb, rng),
    }
}

fn width(block_n: u32) -> PlanOverride {
    PlanOverride {
        block_n: Some(block_n),
        ..Default::default()
    }
}

/// The exact probes of the review's steps 3 to 7, in order. `large` adds the two
/// persistent-scheduler shapes with more tiles than SMs (4096x2112x256 and
/// 4096x4096x256: seconds of CPU reference, so only where a GPU runs them).
pub fn first_run_probes(large: bool) -> Vec<Probe> {
    use Fp8Format::{E4M3, E5M2};
    let mut v = Vec::new();
    let mut seed = 0u64;
    let mut add = |name: String, shape, a_format, fill, split, tiles, scales: fn(_, _, _, &mut Lcg) -> _| {
        seed += 1;
        v.push(probe(name, shape, a_format, fill, split, tiles, scales, seed));
    };
    let auto = PlanOverride::default();
    // 3. One tile, one CTA: identity, K slices, random integers.
    add(
        "3a identity 128^3".into(),
        (128, 128, 128),
        E4M3,
        AFill::Identity,
        true,
        auto,
        per_tensor,
    );
    for s in 0..4 {
        let name = format!("3b k-slice {s} 128^3");
        add(name, (128, 128, 128), E4M3, AFill::KSlice(s), true, auto, per_tensor);
    }
    for split in [true, false] {
        let name = format!("3c integers 128^3 split={split}");
        add(name, (128, 128, 128), E4M3, AFill::Random, split, auto, per_tensor);
    }
    add(
        "3a identity N256".into(),
        (128, 256, 128),
        E4M3,
        AFill::Identity,
        true,
        width(256),
        per_tensor,
    );
    // 4a. Ring wrap on one CTA: 6-stage ring at N128, 4-stage at N256.
    for (block_n, n, blocks) in [(128, 128, [6, 7]), (256, 256, [4, 5])] {
        for kb in blocks {
            for split in [true, false] {
                let name = format!("4a ring wrap N{block_n} K={} split={split}", kb * 128);
                add(
                    name,
                    (128, n, kb * 128),
                    E4M3,
                    AFill::Random,
                    split,
                    width(block_n),
                    per_tensor,
                );
            }
        }
    }
    // 4b. K tails; 4c. ragged M and N.
    for block_n in [128, 256] {
        for k in [16, 144, 272] {
            let name = format!("4b K tail N{block_n} K={k}");
            add(
                name,
                (128, 256, k),
                E4M3,
                AFill::Random,
                true,
                width(block_n),
                per_tensor,
            );
        }
    }
    for m in [1, 65, 129] {
        for n in [1, 127, 129, 257] {
            for block_n in [128, 256] {
                let name = format!("4c ragged {m}x{n}x256 N{block_n}");
                add(name, (m, n, 256), E4M3, AFill::Random, true, width(block_n), per_tensor);
            }
        }
    }
    // 5. Persistent scheduler: 15 (N128) or 9 (N256) tiles on 1, 2, 3 CTAs.
    for block_n in [128, 256] {
        for ctas in [1, 2, 3] {
            for split in [true, false] {
                let tiles = PlanOverride {
                    block_n: Some(block_n),
                    max_ctas: Some(ctas),
                    bounded_waits: true,
                };
                let name = format!("5 persistent 300x520x256 N{block_n} ctas={ctas} split={split}");
                add(name, (300, 520, 256), E4M3, AFill::Random, split, tiles, per_tensor);
            }
        }
    }
    if large {
        for (m, n) in [(4096, 2112), (4096, 4096)] {
            let name = format!("5 persistent {m}x{n}x256 (more tiles than SMs)");
            add(name, (m, n, 256), E4M3, AFill::Random, true, auto, per_tensor);
        }
    }
    // 6. Block scales: all ones (= per tensor), then powers of two; both B layouts, both widths.
    type Scales = fn(usize, usize, usize, &mut Lcg) -> ProbeScales;
    let modes: [(&str, Scales); 4] = [
        ("1x128 x 128x128 ones", ones_128),
        ("1x128 x 128x128 powers of two", pow2_128),
        ("1x128 x 1x128 ones", ones_1x128),
        ("1x128 x 1x128 powers of two", pow2_1x128),
    ];
    for (what, scales) in modes {
        for block_n in [128, 256] {
            let name = format!("6 block scales {what} 200x384x512 N{block_n}");
            add(name, (200, 384, 512), E4M3, AFill::Random, true, width(block_n), scales);
        }
    }
    // 7. Variants: E5M2 A at both widths, split and fast.
    for block_n in [128, 256] {
        for split in [true, false] {
            let name = format!("7 E5M2 x E4M3 N{block_n} split={split}");
            add(
                name,
                (200, 300, 384),
                E5M2,
                AFill::Random,
                split,
                width(block_n),
                per_tensor,
            );
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::hopper::heuristic;
    use crate::gemm::{GemmParams, Operand, Output, cpu};
    use crate::tensor::{QuantizedMatrix, Scales};

    fn cpu_reference(p: &Probe) -> Vec<f32> {
        let (sa, sb) = match &p.scales {
            ProbeScales::PerTensor => (Scales::PerTensor(1.0), Scales::PerTensor(1.0)),
            ProbeScales::Block1x128By128x128 { a, b } => {
                (Scales::Block1x128(a.clone()), Scales::Block128x128(b.clone()))
            }
            ProbeScales::Block1x128By1x128 { a, b } => (Scales::Block1x128(a.clone()), Scales::Block1x128(b.clone())),
        };
        let qa = QuantizedMatrix::new(p.a.clone(), p.m, p.k, sa).unwrap();
        let qb = QuantizedMatrix::new(p.b.clone(), p.n, p.k, sb).unwrap();
        let mut d = vec![0.0f32; p.m * p.n];
        let params = GemmParams {
            split_accumulator: p.split,
            ..Default::default()
        };
        let (a, b) = (Operand::Fp8(p.a_format, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
        cpu::gemm(&a, &b, Output::F32(&mut d), &params).unwrap();
        d
    }

    #[test]
    fn every_partial_sum_is_exact_and_the_cpu_reference_agrees_bit_for_bit() {
        let probes = first_run_probes(false);
        assert!(probes.len() > 60, "{}", probes.len());
        for p in &probes {
            assert!(
                p.max_partial() <= EXACT_PARTIAL_LIMIT,
                "{}: {}",
                p.name,
                p.max_partial()
            );
            assert!(p.k.is_multiple_of(16) && p.tiles.bounded_waits, "{}", p.name);
            let expected = p.expected();
            let reference = cpu_reference(p);
            for (idx, (e, r)) in expected.iter().zip(&reference).enumerate() {
                assert_eq!(e.to_bits(), r.to_bits(), "{}: element {idx}: {e} vs {r}", p.name);
            }
            // Not all zero (beyond tiny outputs): a kernel that writes nothing must fail.
            assert!(expected.len() < 64 || expected.iter().any(|&x| x != 0.0), "{}", p.name);
        }
    }

    #[test]
    fn identity_probe_transposes_b() {
        let p = &first_run_probes(false)[0];
        assert!(p.name.starts_with("3a identity"));
        let d = p.expected();
        for i in 0..p.m {
            for j in 0..p.n {
                assert_eq!(d[i * p.n + j], Fp8Format::E4M3.decode(p.b[j * p.k + i]));
            }
        }
    }

    #[test]
    fn k_slice_probes_touch_only_their_slice() {
        for p in first_run_probes(false).iter().filter(|p| p.name.starts_with("3b")) {
            let s: usize = p.name["3b k-slice ".len()..][..1].parse().unwrap();
            for (idx, &c) in p.a.iter().enumerate() {
                if (idx % p.k) / 32 != s {
                    assert_eq!(Fp8Format::E4M3.decode(c), 0.0, "{}", p.name);
                }
            }
        }
    }

    #[test]
    fn probes_reach_wide_tiles_ring_wrap_and_several_tiles_per_cta() {
        use crate::backend::cuda::hopper::launch::{LaunchShape, plan_with};
        use crate::backend::cuda::params::{FP8_GEMM_OUT_F32, FP8_GEMM_SCALES_PER_TENSOR};
        let (mut wide, mut wrapped, mut multi) = (false, false, false);
        for p in first_run_probes(false)
            .iter()
            .filter(|p| p.scales == ProbeScales::PerTensor)
        {
            let s = LaunchShape {
                m: p.m,
                n: p.n,
                k: p.k,
                a_format: p.a_format,
                b_format: Fp8Format::E4M3,
                scale_mode: FP8_GEMM_SCALES_PER_TENSOR,
                out_dtype: FP8_GEMM_OUT_F32,
                beta: 0.0,
                split_accumulator: p.split,
                lens: [p.a.len(), p.b.len(), p.m * p.n, 1, 1],
                optional_lens: [None, None, None, None],
            };
            let plan = plan_with(&s, heuristic::H100_SMS, p.tiles).unwrap();
            assert!(plan.kernel.ends_with("_bounded"), "{}", p.name);
            wide |= plan.config.block_n == 256;
            wrapped |= plan.k_blocks > plan.config.stages && plan.config.block_n == 256;
            multi |= plan.config.tiles >= 3 * plan.config.ctas;
        }
        assert!(wide && wrapped && multi, "wide {wide} wrapped {wrapped} multi {multi}");
    }

    #[test]
    fn value_limits_keep_spans_exact() {
        assert_eq!(value_limit(128), 4);
        assert_eq!(value_limit(768), 2);
        assert_eq!(value_limit(1024), 2);
        assert_eq!(value_limit(4096), 1);
    }
}
