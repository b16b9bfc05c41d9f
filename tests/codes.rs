//! Every code of every 8-bit format: decodes to the value the spec's table
//! implies (computed here from sign/exponent/mantissa fields in f64, not with
//! the crate's bit tricks) and re-encodes to itself, NaNs to a NaN.

mod common;

use common::value_from_fields;
use fp8_engine::format::{E4M3, E5M2, E8M0, Format, Fp8Format, Overflow, decode_e8m0, encode_e8m0};

/// What the spec's table says a code is.
#[derive(Debug, PartialEq)]
enum Expected {
    Finite(f64),
    Inf(f64),
    NaN,
}

fn expected_e4m3(code: u8) -> Expected {
    if code & 0x7F == 0x7F {
        Expected::NaN // 0x7F, 0xFF
    } else {
        Expected::Finite(value_from_fields(code, 4, 3, 7))
    }
}

fn expected_e5m2(code: u8) -> Expected {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    match code & 0x7F {
        0x7C => Expected::Inf(sign),
        0x7D..=0x7F => Expected::NaN,
        _ => Expected::Finite(value_from_fields(code, 5, 2, 15)),
    }
}

fn check_fp8(format: Fp8Format, expected: fn(u8) -> Expected) {
    for code in 0..=255u8 {
        let got = format.decode(code);
        match expected(code) {
            Expected::NaN => {
                assert!(got.is_nan(), "{format} {code:#04x} should be NaN, got {got}");
                assert!(format.is_nan(code));
                for overflow in [Overflow::Saturate, Overflow::NonSaturating] {
                    let again = format.encode(got, overflow);
                    assert!(format.is_nan(again), "{format} NaN re-encoded to {again:#04x}");
                }
            }
            Expected::Inf(sign) => {
                assert_eq!(got, sign as f32 * f32::INFINITY, "{format} {code:#04x}");
                assert!(format.is_infinite(code));
                assert_eq!(format.encode(got, Overflow::NonSaturating), code);
                // Saturating casts turn inf into max finite.
                assert_eq!(
                    format.decode(format.encode(got, Overflow::Saturate)),
                    sign as f32 * format.max_finite()
                );
            }
            Expected::Finite(v) => {
                assert_eq!(got as f64, v, "{format} {code:#04x}");
                assert_eq!(
                    got.is_sign_negative(),
                    code & 0x80 != 0,
                    "{format} {code:#04x} sign (-0 kept)"
                );
                assert!(!format.is_nan(code) && !format.is_infinite(code));
                for overflow in [Overflow::Saturate, Overflow::NonSaturating] {
                    assert_eq!(format.encode(got, overflow), code, "{format} {code:#04x} round trip");
                }
            }
        }
    }
}

#[test]
fn e4m3_every_code_matches_the_table_and_round_trips() {
    check_fp8(Fp8Format::E4M3, expected_e4m3);
}

#[test]
fn e5m2_every_code_matches_the_table_and_round_trips() {
    check_fp8(Fp8Format::E5M2, expected_e5m2);
}

#[test]
fn e8m0_every_code_is_a_power_of_two_and_round_trips() {
    for code in 0..=255u8 {
        let got = decode_e8m0(code);
        if code == 0xFF {
            assert!(got.is_nan());
            assert_eq!(encode_e8m0(got, Overflow::Saturate), 0xFF);
            continue;
        }
        assert_eq!(got as f64, 2f64.powi(code as i32 - 127), "e8m0 {code:#04x}");
        assert_eq!(E8M0::from_bits(code).to_f32(), got);
        for overflow in [Overflow::Saturate, Overflow::NonSaturating] {
            assert_eq!(encode_e8m0(got, overflow), code);
        }
    }
}

#[test]
fn scalar_newtypes_agree_with_the_format_codecs_and_float8() {
    for code in 0..=255u8 {
        let a = E4M3::from_bits(code);
        let b = E5M2::from_bits(code);
        assert_eq!(a.to_f32().to_bits(), Fp8Format::E4M3.decode(code).to_bits());
        assert_eq!(b.to_f32().to_bits(), Fp8Format::E5M2.decode(code).to_bits());
        assert_eq!(a.is_nan(), expected_e4m3(code) == Expected::NaN);
        assert_eq!(b.is_infinite(), matches!(expected_e5m2(code), Expected::Inf(_)));
        // The float8 crate's decoding is correct even where its constants are not.
        let f8a: float8::F8E4M3 = a.into();
        let f8b: float8::F8E5M2 = b.into();
        assert_eq!(E4M3::from(f8a), a);
        if !a.is_nan() {
            assert_eq!(f8a.to_f32(), a.to_f32(), "float8 e4m3 {code:#04x}");
        }
        if !b.is_nan() {
            assert_eq!(f8b.to_f32(), b.to_f32(), "float8 e5m2 {code:#04x}");
        }
    }
}

#[test]
fn catalog_agrees_with_the_typed_codecs() {
    for code in 0..=255u16 {
        let fp8 = [(Format::E4M3, Fp8Format::E4M3), (Format::E5M2, Fp8Format::E5M2)];
        for (any, typed) in fp8 {
            assert_eq!(any.decode(code).to_bits(), typed.decode(code as u8).to_bits());
            assert_eq!(any.is_nan_code(code), typed.is_nan(code as u8), "{any} {code:#04x}");
        }
        assert_eq!(Format::E8M0.decode(code).to_bits(), decode_e8m0(code as u8).to_bits());
    }
}
