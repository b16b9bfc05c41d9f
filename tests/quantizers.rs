//! Every CPU quantizer against a deliberately simple scalar reading of the
//! spec (element by element, table-search rounding): exact, zero mismatches,
//! on random shapes (most not multiples of the block size), special values and
//! f32/bf16/f16 inputs. Then the proptest properties of the issue.

mod reference;

use fp8_engine::Error;
use fp8_engine::convert::HighPrecision;
use fp8_engine::format::{Fp8Format, Overflow};
use fp8_engine::quantize::{
    ScaleRule, amax, cast_amax, cast_transpose_amax, dequantize::dequantize_blocks, quantize_1x128,
    quantize_1x128_rowwise, quantize_block_128x128, quantize_current, quantize_mxfp8, quantize_per_tensor,
    transpose_codes,
};
use fp8_engine::scaling::{BlockScaling, CurrentScaling, RecipeFormat, TensorRole};
use fp8_engine::tensor::{QuantizedMatrix, QuantizedTensor, ScaleKind, Scales};
use half::{bf16, f16};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reference::*;

// ---------------------------------------------------------------- inputs

/// Shapes around the block sizes (1, 31..33, 127..129, 255..257), wider than
/// one column-wise task (512 columns), and a few odd ones.
const SHAPES: [(usize, usize); 16] = [
    (1, 1),
    (1, 200),
    (3, 5),
    (32, 32),
    (33, 31),
    (128, 128),
    (127, 129),
    (129, 127),
    (130, 257),
    (257, 130),
    (64, 384),
    (200, 1),
    (5, 1100),
    (130, 600),
    (300, 45),
    (0, 7),
];

/// Values spanning many binades, with per-row magnitudes so blocks get different
/// scales, zero blocks, and specials (NaN, +-inf, -0, subnormals, f32 extremes).
fn test_matrix(rows: usize, cols: usize, seed: u64, specials: bool) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut x = vec![0.0f32; rows * cols];
    for r in 0..rows {
        let row_scale = 2f32.powi(rng.random_range(-30..30));
        let zero_row = rng.random_range(0..10) == 0;
        for c in 0..cols {
            let v = if zero_row {
                0.0
            } else {
                let mantissa: f32 = rng.random_range(-1.0..1.0);
                mantissa * row_scale * 2f32.powi(rng.random_range(-8..8))
            };
            x[r * cols + c] = v;
        }
    }
    if specials && !x.is_empty() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            f32::MAX,
            -f32::MAX,
            1e-40,
            448.0,
            -57344.0,
        ];
        for &s in &specials {
            let i = rng.random_range(0..x.len());
            x[i] = s;
        }
    }
    x
}

fn convert_all<T: HighPrecision>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f32(v)).collect()
}

// ---------------------------------------------------------------- reference quantizers

fn assert_codes(what: &str, format: Fp8Format, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| !same_code(format, got[i], want[i]))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} mismatches, first at {}: got {:#04x} want {:#04x}",
        bad.len(),
        bad[0],
        got[bad[0]],
        want[bad[0]]
    );
}

fn assert_f32s(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(same(g, w), "{what}[{i}]: got {g:e} want {w:e}");
    }
}

fn block_scales(m: &QuantizedMatrix) -> &[f32] {
    match m.scales() {
        Scales::Block1x128(s) | Scales::Block128x128(s) => s,
        other => panic!("expected f32 block scales, got {:?}", other.kind()),
    }
}

fn e8m0_scales(m: &QuantizedMatrix) -> &[u8] {
    match m.scales() {
        Scales::Mxfp8(e) => e,
        other => panic!("expected E8M0 scales, got {:?}", other.kind()),
    }
}

/// Reference dequantization of one copy: `decode(q) * scale_inv` in f32.
fn ref_dequantize(m: &QuantizedMatrix, format: Fp8Format) -> Vec<f32> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let q = format.decode(m.data()[r * cols + c]);
            let scale_inv = match m.scales() {
                Scales::PerTensor(s) => *s,
                Scales::Block1x128(s) => s[r * cols.div_ceil(128) + c / 128],
                Scales::Block128x128(s) => s[(r / 128) * cols.div_ceil(128) + c / 128],
                Scales::Mxfp8(e) => 2f64.powi(e[r * cols.div_ceil(32) + c / 32] as i32 - 127) as f32,
            };
            out.push(q * scale_inv);
        }
    }
    out
}

fn check_dequantize(what: &str, t: &QuantizedTensor) {
    let got = t.dequantize::<f32>().unwrap();
    assert_f32s(
        &format!("{what} dequantize"),
        &got,
        &ref_dequantize(t.rowwise(), t.format()),
    );
    let got_bf16 = t.dequantize::<bf16>().unwrap();
    let want_bf16: Vec<f32> = ref_dequantize(t.rowwise(), t.format())
        .into_iter()
        .map(|v| bf16::from_f32(v).to_f32())
        .collect();
    let got_bf16: Vec<f32> = got_bf16.into_iter().map(bf16::to_f32).collect();
    assert_f32s(&format!("{what} dequantize bf16"), &got_bf16, &want_bf16);
    if let Some(col) = t.columnwise() {
        let got = t.dequantize_columnwise::<f32>().unwrap().unwrap();
        assert_f32s(
            &format!("{what} dequantize columnwise"),
            &got,
            &ref_dequantize(col, t.format()),
        );
    }
}

// ---------------------------------------------------------------- exact comparisons

/// Runs `check(input, ctx)` over every shape, special-value setting and input type.
fn for_all_inputs(mut check: impl FnMut(&Input, &str)) {
    for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
        for specials in [false, true] {
            let x = test_matrix(rows, cols, 1000 + s as u64, specials);
            for ty in ["f32", "bf16", "f16"] {
                let ctx = format!("{rows}x{cols} {ty} specials={specials}");
                check(&Input::new(ty, &x, rows, cols), &ctx);
            }
        }
    }
}

/// One input in its storage type, and its exact f32 values.
struct Input {
    ty: &'static str,
    f32s: Vec<f32>,
    bf16s: Vec<bf16>,
    f16s: Vec<f16>,
    rows: usize,
    cols: usize,
}

impl Input {
    fn new(ty: &'static str, x: &[f32], rows: usize, cols: usize) -> Self {
        let bf16s: Vec<bf16> = convert_all(x);
        let f16s: Vec<f16> = convert_all(x);
        let f32s = match ty {
            "bf16" => bf16s.iter().map(|v| v.to_f32()).collect(),
            "f16" => f16s.iter().map(|v| v.to_f32()).collect(),
            _ => x.to_vec(),
        };
        Input {
            ty,
            f32s,
            bf16s,
            f16s,
            rows,
            cols,
        }
    }

    /// Calls the generic quantizer with the input in its storage type.
    fn run<R>(&self, f: impl Quantizer<R>) -> R {
        match self.ty {
            "bf16" => f.call(&self.bf16s),
            "f16" => f.call(&self.f16s),
            _ => f.call(&self.f32s),
        }
    }
}

/// A quantizer generic over the input type (closures cannot be generic).
trait Quantizer<R> {
    fn call<T: HighPrecision>(&self, x: &[T]) -> R;
}

#[test]
fn cast_amax_matches_reference() {
    for_all_inputs(|input, ctx| {
        for format in Fp8Format::ALL {
            for scale in [1.0f32, 0.37, 4096.0, f32::MAX, 1e-30] {
                struct Cast(Fp8Format, f32);
                impl Quantizer<(Vec<u8>, f32)> for Cast {
                    fn call<T: HighPrecision>(&self, x: &[T]) -> (Vec<u8>, f32) {
                        let mut q = vec![0u8; x.len()];
                        let amax = cast_amax(x, &mut q, self.0, self.1).unwrap();
                        (q, amax)
                    }
                }
                let (q, got_amax) = input.run(Cast(format, scale));
                let ctx = format!("{ctx} {format} scale {scale}");
                assert_codes(&ctx, format, &q, &ref_cast(&input.f32s, format, scale));
                assert!(same(got_amax, ref_amax(input.f32s.iter().copied())), "{ctx}: amax");
            }
        }
    });
}

#[test]
fn cast_transpose_amax_matches_reference() {
    for_all_inputs(|input, ctx| {
        for format in Fp8Format::ALL {
            struct CastT(Fp8Format, usize, usize);
            impl Quantizer<(Vec<u8>, Vec<u8>, f32)> for CastT {
                fn call<T: HighPrecision>(&self, x: &[T]) -> (Vec<u8>, Vec<u8>, f32) {
                    let (mut row, mut col) = (vec![0u8; x.len()], vec![0u8; x.len()]);
                    let amax = cast_transpose_amax(x, self.1, self.2, self.0, 3.5, &mut row, &mut col).unwrap();
                    (row, col, amax)
                }
            }
            let (row, col, got_amax) = input.run(CastT(format, input.rows, input.cols));
            let want = ref_cast(&input.f32s, format, 3.5);
            let want_t = ref_cast(&transpose(&input.f32s, input.rows, input.cols), format, 3.5);
            assert_codes(&format!("{ctx} {format} rowwise"), format, &row, &want);
            assert_codes(&format!("{ctx} {format} columnwise"), format, &col, &want_t);
            assert!(same(got_amax, ref_amax(input.f32s.iter().copied())), "{ctx}: amax");
        }
    });
}

#[test]
fn current_scaling_matches_reference() {
    for_all_inputs(|input, ctx| {
        for (format, pow2, eps) in [
            (RecipeFormat::Hybrid, false, 0.0f32),
            (RecipeFormat::E4M3, true, 0.0),
            (RecipeFormat::Hybrid, false, 1e3),
        ] {
            let recipe = CurrentScaling {
                format,
                power_2_scale: pow2,
                amax_epsilon: eps,
            };
            for role in [TensorRole::Input, TensorRole::OutputGrad] {
                let rule = ScaleRule::current(&recipe, role);
                struct Current(ScaleRule, usize, usize);
                impl Quantizer<(QuantizedTensor, f32)> for Current {
                    fn call<T: HighPrecision>(&self, x: &[T]) -> (QuantizedTensor, f32) {
                        quantize_current(x, self.1, self.2, &self.0, true).unwrap()
                    }
                }
                let (t, got_amax) = input.run(Current(rule, input.rows, input.cols));
                let fmt = rule.format;
                let want_amax = ref_amax(input.f32s.iter().copied());
                let scale = ref_current(want_amax, fp8_max(fmt), pow2, eps);
                let ctx = format!("{ctx} {fmt} pow2 {pow2} eps {eps}");
                assert!(same(got_amax, want_amax), "{ctx}: amax");
                assert_eq!(t.rowwise().scales(), &Scales::PerTensor(1.0 / scale), "{ctx}");
                assert_codes(&ctx, fmt, t.rowwise().data(), &ref_cast(&input.f32s, fmt, scale));
                let want_t = ref_cast(&transpose(&input.f32s, input.rows, input.cols), fmt, scale);
                assert_codes(
                    &format!("{ctx} columnwise"),
                    fmt,
                    t.columnwise().unwrap().data(),
                    &want_t,
                );
                check_dequantize(&ctx, &t);
            }
        }
    });
}

#[test]
fn delayed_per_tensor_matches_reference() {
    for_all_inputs(|input, ctx| {
        struct Delayed(usize, usize);
        impl Quantizer<(QuantizedTensor, f32)> for Delayed {
            fn call<T: HighPrecision>(&self, x: &[T]) -> (QuantizedTensor, f32) {
                quantize_per_tensor(x, self.0, self.1, Fp8Format::E5M2, 0.125, false).unwrap()
            }
        }
        let (t, amax) = input.run(Delayed(input.rows, input.cols));
        assert!(t.columnwise().is_none());
        assert!(same(amax, ref_amax(input.f32s.iter().copied())));
        assert_eq!(t.rowwise().scales(), &Scales::PerTensor(8.0));
        assert_codes(
            ctx,
            Fp8Format::E5M2,
            t.rowwise().data(),
            &ref_cast(&input.f32s, Fp8Format::E5M2, 0.125),
        );
        check_dequantize(ctx, &t);
    });
}

fn block_rules() -> Vec<ScaleRule> {
    let mut rules = Vec::new();
    for format in Fp8Format::ALL {
        for (power_2_scale, amax_epsilon) in [(true, 0.0f32), (false, 0.0), (true, 1e-3)] {
            rules.push(ScaleRule {
                format,
                power_2_scale,
                amax_epsilon,
            });
        }
    }
    rules
}

#[test]
fn block_1x128_matches_reference() {
    for_all_inputs(|input, ctx| {
        let (rows, cols) = (input.rows, input.cols);
        for rule in block_rules() {
            struct B1(ScaleRule, usize, usize);
            impl Quantizer<QuantizedTensor> for B1 {
                fn call<T: HighPrecision>(&self, x: &[T]) -> QuantizedTensor {
                    quantize_1x128(x, self.1, self.2, &self.0, true).unwrap()
                }
            }
            let t = input.run(B1(rule, rows, cols));
            let ctx = format!("{ctx} {rule:?}");
            assert_eq!(t.scale_kind(), ScaleKind::Block1x128);
            let (codes, scales) = ref_blocks(
                &input.f32s,
                rows,
                cols,
                (1, 128),
                rule.format,
                ref_block_rule(rule.format, rule.power_2_scale, rule.amax_epsilon),
            );
            assert_codes(&ctx, rule.format, t.rowwise().data(), &codes);
            assert_f32s(&format!("{ctx} scale_inv"), block_scales(t.rowwise()), &scales);
            // Column-wise: 1x128 blocks of X^T, from the source.
            let xt = transpose(&input.f32s, rows, cols);
            let (codes, scales) = ref_blocks(
                &xt,
                cols,
                rows,
                (1, 128),
                rule.format,
                ref_block_rule(rule.format, rule.power_2_scale, rule.amax_epsilon),
            );
            let col = t.columnwise().unwrap();
            assert_eq!((col.rows(), col.cols()), (cols, rows));
            assert_codes(&format!("{ctx} columnwise"), rule.format, col.data(), &codes);
            assert_f32s(&format!("{ctx} columnwise scale_inv"), block_scales(col), &scales);
            check_dequantize(&ctx, &t);
        }
    });
}

#[test]
fn block_128x128_matches_reference() {
    for_all_inputs(|input, ctx| {
        let (rows, cols) = (input.rows, input.cols);
        for rule in block_rules() {
            struct B2(ScaleRule, usize, usize);
            impl Quantizer<QuantizedTensor> for B2 {
                fn call<T: HighPrecision>(&self, x: &[T]) -> QuantizedTensor {
                    quantize_block_128x128(x, self.1, self.2, &self.0, true).unwrap()
                }
            }
            let t = input.run(B2(rule, rows, cols));
            let ctx = format!("{ctx} {rule:?}");
            let (codes, scales) = ref_blocks(
                &input.f32s,
                rows,
                cols,
                (128, 128),
                rule.format,
                ref_block_rule(rule.format, rule.power_2_scale, rule.amax_epsilon),
            );
            assert_codes(&ctx, rule.format, t.rowwise().data(), &codes);
            assert_f32s(&format!("{ctx} scale_inv"), block_scales(t.rowwise()), &scales);
            // Column-wise: 128x128 blocks of X^T quantized from the source.
            let xt = transpose(&input.f32s, rows, cols);
            let (codes, scales) = ref_blocks(
                &xt,
                cols,
                rows,
                (128, 128),
                rule.format,
                ref_block_rule(rule.format, rule.power_2_scale, rule.amax_epsilon),
            );
            let col = t.columnwise().unwrap();
            assert_codes(&format!("{ctx} columnwise"), rule.format, col.data(), &codes);
            assert_f32s(&format!("{ctx} columnwise scale_inv"), block_scales(col), &scales);
            check_dequantize(&ctx, &t);
        }
    });
}

#[test]
fn mxfp8_matches_reference() {
    for_all_inputs(|input, ctx| {
        let (rows, cols) = (input.rows, input.cols);
        for format in Fp8Format::ALL {
            struct Mx(Fp8Format, usize, usize);
            impl Quantizer<QuantizedTensor> for Mx {
                fn call<T: HighPrecision>(&self, x: &[T]) -> QuantizedTensor {
                    quantize_mxfp8(x, self.1, self.2, self.0, true).unwrap()
                }
            }
            let t = input.run(Mx(format, rows, cols));
            let ctx = format!("{ctx} {format}");
            let (codes, scales) = ref_blocks(&input.f32s, rows, cols, (1, 32), format, ref_mx_rule(format));
            assert_codes(&ctx, format, t.rowwise().data(), &codes);
            assert_eq!(e8m0_scales(t.rowwise()), &scales[..], "{ctx} e8m0");
            let xt = transpose(&input.f32s, rows, cols);
            let (codes, scales) = ref_blocks(&xt, cols, rows, (1, 32), format, ref_mx_rule(format));
            let col = t.columnwise().unwrap();
            assert_codes(&format!("{ctx} columnwise"), format, col.data(), &codes);
            assert_eq!(e8m0_scales(col), &scales[..], "{ctx} columnwise e8m0");
            check_dequantize(&ctx, &t);
        }
    });
}

#[test]
fn amax_ignores_nan_and_keeps_inf() {
    assert_eq!(amax::<f32>(&[]), 0.0);
    assert_eq!(amax(&[f32::NAN, f32::NAN]), 0.0);
    assert_eq!(amax(&[1.0, f32::NAN, -3.0]), 3.0);
    assert_eq!(amax(&[1.0, f32::NEG_INFINITY, f32::NAN]), f32::INFINITY);
    let big: Vec<f32> = (0..200_003).map(|i| ((i * 7919) % 100_000) as f32 - 50_000.0).collect();
    assert_eq!(amax(&big), ref_amax(big.iter().copied()));
}

#[test]
fn transpose_codes_is_a_transpose() {
    for &(rows, cols) in &SHAPES {
        let src: Vec<u8> = (0..rows * cols).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        transpose_codes(&src, rows, cols, &mut dst).unwrap();
        assert_eq!(dst, transpose(&src, rows, cols));
    }
}

#[test]
fn wrong_sizes_and_scales_are_errors_not_panics() {
    let x = vec![1.0f32; 12];
    let mut q = vec![0u8; 12];
    let mut s = [0.0f32; 3];
    let rule = ScaleRule::block(&BlockScaling::default(), TensorRole::Input);
    let err = quantize_1x128_rowwise(&x, 4, 4, &rule, &mut q, &mut s[..]).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    let err = quantize_1x128_rowwise(&x, 3, 4, &rule, &mut q, &mut s[..2]).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(quantize_1x128(&x, 5, 5, &rule, false).is_err());
    assert!(quantize_mxfp8(&x, 2, 5, Fp8Format::E4M3, true).is_err());
    assert!(quantize_block_128x128(&x, usize::MAX, 2, &rule, true).is_err());
    for scale in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let err = cast_amax(&x, &mut q, Fp8Format::E4M3, scale).unwrap_err();
        assert!(matches!(err, Error::InvalidScale { .. }), "{err}");
        assert!(cast_amax::<f32>(&[], &mut [], Fp8Format::E4M3, scale).is_err());
        let (mut a, mut b) = (vec![0u8; 12], vec![0u8; 12]);
        assert!(cast_transpose_amax(&x, 3, 4, Fp8Format::E4M3, scale, &mut a, &mut b).is_err());
    }
    assert!(cast_amax(&x, &mut q[..5], Fp8Format::E4M3, 1.0).is_err());
    let mut out = vec![0.0f32; 12];
    assert!(dequantize_blocks(&q, 3, 4, (1, 128), Fp8Format::E4M3, &[1.0, 1.0], &mut out).is_err());
    assert!(dequantize_blocks(&q, 3, 4, (1, 128), Fp8Format::E4M3, &[1.0, 0.0, 1.0], &mut out).is_err());
    // A column-wise copy that is not the transpose is rejected.
    let row = QuantizedMatrix::new(vec![0; 6], 2, 3, Scales::PerTensor(1.0)).unwrap();
    let bad = QuantizedMatrix::new(vec![0; 6], 2, 3, Scales::PerTensor(1.0)).unwrap();
    assert!(QuantizedTensor::new(Fp8Format::E4M3, row, Some(bad)).is_err());
    assert!(QuantizedMatrix::new(vec![0; 6], 2, 3, Scales::Block1x128(vec![1.0])).is_err());
}

#[test]
fn mxfp8_nan_scale_dequantizes_to_nan() {
    let m = QuantizedMatrix::new(vec![0x38; 40], 1, 40, Scales::Mxfp8(vec![0xFF, 127])).unwrap();
    let t = QuantizedTensor::new(Fp8Format::E4M3, m, None).unwrap();
    let out = t.dequantize::<f32>().unwrap();
    assert!(out[..32].iter().all(|v| v.is_nan()));
    assert!(out[32..].iter().all(|&v| v == 1.0));
}

// ---------------------------------------------------------------- properties

/// Finite values over many binades, a few zeros and specials.
fn value_strategy() -> impl Strategy<Value = f32> {
    prop_oneof![
        10 => (-1.0f32..1.0, -40i32..40).prop_map(|(m, e)| m * 2f32.powi(e)),
        1 => Just(0.0f32),
        1 => (1u32..0x0080_0000).prop_map(f32::from_bits),
        1 => prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::MAX)],
    ]
}

fn matrix_strategy() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1usize..70, 1usize..300).prop_flat_map(|(rows, cols)| {
        prop::collection::vec(value_strategy(), rows * cols).prop_map(move |x| (rows, cols, x))
    })
}

/// Per element scale_inv of a row-wise copy.
fn element_scale_inv(m: &QuantizedMatrix, r: usize, c: usize) -> f64 {
    let cols = m.cols();
    match m.scales() {
        Scales::PerTensor(s) => *s as f64,
        Scales::Block1x128(s) => s[r * cols.div_ceil(128) + c / 128] as f64,
        Scales::Block128x128(s) => s[(r / 128) * cols.div_ceil(128) + c / 128] as f64,
        Scales::Mxfp8(e) => 2f64.powi(e[r * cols.div_ceil(32) + c / 32] as i32 - 127),
    }
}

/// |x' - x| <= half an FP8 ulp (at x * scale) times scale_inv, plus the f32
/// roundings of `x * scale` and `q * scale_inv`; saturated elements excepted.
fn check_error_bound(t: &QuantizedTensor, x: &[f32]) -> Result<(), TestCaseError> {
    let [rows, cols] = t.shape();
    let deq = t.dequantize::<f32>().unwrap();
    let max = fp8_max(t.format()) as f64;
    for r in 0..rows {
        for c in 0..cols {
            let (v, d) = (x[r * cols + c] as f64, deq[r * cols + c] as f64);
            if !v.is_finite() {
                continue;
            }
            let scale_inv = element_scale_inv(t.rowwise(), r, c);
            let y = v.abs() / scale_inv;
            if y > max {
                continue; // clipped: saturation, not rounding
            }
            if (t.format().decode(t.rowwise().data()[r * cols + c]) as f64 * scale_inv).abs() > f32::MAX as f64 {
                continue; // within half an FP8 ulp of f32::MAX, rounded up: the f32 dequantization is inf
            }
            let bound = half_ulp(t.format(), y) * scale_inv * (1.0 + 1e-6) + v.abs() * 2f64.powi(-22) + 1e-44;
            prop_assert!(
                (d - v).abs() <= bound,
                "x {v:e} -> {d:e}, bound {bound:e} (scale_inv {scale_inv:e})"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn dequantized_error_is_within_half_ulp((rows, cols, x) in matrix_strategy(), e5m2 in any::<bool>(), pow2 in any::<bool>()) {
        let format = if e5m2 { Fp8Format::E5M2 } else { Fp8Format::E4M3 };
        let rule = ScaleRule { format, power_2_scale: pow2, amax_epsilon: 0.0 };
        check_error_bound(&quantize_current(&x, rows, cols, &rule, false).unwrap().0, &x)?;
        check_error_bound(&quantize_1x128(&x, rows, cols, &rule, false).unwrap(), &x)?;
        check_error_bound(&quantize_block_128x128(&x, rows, cols, &rule, false).unwrap(), &x)?;
        check_error_bound(&quantize_mxfp8(&x, rows, cols, format, false).unwrap(), &x)?;
    }

    #[test]
    fn pow2_block_scales_are_powers_of_two((rows, cols, x) in matrix_strategy()) {
        let rule = ScaleRule::block(&BlockScaling::default(), TensorRole::Weight);
        let tensors = [
            quantize_1x128(&x, rows, cols, &rule, true).unwrap(),
            quantize_block_128x128(&x, rows, cols, &rule, true).unwrap(),
        ];
        for t in &tensors {
            for m in [t.rowwise(), t.columnwise().unwrap()] {
                for &s in block_scales(m) {
                    // As f64 even an f32 subnormal is normal: a power of two has no mantissa bits.
                    let wide = s as f64;
                    prop_assert!(s.is_finite() && s > 0.0 && wide.to_bits() & ((1u64 << 52) - 1) == 0, "scale_inv {s:e}");
                }
            }
        }
    }

    #[test]
    fn e8m0_scales_never_let_a_block_exceed_the_max((rows, cols, x) in matrix_strategy(), e5m2 in any::<bool>()) {
        let format = if e5m2 { Fp8Format::E5M2 } else { Fp8Format::E4M3 };
        let t = quantize_mxfp8(&x, rows, cols, format, true).unwrap();
        let xt = transpose(&x, rows, cols);
        for (m, src) in [(t.rowwise(), &x), (t.columnwise().unwrap(), &xt)] {
            let (mr, mc) = (m.rows(), m.cols());
            let e8m0 = e8m0_scales(m);
            for r in 0..mr {
                for c in 0..mc {
                    let v = src[r * mc + c];
                    if !v.is_finite() {
                        continue;
                    }
                    let e = e8m0[r * mc.div_ceil(32) + c / 32];
                    prop_assert!(e != 0xFF);
                    // The unsaturated cast never overflows: the scaled value is at most the max.
                    let scaled = v * e8m0_multiplier(e);
                    prop_assert!(!format.is_nan(format.encode(scaled, Overflow::NonSaturating)) && !format.is_infinite(format.encode(scaled, Overflow::NonSaturating)),
                        "{v:e} * 2^{} = {scaled:e} overflows {format}", 127 - e as i32);
                    prop_assert!(format.decode(m.data()[r * mc + c]).abs() <= fp8_max(format));
                }
            }
        }
    }
}
