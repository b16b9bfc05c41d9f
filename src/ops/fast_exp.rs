//! `exp` and the logistic sigmoid in branch-free f32 arithmetic, so that loops over slices
//! vectorize (libm's scalar `expf`/`tanhf` were a fifth of a layer's time in GELU).
//! Plain multiplies and adds, no fused multiply-add: the same bits at every vector width, and
//! a CUDA twin gets them with `__fmul_rn`/`__fadd_rn`. Accuracy: `docs/numerics.md`, Activations.

/// Inputs above this overflow to `+inf` through the final doubling (`ln(f32::MAX)` is 88.72).
const EXP_HI: f32 = 89.0;
/// Inputs below this give 0: the `2^(n - 1)` scale stays a normal number down to `n = -125`,
/// and `exp(-86.5) = 2.7e-38` is 2.3x `f32::MIN_POSITIVE`.
const EXP_LO: f32 = -86.5;
/// log2(e).
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 in two parts: the high part has 9 significant bits, so `n * LN2_HI` is exact for
/// `|n| <= 128` and `x - n * LN2_HI` loses nothing.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to an integer (ties to even) and leaves that integer in the
/// low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;
/// `exp(r) = 1 + r + r^2 (Q0 + Q1 r + Q2 r^2 + Q3 r^3 + Q4 r^4)` on `|r| <= ln(2) / 2`: a
/// relative-error minimax fit (iteratively reweighted least squares, rounded to f32),
/// 3.8e-9 relative before f32 rounding, below one ulp (6e-8).
const Q: [f32; 5] = [0.499_999_94, 0.166_665_21, 0.041_668_39, 0.008_368_718, 0.001_381_461_4];

/// `e^x` to within 1 ulp (0.982 over all inputs, `docs/numerics.md`, Activations); `+inf` above 88.72, 0 below
/// -86.5, NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // Comparisons are false for NaN, which therefore flows through to the result.
    let xc = if x > EXP_HI { EXP_HI } else { x };
    let xc = if xc < EXP_LO { EXP_LO } else { xc };
    let shifted = xc * LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let q = Q[0] + r * (Q[1] + r * (Q[2] + r * (Q[3] + r * Q[4])));
    let p = 1.0 + (r + r * r * q);
    // The integer n sits in the low bits of `shifted`; 2^(n - 1) is built from its exponent
    // field (n in -125..=128), and the final doubling overflows to inf for n = 128.
    let n_int = shifted.to_bits() as i32 - ROUNDER.to_bits() as i32;
    let half_scale = f32::from_bits(((n_int + 126) as u32) << 23);
    let e = p * half_scale * 2.0;
    if x < EXP_LO { 0.0 } else { e }
}

/// `1 / (1 + e^-x)`: 0 for `x < -88.8` (the exponential overflows), 1 for big `x`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::*;

    /// `|got - want|` in units of the spacing of f32 at `want` (the f32 ulp, subnormal-aware).
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = if w.is_finite() && w != 0.0 {
            (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64
        } else {
            f32::from_bits(1) as f64
        };
        (got as f64 - want).abs() / ulp
    }

    /// The largest error in ulp over every `stride`-th f32 bit pattern whose exp is a normal
    /// f32 (`-86.5 <= x <= 88.72`), and the checks of the flushed and overflowing ends.
    fn worst_exp_error(stride: usize) -> f64 {
        (0..(1usize << 32).div_ceil(stride))
            .into_par_iter()
            .map(|i| {
                let x = f32::from_bits((i * stride) as u32);
                let got = exp(x);
                if x.is_nan() {
                    assert!(got.is_nan(), "exp(NaN) = {got}");
                    return 0.0;
                }
                let want = (x as f64).exp();
                if x < EXP_LO {
                    assert_eq!(got, 0.0, "exp({x}) flushes to 0");
                    return 0.0;
                }
                if want > f32::MAX as f64 {
                    assert_eq!(got, f32::INFINITY, "exp({x}) overflows");
                    return 0.0;
                }
                ulps(got, want)
            })
            .reduce(|| 0.0, f64::max)
    }

    #[test]
    fn exp_is_within_one_ulp_on_a_dense_sample() {
        // Every 61st bit pattern: 70 M inputs, every exponent and both signs.
        let worst = worst_exp_error(61);
        assert!(worst < 1.0, "worst exp error {worst} ulp");
    }

    /// All 2^32 inputs: `cargo test --release --lib fast_exp -- --ignored` (~1 min on 2 cores).
    #[test]
    #[ignore]
    fn exp_is_within_one_ulp_on_every_input() {
        let worst = worst_exp_error(1);
        eprintln!("worst exp error over all f32: {worst} ulp");
        assert!(worst < 1.0, "worst exp error {worst} ulp");
    }

    #[test]
    fn exp_ends_and_special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert!(exp(88.72).is_finite());
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(sigmoid(-100.0), 0.0);
        assert_eq!(sigmoid(100.0), 1.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
