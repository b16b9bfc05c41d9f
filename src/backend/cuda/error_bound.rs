//! How far a GPU GEMM may be from its reference, as a bound per output element,
//! and the worst `error / bound` ratio of a result, which GPU tests and benches
//! print (1.0 uses the whole budget; above 1 fails).
//!
//! GPU and CPU sum the same exact products in different orders, and FP8 tensor
//! cores truncate their accumulator inside one mma (K = 32), so output (i, j) may be off
//! by `S_ij * (K / step + 2) * 2^-bits` with `S_ij = |alpha| sum_k |a_ik b_jk| sA sB`:
//! step 32 and [`FP8_ACCUMULATOR_BITS`] for FP8 inputs, step 16 and 22 bits for
//! 16-bit inputs (the bound `tests/gpu_gemm.rs` uses). The output's rounding adds one
//! unit in its last place at the larger magnitude, plus its smallest subnormal.

/// Bits the FP8 bound charges per k32 mma: 12, measured. The H200's wgmma FP8
/// accumulator erred by up to 6.6 * 2^-13 * S at K = 128 (4 mmas; split and fast alike,
/// `docs/numerics.md`, first GPU run), past the 6 * 2^-13 * S a 13-bit charge allows:
/// it keeps 13 significant bits and truncates, so each step costs up to 2^-12 of S.
pub const FP8_ACCUMULATOR_BITS: i32 = 12;

/// K per tensor-core mma and the bits kept by its accumulator, per input kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulation {
    /// FP8 inputs: k32 mma, [`FP8_ACCUMULATOR_BITS`].
    Fp8,
    /// bf16/f16 inputs: k16 mma, ~22 bits.
    Half,
}

/// Bound on the f32 accumulation error of one output with magnitude `s` (`S_ij` above) and reduction length `k`.
pub fn accumulation_bound(kind: Accumulation, s: f64, k: usize) -> f64 {
    let (step, bits) = match kind {
        Accumulation::Fp8 => (32.0, FP8_ACCUMULATOR_BITS),
        Accumulation::Half => (16.0, 22),
    };
    s * (k as f64 / step + 2.0) * 2f64.powi(-bits)
}

/// Relative spacing and smallest subnormal of an output type (f32: none counted).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputUlp {
    /// One unit in the last place relative to the value, at most: 2^-(stored mantissa
    /// bits), the ulp of a value just above a power of two (bf16: 2^-7, not 2^-8).
    pub relative: f64,
    /// Smallest positive subnormal, in output units.
    pub subnormal: f64,
}

impl OutputUlp {
    /// f32 output: its rounding is inside the accumulation bound.
    pub const F32: OutputUlp = OutputUlp {
        relative: 0.0,
        subnormal: 0.0,
    };
    /// bf16 output.
    pub const BF16: OutputUlp = OutputUlp {
        relative: 1.0 / 128.0,
        subnormal: 1e-38,
    };
    /// fp16 output.
    pub const F16: OutputUlp = OutputUlp {
        relative: 1.0 / 1024.0,
        subnormal: 1.0 / 16_777_216.0,
    };
    /// E4M3 output (before dividing by the output scale).
    pub const E4M3: OutputUlp = OutputUlp {
        relative: 1.0 / 8.0,
        subnormal: 1.0 / 512.0,
    };
    /// E5M2 output (before dividing by the output scale).
    pub const E5M2: OutputUlp = OutputUlp {
        relative: 1.0 / 4.0,
        subnormal: 1.0 / 65_536.0,
    };
}

/// The worst element of a comparison: `|got - reference| / bound` and where.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorstRatio {
    /// Largest ratio (infinite for a NaN where the reference is finite, or a non-finite mismatch).
    pub ratio: f64,
    /// Index of that element.
    pub index: usize,
    /// The result there.
    pub got: f64,
    /// The reference there.
    pub reference: f64,
    /// The bound there.
    pub bound: f64,
}

impl WorstRatio {
    /// Within the bound everywhere.
    pub fn passed(&self) -> bool {
        self.ratio <= 1.0
    }
}

impl std::fmt::Display for WorstRatio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "err/bound={:.3} (element {}: got {} reference {} bound {:.3e})",
            self.ratio, self.index, self.got, self.reference, self.bound
        )
    }
}

/// Worst `|got - reference| / bound` where element i's bound is `accumulation[i]`
/// plus one output ulp at the larger magnitude plus `ulp.subnormal / out_scale`.
/// Equal non-finite values (same infinity, NaN for NaN) count as exact.
pub fn worst_ratio(got: &[f32], reference: &[f32], accumulation: &[f64], ulp: OutputUlp, out_scale: f64) -> WorstRatio {
    let mut worst = WorstRatio {
        ratio: 0.0,
        index: 0,
        got: 0.0,
        reference: 0.0,
        bound: 0.0,
    };
    for (i, ((&g, &r), &acc)) in got.iter().zip(reference).zip(accumulation).enumerate() {
        let (g, r) = (g as f64, r as f64);
        let bound = acc + ulp.relative * g.abs().max(r.abs()) + ulp.subnormal / out_scale;
        let ratio = if g == r || (g.is_nan() && r.is_nan()) {
            0.0
        } else if !(g - r).is_finite() || bound == 0.0 {
            f64::INFINITY
        } else {
            (g - r).abs() / bound
        };
        if ratio > worst.ratio || (i == 0 && ratio == 0.0) {
            worst = WorstRatio {
                ratio,
                index: i,
                got: g,
                reference: r,
                bound,
            };
        }
    }
    if got.len() != reference.len() || got.len() != accumulation.len() {
        worst.ratio = f64::INFINITY;
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulation_bound_grows_with_k() {
        // S = 2^12, K = 32 * 6: (6 + 2) * 2^-12 * 2^12 = 8.
        assert_eq!(accumulation_bound(Accumulation::Fp8, 4096.0, 192), 8.0);
        assert_eq!(accumulation_bound(Accumulation::Half, 4_194_304.0, 32), 4.0);
        assert!(accumulation_bound(Accumulation::Fp8, 1.0, 4096) > accumulation_bound(Accumulation::Fp8, 1.0, 128));
    }

    #[test]
    fn ratio_is_error_over_bound() {
        let w = worst_ratio(
            &[1.0, 2.5, 3.0],
            &[1.0, 2.0, 3.0],
            &[1.0, 1.0, 1.0],
            OutputUlp::F32,
            1.0,
        );
        assert_eq!((w.ratio, w.index), (0.5, 1));
        assert!(w.passed());
        let w = worst_ratio(&[1.0, 4.0], &[1.0, 2.0], &[1.0, 1.0], OutputUlp::F32, 1.0);
        assert_eq!(w.ratio, 2.0);
        assert!(!w.passed());
        assert!(w.to_string().starts_with("err/bound=2.000"), "{w}");
    }

    #[test]
    fn output_ulp_widens_the_bound() {
        // bf16: 2^-7 of 256 = 2 on top of the accumulation bound 1.
        let w = worst_ratio(&[257.0], &[256.0], &[1.0], OutputUlp::BF16, 1.0);
        assert!((w.ratio - 1.0 / 3.0).abs() < 1e-3, "{w}");
    }

    #[test]
    fn one_output_ulp_apart_fits_just_above_a_power_of_two() {
        // The first GPU run's case: bf16 272384 vs 274432 (2^18 * 1.039), one bf16 step
        // (2048) apart, with a small accumulation bound. 2^-8 of the value (1072) was too little.
        for (ulp, lo, hi) in [
            (OutputUlp::BF16, 272_384.0f32, 274_432.0f32),
            (OutputUlp::F16, 1026.0, 1027.0),
            (OutputUlp::E4M3, 18.0, 20.0),
            (OutputUlp::E5M2, 20.0, 24.0),
        ] {
            let w = worst_ratio(&[lo], &[hi], &[1e-6], ulp, 1.0);
            assert!(w.passed(), "{ulp:?}: {w}");
        }
    }

    #[test]
    fn exact_bound_and_specials() {
        // A zero bound: exact equality passes, any difference is infinitely over.
        assert_eq!(worst_ratio(&[3.0], &[3.0], &[0.0], OutputUlp::F32, 1.0).ratio, 0.0);
        assert!(
            worst_ratio(&[3.0], &[4.0], &[0.0], OutputUlp::F32, 1.0)
                .ratio
                .is_infinite()
        );
        assert!(
            worst_ratio(&[f32::NAN], &[1.0], &[1.0], OutputUlp::F32, 1.0)
                .ratio
                .is_infinite()
        );
        assert_eq!(
            worst_ratio(&[f32::NAN], &[f32::NAN], &[0.0], OutputUlp::F32, 1.0).ratio,
            0.0
        );
        assert_eq!(
            worst_ratio(&[f32::INFINITY], &[f32::INFINITY], &[0.0], OutputUlp::F32, 1.0).ratio,
            0.0
        );
        assert!(
            worst_ratio(&[1.0, 2.0], &[1.0], &[1.0], OutputUlp::F32, 1.0)
                .ratio
                .is_infinite()
        );
    }
}
