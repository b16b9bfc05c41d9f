//! `--frozen-dtype checkpoint`: frozen embeddings, norms and head held at their checkpoint's 16
//! bits compute bit for bit what their f32 copies did (LoRA training, an FP8 base, evaluation,
//! generation, the merged save), and the ledger counts 2 bytes a value for them.

mod hf_cli;
use hf_cli::{fixture, fp8, losses};

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use fp8_engine::amp::Precision;
use fp8_engine::hf::{HfModelDir, expected_tensors};
use fp8_engine::model::{FrozenDtype, LlamaModel, LoraConfig, Recompute};
use fp8_engine::nn::{BaseScaling, LoraSettings, Module};
use fp8_engine::plan::embedding_norm_head_count;
use fp8_engine::tensor::Dtype;
use fp8_engine::tools::safetensors_io::{OutTensor, serialize};

/// The tiny fixture `name` with every tensor rounded to `dtype` (bf16 or f16) and stored so,
/// tokenizer and config (its dtype set) copied: a 16-bit checkpoint of the same shape.
fn narrow_fixture(name: &str, dtype: Dtype, dir: &Path) -> PathBuf {
    let src = fixture(&format!("models/{name}"));
    let out = dir.join(format!("{name}-{dtype}"));
    std::fs::create_dir_all(&out).unwrap();
    let hf = HfModelDir::open(&src).unwrap();
    let (st, torch) = match dtype {
        Dtype::Bf16 => (safetensors::Dtype::BF16, "bfloat16"),
        _ => (safetensors::Dtype::F16, "float16"),
    };
    let tensors: Vec<(String, OutTensor<'_>)> = expected_tensors(&hf.config)
        .into_iter()
        .map(|t| {
            let values = hf.read_f32(&t.name).unwrap();
            let data: Vec<u8> = match dtype {
                Dtype::Bf16 => values
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
                _ => values
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
            };
            let tensor = OutTensor {
                dtype: st,
                shape: t.shape.clone(),
                data: Cow::Owned(data),
            };
            (t.name, tensor)
        })
        .collect();
    let bytes = serialize(&tensors, HashMap::new(), "test").unwrap();
    std::fs::write(out.join("model.safetensors"), bytes).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        if file == "config.json" {
            let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["dtype"] = torch.into();
            std::fs::write(out.join(file), config.to_string()).unwrap();
        } else if file != "model.safetensors" && path.is_file() {
            std::fs::copy(&path, out.join(file)).unwrap();
        }
    }
    out
}

fn lora() -> LoraConfig {
    let settings = LoraSettings {
        rank: 16,
        alpha: 32.0,
        dropout: 0.0,
    };
    LoraConfig::new(settings, "q_proj,k_proj,v_proj,o_proj").unwrap()
}

/// The model of `dir` under `precision` (with an FP8 base or not), LoRA r16 on q, k, v, o, its
/// frozen embeddings, norms and head held as `frozen` says.
fn load(dir: &HfModelDir, precision: &str, fp8_base: bool, frozen: FrozenDtype) -> LlamaModel {
    let precision: Precision = precision.parse().unwrap();
    let mut model = match fp8_base {
        true => {
            LlamaModel::from_hf_fp8_base(dir, &precision, Recompute::None, BaseScaling::Block)
                .unwrap()
                .0
        }
        false => LlamaModel::from_hf(dir, &precision, Recompute::None).unwrap(),
    };
    model.enable_lora(&lora(), 3).unwrap();
    model.hold_frozen(dir, frozen).unwrap();
    model
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// The loss, every trainable gradient, the logits of a forward-only pass and of a cached
/// (generation) pass, and the merged model's tensors, as bits.
fn fingerprint(model: &mut LlamaModel) -> Vec<Vec<u32>> {
    let vocab = model.vocab() as u32;
    // Repeated ids: the lookup widens each distinct row once and must still fill every position.
    let ids: Vec<u32> = (0..32u32).map(|i| (i * 37 + i / 3) % vocab).collect();
    let targets: Vec<u32> = ids.iter().map(|&i| (i + 1) % vocab).collect();
    let mut out = Vec::new();
    for _ in 0..2 {
        let loss = model.forward_loss(&ids, &targets, 2, 16).unwrap();
        model.backward(1.0).unwrap();
        out.push(vec![loss.to_bits()]);
    }
    model.visit_parameters(&mut |p| out.push(bits(p.grad())));
    out.push(bits(&model.forward_logits(&ids, 2, 16).unwrap()));
    let mut cache = model.new_cache();
    out.push(bits(&model.forward_cached(&ids[..5], &mut cache).unwrap()));
    out.push(bits(&model.forward_cached(&ids[5..7], &mut cache).unwrap()));
    for (_, _, values) in model.hf_tensors().unwrap() {
        out.push(bits(&values));
    }
    out
}

#[test]
fn held_at_the_checkpoint_width_the_frozen_values_compute_the_same_bits_in_half_the_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    // Llama: tied head; Qwen2: separate head, q/k/v biases (frozen, kept in f32).
    for name in ["llama", "qwen2"] {
        for (stored, precisions) in [
            (Dtype::Bf16, &["fp32", "bf16", "fp16", "fp8-block"][..]),
            (Dtype::F16, &["fp16", "bf16"][..]),
        ] {
            let dir = HfModelDir::open(&narrow_fixture(name, stored, tmp.path())).unwrap();
            let narrowable = embedding_norm_head_count(&dir.config) as usize;
            for &precision in precisions {
                for fp8_base in [false, true] {
                    let what = format!("{name} {stored} {precision} fp8 base {fp8_base}");
                    let mut wide = load(&dir, precision, fp8_base, FrozenDtype::F32);
                    let mut narrow = load(&dir, precision, fp8_base, FrozenDtype::Checkpoint);
                    assert_eq!(
                        wide.frozen_parameter_bytes() - narrow.frozen_parameter_bytes(),
                        2 * narrowable,
                        "{what}"
                    );
                    assert_eq!(fingerprint(&mut wide), fingerprint(&mut narrow), "{what}");
                    // A separate frozen head in 16 bits of its GEMM's dtype is its own operand:
                    // no cache beside it. In another dtype it keeps its compute copy.
                    if !dir.config.tie_word_embeddings {
                        let head_dtype = precision.parse::<Precision>().unwrap().without_fp8().compute_dtype();
                        let (narrow_cache, wide_cache) = (narrow.weight_cache_bytes(), wide.weight_cache_bytes());
                        match head_dtype == stored {
                            true => assert!(narrow_cache < wide_cache, "{what}"),
                            false => assert_eq!(narrow_cache, wide_cache, "{what}"),
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn an_f32_checkpoint_and_trained_parameters_stay_in_f32() {
    let dir = HfModelDir::open(&fixture("models/llama")).unwrap();
    let mut model = load(&dir, "bf16", false, FrozenDtype::Checkpoint);
    let mut f32s = load(&dir, "bf16", false, FrozenDtype::F32);
    assert_eq!(model.frozen_parameter_bytes(), f32s.frozen_parameter_bytes());
    let mut trained = 0;
    model.visit_parameters(&mut |p| {
        assert_eq!(p.storage_dtype(), Dtype::F32, "{}", p.name());
        trained += 1;
    });
    assert!(trained > 0);
    // A trainable parameter refuses 16-bit storage: its master is what trains.
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = HfModelDir::open(&narrow_fixture("llama", Dtype::Bf16, tmp.path())).unwrap();
    let mut full = LlamaModel::from_hf(&bf16, &"bf16".parse().unwrap(), Recompute::None).unwrap();
    assert_eq!(full.hold_frozen(&bf16, FrozenDtype::Checkpoint).unwrap(), 0);
    full.visit_parameters(&mut |p| assert_eq!(p.storage_dtype(), Dtype::F32, "{}", p.name()));
    let mut err = None;
    full.visit_parameters(&mut |p| {
        if err.is_none() {
            err = p.hold_frozen_in(Dtype::Bf16).err();
        }
    });
    assert!(err.unwrap().to_string().contains("trainable"));
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn with_frozen(args: &[&str], frozen: &str) -> String {
    ok(&fp8(&[args, &["--frozen-dtype", frozen]].concat()))
}

#[test]
fn eval_generate_and_lora_training_print_the_same_numbers_under_either_frozen_dtype() {
    let tmp = tempfile::tempdir().unwrap();
    let model = narrow_fixture("llama", Dtype::Bf16, tmp.path());
    let model = model.to_str().unwrap();
    let text = fixture("text/finetune.txt");
    let text = text.to_str().unwrap();
    for base in [&[][..], &["--base-precision", "fp8"][..]] {
        let eval = [
            &["eval", "--model", model, "--text", text, "--seq", "16", "--json"],
            base,
        ]
        .concat();
        assert_eq!(with_frozen(&eval, "f32"), with_frozen(&eval, "checkpoint"), "{base:?}");
        let generate = [
            &[
                "generate",
                "--model",
                model,
                "--prompt",
                "The",
                "--max-new-tokens",
                "6",
                "--json",
            ],
            base,
        ]
        .concat();
        assert_eq!(
            with_frozen(&generate, "f32"),
            with_frozen(&generate, "checkpoint"),
            "{base:?}"
        );
    }
    let train = |out: &Path, frozen: &str| {
        let args = [
            "train",
            "--init-from",
            model,
            "--text",
            text,
            "--out",
            out.to_str().unwrap(),
            "--seq",
            "16",
            "--batch",
            "4",
            "--steps",
            "3",
            "--lr",
            "1e-2",
            "--precision",
            "bf16",
            "--seed",
            "5",
            "--lora-rank",
            "8",
            "--quiet",
            "--frozen-dtype",
            frozen,
        ];
        ok(&fp8(&args));
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
        let peak = summary["bf16"]["peak_bytes"].as_u64().unwrap();
        let adapter = std::fs::read(out.join("bf16/adapter/adapter_model.safetensors")).unwrap();
        (losses(&out.join("bf16")), adapter, peak)
    };
    let (wide_losses, wide_adapter, wide_peak) = train(&tmp.path().join("wide"), "f32");
    let (narrow_losses, narrow_adapter, narrow_peak) = train(&tmp.path().join("narrow"), "checkpoint");
    assert_eq!(wide_losses, narrow_losses);
    assert_eq!(wide_adapter, narrow_adapter);
    // Tied head: the table (400 x 32) and 5 norms (32 each) at 2 bytes a value instead of 4.
    assert_eq!(wide_peak - narrow_peak, 2 * (400 * 32 + 5 * 32));
    let bad = fp8(&["eval", "--model", model, "--text", text, "--frozen-dtype", "bf8"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("bf8"));
}
