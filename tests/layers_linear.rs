//! Linear: finite-difference gradients (fp32), every precision against fp32, the
//! delayed-scaling state against a hand-run of the delayed-scaling update (`docs/numerics.md`), weight caching across
//! micro-batches, statistics, and typed errors.

mod layers_util;

use fp8_engine::amp::{Fp8Recipe, Precision};
use fp8_engine::format::Fp8Format;
use fp8_engine::nn::{Linear, Module, Tensor};
use fp8_engine::scaling::{AmaxComputeAlgo, DelayedScaling, DelayedSlot, RecipeFormat};
use layers_util::*;

const POLICIES: [&str; 7] = [
    "bf16",
    "fp16",
    "fp8-delayed",
    "fp8-current",
    "fp8-block",
    "mxfp8",
    "fp32",
];

#[test]
fn gradients_match_finite_differences_under_fp32() {
    for bias in [false, true] {
        let mut layer = Linear::new("fc", 24, 20, bias, &Precision::Fp32, 3).unwrap();
        let x = tensor(1, 6, 24, 1.0);
        grad_check(&mut layer, &x, &|l, x| l.forward(x).unwrap(), &|l, dy| {
            l.backward(dy).unwrap()
        });
    }
}

/// Forward output, dX and dW of one step under `name`, with identical weights and inputs.
fn one_step(name: &str, x: &Tensor, dy: &Tensor) -> (Tensor, Tensor, Vec<f32>, Vec<f32>) {
    let mut layer = Linear::new("fc", 256, 128, true, &precision(name), 11).unwrap();
    let y = layer.forward(x).unwrap();
    let dx = layer.backward(dy).unwrap();
    let g = grads(&mut layer);
    (y, dx, g[0].1.clone(), g[1].1.clone())
}

#[test]
fn every_precision_matches_fp32_within_spec_tolerances() {
    // Realistic inputs: roughly normal, a non-zero mean, a few outliers.
    let mut x = tensor(5, 64, 256, 1.0);
    x.data_mut().iter_mut().step_by(97).for_each(|v| *v *= 6.0);
    let dy = tensor(6, 64, 128, 0.05);
    let (y32, dx32, dw32, db32) = one_step("fp32", &x, &dy);
    for name in POLICIES {
        let (y, dx, dw, db) = one_step(name, &x, &dy);
        assert_close(&format!("{name} y"), y.data(), y32.data(), tolerance(name, false));
        assert_close(&format!("{name} dx"), dx.data(), dx32.data(), tolerance(name, true));
        assert_close(&format!("{name} dw"), &dw, &dw32, tolerance(name, true));
        // dbias is an f32 column sum of dY under every precision.
        assert_close(&format!("{name} db"), &db, &db32, tolerance("fp32", true));
    }
}

#[allow(clippy::manual_memcpy)] // element by element, as the spec states it
/// The delayed-scaling update (`docs/numerics.md`) by hand: roll `last` into the window, scale from the max (or the last).
fn hand_update(scale: &mut f32, history: &mut Vec<f32>, last: f32, fp8_max: f32, algo: AmaxComputeAlgo) {
    if last == 0.0 {
        return;
    }
    let window_max = history[1..].iter().fold(last, |a, &b| a.max(b));
    let amax = if algo == AmaxComputeAlgo::Max { window_max } else { last };
    let mut rolled = vec![0.0; history.len()];
    for i in 1..history.len() - 1 {
        rolled[i] = history[i + 1];
    }
    if history.len() > 1 {
        *rolled.last_mut().unwrap() = last;
    }
    *history = rolled;
    if amax.is_finite() && amax > 0.0 {
        let s = fp8_max / amax;
        *scale = if s.is_infinite() { f32::MAX } else { s };
    }
}

fn slots(layer: &mut Linear) -> Vec<(String, DelayedSlot)> {
    let mut out = Vec::new();
    layer.visit_fp8_slots(&mut |name, slot| out.push((name.to_string(), slot.clone())));
    out
}

fn amax(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |a, &b| a.max(b.abs()))
}

#[test]
fn delayed_scaling_state_equals_a_hand_run_of_the_spec() {
    for algo in [AmaxComputeAlgo::Max, AmaxComputeAlgo::MostRecent] {
        let recipe = DelayedScaling {
            amax_history_len: 3,
            amax_compute_algo: algo,
            ..DelayedScaling::default()
        };
        let precision = Precision::Fp8(Fp8Recipe::Delayed(recipe));
        let mut layer = Linear::new("fc", 32, 48, false, &precision, 7).unwrap();
        // [scale, history] per slot: input, weight, output_grad (exact amaxes known up front).
        let mut hand = vec![(1.0f32, vec![0.0f32; 3]); 3];
        let w_amax = amax(layer.weight().value());
        for step in 0..5u64 {
            // Input and gradient magnitudes change from step to step, so the window matters.
            let x = tensor(100 + step, 16, 32, 0.5 + step as f32 * 0.7 % 2.0);
            let dy = tensor(200 + step, 16, 48, 0.01 * (5 - step) as f32);
            // Every slot casts with the scale of the previous steps' amaxes.
            let before = slots(&mut layer);
            assert_eq!(before[0].1.scale, hand[0].0, "step {step} input scale");
            layer.forward(&x).unwrap();
            let y_slot = slots(&mut layer)[2].1.clone();
            layer.backward(&dy).unwrap();
            layer.weight_mut().mark_updated(); // an optimizer step: the weight is cast again
            for (k, last, format) in [
                (0, amax(x.data()), Fp8Format::E4M3),
                (1, w_amax, Fp8Format::E4M3),
                (2, amax(dy.data()), Fp8Format::E5M2),
            ] {
                let (scale, history) = &mut hand[k];
                hand_update(scale, history, last, format.max_finite(), algo);
            }
            let after = slots(&mut layer);
            for (k, index) in [(0, 0), (1, 1), (2, 3)] {
                let (name, slot) = &after[index];
                assert_eq!(slot.history, hand[k].1, "step {step} {name} history");
                assert_eq!(slot.scale, hand[k].0, "step {step} {name} scale");
            }
            // Output slot: its last entry is the amax of the f32 GEMM result (bf16-rounded output here).
            assert_eq!(y_slot.history[0], 0.0, "the forward update cleared slot 0");
            assert_eq!(after[2].0, "fc.output");
        }
    }
}

#[test]
fn delayed_output_slot_records_the_gemm_amax() {
    let precision = precision("fp8-delayed");
    let mut layer = Linear::new("fc", 32, 16, false, &precision, 1).unwrap();
    let y = layer.forward(&tensor(3, 16, 32, 1.0)).unwrap();
    let slot = slots(&mut layer)[2].1.clone();
    let recorded = *slot.history.last().unwrap();
    let rounded = amax(y.data());
    assert!(
        (recorded - rounded).abs() <= rounded * 2f32.powi(-8),
        "{recorded} vs {rounded}"
    );
    assert_eq!(slot.scale, 448.0 / recorded);
}

#[test]
fn weight_copy_is_made_once_per_step_and_wgrad_accumulates_across_micro_batches() {
    let precision = precision("fp8-current");
    let mut split = Linear::new("fc", 64, 32, true, &precision, 9).unwrap();
    let mut single = [
        Linear::new("fc", 64, 32, true, &precision, 9).unwrap(),
        Linear::new("fc", 64, 32, true, &precision, 9).unwrap(),
    ];
    let xs = [tensor(1, 16, 64, 1.0), tensor(2, 16, 64, 2.0)];
    let dys = [tensor(3, 16, 32, 0.1), tensor(4, 16, 32, 0.3)];
    for i in 0..2 {
        split.forward(&xs[i]).unwrap();
        split.backward(&dys[i]).unwrap();
        single[i].forward(&xs[i]).unwrap();
        single[i].backward(&dys[i]).unwrap();
    }
    let (a, b) = (grads(&mut single[0]), grads(&mut single[1]));
    for (k, (name, g)) in grads(&mut split).iter().enumerate() {
        let sum: Vec<f32> = a[k].1.iter().zip(&b[k].1).map(|(x, y)| x + y).collect();
        if name.ends_with("weight") {
            // wgrad's GEMM adds into the f32 grad (beta = 1): exactly the sum of the two products.
            assert_eq!(g, &sum, "{name}: f32 accumulation over micro-batches");
        } else {
            // dbias sums rows one by one into the grad: the same values, another summation order.
            assert_close(name, g, &sum, tolerance("fp32", true));
        }
    }
    // The cache holds E4M3 codes of W and W^T (+ scales), and survives until the version changes.
    let bytes = split.weight_cache_bytes();
    assert_eq!(bytes, 2 * (64 * 32 + 4));
    split.weight_mut().value_mut()[0] += 1.0;
    split.weight_mut().mark_updated();
    let y_new = split.forward(&xs[0]).unwrap();
    let y_old = single[0].forward(&xs[0]).unwrap();
    assert_ne!(y_new, y_old, "a new version is cast again");
}

#[test]
fn statistics_count_saturation_flush_and_nonfinite_values() {
    // Delayed scaling's first step casts with scale 1: values above 448 saturate, tiny ones flush.
    let mut layer = Linear::new("fc", 32, 16, false, &precision("fp8-delayed"), 2).unwrap();
    let mut x = tensor(7, 16, 32, 1.0);
    x.data_mut()[0] = 1000.0;
    x.data_mut()[1] = -500.0;
    x.data_mut()[2] = 1e-6;
    x.data_mut()[3] = f32::NAN;
    x.data_mut()[4] = f32::INFINITY;
    let y = layer.forward(&x).unwrap(); // no panic
    assert_eq!(y.rows(), 16);
    let mut stats = Vec::new();
    layer.collect_fp8_stats(&mut stats);
    let input = stats.iter().find(|s| s.name == "fc.input").unwrap();
    assert_eq!(input.format, "e4m3");
    assert_eq!(input.nonfinite, 2);
    assert_eq!(input.scale, 1.0);
    assert_eq!(input.amax, f32::INFINITY);
    assert!((input.saturated - 2.0 / 512.0).abs() < 1e-12, "{}", input.saturated);
    let nonzero = x.data().iter().filter(|v| v.is_finite() && **v != 0.0).count() as f64;
    let flushed = x
        .data()
        .iter()
        .filter(|v| v.is_finite() && **v != 0.0 && v.abs() < 2f32.powi(-10))
        .count();
    assert!(
        (input.underflow - flushed as f64 / nonzero).abs() < 1e-12,
        "{}",
        input.underflow
    );
    layer.backward(&tensor(8, 16, 16, 0.1)).unwrap();
    stats.clear();
    layer.collect_fp8_stats(&mut stats);
    let names: Vec<&str> = stats.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["fc.input", "fc.weight", "fc.output", "fc.output_grad", "fc.input_grad"]
    );
    assert_eq!(stats[3].format, "e5m2");
}

#[test]
fn shape_and_dimension_errors_name_the_shapes() {
    let mut layer = Linear::new("lm.fc", 32, 16, false, &Precision::Fp32, 1).unwrap();
    let err = layer.forward(&tensor(1, 4, 30, 1.0)).unwrap_err().to_string();
    assert!(
        err.contains("lm.fc") && err.contains("4x30") && err.contains("32"),
        "{err}"
    );
    let err = layer.backward(&tensor(1, 4, 16, 1.0)).unwrap_err().to_string();
    assert!(err.contains("without a forward"), "{err}");
    let err = Linear::new("fc", 40, 16, false, &precision("fp8-delayed"), 1)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("16x40") && err.contains("multiples of 16"), "{err}");
    let mut fp8 = Linear::new("fc", 32, 16, false, &precision("mxfp8"), 1).unwrap();
    let err = fp8.forward(&tensor(1, 10, 32, 1.0)).unwrap_err().to_string();
    assert!(err.contains("10x32") && err.contains("multiple of 16"), "{err}");
    fp8.forward(&tensor(1, 16, 32, 1.0)).unwrap();
    let err = fp8.backward(&tensor(1, 32, 16, 1.0)).unwrap_err().to_string();
    assert!(err.contains("16x16"), "{err}");
    // A high-precision layer takes any shape under an FP8 policy.
    let mut head = Linear::new_high_precision("head", 40, 10, false, &precision("fp8-block"), 1).unwrap();
    assert_eq!(head.precision(), &Precision::Bf16);
    head.forward(&tensor(1, 3, 40, 1.0)).unwrap();
}

#[test]
fn e4m3_only_recipe_uses_e4m3_gradients() {
    let recipe = DelayedScaling {
        format: RecipeFormat::E4M3,
        ..DelayedScaling::default()
    };
    let mut layer = Linear::new("fc", 32, 16, false, &Precision::Fp8(Fp8Recipe::Delayed(recipe)), 1).unwrap();
    layer.forward(&tensor(1, 16, 32, 1.0)).unwrap();
    layer.backward(&tensor(2, 16, 16, 1.0)).unwrap();
    let mut stats = Vec::new();
    layer.collect_fp8_stats(&mut stats);
    assert!(stats.iter().all(|s| s.format == "e4m3"));
}
