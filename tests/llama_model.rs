//! The engine's Llama-family model (`model::LlamaModel`) against the tiny Llama, Mistral and Qwen2
//! checkpoints of tests/fixtures/hf/models, whose logits, loss and greedy tokens `transformers`
//! recorded (scripts/fixtures/make_tiny_models.py; tests/hf_models.rs checks those recordings
//! against an independent f64 forward): fp32 logits, losses under bf16 and FP8, cached generation,
//! and the backward against finite differences.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use fp8_engine::amp::Precision;
use fp8_engine::data::IGNORE_INDEX;
use fp8_engine::hf::{HfConfig, HfModelDir};
use fp8_engine::model::{LlamaModel, Recompute};
use fp8_engine::nn::Module;
use serde_json::Value;

const MODELS: [&str; 3] = ["llama", "mistral", "qwen2"];

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf/models")
        .join(name)
}

struct Reference {
    ids: Vec<u32>,
    logits: Vec<f64>,
    loss: f64,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn reference(name: &str) -> Reference {
    let text = std::fs::read_to_string(model_dir(name).join("reference.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    Reference {
        ids: ids(&r["ids"]),
        logits: r["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
            .collect(),
        loss: r["loss"].as_f64().unwrap(),
        prompt: ids(&r["prompt"]),
        greedy: ids(&r["greedy"]),
    }
}

fn load(name: &str, precision: &str) -> LlamaModel {
    let dir = HfModelDir::open(&model_dir(name)).unwrap();
    LlamaModel::from_hf(&dir, &Precision::from_str(precision).unwrap(), Recompute::None).unwrap()
}

/// The reference window padded to 32 tokens (FP8 GEMMs take multiples of 16 rows); the padding
/// comes after every scored position, so causality keeps it out of the loss.
fn padded_window(r: &Reference) -> (Vec<u32>, Vec<u32>) {
    let mut inputs = r.ids.clone();
    let mut targets: Vec<u32> = r.ids[1..].to_vec();
    targets.push(IGNORE_INDEX);
    inputs.resize(32, 0);
    targets.resize(32, IGNORE_INDEX);
    (inputs, targets)
}

#[test]
fn fp32_logits_and_loss_match_transformers() {
    for name in MODELS {
        let r = reference(name);
        let mut model = load(name, "fp32");
        let logits = model.forward_logits(&r.ids, 1, r.ids.len()).unwrap();
        assert_eq!(logits.len(), r.logits.len());
        let scale = r.logits.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = logits
            .iter()
            .zip(&r.logits)
            .fold(0f64, |m, (a, b)| m.max((f64::from(*a) - b).abs()));
        // f32 forward against transformers' f32 forward: summation order only (~1e-6); a wrong
        // convention moves logits by 1e-2 of their scale or more.
        assert!(worst <= 1e-4 * scale, "{name}: max |diff| {worst}, max |logit| {scale}");
        let (inputs, targets) = padded_window(&r);
        let loss = model.forward_loss(&inputs, &targets, 1, 32).unwrap();
        let rel = (f64::from(loss) - r.loss).abs() / r.loss;
        assert!(rel <= 1e-4, "{name}: fp32 loss {loss} vs {} ({rel:e})", r.loss);
    }
}

#[test]
fn low_precision_losses_stay_near_the_reference() {
    for name in MODELS {
        let r = reference(name);
        let (inputs, targets) = padded_window(&r);
        for (precision, tolerance) in [
            ("bf16", 0.01),
            ("fp16", 0.01),
            ("fp8-current", 0.03),
            ("fp8-delayed", 0.03),
            ("fp8-block", 0.03),
            ("mxfp8", 0.03),
        ] {
            let mut model = load(name, precision);
            let loss = model.forward_loss(&inputs, &targets, 1, 32).unwrap();
            let rel = (f64::from(loss) - r.loss).abs() / r.loss;
            assert!(
                rel <= tolerance,
                "{name} {precision}: loss {loss} vs {} ({rel:e})",
                r.loss
            );
            // The backward runs under every precision and gives finite gradients.
            model.backward(1.0).unwrap();
            let mut finite = true;
            model.visit_parameters(&mut |p| finite &= p.grad().iter().all(|g| g.is_finite()));
            assert!(finite, "{name} {precision}: non-finite gradient");
        }
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn cached_greedy_generation_matches_transformers_and_full_recompute() {
    for name in MODELS {
        let r = reference(name);
        let mut model = load(name, "fp32");
        let vocab = model.vocab();
        let mut cache = model.new_cache();
        let mut logits = model.forward_cached(&r.prompt, &mut cache).unwrap();
        let mut seq = r.prompt.clone();
        for _ in 0..r.greedy.len() {
            let next = argmax(&logits[logits.len() - vocab..]);
            // The cached step's logits are the full recompute's last row.
            let full = model.forward_logits(&seq, 1, seq.len()).unwrap();
            let last = &full[full.len() - vocab..];
            let tail = &logits[logits.len() - vocab..];
            let worst = last.iter().zip(tail).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst <= 1e-5, "{name}: cached vs full logits differ by {worst}");
            seq.push(next);
            logits = model.forward_cached(&[next], &mut cache).unwrap();
        }
        assert_eq!(&seq[r.prompt.len()..], &r.greedy[..], "{name}: greedy tokens");
        assert_eq!(cache[0].len(), seq.len());
    }
}

#[test]
fn cached_generation_runs_under_fp8_with_padded_rows() {
    let r = reference("qwen2");
    let mut model = load("qwen2", "fp8-current");
    let vocab = model.vocab();
    let mut cache = model.new_cache();
    let first = model.forward_cached(&r.prompt, &mut cache).unwrap();
    assert_eq!(first.len(), r.prompt.len() * vocab);
    let next = model
        .forward_cached(&[argmax(&first[first.len() - vocab..])], &mut cache)
        .unwrap();
    assert_eq!(next.len(), vocab);
    assert!(next.iter().all(|v| v.is_finite()));
    assert_eq!(cache[1].len(), r.prompt.len() + 1);
}

fn tiny_config(tied: bool, bias: bool, kv_heads: usize) -> HfConfig {
    let arch = if bias { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" };
    HfConfig::from_json(&format!(
        r#"{{"architectures": ["{arch}"], "hidden_size": 16, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": {kv_heads},
            "head_dim": 4, "vocab_size": 11, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
            "rope_theta": 100.0, "tie_word_embeddings": {tied}, "hidden_act": "silu"}}"#
    ))
    .unwrap()
}

fn params(model: &mut LlamaModel) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    let mut out = Vec::new();
    model.visit_parameters(&mut |p| out.push((p.name().to_string(), p.value().to_vec(), p.grad().to_vec())));
    out
}

fn set_param(model: &mut LlamaModel, name: &str, values: &[f32]) {
    model.visit_parameters(&mut |p| {
        if p.name() == name {
            p.value_mut().copy_from_slice(values);
            p.mark_updated();
        }
    });
}

#[test]
fn backward_matches_finite_differences() {
    let (batch, seq) = (2, 5);
    let inputs: Vec<u32> = (0..batch * seq).map(|i| (i * 7 % 11) as u32).collect();
    let mut targets: Vec<u32> = (0..batch * seq).map(|i| (i * 3 % 11) as u32).collect();
    targets[3] = IGNORE_INDEX;
    for (tied, bias, kv_heads) in [(true, false, 2), (false, true, 1), (false, false, 4)] {
        let config = tiny_config(tied, bias, kv_heads);
        let mut model = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 5).unwrap();
        // Non-trivial norm weights and biases, so their gradients are tested too.
        for (name, value, _) in params(&mut model) {
            if name.ends_with("norm.weight") || name.ends_with(".bias") {
                let moved: Vec<f32> = value
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v + 0.1 * ((i as f32).sin()))
                    .collect();
                set_param(&mut model, &name, &moved);
            }
        }
        model.forward_loss(&inputs, &targets, batch, seq).unwrap();
        model.backward(1.0).unwrap();
        for (name, value, grad) in params(&mut model) {
            // Directional derivative along a fixed pattern, in f64 from f32 losses.
            let dir: Vec<f32> = (0..value.len()).map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0).collect();
            let analytic: f64 = grad.iter().zip(&dir).map(|(g, d)| f64::from(*g) * f64::from(*d)).sum();
            let eps = 3e-3f32;
            let mut loss_at = |sign: f32| {
                let moved: Vec<f32> = value.iter().zip(&dir).map(|(v, d)| v + sign * eps * d).collect();
                set_param(&mut model, &name, &moved);
                let (losses, _) = model.evaluate_losses(&inputs, &[&targets], batch, seq).unwrap();
                f64::from(losses[0])
            };
            let numeric = (loss_at(1.0) - loss_at(-1.0)) / (2.0 * f64::from(eps));
            set_param(&mut model, &name, &value);
            // Central differences: O(eps^2) curvature (1e-2 showed 2e-3 relative on the embedding)
            // plus f32 loss rounding / eps (~1e-4).
            let tolerance = 2e-3 * analytic.abs().max(numeric.abs()) + 2e-4;
            assert!(
                (analytic - numeric).abs() <= tolerance,
                "tied {tied} bias {bias} kv {kv_heads}: {name}: analytic {analytic} vs numeric {numeric}"
            );
        }
    }
}

#[test]
fn recompute_gives_the_same_gradients() {
    let config = tiny_config(false, true, 2);
    let inputs: Vec<u32> = (0..16).map(|i| (i * 5 % 11) as u32).collect();
    let targets: Vec<u32> = (0..16).map(|i| (i * 3 % 11) as u32).collect();
    let grads = |recompute| {
        let mut model = LlamaModel::new(&config, &Precision::Fp32, recompute, 9).unwrap();
        let loss = model.forward_loss(&inputs, &targets, 2, 8).unwrap();
        model.backward(1.0).unwrap();
        (loss.to_bits(), params(&mut model))
    };
    let (plain_loss, plain) = grads(Recompute::None);
    let (loss, recomputed) = grads(Recompute::Every);
    assert_eq!(plain_loss, loss);
    for ((name, _, a), (_, _, b)) in plain.iter().zip(&recomputed) {
        assert_eq!(a, b, "{name}");
    }
    assert!(plain.iter().any(|(_, _, g)| g.iter().any(|v| *v != 0.0)));
}

#[test]
fn every_op_of_the_model_passes_the_cpu_shadow_check() {
    let r = reference("qwen2");
    let (inputs, targets) = padded_window(&r);
    let mut model = load("qwen2", "fp32");
    model.check_against_cpu(true);
    let loss = model.forward_loss(&inputs, &targets, 1, 32).unwrap();
    model.backward(1.0).unwrap();
    let mut cache = model.new_cache();
    model.forward_cached(&r.prompt, &mut cache).unwrap();
    assert!((f64::from(loss) - r.loss).abs() <= 1e-4 * r.loss);
}

/// A held-out evaluation between training steps leaves the FP8 scaling state as the run without
/// it has it: the evaluation's forward makes the weights' FP8 copies after an optimizer step, and
/// the next training forward, which finds them made, still records their amaxes.
#[test]
fn an_evaluation_between_steps_leaves_the_scaling_history_as_it_was() {
    use fp8_engine::train::adamw::{AdamW, AdamWConfig};
    let config = tiny_config(false, false, 4);
    let precision: Precision = "fp8-delayed".parse().unwrap();
    let inputs: Vec<u32> = (0..16).map(|i| (i * 5 % 11) as u32).collect();
    let targets: Vec<u32> = (0..16).map(|i| (i * 3 % 11) as u32).collect();
    let run = |evaluate: bool| {
        let mut model = LlamaModel::new(&config, &precision, Recompute::None, 4).unwrap();
        let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
        let mut losses = Vec::new();
        for _ in 0..3 {
            model.visit_parameters(&mut |p| p.zero_grad());
            losses.push(model.forward_loss(&inputs, &targets, 2, 8).unwrap().to_bits());
            model.backward(1.0).unwrap();
            opt.step(&mut model, 1e-2).unwrap();
            if evaluate {
                model.evaluate_losses(&inputs, &[&targets], 2, 8).unwrap();
            }
        }
        let mut slots = Vec::new();
        model.visit_fp8_slots(&mut |name, slot| {
            let bits: Vec<u32> = slot.history.iter().map(|a| a.to_bits()).collect();
            slots.push((name.to_string(), slot.scale.to_bits(), bits));
        });
        assert!(!slots.is_empty(), "an fp8-delayed model has slots");
        (losses, slots)
    };
    let (plain, evaluated) = (run(false), run(true));
    assert_eq!(plain.0, evaluated.0, "every step's loss");
    for (a, b) in plain.1.iter().zip(&evaluated.1) {
        assert_eq!(a, b, "slot {}", a.0);
    }
}
