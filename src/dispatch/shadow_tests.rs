//! Shadow mode on the CPU: a whole `TransformerLayer` shadowed by itself passes and
//! keeps its results; a perturbed exact op fails naming op, layer and index; a
//! perturbed bounded op passes within its bound and fails beyond it.

use super::{Backend, Perturbed, perturb_cpu_primaries};
use super::{Values, ValuesMut};
use crate::amp::{Fp8Recipe, Precision};
use crate::backend::cuda::error_bound::FP8_ACCUMULATOR_BITS;
use crate::error::{Error, Result};
use crate::gemm::{GemmParams, Mat, Operand, Output};
use crate::nn::{Module, TransformerConfig, TransformerLayer};
use crate::scaling::DelayedScaling;
use crate::tensor::Tensor;

const BATCH: usize = 2;
const SEQ: usize = 8;

fn config() -> TransformerConfig {
    TransformerConfig {
        hidden: 32,
        heads: 4,
        ffn_hidden: 64,
        ..TransformerConfig::default()
    }
}

fn input(seed: u32) -> Tensor {
    let data = (0..BATCH * SEQ * 32)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
        .collect();
    Tensor::new(data, BATCH * SEQ, 32).unwrap()
}

/// Two steps of forward + backward (the second one with delayed scales updated); the outputs,
/// input gradients and parameter gradients, as bits.
fn run(precision: &Precision, check: bool, perturbed: Option<Perturbed>) -> Result<Vec<u32>> {
    let mut layer = TransformerLayer::new("blocks.0", &config(), precision, 3)?;
    perturb_cpu_primaries(perturbed);
    layer.check_against_cpu(check);
    perturb_cpu_primaries(None);
    let mut bits = Vec::new();
    for step in 0..2 {
        layer.zero_grad();
        let y = layer.forward(&input(step), BATCH, SEQ)?;
        let dx = layer.backward(&y)?;
        bits.extend(y.data().iter().chain(dx.data()).map(|v| v.to_bits()));
        layer.visit_parameters(&mut |p| bits.extend(p.grad().iter().map(|v| v.to_bits())));
    }
    Ok(bits)
}

fn precisions() -> [Precision; 2] {
    [
        Precision::Fp32,
        Precision::Fp8(Fp8Recipe::Delayed(DelayedScaling::default())),
    ]
}

#[test]
fn a_layer_shadowed_by_the_cpu_passes_with_the_same_bits() {
    for precision in precisions() {
        let plain = run(&precision, false, None).unwrap();
        let shadowed = run(&precision, true, None).unwrap_or_else(|e| panic!("{}: {e}", precision.name()));
        assert_eq!(
            plain,
            shadowed,
            "{}: shadow mode must not change results",
            precision.name()
        );
    }
}

#[test]
fn a_perturbed_exact_op_fails_naming_op_layer_and_index() {
    let fp8 = &precisions()[1];
    let quantize = Perturbed {
        op: "quantize",
        index: 5,
        ulps: 1,
    };
    match run(fp8, true, Some(quantize)) {
        Err(Error::TwinMismatch {
            op,
            layer,
            index,
            primary,
            cpu,
            ..
        }) => {
            assert_eq!((op, index), ("quantize", 5));
            assert_eq!(layer, "blocks.0.attn.qkv.linear");
            // The code with its lowest mantissa bit flipped.
            assert_eq!(primary as u32 ^ 1, cpu as u32);
        }
        other => panic!("expected a quantize mismatch, got {other:?}"),
    }
    let residual = Perturbed {
        op: "residual_add",
        index: 17,
        ulps: 1,
    };
    match run(&Precision::Fp32, true, Some(residual)) {
        Err(
            e @ Error::TwinMismatch {
                op: "residual_add",
                index: 17,
                ..
            },
        ) => {
            let message = e.to_string();
            assert!(
                message.contains("residual_add") && message.contains("blocks.0") && message.contains("17"),
                "{message}"
            );
        }
        other => panic!("expected a residual_add mismatch, got {other:?}"),
    }
}

#[test]
fn a_perturbed_bounded_op_passes_within_its_bound_and_fails_beyond() {
    for precision in precisions() {
        // rtol 1e-5 is about 40 to 80 ulp of f32; 4 ulp is within, 2^16 ulp (about 1%) beyond.
        let within = Perturbed {
            op: "gelu_forward",
            index: 3,
            ulps: 4,
        };
        let result = run(&precision, true, Some(within));
        assert!(result.is_ok(), "{}: {result:?}", precision.name());
        if precision == Precision::Fp32 {
            // (Under FP8 the next cast rounds 4 ulp away.)
            assert_ne!(
                result.unwrap(),
                run(&precision, false, None).unwrap(),
                "the perturbation must take effect"
            );
        }
        let beyond = Perturbed {
            op: "gelu_forward",
            index: 3,
            ulps: 1 << 16,
        };
        match run(&precision, true, Some(beyond)) {
            Err(Error::TwinMismatch {
                op: "gelu_forward",
                layer,
                index: 3,
                ..
            }) => assert_eq!(layer, "blocks.0.mlp"),
            other => panic!("{}: expected a gelu_forward mismatch, got {other:?}", precision.name()),
        }
    }
}

#[test]
fn switching_the_check_off_gives_the_plain_backend_back() {
    let mut layer = TransformerLayer::new("blocks.0", &config(), &Precision::Fp32, 3).unwrap();
    perturb_cpu_primaries(Some(Perturbed {
        op: "residual_add",
        index: 0,
        ulps: 1,
    }));
    layer.check_against_cpu(true);
    perturb_cpu_primaries(None);
    layer.check_against_cpu(false);
    layer
        .forward(&input(0), BATCH, SEQ)
        .expect("no shadow, no perturbation");
}

#[test]
fn in_place_state_is_copied_before_the_primary_op() {
    // `+=` ops: the twin must start from the sums as they were, not as the primary left them.
    let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
    let (mut plain, mut checked) = (vec![1.0f32, -2.0, 3.0], vec![1.0f32, -2.0, 3.0]);
    Backend::default()
        .kernels()
        .column_sum(Values::Host(&x), 3, ValuesMut::Host(&mut plain))
        .unwrap();
    let shadow = Backend::default().checked_against_cpu(true, "bias");
    shadow
        .kernels()
        .column_sum(Values::Host(&x), 3, ValuesMut::Host(&mut checked))
        .unwrap();
    assert_eq!(plain, checked);
    // And a moved accumulator is caught at its index.
    perturb_cpu_primaries(Some(Perturbed {
        op: "column_sum",
        index: 2,
        ulps: 1 << 12,
    }));
    let perturbed = Backend::default().checked_against_cpu(true, "bias");
    perturb_cpu_primaries(None);
    let err = perturbed
        .kernels()
        .column_sum(Values::Host(&x), 3, ValuesMut::Host(&mut checked))
        .expect_err("moved beyond the bound");
    assert!(
        matches!(
            err,
            Error::TwinMismatch {
                op: "column_sum",
                index: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A GEMM's f32 result is held to the order bound of its own K (`contract::gemm_tolerance`):
/// the same 1000-ulp move of one output (at most 1.2e-4 relative here) passes with K = 4096
/// (rtol 4.9e-4) and fails with K = 16 (rtol 1.9e-6, atol 1e-5 at |D| near 30).
#[test]
fn a_perturbed_gemm_is_held_to_the_tolerance_of_its_own_k() {
    for (k, passes) in [(4096usize, true), (16, false)] {
        let values = |rows: usize| -> Vec<f32> { (0..rows * k).map(|i| 1.0 + (i % 7) as f32 / 8.0).collect() };
        let (a, b) = (values(2), values(3));
        let (a, b) = (Mat::new(&a, 2, k).unwrap(), Mat::new(&b, 3, k).unwrap());
        perturb_cpu_primaries(Some(Perturbed {
            op: "gemm",
            index: 4,
            ulps: 1000,
        }));
        let shadow = Backend::default().checked_against_cpu(true, "probe");
        perturb_cpu_primaries(None);
        let mut d = vec![0.0f32; 6];
        let result = shadow.kernels().gemm(
            &Operand::F32(a),
            &Operand::F32(b),
            Output::F32(&mut d),
            GemmParams::default(),
        );
        match (passes, result) {
            (true, Ok(_)) => {}
            (
                false,
                Err(Error::TwinMismatch {
                    op: "gemm", index: 4, ..
                }),
            ) => {}
            (_, other) => panic!("K = {k}: {other:?}"),
        }
    }
}

/// `gemm_into` (an f32 output held anywhere) is held to the same per-K bound as `gemm`, and
/// its twin starts from the output's values before the call (what `beta` multiplies).
#[test]
fn a_perturbed_gemm_into_is_held_like_gemm_and_accumulates_from_the_same_start() {
    for (k, passes) in [(4096usize, true), (16, false)] {
        let values = |rows: usize| -> Vec<f32> { (0..rows * k).map(|i| 1.0 + (i % 7) as f32 / 8.0).collect() };
        let (a, b) = (values(2), values(3));
        let (a, b) = (Mat::new(&a, 2, k).unwrap(), Mat::new(&b, 3, k).unwrap());
        perturb_cpu_primaries(Some(Perturbed {
            op: "gemm_into",
            index: 4,
            ulps: 1000,
        }));
        let shadow = Backend::default().checked_against_cpu(true, "probe");
        perturb_cpu_primaries(None);
        // beta = 1 over a start of distinct values: a twin that started from anything else
        // would differ at every element.
        let start: Vec<f32> = (0..6).map(|i| 100.0 * i as f32).collect();
        let mut d = start.clone();
        let accumulate = GemmParams {
            beta: 1.0,
            ..GemmParams::default()
        };
        let result =
            shadow
                .kernels()
                .gemm_into(&Operand::F32(a), &Operand::F32(b), ValuesMut::Host(&mut d), accumulate);
        match (passes, result) {
            (true, Ok(_)) => assert!(d.iter().zip(&start).all(|(x, s)| x > s), "accumulated: {d:?}"),
            (
                false,
                Err(Error::TwinMismatch {
                    op: "gemm_into",
                    index: 4,
                    ..
                }),
            ) => {}
            (_, other) => panic!("K = {k}: {other:?}"),
        }
    }
}

/// Operands `1 x k` from values exact in E4M3, with `scales`.
fn e4m3(values: &[f32], scales: crate::tensor::Scales) -> crate::tensor::QuantizedMatrix {
    let table = crate::format::Fp8Format::E4M3.decode_table();
    let codes = values
        .iter()
        .map(|&v| table.iter().position(|&x| x == v).expect("exact in E4M3") as u8)
        .collect();
    crate::tensor::QuantizedMatrix::new(codes, 1, values.len(), scales).unwrap()
}

/// One `1 x 1` GEMM with an f32 output, shadowed by the CPU with the primary's output moved by `ulps`.
fn shadowed_gemm(a: &Operand, b: &Operand, ulps: i32) -> Result<crate::gemm::GemmReport> {
    perturb_cpu_primaries(Some(Perturbed {
        op: "gemm",
        index: 0,
        ulps,
    }));
    let shadow = Backend::default().checked_against_cpu(true, "probe");
    perturb_cpu_primaries(None);
    let mut d = [0.0f32];
    shadow.kernels().gemm(a, b, Output::F32(&mut d), GemmParams::default())
}

/// The ulps of `d` (a normal f32) that make `distance`, which must be a whole number of them.
fn ulps_of(d: f32, distance: f64) -> i32 {
    let ulp = 2f64.powi(d.abs().log2().floor() as i32 - 23);
    let ulps = distance / ulp;
    assert_eq!(ulps.fract(), 0.0, "{distance} is not a whole number of ulps of {d}");
    ulps as i32
}

/// FP8 GEMMs with an f32 output are held to their own bound (`docs/numerics.md`, Tolerances):
/// `S (K/32 + 2) 2^-12`, `S = sum |a b| sA sB` with each K block's scales (per tensor, 1x128 x
/// 128x128, MXFP8), not the f32 row (rtol 7.6e-6 at K = 64): exactly the bound passes, one
/// ulp more fails naming the bound and the ratio. The cancelling case (D = 2, S = 95) passes
/// only through the exact `S`, the estimate from `|D|` being 47 times smaller.
#[test]
fn a_perturbed_fp8_gemm_is_held_to_its_own_bound() {
    use crate::tensor::Scales;
    let ones = |k: usize| vec![1.0f32; k];
    let mut cancelling = vec![1.5f32; 32];
    cancelling.extend([-1.5f32; 31]);
    cancelling.push(0.5);
    // (label, A, B, D, S, K): hand sums.
    let cases = [
        (
            "per tensor",
            e4m3(&[1.5; 64], Scales::PerTensor(1.0)),
            e4m3(&ones(64), Scales::PerTensor(1.0)),
            96.0,
            96.0,
            64,
        ),
        (
            "cancelling",
            e4m3(&cancelling, Scales::PerTensor(1.0)),
            e4m3(&ones(64), Scales::PerTensor(1.0)),
            2.0,
            95.0,
            64,
        ),
        // 1.5 * 0.5 * 1 * 4 per product.
        (
            "1x128 x 128x128",
            e4m3(&[1.5; 128], Scales::Block1x128(vec![0.5])),
            e4m3(&ones(128), Scales::Block128x128(vec![4.0])),
            384.0,
            384.0,
            128,
        ),
        // E8M0 128 = 2 on the first 32 of K, 127 = 1 on the rest.
        (
            "mxfp8",
            e4m3(&[1.5; 64], Scales::Mxfp8(vec![128, 127])),
            e4m3(&ones(64), Scales::Mxfp8(vec![127, 127])),
            144.0,
            144.0,
            64,
        ),
    ];
    for (label, a, b, d, s, k) in &cases {
        let (a, b) = (
            Operand::Fp8(crate::format::Fp8Format::E4M3, a),
            Operand::Fp8(crate::format::Fp8Format::E4M3, b),
        );
        let bound = s * (*k as f64 / 32.0 + 2.0) * 2f64.powi(-FP8_ACCUMULATOR_BITS);
        let mut plain = [0.0f32];
        Backend::default()
            .kernels()
            .gemm(&a, &b, Output::F32(&mut plain), GemmParams::default())
            .unwrap();
        assert_eq!(plain[0], *d, "{label}");
        let at_bound = ulps_of(*d, bound);
        // Outside the f32 row that held these GEMMs before.
        let row = super::contract::gemm_tolerance(super::contract::GemmDtype::F32, *k);
        assert!(
            !super::contract::agrees(row, *d as f64 + bound / 2.0, *d as f64),
            "{label}"
        );
        for ulps in [at_bound / 2, at_bound, -at_bound] {
            shadowed_gemm(&a, &b, ulps).unwrap_or_else(|e| panic!("{label}, {ulps} ulps: {e}"));
        }
        match shadowed_gemm(&a, &b, at_bound + 1) {
            Err(
                e @ Error::TwinMismatch {
                    op: "gemm", index: 0, ..
                },
            ) => {
                let Error::TwinMismatch {
                    bound: got,
                    ratio,
                    layer,
                    ..
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!((*got, layer.as_str()), (bound, "probe"), "{label}");
                let expected = (at_bound + 1) as f64 / at_bound as f64;
                assert!((ratio - expected).abs() < 1e-9, "{label}: ratio {ratio} vs {expected}");
                let message = e.to_string();
                assert!(
                    message.contains(&format!("{expected:.3}")) && message.contains(&format!("{bound:e}")),
                    "{message}"
                );
            }
            other => panic!("{label}: expected a gemm mismatch, got {other:?}"),
        }
    }
}

/// The same numbers in f32 operands keep the f32 contract: `2 gamma_K sum |a b|` (7.3e-4 at
/// D = S = 96, K = 64), so half the FP8 bound (0.047) is a breach there, and the ratio says by how much.
#[test]
fn a_perturbed_f32_gemm_keeps_the_f32_bound() {
    let (av, bv) = ([1.5f32; 64], [1.0f32; 64]);
    let (a, b) = (
        Operand::F32(Mat::new(&av, 1, 64).unwrap()),
        Operand::F32(Mat::new(&bv, 1, 64).unwrap()),
    );
    let fp8_half = ulps_of(96.0, 96.0 * 4.0 * 2f64.powi(-FP8_ACCUMULATOR_BITS) / 2.0);
    match shadowed_gemm(&a, &b, fp8_half) {
        Err(Error::TwinMismatch {
            op: "gemm",
            bound,
            ratio,
            ..
        }) => {
            let u = 2f64.powi(-24);
            let order = 2.0 * 64.0 * u / (1.0 - 64.0 * u) * 96.0;
            assert!((bound - order).abs() <= 1e-12 * order, "bound {bound} vs {order}");
            let half_fp8 = 96.0 * 4.0 * 2f64.powi(-FP8_ACCUMULATOR_BITS) / 2.0;
            assert!((ratio - half_fp8 / order).abs() < 1e-6 * ratio, "{ratio}");
        }
        other => panic!("expected a gemm mismatch, got {other:?}"),
    }
    // Within the order bound (5 ulp of 96 = 3.8e-5): passes, as before.
    shadowed_gemm(&a, &b, 5).unwrap();
}
