//! `gemm::cpu::gemm` against an f64 reference written here: codes decoded from
//! their bit fields (not the library's tables), scales looked up from the spec's
//! compact layouts (numerics.md 4.3, 4.4), every product and sum in f64.
//!
//! Error bound (u = 2^-24, the f32 unit roundoff). Write `t_k` for the k-th
//! scaled term `alpha * sA * sB * a_k * b_k` and `S = sum |t_k| + |bias| +
//! |beta * old|`. The engine rounds:
//! * inside a K block of L terms: each FMA/add once, so the block's sum is off by
//!   at most `L u` times the sum of its |terms| (any summation order; a plain f32
//!   input adds one product rounding: `(L + 1) u`);
//! * at promotion: `sA * sB` once, `partial * that` once, the add into the
//!   accumulator once per block: `K/L + 2` more;
//! * in the epilogue: `alpha * sA * sB` (2), `* factor` (1), `+ bias` (1),
//!   `beta * old` and its add (2).
//!
//! Summing the first-order terms, `|D - D_ref| <= (K + K/L + 9) u S`, and
//! `K/L <= K`, so every test uses `(2K + 16) u S` (second-order terms are far
//! inside the slack). Outputs narrower than f32 add their own rounding:
//! `u_out (|D_ref| + f32 bound) + half the smallest subnormal step`.
//! The bound is tight enough to catch a scale applied to the wrong block or a
//! missing block: those move `D` by a whole block's worth of terms, about
//! `S * 128 / K`, against `2K u S` (< 0.003 S for K <= 16384).

use fp8_engine::Error;
use fp8_engine::format::Fp8Format;
use fp8_engine::gemm::{self, GemmParams, GemmReport, Mat, Operand, Output};
use fp8_engine::quantize::{ScaleRule, quantize_1x128, quantize_block_128x128, quantize_current, quantize_mxfp8};
use fp8_engine::tensor::{QuantizedMatrix, ScaleKind, Scales};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::value_from_fields;

const U: f64 = 1.0 / (1u64 << 24) as f64;

// ---------------------------------------------------------------- inputs

/// Standard normal (Box-Muller), times a per-row and per-64-column magnitude
/// in 2^[-4, 4] so block scales differ from block to block.
fn spread_normal(rng: &mut StdRng, rows: usize, cols: usize) -> Vec<f32> {
    let row_mag: Vec<f64> = (0..rows).map(|_| 2f64.powf(rng.random_range(-4.0..4.0))).collect();
    let col_mag: Vec<f64> = (0..cols.div_ceil(64))
        .map(|_| 2f64.powf(rng.random_range(-4.0..4.0)))
        .collect();
    (0..rows * cols)
        .map(|i| {
            let (u1, u2): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (z * row_mag[i / cols] * col_mag[(i % cols) / 64]) as f32
        })
        .collect()
}

/// Block scales with any mantissa (not powers of two), E4M3 or E5M2 data.
fn rule(format: Fp8Format) -> ScaleRule {
    ScaleRule {
        format,
        power_2_scale: false,
        amax_epsilon: 0.0,
    }
}

/// `rows x k` normal data quantized with the library's quantizer for `kind`.
fn quantized(rng: &mut StdRng, kind: ScaleKind, format: Fp8Format, rows: usize, k: usize) -> QuantizedMatrix {
    let x = spread_normal(rng, rows, k);
    let tensor = match kind {
        ScaleKind::PerTensor => quantize_current(&x, rows, k, &rule(format), false).unwrap().0,
        ScaleKind::Block1x128 => quantize_1x128(&x, rows, k, &rule(format), false).unwrap(),
        ScaleKind::Block128x128 => quantize_block_128x128(&x, rows, k, &rule(format), false).unwrap(),
        ScaleKind::Mxfp8 => quantize_mxfp8(&x, rows, k, format, false).unwrap(),
    };
    tensor.into_parts().1
}

/// Uniformly random finite codes (subnormals and the largest values included)
/// with random scale_invs in [2^-6, 2^6) of any mantissa.
fn random_codes(rng: &mut StdRng, kind: ScaleKind, format: Fp8Format, rows: usize, k: usize) -> QuantizedMatrix {
    let codes: Vec<u8> = (0..rows * k)
        .map(|_| {
            loop {
                let c: u8 = rng.random();
                if decode(format, c).is_finite() {
                    break c;
                }
            }
        })
        .collect();
    let (sr, sc) = kind.scale_shape(rows, k);
    let mut scale = || 2f32.powf(rng.random_range(-6.0..6.0));
    let scales = match kind {
        ScaleKind::PerTensor => Scales::PerTensor(scale()),
        ScaleKind::Block1x128 => Scales::Block1x128((0..sr * sc).map(|_| scale()).collect()),
        ScaleKind::Block128x128 => Scales::Block128x128((0..sr * sc).map(|_| scale()).collect()),
        ScaleKind::Mxfp8 => Scales::Mxfp8((0..sr * sc).map(|_| rng.random_range(120..135)).collect()),
    };
    QuantizedMatrix::new(codes, rows, k, scales).unwrap()
}

// ---------------------------------------------------------------- the f64 reference

/// An FP8 code's value from its bit fields; NaN and inf codes decode as NaN/inf.
fn decode(format: Fp8Format, code: u8) -> f64 {
    match format {
        Fp8Format::E4M3 if code & 0x7F == 0x7F => f64::NAN,
        Fp8Format::E4M3 => value_from_fields(code, 4, 3, 7),
        Fp8Format::E5M2 if code & 0x7F == 0x7C => f64::INFINITY.copysign(if code & 0x80 != 0 { -1.0 } else { 1.0 }),
        Fp8Format::E5M2 if (code >> 2) & 0x1F == 0x1F => f64::NAN,
        Fp8Format::E5M2 => value_from_fields(code, 5, 2, 15),
    }
}

/// An operand as f64 rows with every scale applied element by element.
struct RefOperand {
    values: Vec<f64>,
    k: usize,
}

impl RefOperand {
    fn fp8(format: Fp8Format, q: &QuantizedMatrix) -> Self {
        let (rows, k) = (q.rows(), q.cols());
        let mut values = vec![0.0; rows * k];
        for r in 0..rows {
            for c in 0..k {
                // Compact layouts: 1x128 [rows, ceil(k/128)], 128x128 [ceil(rows/128), ceil(k/128)], MXFP8 [rows, ceil(k/32)].
                let s = match q.scales() {
                    Scales::PerTensor(s) => *s as f64,
                    Scales::Block1x128(s) => s[r * k.div_ceil(128) + c / 128] as f64,
                    Scales::Block128x128(s) => s[(r / 128) * k.div_ceil(128) + c / 128] as f64,
                    Scales::Mxfp8(e) => 2f64.powi(e[r * k.div_ceil(32) + c / 32] as i32 - 127),
                };
                values[r * k + c] = decode(format, q.data()[r * k + c]) * s;
            }
        }
        RefOperand { values, k }
    }

    fn plain(values: impl Iterator<Item = f64>, k: usize) -> Self {
        RefOperand {
            values: values.collect(),
            k,
        }
    }

    fn row(&self, r: usize) -> &[f64] {
        &self.values[r * self.k..(r + 1) * self.k]
    }
}

/// `D_ref` and `S` (the sum of magnitudes the bound scales with), both f64.
fn reference(a: &RefOperand, b: &RefOperand, params: &GemmParams, old: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let (m, n) = (a.values.len() / a.k.max(1), b.values.len() / b.k.max(1));
    let alpha = params.alpha as f64;
    let mut d = Vec::with_capacity(m * n);
    let mut s = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut mag) = (0.0f64, 0.0f64);
            for (x, y) in a.row(i).iter().zip(b.row(j)) {
                sum += alpha * x * y;
                mag += (alpha * x * y).abs();
            }
            if let Some(bias) = params.bias.and_then(|b| b.as_host()) {
                sum += bias[j] as f64;
                mag += (bias[j] as f64).abs();
            }
            if params.beta != 0.0 {
                let t = params.beta as f64 * old.unwrap()[i * n + j] as f64;
                sum += t;
                mag += t.abs();
            }
            d.push(sum);
            s.push(mag);
        }
    }
    (d, s)
}

fn f32_bound(k: usize, s: f64) -> f64 {
    (2.0 * k as f64 + 16.0) * U * s
}

/// Checks every element of `got` against the reference; `k` sizes the bound,
/// `(u_out, sub_out)` the output cast's relative rounding and absolute
/// subnormal step. Also checks the reported amax (the f32 result's).
fn check(what: &str, got: &[f64], reference: &(Vec<f64>, Vec<f64>), k: usize, out: (f64, f64), report: GemmReport) {
    let (d, s) = reference;
    assert_eq!(got.len(), d.len(), "{what}: length");
    let (u_out, sub_out) = out;
    let (mut amax, mut amax_slack) = (0.0f64, 0.0f64);
    for (idx, ((&g, &r), &s)) in got.iter().zip(d).zip(s).enumerate() {
        let f32_err = f32_bound(k, s);
        let bound = f32_err + u_out * (r.abs() + f32_err) + sub_out;
        assert!(
            (g - r).abs() <= bound,
            "{what}: element {idx}: got {g}, f64 reference {r}, |diff| {} > bound {bound}",
            (g - r).abs()
        );
        amax = amax.max(r.abs());
        amax_slack = amax_slack.max(f32_err);
    }
    let reported = report.amax as f64;
    assert!(
        (reported - amax).abs() <= amax_slack,
        "{what}: amax {reported} vs reference {amax} (slack {amax_slack})"
    );
}

/// Runs the GEMM into a fresh f32 output (or `old` with beta) and checks it.
fn check_f32(what: &str, a: &Operand, b: &Operand, (ra, rb): (&RefOperand, &RefOperand), params: &GemmParams) {
    let (m, k) = a.shape();
    let n = b.shape().0;
    let mut rng = StdRng::seed_from_u64(m as u64 * 31 + n as u64);
    let old: Vec<f32> = (0..m * n).map(|_| rng.random_range(-4.0..4.0)).collect();
    let mut d = old.clone();
    let report = gemm::cpu::gemm(a, b, Output::F32(&mut d), params).unwrap();
    let reference = reference(ra, rb, params, Some(&old));
    let got: Vec<f64> = d.iter().map(|&x| x as f64).collect();
    check(what, &got, &reference, k, (0.0, 0.0), report);
}

fn fp8_ref(format: Fp8Format, q: &QuantizedMatrix) -> RefOperand {
    RefOperand::fp8(format, q)
}

/// Scales of the right length for an empty or tiny matrix (values 1).
fn scales_for(kind: ScaleKind, rows: usize, k: usize) -> Scales {
    let (r, c) = kind.scale_shape(rows, k);
    match kind {
        ScaleKind::PerTensor => Scales::PerTensor(1.0),
        ScaleKind::Block1x128 => Scales::Block1x128(vec![1.0; r * c]),
        ScaleKind::Block128x128 => Scales::Block128x128(vec![1.0; r * c]),
        ScaleKind::Mxfp8 => Scales::Mxfp8(vec![127; r * c]),
    }
}

// ---------------------------------------------------------------- tests

const SCALE_PAIRS: [(ScaleKind, ScaleKind); 4] = [
    (ScaleKind::PerTensor, ScaleKind::PerTensor),
    (ScaleKind::Block1x128, ScaleKind::Block128x128),
    (ScaleKind::Block1x128, ScaleKind::Block1x128),
    (ScaleKind::Mxfp8, ScaleKind::Mxfp8),
];

const FORMAT_PAIRS: [(Fp8Format, Fp8Format); 3] = [
    (Fp8Format::E4M3, Fp8Format::E4M3),
    (Fp8Format::E5M2, Fp8Format::E4M3),
    (Fp8Format::E4M3, Fp8Format::E5M2),
];

/// Ragged shapes: M and N multiples of nothing, K a multiple of 16 but not of
/// 128 (and of 32 in one case), several output tiles, one row, one column.
const SHAPES: [(usize, usize, usize); 5] = [
    (37, 300, 272),
    (300, 45, 400),
    (1, 1, 16),
    (130, 129, 128),
    (3, 517, 48),
];

#[test]
fn every_scale_pair_and_format_pair_matches_f64() {
    let mut rng = StdRng::seed_from_u64(1);
    for (ka, kb) in SCALE_PAIRS {
        for (fa, fb) in FORMAT_PAIRS {
            for (m, n, k) in SHAPES {
                let qa = quantized(&mut rng, ka, fa, m, k);
                let qb = quantized(&mut rng, kb, fb, n, k);
                let refs = (&fp8_ref(fa, &qa), &fp8_ref(fb, &qb));
                for split in [true, false] {
                    let params = GemmParams {
                        split_accumulator: split,
                        ..GemmParams::default()
                    };
                    let what = format!("{ka:?}x{kb:?} {fa:?}x{fb:?} {m}x{n}x{k} split={split}");
                    check_f32(&what, &Operand::Fp8(fa, &qa), &Operand::Fp8(fb, &qb), refs, &params);
                }
            }
        }
    }
}

#[test]
fn random_codes_and_scales_match_f64() {
    // Subnormal, huge and zero codes with scales of any mantissa, alpha, bias and beta.
    let mut rng = StdRng::seed_from_u64(2);
    let (m, n, k) = (70, 90, 400);
    for (ka, kb) in SCALE_PAIRS {
        for (fa, fb) in FORMAT_PAIRS {
            let qa = random_codes(&mut rng, ka, fa, m, k);
            let qb = random_codes(&mut rng, kb, fb, n, k);
            let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3..1e3)).collect();
            let params = GemmParams {
                alpha: -0.3,
                beta: 0.75,
                bias: Some((&bias).into()),
                split_accumulator: false,
                report_amax: true,
            };
            let what = format!("random codes {ka:?}x{kb:?} {fa:?}x{fb:?}");
            let refs = (&fp8_ref(fa, &qa), &fp8_ref(fb, &qb));
            check_f32(&what, &Operand::Fp8(fa, &qa), &Operand::Fp8(fb, &qb), refs, &params);
        }
    }
}

#[test]
fn every_output_type_matches_f64() {
    let mut rng = StdRng::seed_from_u64(3);
    let (m, n, k) = (45, 270, 208);
    for (ka, kb) in SCALE_PAIRS {
        let qa = quantized(&mut rng, ka, Fp8Format::E4M3, m, k);
        let qb = quantized(&mut rng, kb, Fp8Format::E4M3, n, k);
        let (a, b) = (Operand::Fp8(Fp8Format::E4M3, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
        let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        // Small enough for f16's range (|D| reaches ~1e5 with alpha 1).
        let params = GemmParams {
            alpha: 0.03,
            bias: Some((&bias).into()),
            ..GemmParams::default()
        };
        let reference = reference(
            &fp8_ref(Fp8Format::E4M3, &qa),
            &fp8_ref(Fp8Format::E4M3, &qb),
            &params,
            None,
        );
        let what = |out: &str| format!("{ka:?}x{kb:?} -> {out}");

        let mut d = vec![bf16::ZERO; m * n];
        let report = gemm::cpu::gemm(&a, &b, Output::Bf16(&mut d), &params).unwrap();
        let got: Vec<f64> = d.iter().map(|x| x.to_f64()).collect();
        // bf16: 8 significant bits, same exponent range as f32.
        check(
            &what("bf16"),
            &got,
            &reference,
            k,
            (2f64.powi(-8), 2f64.powi(-134)),
            report,
        );

        let mut d = vec![f16::ZERO; m * n];
        let report = gemm::cpu::gemm(&a, &b, Output::F16(&mut d), &params).unwrap();
        let got: Vec<f64> = d.iter().map(|x| x.to_f64()).collect();
        // f16: 11 significant bits, subnormal step 2^-24.
        check(
            &what("f16"),
            &got,
            &reference,
            k,
            (2f64.powi(-11), 2f64.powi(-25)),
            report,
        );

        let max_ref = reference.0.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (format, u_out, sub_half, fp8_max) in [
            (Fp8Format::E4M3, 2f64.powi(-4), 2f64.powi(-10), 448.0),
            (Fp8Format::E5M2, 2f64.powi(-3), 2f64.powi(-17), 57344.0),
        ] {
            // Half the range, so nothing saturates.
            let scale = (fp8_max / 2.0 / max_ref) as f32;
            let mut codes = vec![0u8; m * n];
            let out = Output::Fp8 {
                codes: &mut codes,
                format,
                scale,
            };
            let report = gemm::cpu::gemm(&a, &b, out, &params).unwrap();
            let got: Vec<f64> = codes.iter().map(|&c| decode(format, c) / scale as f64).collect();
            let what = what(&format!("{format:?} (scale {scale})"));
            // The output scale's own rounding (one more u on the value) fits the slack.
            check(&what, &got, &reference, k, (u_out, sub_half / scale as f64), report);
        }
    }
}

#[test]
fn plain_inputs_match_f64() {
    let mut rng = StdRng::seed_from_u64(4);
    for (m, n, k) in [(33, 260, 100), (1, 7, 3), (257, 3, 1)] {
        let xa = spread_normal(&mut rng, m, k);
        let xb = spread_normal(&mut rng, n, k);
        let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        for split in [true, false] {
            let params = GemmParams {
                alpha: 0.5,
                beta: 2.0,
                bias: Some((&bias).into()),
                split_accumulator: split,
                report_amax: true,
            };
            let f64s = |x: &[f32]| RefOperand::plain(x.iter().map(|&v| v as f64), k);
            let (a, b) = (Mat::new(&xa, m, k).unwrap(), Mat::new(&xb, n, k).unwrap());
            check_f32(
                "f32",
                &Operand::F32(a),
                &Operand::F32(b),
                (&f64s(&xa), &f64s(&xb)),
                &params,
            );

            let (ha, hb): (Vec<bf16>, Vec<bf16>) = (
                xa.iter().map(|&v| bf16::from_f32(v)).collect(),
                xb.iter().map(|&v| bf16::from_f32(v)).collect(),
            );
            let refs = (
                &RefOperand::plain(ha.iter().map(|v| v.to_f64()), k),
                &RefOperand::plain(hb.iter().map(|v| v.to_f64()), k),
            );
            let (a, b) = (Mat::new(&ha, m, k).unwrap(), Mat::new(&hb, n, k).unwrap());
            check_f32("bf16", &Operand::Bf16(a), &Operand::Bf16(b), refs, &params);

            let (fa, fb): (Vec<f16>, Vec<f16>) = (
                xa.iter().map(|&v| f16::from_f32(v)).collect(),
                xb.iter().map(|&v| f16::from_f32(v)).collect(),
            );
            let refs = (
                &RefOperand::plain(fa.iter().map(|v| v.to_f64()), k),
                &RefOperand::plain(fb.iter().map(|v| v.to_f64()), k),
            );
            let (a, b) = (Mat::new(&fa, m, k).unwrap(), Mat::new(&fb, n, k).unwrap());
            check_f32("f16", &Operand::F16(a), &Operand::F16(b), refs, &params);
        }
    }
}

#[test]
fn beta_one_accumulates_micro_batches() {
    // Weight-gradient accumulation: D = A1 B1^T, then D += A2 B2^T twice more
    // (beta = 1) gives A1 B1^T + 2 A2 B2^T.
    let mut rng = StdRng::seed_from_u64(5);
    let (m, n, k) = (40, 150, 160);
    let (ka, kb) = (ScaleKind::Block1x128, ScaleKind::Block1x128);
    let (a1, b1) = (
        quantized(&mut rng, ka, Fp8Format::E5M2, m, k),
        quantized(&mut rng, kb, Fp8Format::E4M3, n, k),
    );
    let (a2, b2) = (
        quantized(&mut rng, ka, Fp8Format::E5M2, m, k),
        quantized(&mut rng, kb, Fp8Format::E4M3, n, k),
    );
    let mut d = vec![f32::NAN; m * n]; // beta = 0 must not read it
    let first = GemmParams::default();
    let accumulate = GemmParams {
        beta: 1.0,
        ..GemmParams::default()
    };
    let op = |q| Operand::Fp8(Fp8Format::E5M2, q);
    let opb = |q| Operand::Fp8(Fp8Format::E4M3, q);
    gemm::cpu::gemm(&op(&a1), &opb(&b1), Output::F32(&mut d), &first).unwrap();
    gemm::cpu::gemm(&op(&a2), &opb(&b2), Output::F32(&mut d), &accumulate).unwrap();
    let report = gemm::cpu::gemm(&op(&a2), &opb(&b2), Output::F32(&mut d), &accumulate).unwrap();

    let (d1, s1) = reference(
        &fp8_ref(Fp8Format::E5M2, &a1),
        &fp8_ref(Fp8Format::E4M3, &b1),
        &first,
        None,
    );
    let (d2, s2) = reference(
        &fp8_ref(Fp8Format::E5M2, &a2),
        &fp8_ref(Fp8Format::E4M3, &b2),
        &first,
        None,
    );
    // Each later GEMM's S includes |old| <= the earlier magnitudes: doubling covers all three bounds.
    let expected: Vec<f64> = d1.iter().zip(&d2).map(|(x, y)| x + 2.0 * y).collect();
    let magnitude: Vec<f64> = s1.iter().zip(&s2).map(|(x, y)| 2.0 * (x + 2.0 * y)).collect();
    let got: Vec<f64> = d.iter().map(|&x| x as f64).collect();
    check("beta=1 twice", &got, &(expected, magnitude), k, (0.0, 0.0), report);
}

#[test]
fn split_and_fast_accumulation_at_long_k() {
    // On the CPU both modes accumulate in f32; record how far each is from
    // f64 (relative Frobenius error) and hold both to the f32 bound.
    let mut rng = StdRng::seed_from_u64(6);
    let (m, n) = (16, 24);
    for k in [4096, 8192, 16384] {
        let qa = quantized(&mut rng, ScaleKind::PerTensor, Fp8Format::E4M3, m, k);
        let qb = quantized(&mut rng, ScaleKind::PerTensor, Fp8Format::E4M3, n, k);
        let reference = reference(
            &fp8_ref(Fp8Format::E4M3, &qa),
            &fp8_ref(Fp8Format::E4M3, &qb),
            &GemmParams::default(),
            None,
        );
        let ref_norm = reference.0.iter().map(|x| x * x).sum::<f64>().sqrt();
        let mut errors = Vec::new();
        for split in [true, false] {
            let params = GemmParams {
                split_accumulator: split,
                ..GemmParams::default()
            };
            let mut d = vec![0.0f32; m * n];
            let a = Operand::Fp8(Fp8Format::E4M3, &qa);
            let b = Operand::Fp8(Fp8Format::E4M3, &qb);
            let report = gemm::cpu::gemm(&a, &b, Output::F32(&mut d), &params).unwrap();
            let got: Vec<f64> = d.iter().map(|&x| x as f64).collect();
            check(&format!("K={k} split={split}"), &got, &reference, k, (0.0, 0.0), report);
            let err = got
                .iter()
                .zip(&reference.0)
                .map(|(g, r)| (g - r).powi(2))
                .sum::<f64>()
                .sqrt();
            errors.push(err / ref_norm);
        }
        println!(
            "K={k:5}: relative Frobenius error vs f64: split {:.3e}, fast {:.3e} (f32 unit roundoff {U:.1e})",
            errors[0], errors[1]
        );
        // Random-sign sums grow like sqrt(K) u, far below the worst case K u.
        assert!(errors.iter().all(|&e| e < (k as f64).sqrt() * 16.0 * U), "{errors:?}");
    }
}

// ---------------------------------------------------------------- typed errors

fn expect_args(result: fp8_engine::Result<GemmReport>, needle: &str) {
    match result {
        Err(Error::KernelArgs { kernel: "gemm", detail }) => {
            assert!(detail.contains(needle), "message '{detail}' should mention '{needle}'")
        }
        other => panic!("expected a gemm KernelArgs error mentioning '{needle}', got {other:?}"),
    }
}

#[test]
fn unsupported_inputs_are_typed_errors() {
    let mut rng = StdRng::seed_from_u64(7);
    let q = |rng: &mut StdRng, kind, format, rows, k| quantized(rng, kind, format, rows, k);
    let (e4, e5) = (Fp8Format::E4M3, Fp8Format::E5M2);
    let pt = ScaleKind::PerTensor;
    let p = GemmParams::default();
    let mut d = vec![0.0f32; 4 * 5];

    let (a5, b5) = (q(&mut rng, pt, e5, 4, 32), q(&mut rng, pt, e5, 5, 32));
    let r = gemm::cpu::gemm(&Operand::Fp8(e5, &a5), &Operand::Fp8(e5, &b5), Output::F32(&mut d), &p);
    expect_args(r, "E5M2 x E5M2");

    let (a, b) = (q(&mut rng, pt, e4, 4, 24), q(&mut rng, pt, e4, 5, 24));
    let r = gemm::cpu::gemm(&Operand::Fp8(e4, &a), &Operand::Fp8(e4, &b), Output::F32(&mut d), &p);
    expect_args(r, "4x5x24: K must be a multiple of 16");

    let (a, b) = (q(&mut rng, pt, e4, 4, 32), q(&mut rng, pt, e4, 5, 48));
    let r = gemm::cpu::gemm(&Operand::Fp8(e4, &a), &Operand::Fp8(e4, &b), Output::F32(&mut d), &p);
    expect_args(r, "A is 4x32 and B is 5x48");

    let (a, b) = (q(&mut rng, pt, e4, 4, 32), q(&mut rng, pt, e4, 5, 32));
    let (fa, fb) = (Operand::Fp8(e4, &a), Operand::Fp8(e4, &b));
    let mut short = vec![0.0f32; 19];
    match gemm::cpu::gemm(&fa, &fb, Output::F32(&mut short), &p) {
        Err(Error::ShapeMismatch {
            rows: 4,
            cols: 5,
            expected: 20,
            got: 19,
            ..
        }) => {}
        other => panic!("wrong output length: {other:?}"),
    }

    let bias = [0.0f32; 4];
    let with_bias = GemmParams {
        bias: Some((&bias).into()),
        ..p
    };
    expect_args(
        gemm::cpu::gemm(&fa, &fb, Output::F32(&mut d), &with_bias),
        "bias has 4 elements, N is 5",
    );

    let beta = GemmParams { beta: 1.0, ..p };
    let mut half_out = vec![bf16::ZERO; 20];
    expect_args(
        gemm::cpu::gemm(&fa, &fb, Output::Bf16(&mut half_out), &beta),
        "needs an f32 output",
    );
    let mut codes = vec![0u8; 20];
    let fp8_out = Output::Fp8 {
        codes: &mut codes,
        format: e4,
        scale: 1.0,
    };
    expect_args(gemm::cpu::gemm(&fa, &fb, fp8_out, &beta), "needs an f32 output");
    let bad_scale = Output::Fp8 {
        codes: &mut codes,
        format: e4,
        scale: 0.0,
    };
    assert!(matches!(
        gemm::cpu::gemm(&fa, &fb, bad_scale, &p),
        Err(Error::InvalidScale { .. })
    ));

    let xs = vec![1.0f32; 4 * 32];
    let hs = vec![bf16::ONE; 5 * 32];
    let (pa, pb) = (Mat::new(&xs, 4, 32).unwrap(), Mat::new(&hs, 5, 32).unwrap());
    expect_args(
        gemm::cpu::gemm(&Operand::F32(pa), &Operand::Bf16(pb), Output::F32(&mut d), &p),
        "A is f32 and B is bf16",
    );
    expect_args(
        gemm::cpu::gemm(&Operand::F32(pa), &fb, Output::F32(&mut d), &p),
        "A is f32 and B is e4m3",
    );
    // A Mat built field by field with too few values.
    let liar = Mat {
        data: &xs[..10],
        rows: 4,
        cols: 32,
        transposed: false,
        mirror: None,
    };
    assert!(matches!(
        gemm::cpu::gemm(&Operand::F32(liar), &Operand::F32(pa), Output::F32(&mut d), &p),
        Err(Error::ShapeMismatch { got: 10, .. })
    ));

    for (ka, kb) in [
        (ScaleKind::Block128x128, ScaleKind::Block1x128),
        (ScaleKind::Block128x128, ScaleKind::Block128x128),
        (ScaleKind::PerTensor, ScaleKind::Block1x128),
        (ScaleKind::Mxfp8, ScaleKind::Block1x128),
    ] {
        let (a, b) = (q(&mut rng, ka, e4, 4, 32), q(&mut rng, kb, e4, 5, 32));
        let r = gemm::cpu::gemm(&Operand::Fp8(e4, &a), &Operand::Fp8(e4, &b), Output::F32(&mut d), &p);
        expect_args(r, &format!("scales {ka:?} (A) x {kb:?} (B) are not a supported pair"));
    }
}

#[test]
fn empty_and_nan_edges() {
    // K = 0: D = bias; M = 0: nothing to write; a NaN code makes the amax NaN.
    let bias = [1.0f32, -2.0, 3.0];
    let p = GemmParams {
        bias: Some((&bias).into()),
        ..GemmParams::default()
    };
    let none: [f32; 0] = [];
    let (a, b) = (Mat::new(&none, 2, 0).unwrap(), Mat::new(&none, 3, 0).unwrap());
    let mut d = vec![f32::NAN; 6];
    let report = gemm::cpu::gemm(&Operand::F32(a), &Operand::F32(b), Output::F32(&mut d), &p).unwrap();
    assert_eq!(d, [1.0, -2.0, 3.0, 1.0, -2.0, 3.0]);
    assert_eq!(report.amax, 3.0);

    // FP8 with K = 0 after a GEMM that left other values in the engine's scratch tiles.
    let mut rng = StdRng::seed_from_u64(8);
    let (qa, qb) = (
        quantized(&mut rng, ScaleKind::Block1x128, Fp8Format::E4M3, 2, 128),
        quantized(&mut rng, ScaleKind::Block128x128, Fp8Format::E4M3, 3, 128),
    );
    let (a, b) = (Operand::Fp8(Fp8Format::E4M3, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
    gemm::cpu::gemm(&a, &b, Output::F32(&mut d), &GemmParams::default()).unwrap();
    for kind in [ScaleKind::PerTensor, ScaleKind::Block1x128] {
        let q0 = |rows| QuantizedMatrix::new(Vec::new(), rows, 0, scales_for(kind, rows, 0)).unwrap();
        let (qa, qb) = (q0(2), q0(3));
        let (a, b) = (Operand::Fp8(Fp8Format::E4M3, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
        let mut d = vec![f32::NAN; 6];
        gemm::cpu::gemm(&a, &b, Output::F32(&mut d), &p).unwrap();
        assert_eq!(d, [1.0, -2.0, 3.0, 1.0, -2.0, 3.0], "{kind:?}");
    }

    let mut empty: Vec<f32> = Vec::new();
    let (a, b) = (Mat::new(&none, 0, 0).unwrap(), Mat::new(&none, 3, 0).unwrap());
    let report = gemm::cpu::gemm(&Operand::F32(a), &Operand::F32(b), Output::F32(&mut empty), &p).unwrap();
    assert_eq!(report.amax, 0.0);

    let mut codes = vec![0x38u8; 2 * 16]; // 1.0 in E4M3
    codes[5] = 0x7F; // NaN
    let qa = QuantizedMatrix::new(codes, 2, 16, Scales::PerTensor(1.0)).unwrap();
    let qb = QuantizedMatrix::new(vec![0x38u8; 16], 1, 16, Scales::PerTensor(1.0)).unwrap();
    let mut d = vec![0.0f32; 2];
    let (a, b) = (Operand::Fp8(Fp8Format::E4M3, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
    let report = gemm::cpu::gemm(&a, &b, Output::F32(&mut d), &GemmParams::default()).unwrap();
    assert!(d[0].is_nan() && d[1] == 16.0, "{d:?}");
    assert!(report.amax.is_nan());
}

/// A plain operand read from its stored transpose (`Mat::transposed`, how the backward reads
/// `X`, `dY` and `W`) gives the bits of the same GEMM on a K-major copy, for every plain dtype,
/// on either side, with a K that is cut into chunks; `k_major` makes that copy.
#[test]
fn transposed_plain_operands_match_k_major_copies() {
    let mut rng = StdRng::seed_from_u64(7);
    let (m, n, k) = (70, 45, 600);
    let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2.0..2.0)).collect();
    let b: Vec<f32> = (0..n * k).map(|_| rng.random_range(-2.0..2.0)).collect();
    let transpose =
        |x: &[f32], rows: usize| -> Vec<f32> { (0..k).flat_map(|kk| (0..rows).map(move |r| x[r * k + kk])).collect() };
    let (at, bt) = (transpose(&a, m), transpose(&b, n));
    let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25).collect();
    let p = GemmParams {
        bias: Some((&bias).into()),
        ..GemmParams::default()
    };
    let run = |x: &Operand, y: &Operand| {
        let mut d = vec![0.0f32; m * n];
        gemm::cpu::gemm(x, y, Output::F32(&mut d), &p).unwrap();
        d.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    // f32
    let (ak, bk) = (Mat::new(&a, m, k).unwrap(), Mat::new(&b, n, k).unwrap());
    let (atm, btm) = (Mat::transposed(&at, m, k).unwrap(), Mat::transposed(&bt, n, k).unwrap());
    assert_eq!(atm.k_major().as_ref(), a.as_slice());
    assert_eq!(btm.k_major().as_ref(), b.as_slice());
    let want = run(&Operand::F32(ak), &Operand::F32(bk));
    assert_eq!(run(&Operand::F32(atm), &Operand::F32(bk)), want, "f32, A transposed");
    assert_eq!(run(&Operand::F32(ak), &Operand::F32(btm)), want, "f32, B transposed");
    assert_eq!(
        run(&Operand::F32(atm), &Operand::F32(btm)),
        want,
        "f32, both transposed"
    );
    // bf16 and f16: the same values narrowed first.
    let h = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
    let (ah, bh, ath, bth) = (h(&a), h(&b), h(&at), h(&bt));
    let want = run(
        &Operand::Bf16(Mat::new(&ah, m, k).unwrap()),
        &Operand::Bf16(Mat::new(&bh, n, k).unwrap()),
    );
    let got = run(
        &Operand::Bf16(Mat::transposed(&ath, m, k).unwrap()),
        &Operand::Bf16(Mat::transposed(&bth, n, k).unwrap()),
    );
    assert_eq!(got, want, "bf16, both transposed");
    let f = |x: &[f32]| x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>();
    let (af, btf) = (f(&a), f(&bt));
    let want = run(
        &Operand::F16(Mat::new(&af, m, k).unwrap()),
        &Operand::F16(Mat::new(&f(&b), n, k).unwrap()),
    );
    let got = run(
        &Operand::F16(Mat::new(&af, m, k).unwrap()),
        &Operand::F16(Mat::transposed(&btf, n, k).unwrap()),
    );
    assert_eq!(got, want, "f16, B transposed");
    // A transposed matrix is checked like any other: rows * cols values.
    assert!(matches!(
        Mat::transposed(&at[..10], m, k),
        Err(Error::ShapeMismatch { got: 10, .. })
    ));
}
