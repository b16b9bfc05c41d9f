//! The softmax `exp` against `f64::exp`: its error bound, the inputs where it differs from
//! `(x as f64).exp() as f32`, and the same bits from the scalar and the vector loops.

use rayon::prelude::*;

use super::*;

/// Error of `got` against the exact `want` in units of the f32 spacing next to `got` on
/// `want`'s side (0.5 or less: `got` is `want` correctly rounded).
fn ulps(got: f32, want: f64) -> f64 {
    let other = if want > f64::from(got) {
        got.next_up()
    } else {
        got.next_down()
    };
    (f64::from(got) - want).abs() / (f64::from(other) - f64::from(got)).abs()
}

#[derive(Default)]
struct Survey {
    /// Finite, non-NaN inputs checked.
    inputs: u64,
    /// The largest error in ulp of a finite result.
    worst: f64,
    /// Inputs whose result differs from `(x as f64).exp() as f32`.
    differ: u64,
    /// Inputs `<= 0` and `> 0` whose result differs from `f32::exp` (the C library's `expf`,
    /// which the softmax called before: reported, not checked).
    libm: (u64, u64),
}

impl Survey {
    fn add(self, o: Survey) -> Survey {
        Survey {
            inputs: self.inputs + o.inputs,
            worst: self.worst.max(o.worst),
            differ: self.differ + o.differ,
            libm: (self.libm.0 + o.libm.0, self.libm.1 + o.libm.1),
        }
    }
}

/// Checks `exp` on `xs`: NaN stays NaN, overflow gives `+inf` exactly where the rounded value
/// does, and the vector loop gives the scalar bits.
fn check(xs: &[f32]) -> Survey {
    let mut vector = xs.to_vec();
    exp_shifted(&mut vector, 0.0); // x - 0 is x (and -0 stays -0)
    let mut s = Survey::default();
    for (&x, &v) in xs.iter().zip(&vector) {
        let got = exp(x);
        if x.is_nan() {
            assert!(got.is_nan() && v.is_nan(), "exp(NaN) = {got}, vector {v}");
            continue;
        }
        assert_eq!(got.to_bits(), v.to_bits(), "exp({x:e}): scalar {got:e}, vector {v:e}");
        let want = f64::from(x).exp();
        let rounded = want as f32;
        if got.to_bits() != rounded.to_bits() {
            s.differ += 1;
            assert!(
                got.is_finite() && rounded.is_finite(),
                "exp({x:e}) = {got:e}, rounded {rounded:e}"
            );
        }
        if got.to_bits() != x.exp().to_bits() {
            if x <= 0.0 { s.libm.0 += 1 } else { s.libm.1 += 1 }
        }
        if got.is_finite() {
            s.worst = s.worst.max(ulps(got, want));
        }
        s.inputs += 1;
    }
    s
}

/// Every `stride`-th f32 bit pattern, in runs of 4096 (one vector call each).
fn survey(stride: u64) -> Survey {
    let n = (1u64 << 32).div_ceil(stride);
    (0..n.div_ceil(4096))
        .into_par_iter()
        .map(|c| {
            let xs: Vec<f32> = (c * 4096..((c + 1) * 4096).min(n))
                .map(|i| f32::from_bits((i * stride) as u32))
                .collect();
            check(&xs)
        })
        .reduce(Survey::default, Survey::add)
}

/// The bound of `docs/numerics.md`: correctly rounded but within 1e-6 ulp of a midpoint
/// (the analysis gives ~4e-9; f64::exp's own error is about 1e-16 relative).
const BOUND: f64 = 0.5 + 1e-6;

/// Prints what a survey found and asserts the bound on its worst error.
fn report_and_bound(s: &Survey) {
    eprintln!(
        "{} inputs: worst {} ulp, {} differ from f64::exp rounded",
        s.inputs, s.worst, s.differ
    );
    eprintln!("differ from f32::exp: {} inputs <= 0, {} above", s.libm.0, s.libm.1);
    assert!(s.worst <= BOUND, "worst {} ulp", s.worst);
}

#[test]
fn exp_is_correctly_rounded_but_near_midpoints_on_a_dense_sample() {
    // Every 61st bit pattern: 70 M inputs, every exponent and both signs.
    let s = survey(61);
    report_and_bound(&s);
    assert!(s.inputs > 70_000_000);
}

/// All 2^32 inputs: `cargo test --release --lib softmax_exp -- --ignored --nocapture`.
#[test]
#[ignore]
fn exp_is_correctly_rounded_but_near_midpoints_on_every_input() {
    let s = survey(1);
    report_and_bound(&s);
}

#[test]
fn ends_and_special_values() {
    let min_normal = f32::MIN_POSITIVE.ln(); // -87.336
    let min_sub = f32::from_bits(1).ln(); // -103.279
    let max = f32::MAX.ln(); // 88.7228
    let cases = [
        (f32::NEG_INFINITY, 0.0),
        (0.0, 1.0),
        (-0.0, 1.0),
        (f32::from_bits(1), 1.0),
        (-f32::from_bits(1), 1.0),
        (-1e-8, 1.0),
        (-104.0, 0.0),
        (-110.0, 0.0),
        (-1e30, 0.0),
        (f32::MIN, 0.0),
        (89.0, f32::INFINITY),
        (1e30, f32::INFINITY),
        (f32::INFINITY, f32::INFINITY),
    ];
    for (x, want) in cases {
        assert_eq!(exp(x), want, "exp({x:e})");
    }
    // Both sides of each limit: the last normal and subnormal results, the overflow.
    for x in [min_normal, min_sub, max] {
        for x in [x.next_down(), x, x.next_up()] {
            let (got, want) = (exp(x), f64::from(x).exp());
            assert_eq!(got, want as f32, "exp({x:e})");
            assert!(got.is_infinite() || ulps(got, want) <= BOUND, "exp({x:e})");
        }
    }
    // ln(f32::MAX) = 88.7228391 lies between these two f32 values.
    assert!(exp(88.722_83).is_finite() && exp(88.722_84).is_infinite());
    assert!(exp(f32::NAN).is_nan() && exp(-f32::NAN).is_nan());
    // Every 4099th input through the vector loop at every tail length, with a shift.
    let xs: Vec<f32> = (0..1u32 << 20).map(|i| f32::from_bits(i.wrapping_mul(4099))).collect();
    for len in 0..40 {
        let mut v = xs[..len].to_vec();
        exp_shifted(&mut v, 0.75);
        for (&x, &g) in xs.iter().zip(&v) {
            let want = exp(x - 0.75);
            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{x:e}");
        }
    }
    let mut v = xs.clone();
    exp_shifted(&mut v, -3.5);
    for (&x, &g) in xs.iter().zip(&v) {
        let want = exp(x + 3.5);
        assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{x:e}");
    }
}

#[test]
fn the_fma_loop_gives_the_same_bits() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        let xs: Vec<f32> = (0..1 << 20).map(|i| f32::from_bits(i * 4093)).collect();
        let mut v = xs.clone();
        // SAFETY: the CPU has FMA (checked above).
        unsafe { exp_shifted_fma(&mut v, 1.25) };
        for (&x, &g) in xs.iter().zip(&v) {
            let want = exp(x - 1.25);
            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{x:e}");
        }
    }
}

#[test]
fn the_table_holds_two_to_the_sixteenths() {
    for (j, &t) in T.iter().enumerate() {
        let want = (j as f64 / 16.0).exp2();
        let got = f64::from_bits(t);
        // libm's exp2 is within 1 ulp; the table is the correct rounding (80 digits).
        assert!(
            (got - want).abs() <= f64::EPSILON * want,
            "T[{j}] = {got} against {want}"
        );
    }
    assert_eq!(f64::from_bits(T[8]), std::f64::consts::SQRT_2);
    assert_eq!(C_HI, std::f64::consts::LN_2 / 16.0);
    assert!(C_LO.abs() < C_HI * f64::EPSILON);
}
