//! LoRA on the Llama family: adapter gradients against finite differences, frozen base weights,
//! recompute, the merge in f32, the PEFT files round trip, FP8 adapters.

use fp8_engine::amp::Precision;
use fp8_engine::hf::HfConfig;
use fp8_engine::model::{LlamaModel, LoraConfig, Recompute, lora_trainable_parameters};
use fp8_engine::nn::{LoraSettings, Module};
use fp8_engine::train::adamw::{AdamW, AdamWConfig};

fn tiny_config(tied: bool, bias: bool) -> HfConfig {
    let arch = if bias { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" };
    HfConfig::from_json(&format!(
        r#"{{"architectures": ["{arch}"], "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 4, "vocab_size": 11, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
            "rope_theta": 100.0, "tie_word_embeddings": {tied}, "hidden_act": "silu"}}"#
    ))
    .unwrap()
}

const ALL: &str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";

fn lora(rank: usize, dropout: f32, targets: &str) -> LoraConfig {
    LoraConfig::new(
        LoraSettings {
            rank,
            alpha: 2.0 * rank as f32,
            dropout,
        },
        targets,
    )
    .unwrap()
}

fn batch() -> (Vec<u32>, Vec<u32>) {
    let inputs = (0..16).map(|i| (i * 7 % 11) as u32).collect();
    let targets = (0..16).map(|i| (i * 3 % 11) as u32).collect();
    (inputs, targets)
}

/// (name, value, grad) of every trainable parameter.
fn trainable(model: &mut LlamaModel) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    let mut out = Vec::new();
    model.visit_parameters(&mut |p| out.push((p.name().to_string(), p.value().to_vec(), p.grad().to_vec())));
    out
}

fn set(model: &mut LlamaModel, name: &str, values: &[f32]) {
    model.visit_parameters(&mut |p| {
        if p.name() == name {
            p.value_mut().copy_from_slice(values);
            p.mark_updated();
        }
    });
}

/// Gives every B non-zero values, so A gets a gradient too.
fn perturb_b(model: &mut LlamaModel) {
    for (name, value, _) in trainable(model) {
        if name.ends_with("lora_B.weight") {
            let moved: Vec<f32> = (0..value.len()).map(|i| 0.05 * ((i as f32) * 0.7).sin()).collect();
            set(model, &name, &moved);
        }
    }
}

#[test]
fn adapter_gradients_match_finite_differences() {
    let (inputs, targets) = batch();
    for (tied, bias) in [(true, false), (false, true)] {
        let config = tiny_config(tied, bias);
        let mut model = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 3).unwrap();
        model.enable_lora(&lora(4, 0.0, ALL), 7).unwrap();
        perturb_b(&mut model);
        model.zero_grad();
        model.forward_loss(&inputs, &targets, 2, 8).unwrap();
        model.backward(1.0).unwrap();
        let params = trainable(&mut model);
        assert_eq!(params.len(), 2 * 7 * 2, "A and B of 7 targets in 2 layers");
        for (name, value, grad) in params {
            let dir: Vec<f32> = (0..value.len()).map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0).collect();
            let analytic: f64 = grad.iter().zip(&dir).map(|(g, d)| f64::from(*g) * f64::from(*d)).sum();
            let eps = 3e-3f32;
            let mut loss_at = |sign: f32| {
                let moved: Vec<f32> = value.iter().zip(&dir).map(|(v, d)| v + sign * eps * d).collect();
                set(&mut model, &name, &moved);
                let (losses, _) = model.evaluate_losses(&inputs, &[&targets], 2, 8).unwrap();
                f64::from(losses[0])
            };
            let numeric = (loss_at(1.0) - loss_at(-1.0)) / (2.0 * f64::from(eps));
            set(&mut model, &name, &value);
            let tolerance = 2e-3 * analytic.abs().max(numeric.abs()) + 2e-4;
            assert!(
                (analytic - numeric).abs() <= tolerance,
                "tied {tied} bias {bias}: {name}: analytic {analytic} vs numeric {numeric}"
            );
            assert!(
                analytic.abs() > 1e-6,
                "{name}: the gradient is zero, the test would prove nothing"
            );
        }
    }
}

#[test]
fn base_weights_stay_frozen_and_only_adapters_get_optimizer_state() {
    let config = tiny_config(false, true);
    let (inputs, targets) = batch();
    let mut model = LlamaModel::new(&config, &Precision::Bf16, Recompute::None, 3).unwrap();
    let base_before = model.hf_tensors().unwrap();
    let full_count = model.parameter_count();
    let lora = lora(4, 0.1, "q_proj,v_proj,down_proj");
    model.enable_lora(&lora, 7).unwrap();
    let expected = lora_trainable_parameters(&config, 4, &lora.targets);
    // 2 layers x (q: 4*(16+16) + v: 4*(16+8) + down: 4*(32+16)) = 2 * 416
    assert_eq!(expected, 832);
    assert_eq!(model.parameter_count() as u64, expected);
    assert!((model.parameter_count()) < full_count);
    let mut optimizer = AdamW::new(AdamWConfig::default()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..3 {
        model.zero_grad();
        losses.push(model.forward_loss(&inputs, &targets, 2, 8).unwrap());
        model.backward(1.0).unwrap();
        optimizer.step(&mut model, 1e-2).unwrap();
    }
    assert_eq!(
        optimizer.state_bytes() as u64,
        expected * 8,
        "m and v of the adapters only"
    );
    assert!(losses[2] < losses[0], "the adapters learn: {losses:?}");
    // Every base tensor is bit-identical; frozen parameters have no gradient buffer at all.
    let base_after = model.hf_tensors().unwrap();
    assert_eq!(base_before.len(), base_after.len());
    for (before, after) in base_before.iter().zip(&base_after) {
        assert_eq!(before.0, after.0);
        assert!(
            before.2.iter().zip(&after.2).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}",
            before.0
        );
    }
    let mut frozen_grads = 0;
    let mut trained = 0;
    model.visit_all_parameters(&mut |p| match p.is_frozen() {
        true => frozen_grads += p.grad().len(),
        false => trained += 1,
    });
    assert_eq!(frozen_grads, 0);
    assert_eq!(trained, 2 * 3 * 2);
}

#[test]
fn fresh_adapters_change_nothing_and_recompute_replays_dropout() {
    let config = tiny_config(true, false);
    let (inputs, targets) = batch();
    let mut base = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 3).unwrap();
    let base_loss = base.forward_loss(&inputs, &targets, 2, 8).unwrap();
    let run = |recompute| {
        let mut model = LlamaModel::new(&config, &Precision::Fp32, recompute, 3).unwrap();
        model.enable_lora(&lora(4, 0.3, ALL), 7).unwrap();
        let fresh = model.evaluate_losses(&inputs, &[&targets], 2, 8).unwrap().0[0];
        perturb_b(&mut model);
        let mut out = Vec::new();
        for _ in 0..2 {
            model.zero_grad();
            let loss = model.forward_loss(&inputs, &targets, 2, 8).unwrap();
            model.backward(1.0).unwrap();
            out.push((loss.to_bits(), trainable(&mut model)));
        }
        (fresh, out)
    };
    let (fresh, plain) = run(Recompute::None);
    let (_, recomputed) = run(Recompute::Every);
    assert_eq!(
        fresh.to_bits(),
        base_loss.to_bits(),
        "B = 0: the adapted model is the base model"
    );
    assert_ne!(plain[0].0, plain[1].0, "dropout draws a new mask each forward");
    for ((la, a), (lb, b)) in plain.iter().zip(&recomputed) {
        assert_eq!(la, lb);
        for ((name, _, ga), (_, _, gb)) in a.iter().zip(b) {
            assert_eq!(ga, gb, "{name}");
        }
    }
}

#[test]
fn merge_is_base_plus_scaled_b_times_a_in_f32() {
    let config = tiny_config(false, false);
    let mut model = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 3).unwrap();
    let lora = lora(4, 0.0, ALL);
    model.enable_lora(&lora, 7).unwrap();
    perturb_b(&mut model);
    let base: std::collections::HashMap<String, Vec<f32>> = model
        .hf_tensors()
        .unwrap()
        .into_iter()
        .map(|(n, _, v)| (n, v))
        .collect();
    let mut adapters = Vec::new();
    model.visit_adapters(&mut |a| {
        adapters.push((a.module().to_string(), a.a().value().to_vec(), a.b().value().to_vec()))
    });
    assert_eq!(adapters.len(), 14);
    let (inputs, targets) = batch();
    let adapted = model.evaluate_losses(&inputs, &[&targets], 2, 8).unwrap().0[0];
    model.merge_lora().unwrap();
    let merged: std::collections::HashMap<String, Vec<f32>> = model
        .hf_tensors()
        .unwrap()
        .into_iter()
        .map(|(n, _, v)| (n, v))
        .collect();
    let s = 2.0f64; // alpha / r = 8 / 4
    for (module, a, b) in &adapters {
        let name = format!("{module}.weight");
        let (w, m) = (&base[&name], &merged[&name]);
        let inp = a.len() / 4;
        let out = b.len() / 4;
        assert_eq!(w.len(), out * inp, "{name}");
        for o in 0..out {
            for i in 0..inp {
                let mut ba = 0.0f64;
                for k in 0..4 {
                    ba += f64::from(b[o * 4 + k]) * f64::from(a[k * inp + i]);
                }
                let expected = (f64::from(w[o * inp + i]) + s * ba) as f32;
                assert_eq!(m[o * inp + i].to_bits(), expected.to_bits(), "{name}[{o},{i}]");
            }
        }
        assert_ne!(w, m, "{name}: B != 0 must change the weight");
    }
    let merged_loss = model.evaluate_losses(&inputs, &[&targets], 2, 8).unwrap().0[0];
    assert!(
        (merged_loss - adapted).abs() < 1e-5,
        "merged {merged_loss} vs adapted {adapted}"
    );
}

#[test]
fn peft_files_round_trip() {
    let config = tiny_config(true, true);
    let dir = tempfile::tempdir().unwrap();
    let lora = lora(4, 0.05, "k_proj,o_proj,up_proj");
    let mut model = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 3).unwrap();
    model.enable_lora(&lora, 7).unwrap();
    perturb_b(&mut model);
    model.save_adapter(&lora, "tiny", dir.path()).unwrap();
    let text = std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["peft_type"], "LORA");
    assert_eq!(json["r"], 4);
    assert_eq!(
        json["target_modules"],
        serde_json::json!(["k_proj", "o_proj", "up_proj"])
    );
    let bytes = std::fs::read(dir.path().join("adapter_model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let a = file
        .tensor("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight")
        .unwrap();
    let b = file
        .tensor("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight")
        .unwrap();
    assert_eq!((a.shape(), b.shape()), (&[4, 16][..], &[8, 4][..]));
    assert_eq!(file.len(), 2 * 3 * 2);

    let mut loaded = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 3).unwrap();
    assert_eq!(loaded.load_adapter(dir.path()).unwrap(), lora);
    let (inputs, targets) = batch();
    let want = model.evaluate_losses(&inputs, &[&targets], 2, 8).unwrap().0[0];
    let got = loaded.evaluate_losses(&inputs, &[&targets], 2, 8).unwrap().0[0];
    assert_eq!(want.to_bits(), got.to_bits());
    // A file missing a tensor is refused.
    let mut other = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 3).unwrap();
    let wider = LoraConfig::new(lora.settings, "k_proj,o_proj,up_proj,q_proj").unwrap();
    other.enable_lora(&wider, 1).unwrap();
    other.save_adapter(&lora, "tiny", dir.path()).unwrap();
    let mut again = LlamaModel::new(&config, &Precision::Fp32, Recompute::None, 3).unwrap();
    assert!(
        again.load_adapter(dir.path()).is_err(),
        "16 tensors for 12 adapters is an error"
    );
}

#[test]
fn fp8_adapters_need_a_rank_multiple_of_16() {
    let config = HfConfig::from_json(
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": 48, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
            "rope_theta": 100.0, "tie_word_embeddings": true, "hidden_act": "silu"}"#,
    )
    .unwrap();
    let fp8: Precision = "fp8-delayed".parse().unwrap();
    let mut model = LlamaModel::new(&config, &fp8, Recompute::None, 3).unwrap();
    assert!(model.enable_lora(&lora(4, 0.0, "q_proj"), 7).is_err());
    let mut model = LlamaModel::new(&config, &fp8, Recompute::None, 3).unwrap();
    model.enable_lora(&lora(16, 0.0, "q_proj,v_proj,o_proj"), 7).unwrap();
    perturb_b(&mut model);
    let inputs: Vec<u32> = (0..16).map(|i| (i * 7 % 48) as u32).collect();
    let targets: Vec<u32> = (0..16).map(|i| (i * 5 % 48) as u32).collect();
    let loss = model.forward_loss(&inputs, &targets, 1, 16).unwrap();
    model.backward(1.0).unwrap();
    assert!(loss.is_finite());
    let params = trainable(&mut model);
    assert!(params.iter().all(|(_, _, g)| g.iter().all(|v| v.is_finite())));
    assert!(
        params
            .iter()
            .any(|(n, _, g)| n.ends_with("lora_A.weight") && g.iter().any(|v| *v != 0.0))
    );
    let mut slots = 0;
    model.visit_fp8_slots(&mut |name, _| slots += usize::from(name.contains(".lora_")));
    assert_eq!(slots, 3 * 2 * 5, "five delayed-scaling slots per adapter GEMM");
}
