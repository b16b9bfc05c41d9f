//! The crate's `FormatLimits` for every format: derived again here by
//! enumerating every code of the codec, and checked against the spec's table.

use fp8_engine::format::{Format, Overflow};

/// Limits recomputed from nothing but `decode` over every code.
struct Derived {
    max_finite: f64,
    max_finite_code: u16,
    min_positive: f64,
    min_normal: f64,
    epsilon: Option<f64>,
    infinity: Option<(u16, u16)>,
    nan_codes: Vec<u16>,
}

fn derive(format: Format) -> Derived {
    let l = format.limits();
    let codes = 0..format.code_count();
    let decoded: Vec<(u16, f64)> = codes.map(|c| (c as u16, format.decode(c as u16) as f64)).collect();
    let finite_pos = || decoded.iter().filter(|(_, v)| v.is_finite() && *v > 0.0);
    let (max_finite_code, max_finite) = finite_pos().fold((0, 0.0), |a, &(c, v)| if v > a.1 { (c, v) } else { a });
    let min_positive = finite_pos().map(|&(_, v)| v).fold(f64::INFINITY, f64::min);
    // Smallest positive value whose exponent field is nonzero; a format with
    // no mantissa (E8M0) has no subnormals, so every code is normal.
    let min_normal = finite_pos()
        .filter(|&&(c, _)| l.mantissa_bits == 0 || (c >> l.mantissa_bits) & ((1 << l.exponent_bits) - 1) != 0)
        .map(|&(_, v)| v)
        .fold(f64::INFINITY, f64::min);
    let epsilon = (l.mantissa_bits > 0).then(|| {
        let above = finite_pos()
            .map(|&(_, v)| v)
            .filter(|&v| v > 1.0)
            .fold(f64::INFINITY, f64::min);
        above - 1.0
    });
    let pos_inf = decoded.iter().find(|(_, v)| *v == f64::INFINITY).map(|&(c, _)| c);
    let neg_inf = decoded.iter().find(|(_, v)| *v == f64::NEG_INFINITY).map(|&(c, _)| c);
    let nan_codes = decoded.iter().filter(|(_, v)| v.is_nan()).map(|&(c, _)| c).collect();
    Derived {
        max_finite,
        max_finite_code,
        min_positive,
        min_normal,
        epsilon,
        infinity: pos_inf.zip(neg_inf),
        nan_codes,
    }
}

#[test]
fn limits_match_what_the_codecs_decode() {
    for format in Format::ALL {
        let l = format.limits();
        let d = derive(format);
        assert_eq!(l.max_finite, d.max_finite, "{format} max");
        assert_eq!(l.max_finite_code, d.max_finite_code, "{format} max code");
        assert_eq!(l.min_normal, d.min_normal, "{format} min normal");
        assert_eq!(
            l.min_subnormal.unwrap_or(l.min_normal),
            d.min_positive,
            "{format} min positive"
        );
        assert_eq!(l.epsilon, d.epsilon, "{format} eps");
        assert_eq!(l.infinity, d.infinity, "{format} inf codes");
        let listed: Vec<u16> = l.nan.iter().flat_map(|&(lo, hi)| lo..=hi).collect();
        assert_eq!(listed, d.nan_codes, "{format} NaN codes");
        assert_eq!(
            l.sign_bits + l.exponent_bits + l.mantissa_bits,
            format.storage_bits(),
            "{format} field widths fill the storage"
        );
    }
}

#[test]
fn limits_match_the_spec_table() {
    // numerics.md section 1, written out as the spec states it.
    let p = |e: i32| 2f64.powi(e);
    let table = [
        (Format::E4M3, (1, 4, 3), 7, 448.0, p(-6), Some(p(-9)), Some(p(-3))),
        (Format::E5M2, (1, 5, 2), 15, 57344.0, p(-14), Some(p(-16)), Some(p(-2))),
        (Format::E8M0, (0, 8, 0), 127, p(127), p(-127), None, None),
        (
            Format::Bf16,
            (1, 8, 7),
            127,
            3.3895313892515355e38,
            p(-126),
            Some(p(-133)),
            Some(p(-7)),
        ),
        (
            Format::Fp16,
            (1, 5, 10),
            15,
            65504.0,
            p(-14),
            Some(p(-24)),
            Some(p(-10)),
        ),
    ];
    for (format, (s, e, m), bias, max, min_normal, min_sub, eps) in table {
        let l = format.limits();
        assert_eq!((l.sign_bits, l.exponent_bits, l.mantissa_bits), (s, e, m), "{format}");
        assert_eq!(l.bias, bias, "{format}");
        assert_eq!(l.max_finite, max, "{format}");
        assert_eq!(l.min_normal, min_normal, "{format}");
        assert_eq!(l.min_subnormal, min_sub, "{format}");
        assert_eq!(l.epsilon, eps, "{format}");
    }
    assert_eq!(Format::E4M3.limits().nan, &[(0x7F, 0x7F), (0xFF, 0xFF)]);
    assert_eq!(Format::E5M2.limits().infinity, Some((0x7C, 0xFC)));
    assert_eq!(Format::E5M2.limits().nan, &[(0x7D, 0x7F), (0xFD, 0xFF)]);
    assert_eq!(Format::E8M0.limits().nan, &[(0xFF, 0xFF)]);
}

#[test]
fn sixteen_bit_formats_saturate_only_when_asked() {
    for format in [Format::Bf16, Format::Fp16] {
        let l = format.limits();
        let huge = (l.max_finite * 4.0) as f32;
        let inf = l.infinity.expect("IEEE formats have inf");
        assert_eq!(format.encode(huge, Overflow::NonSaturating), inf.0);
        assert_eq!(format.encode(-huge, Overflow::NonSaturating), inf.1);
        assert_eq!(format.encode(huge, Overflow::Saturate), l.max_finite_code);
        assert_eq!(
            format.encode(f32::NEG_INFINITY, Overflow::Saturate),
            l.max_finite_code | 0x8000
        );
        assert!(format.is_nan_code(format.encode(f32::NAN, Overflow::Saturate)));
    }
}

#[test]
fn format_names_parse_back() {
    for format in Format::ALL {
        assert_eq!(format.name().parse::<Format>(), Ok(format));
        assert_eq!(format.name().to_uppercase().parse::<Format>(), Ok(format));
    }
    let err = "e3m4".parse::<Format>().unwrap_err().to_string();
    assert!(err.contains("e3m4") && err.contains("e4m3"), "{err}");
}
