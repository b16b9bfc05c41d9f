//! `fp8 train --init-from DIR --lora-rank R` on the tiny Llama checkpoint: the held-out loss
//! drops below the base model's, the PEFT adapter reloads in `fp8 eval --lora`, the merged
//! `--save-hf` model evaluates like the adapters, and resume, accumulation and recompute work.

mod hf_cli;
use hf_cli::{fixture, fp8, losses};

use std::path::{Path, PathBuf};
use std::process::Output;

use fp8_engine::hf::HfModelDir;
use fp8_engine::model::{LoraTarget, lora_trainable_parameters};
use serde_json::Value;

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The fine-tuning text cut in two: the first 900 bytes to train on, the rest held out.
fn split_text(dir: &Path) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(fixture("text/finetune.txt")).unwrap();
    let cut = text.char_indices().map(|(i, _)| i).find(|&i| i >= 900).unwrap();
    let (train, held) = (dir.join("train.txt"), dir.join("held.txt"));
    std::fs::write(&train, &text[..cut]).unwrap();
    std::fs::write(&held, &text[cut..]).unwrap();
    (train, held)
}

fn lora_train(train: &Path, out: &Path, extra: &[&str]) -> Output {
    let model = fixture("models/llama");
    let mut args = vec![
        "train",
        "--init-from",
        model.to_str().unwrap(),
        "--text",
        train.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--seq",
        "16",
        "--batch",
        "4",
        "--lr",
        "1e-2",
        "--precision",
        "fp32",
        "--seed",
        "5",
        "--lora-rank",
        "8",
        "--lora-alpha",
        "16",
        "--lora-targets",
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    fp8(&args)
}

fn eval_loss(model: &Path, text: &Path, lora: Option<&Path>) -> f64 {
    let mut args = vec![
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
        "--seq",
        "16",
        "--json",
    ];
    if let Some(dir) = lora {
        args.extend(["--lora", dir.to_str().unwrap()]);
    }
    let json: Value = serde_json::from_str(ok(&fp8(&args)).trim()).unwrap();
    json["loss"].as_f64().unwrap()
}

#[test]
fn lora_fine_tuning_beats_the_base_on_held_out_text_and_saves_peft_and_merged_models() {
    let tmp = tempfile::tempdir().unwrap();
    let (train, held) = split_text(tmp.path());
    let out = tmp.path().join("run");
    let merged = tmp.path().join("merged");
    let stdout = ok(&lora_train(
        &train,
        &out,
        &["--steps", "60", "--save-hf", merged.to_str().unwrap()],
    ));
    let adapter = out.join("fp32/adapter");
    assert!(adapter.join("adapter_config.json").is_file());
    assert!(adapter.join("adapter_model.safetensors").is_file());
    let base = eval_loss(&fixture("models/llama"), &held, None);
    let tuned = eval_loss(&fixture("models/llama"), &held, Some(&adapter));
    assert!(tuned < base - 0.1, "held-out loss: LoRA {tuned} vs base {base}");
    // The merged model (W + (alpha / r) B A in f32) evaluates like base + adapters, to f32 rounding.
    let merged_loss = eval_loss(&merged, &held, None);
    assert!(
        (merged_loss - tuned).abs() < 1e-4,
        "merged {merged_loss} vs adapters {tuned}"
    );
    // `fp8 generate --lora` generates what the merged model generates (greedy).
    let generate = |model: &Path, lora: Option<&Path>| {
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "the",
            "--max-new-tokens",
            "12",
            "--json",
        ];
        if let Some(dir) = lora {
            args.extend(["--lora", dir.to_str().unwrap()]);
        }
        let json: Value = serde_json::from_str(ok(&fp8(&args)).trim()).unwrap();
        json["tokens"].clone()
    };
    let with_adapter = generate(&fixture("models/llama"), Some(&adapter));
    assert_eq!(with_adapter, generate(&merged, None));
    assert_ne!(with_adapter, generate(&fixture("models/llama"), None));
    // The memory summary: gradients and two moments for the adapters only.
    let config = HfModelDir::open(&fixture("models/llama")).unwrap().config;
    let targets: Vec<LoraTarget> = LoraTarget::ALL.to_vec();
    let trainable = lora_trainable_parameters(&config, 8, &targets);
    let line = |category: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start_matches('|').trim_start().starts_with(category))
            .unwrap_or_else(|| panic!("no {category} line in {stdout}"))
            .to_string()
    };
    assert!(
        line("gradients").contains(&format!("({})", trainable * 4)),
        "{}",
        line("gradients")
    );
    assert!(
        line("optimizer state").contains(&format!("({})", trainable * 8)),
        "{}",
        line("optimizer state")
    );
}

#[test]
fn lora_on_an_fp8_base_learns_the_held_out_text_under_both_base_scalings() {
    let tmp = tempfile::tempdir().unwrap();
    let (train, held) = split_text(tmp.path());
    let base = eval_loss(&fixture("models/llama"), &held, None);
    for scaling in ["block", "tensor"] {
        let out = tmp.path().join(scaling);
        let run = lora_train(
            &train,
            &out,
            &["--steps", "60", "--base-precision", "fp8", "--base-scaling", scaling],
        );
        ok(&run);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(stderr.contains("FP8 base"), "{stderr}");
        // The adapters trained against the FP8 codes also lower the f32 base's held-out loss.
        let tuned = eval_loss(&fixture("models/llama"), &held, Some(&out.join("fp32/adapter")));
        assert!(
            tuned < base - 0.1,
            "{scaling}: held-out loss LoRA on FP8 base {tuned} vs base {base}"
        );
        let curve = losses(&out.join("fp32"));
        assert!(curve[curve.len() - 1] < curve[0] - 0.1, "{scaling}: {curve:?}");
    }
}

#[test]
fn a_resumed_lora_run_with_dropout_draws_the_masks_of_the_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (train, _) = split_text(tmp.path());
    let extra = ["--steps", "6", "--lora-dropout", "0.1", "--micro-batches", "2"];
    let whole = tmp.path().join("whole");
    ok(&lora_train(&train, &whole, &extra));
    let split = tmp.path().join("split");
    ok(&lora_train(
        &train,
        &split,
        &[&extra[..], &["--stop-after", "3"]].concat(),
    ));
    let checkpoint = split.join("fp32/checkpoint.safetensors");
    ok(&lora_train(
        &train,
        &split,
        &[&extra[..], &["--resume", checkpoint.to_str().unwrap()]].concat(),
    ));
    let (reference, resumed) = (losses(&whole.join("fp32")), losses(&split.join("fp32")));
    assert_eq!(reference.len(), 6);
    assert_eq!(resumed, reference, "bit-identical losses after resume with dropout");
    // Dropout is on: the same run without it has other losses.
    let plain = tmp.path().join("plain");
    ok(&lora_train(&train, &plain, &["--steps", "6", "--micro-batches", "2"]));
    assert_ne!(losses(&plain.join("fp32")), reference);
}

#[test]
fn lora_runs_resume_accumulate_and_recompute_like_full_training() {
    let tmp = tempfile::tempdir().unwrap();
    let (train, _) = split_text(tmp.path());
    let whole = tmp.path().join("whole");
    ok(&lora_train(&train, &whole, &["--steps", "6"]));
    let split = tmp.path().join("split");
    ok(&lora_train(&train, &split, &["--steps", "6", "--stop-after", "3"]));
    let checkpoint = split.join("fp32/checkpoint.safetensors");
    ok(&lora_train(
        &train,
        &split,
        &["--steps", "6", "--resume", checkpoint.to_str().unwrap()],
    ));
    let reference = losses(&whole.join("fp32"));
    assert_eq!(reference.len(), 6);
    assert_eq!(reference, losses(&split.join("fp32")), "resumed LoRA run");
    assert!(reference[5] < reference[0], "{reference:?}");
    let recompute = tmp.path().join("recompute");
    ok(&lora_train(
        &train,
        &recompute,
        &["--steps", "6", "--recompute", "every"],
    ));
    assert_eq!(reference, losses(&recompute.join("fp32")), "recompute changes nothing");
    let micro = tmp.path().join("micro");
    ok(&lora_train(&train, &micro, &["--steps", "6", "--micro-batches", "2"]));
    for (a, b) in reference.iter().zip(losses(&micro.join("fp32"))) {
        assert!((a - b).abs() <= 1e-5 * a, "{a} vs {b}");
    }
    // Continuing from the saved adapters (--lora-from) starts where the run ended.
    let more = tmp.path().join("more");
    let adapter = whole.join("fp32/adapter");
    let model = fixture("models/llama");
    ok(&fp8(&[
        "train",
        "--init-from",
        model.to_str().unwrap(),
        "--text",
        train.to_str().unwrap(),
        "--out",
        more.to_str().unwrap(),
        "--seq",
        "16",
        "--batch",
        "4",
        "--lr",
        "1e-2",
        "--precision",
        "fp32",
        "--steps",
        "2",
        "--lora-from",
        adapter.to_str().unwrap(),
        "--quiet",
    ]));
    let continued = losses(&more.join("fp32"));
    assert!(continued[0] < reference[0], "{continued:?} vs {reference:?}");
}
