//! `fp8 train --init-from` on the tiny Llama, Mistral and Qwen2 checkpoints: the fp32 loss
//! trajectory against the same fine-tune in PyTorch with `torch.optim.AdamW`
//! (tests/fixtures/hf/models/*/commands.json, scripts/fixtures/make_llama_references.py), the
//! existing training options on a loaded model, and `--save-hf` round trips.

mod hf_cli;
use hf_cli::{fixture, fp8, losses, reference};

use std::path::Path;
use std::process::Output;
use std::str::FromStr;

use fp8_engine::amp::Precision;
use fp8_engine::hf::HfModelDir;
use fp8_engine::model::{LlamaModel, Recompute};
use fp8_engine::nn::Module;
use serde_json::Value;

/// `fp8 train --init-from MODEL --text finetune.txt` with the reference's settings plus `extra`.
fn fine_tune(model: &str, out: &Path, extra: &[&str]) -> Output {
    let r = reference(model);
    let f = &r["finetune"];
    let dir = fixture(&format!("models/{model}"));
    let text = fixture("text/finetune.txt");
    let owned: Vec<String> = vec![
        f["batch"].to_string(),
        f["lr"].to_string(),
        f["beta1"].to_string(),
        f["beta2"].to_string(),
        f["eps"].to_string(),
        r["seq"].to_string(),
    ];
    let mut args = vec![
        "train",
        "--init-from",
        dir.to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--batch",
        &owned[0],
        "--lr",
        &owned[1],
        "--beta1",
        &owned[2],
        "--beta2",
        &owned[3],
        "--eps",
        &owned[4],
        "--seq",
        &owned[5],
        "--schedule",
        "constant",
        "--warmup",
        "0",
        "--clip",
        "0",
        "--weight-decay",
        "0",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    fp8(&args)
}

fn ok(out: &Output) {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn fp32_fine_tune_follows_pytorch_adamw_step_by_step() {
    for name in ["llama", "mistral", "qwen2"] {
        let tmp = tempfile::tempdir().unwrap();
        let out = fine_tune(
            name,
            tmp.path(),
            &["--steps", "20", "--precision", "fp32", "--data-order", "sequential"],
        );
        ok(&out);
        let got = losses(&tmp.path().join("fp32"));
        let want: Vec<f64> = reference(name)["finetune"]["losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(got.len(), want.len());
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-3 * w, "{name} step {step}: {g} vs pytorch {w}");
        }
        // The run learned: the last loss is well below the first.
        assert!(got[19] < got[0] - 0.3, "{name}: {got:?}");
    }
}

#[test]
fn resume_compare_accumulation_and_save_hf_work_on_a_loaded_model() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    ok(&fine_tune("qwen2", &whole, &["--steps", "6", "--precision", "fp32"]));
    // Interrupted after 3 steps and resumed: the same trajectory.
    let split = tmp.path().join("split");
    ok(&fine_tune(
        "qwen2",
        &split,
        &["--steps", "6", "--precision", "fp32", "--stop-after", "3"],
    ));
    let checkpoint = split.join("fp32/checkpoint.safetensors");
    ok(&fine_tune(
        "qwen2",
        &split,
        &[
            "--steps",
            "6",
            "--precision",
            "fp32",
            "--resume",
            checkpoint.to_str().unwrap(),
        ],
    ));
    assert_eq!(losses(&whole.join("fp32")), losses(&split.join("fp32")));
    // Two micro-batches of 2 windows: the same mean loss per step as one batch of 4 (each window
    // scores the same number of positions), to f32 rounding.
    let micro = tmp.path().join("micro");
    ok(&fine_tune(
        "qwen2",
        &micro,
        &["--steps", "6", "--precision", "fp32", "--micro-batches", "2"],
    ));
    for (a, b) in losses(&whole.join("fp32")).iter().zip(losses(&micro.join("fp32"))) {
        assert!((a - b).abs() <= 1e-5 * a, "{a} vs {b}");
    }
    // --compare with --save-hf writes one model per precision; each loads and evaluates.
    let compare = tmp.path().join("compare");
    let saved = tmp.path().join("saved");
    ok(&fine_tune(
        "qwen2",
        &compare,
        &[
            "--steps",
            "4",
            "--compare",
            "fp32,fp8-current",
            "--data-order",
            "shuffled",
            "--save-hf",
            saved.to_str().unwrap(),
        ],
    ));
    for precision in ["fp32", "fp8-current"] {
        let l = losses(&compare.join(precision));
        assert_eq!(l.len(), 4);
        let eval = fp8(&[
            "eval",
            "--model",
            saved.join(precision).to_str().unwrap(),
            "--text",
            fixture("text/finetune.txt").to_str().unwrap(),
            "--seq",
            "16",
            "--json",
        ]);
        ok(&eval);
        let loss = serde_json::from_slice::<Value>(&eval.stdout).unwrap()["loss"]
            .as_f64()
            .unwrap();
        let before = reference("qwen2")["eval_loss"].as_f64().unwrap();
        assert!(loss < before, "{precision}: fine-tuned {loss} vs {before}");
    }
}

fn values(model: &mut LlamaModel) -> Vec<(String, Vec<u32>)> {
    let mut out = Vec::new();
    model.visit_parameters(&mut |p| out.push((p.name().to_string(), p.value().iter().map(|v| v.to_bits()).collect())));
    out
}

#[test]
fn save_hf_then_load_is_exact() {
    for name in ["llama", "qwen2"] {
        let source = fixture(&format!("models/{name}"));
        let dir = HfModelDir::open(&source).unwrap();
        let mut model = LlamaModel::from_hf(&dir, &Precision::Fp32, Recompute::None).unwrap();
        // Move every value so the saved file cannot be the source by accident.
        model.visit_parameters(&mut |p| {
            for (i, v) in p.value_mut().iter_mut().enumerate() {
                *v += 1e-3 * ((i % 7) as f32 - 3.0);
            }
            p.mark_updated();
        });
        let tmp = tempfile::tempdir().unwrap();
        model.save_hf(&source, tmp.path()).unwrap();
        let reopened = HfModelDir::open(tmp.path()).unwrap();
        assert_eq!(reopened.config, dir.config, "{name}: config.json keeps the model");
        let mut loaded =
            LlamaModel::from_hf(&reopened, &Precision::from_str("fp32").unwrap(), Recompute::None).unwrap();
        assert_eq!(values(&mut model), values(&mut loaded), "{name}");
        assert!(tmp.path().join("tokenizer.json").is_file());
        assert!(tmp.path().join("generation_config.json").is_file());
    }
}

#[test]
fn bad_fine_tune_settings_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for (extra, needle) in [
        (vec!["--data-order", "random"], "data-order"),
        (vec!["--seq", "100000"], "seq"),
    ] {
        let mut args = vec!["--steps", "1"];
        args.extend(extra);
        let out = fine_tune("llama", tmp.path(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
    }
    let text = fixture("text/finetune.txt");
    let (model, text) = (fixture("models/llama"), text.to_str().unwrap());
    let out_dir = tmp.path().join("fp8");
    let out = fp8(&[
        "train",
        "--init-from",
        model.to_str().unwrap(),
        "--text",
        text,
        "--precision",
        "fp8-current",
        "--seq",
        "15",
        "--batch",
        "3",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiples of 16"));
    let out = fp8(&["train", "--init-from", "/nonexistent", "--text", text]);
    assert!(!out.status.success());
    let out = fp8(&["train", "--init-from", model.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--text"));
    let out = fp8(&["train", "--save-hf", "/tmp/x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("init-from"));
}
