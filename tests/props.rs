//! Property tests of the FP8 and E8M0 encoders: sign symmetry, monotonicity,
//! half-ulp accuracy in range, saturation at the edges, agreement with the
//! `float8` crate's (CUDA-derived) conversion.

use fp8_engine::format::{Fp8Format, Overflow, decode_e8m0, encode_e8m0};
use proptest::prelude::*;

const MODES: [Overflow; 2] = [Overflow::Saturate, Overflow::NonSaturating];

/// Any non-NaN f32, from its bits (so huge, tiny and subnormal values all occur).
fn any_non_nan() -> impl Strategy<Value = f32> {
    any::<u32>()
        .prop_map(f32::from_bits)
        .prop_filter("not NaN", |x| !x.is_nan())
}

/// Values around the FP8 ranges, where the interesting rounding happens.
fn fp8_range() -> impl Strategy<Value = f32> {
    prop_oneof![
        -70000.0f32..70000.0,
        -600.0f32..600.0,
        -0.02f32..0.02,
        -1.0e-4f32..1.0e-4,
        any_non_nan(),
    ]
}

fn format() -> impl Strategy<Value = Fp8Format> {
    prop_oneof![Just(Fp8Format::E4M3), Just(Fp8Format::E5M2)]
}

/// Distance between adjacent values at |x| (f64), from the format's fields.
fn ulp(format: Fp8Format, x: f64) -> f64 {
    let (man_bits, bias) = match format {
        Fp8Format::E4M3 => (3, 7),
        Fp8Format::E5M2 => (2, 15),
    };
    let exponent = (x.abs().log2().floor() as i32).max(1 - bias); // subnormals share the lowest binade's ulp
    2f64.powi(exponent - man_bits)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn sign_symmetry(format in format(), x in fp8_range()) {
        for overflow in MODES {
            let pos = format.encode(x, overflow);
            let neg = format.encode(-x, overflow);
            prop_assert_eq!(pos ^ 0x80, neg);
            if !format.is_nan(pos) {
                prop_assert_eq!(format.decode(neg).to_bits(), (-format.decode(pos)).to_bits());
            }
        }
    }

    #[test]
    fn monotone(format in format(), a in fp8_range(), b in fp8_range()) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        for overflow in MODES {
            let (qlo, qhi) = (format.decode(format.encode(lo, overflow)), format.decode(format.encode(hi, overflow)));
            if !qlo.is_nan() && !qhi.is_nan() {
                prop_assert!(qlo <= qhi, "{} {:?}: {} -> {}, {} -> {}", format, overflow, lo, qlo, hi, qhi);
            }
        }
    }

    #[test]
    fn within_half_ulp_in_range((format, x) in format().prop_flat_map(|f| {
        let max = f.max_finite();
        (Just(f), prop_oneof![-max..=max, -1.0f32..1.0, -0.02f32..0.02, -1.0e-4f32..1.0e-4])
    })) {
        for overflow in MODES {
            let q = format.decode(format.encode(x, overflow)) as f64;
            let err = (q - x as f64).abs();
            prop_assert!(err <= ulp(format, x as f64) / 2.0, "{} {}: {} (err {})", format, x, q, err);
        }
    }

    #[test]
    fn saturation_at_the_edges(format in format(), over in 0.0f64..1.0e6, negative in any::<bool>()) {
        let max = format.max_finite() as f64;
        // Half an ulp above max is the overflow boundary; E4M3's top tie rounds down to max (even).
        let boundary = max + ulp(format, max) / 2.0;
        let magnitude = (max + over * ulp(format, max) / 4.0) as f32;
        let x = if negative { -magnitude } else { magnitude };
        let sign = if negative { -1.0f32 } else { 1.0 };
        prop_assert_eq!(format.decode(format.encode(x, Overflow::Saturate)), sign * format.max_finite());
        let nonsat = format.decode(format.encode(x, Overflow::NonSaturating));
        let overflows = match format {
            Fp8Format::E4M3 => magnitude as f64 > boundary,
            Fp8Format::E5M2 => magnitude as f64 >= boundary,
        };
        match (overflows, format) {
            (false, _) => prop_assert_eq!(nonsat, sign * format.max_finite()),
            (true, Fp8Format::E4M3) => prop_assert!(nonsat.is_nan()),
            (true, Fp8Format::E5M2) => prop_assert_eq!(nonsat, sign * f32::INFINITY),
        }
    }

    #[test]
    fn agrees_with_float8_crate_saturating(x in fp8_range()) {
        prop_assert_eq!(Fp8Format::E4M3.encode(x, Overflow::Saturate), float8::F8E4M3::from_f32(x).to_bits(), "e4m3 {}", x);
        prop_assert_eq!(Fp8Format::E5M2.encode(x, Overflow::Saturate), float8::F8E5M2::from_f32(x).to_bits(), "e5m2 {}", x);
    }

    #[test]
    fn e8m0_is_the_nearest_power_of_two(x in 1.0e-38f32..1.0e38) {
        let code = encode_e8m0(x, Overflow::Saturate);
        let p = decode_e8m0(code) as f64;
        let (x, e) = (x as f64, (p.log2()) as i32);
        prop_assert_eq!(p, 2f64.powi(e), "a power of two");
        // Nearest by linear distance: no neighbour is strictly closer.
        let (below, above) = (2f64.powi(e - 1), 2f64.powi(e + 1));
        prop_assert!((p - x).abs() <= (below - x).abs() && (p - x).abs() <= (above - x).abs(), "{} -> {}", x, p);
    }
}
