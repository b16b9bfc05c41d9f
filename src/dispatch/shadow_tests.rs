//! Shadow mode on the CPU: a whole `TransformerLayer` shadowed by itself passes and
//! keeps its results; a perturbed exact op fails naming op, layer and index; a
//! perturbed bounded op passes within its bound and fails beyond it.

use super::{Backend, Perturbed, perturb_cpu_primaries};
use crate::amp::{Fp8Recipe, Precision};
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
    Backend::default().kernels().column_sum(&x, 3, &mut plain).unwrap();
    let shadow = Backend::default().checked_against_cpu(true, "bias");
    shadow.kernels().column_sum(&x, 3, &mut checked).unwrap();
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
        .column_sum(&x, 3, &mut checked)
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
            &GemmParams::default(),
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
