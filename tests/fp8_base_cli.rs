//! `--base-precision fp8` at the command line: `fp8 eval` and `fp8 generate` run on the FP8 base
//! (with and without `--lora`), and a `--base-scaling` without an FP8 base is an error.

mod hf_cli;
use hf_cli::{fixture, fp8};

use std::path::Path;
use std::process::Output;

use serde_json::Value;

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `fp8 eval --json` on the fine-tuning text with `extra` flags: the loss and stderr.
fn eval(model: &Path, extra: &[&str]) -> (f64, String) {
    let text = fixture("text/finetune.txt");
    let mut args = vec!["eval", "--model", s(model), "--text", s(&text), "--seq", "16", "--json"];
    args.extend_from_slice(extra);
    let out = fp8(&args);
    let json: Value = serde_json::from_str(ok(&out).trim()).unwrap();
    (
        json["loss"].as_f64().unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The greedy tokens of `fp8 generate --json` with `extra` flags.
fn generate(model: &Path, extra: &[&str]) -> Vec<u64> {
    let mut args = vec![
        "generate",
        "--model",
        s(model),
        "--prompt",
        "the",
        "--max-new-tokens",
        "8",
        "--json",
    ];
    args.extend_from_slice(extra);
    let json: Value = serde_json::from_str(ok(&fp8(&args)).trim()).unwrap();
    json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn base_scaling_without_an_fp8_base_is_an_error_naming_both_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("models/llama");
    let text = fixture("text/finetune.txt");
    let out = tmp.path().join("run");
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--text",
            s(&text),
            "--out",
            s(&out),
            "--seq",
            "16",
            "--batch",
            "4",
            "--steps",
            "1",
            "--precision",
            "fp32",
            "--quiet",
        ];
        args.extend_from_slice(extra);
        fp8(&args)
    };
    let runs = [
        train(&["--init-from", s(&model), "--lora-rank", "8", "--base-scaling", "tensor"]),
        train(&[
            "--init-from",
            s(&model),
            "--base-precision",
            "bf16",
            "--base-scaling",
            "block",
        ]),
        fp8(&[
            "eval",
            "--model",
            s(&model),
            "--text",
            s(&text),
            "--base-scaling",
            "tensor",
        ]),
        fp8(&[
            "generate",
            "--model",
            s(&model),
            "--prompt",
            "the",
            "--base-scaling",
            "block",
        ]),
    ];
    for run in &runs {
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{err}");
        assert!(
            err.contains("--base-scaling") && err.contains("--base-precision fp8"),
            "{err}"
        );
    }
    // The FP8 base flags belong to a loaded model: the built-in one refuses them.
    let run = train(&["--base-precision", "fp8"]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(err.contains("--init-from"), "{err}");
    assert!(!out.exists(), "nothing is written before the checks");
}

#[test]
fn eval_and_generate_run_on_an_fp8_base_with_and_without_adapters() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("models/llama");
    let (reference, _) = eval(&model, &[]);
    // The same codes exported by `fp8 quantize --hf` and used as stored give the same results.
    let exported = tmp.path().join("fp8");
    ok(&fp8(&["quantize", s(&model), s(&exported), "--hf"]));
    for scaling in ["block", "tensor"] {
        let flags = ["--base-precision", "fp8", "--base-scaling", scaling];
        let (loss, stderr) = eval(&model, &flags);
        assert!(stderr.contains("fp8 eval: FP8 base"), "{stderr}");
        // Every GEMM of the base now reads E4M3 weights and activations: each product carries at
        // most 2^-4 relative error from either cast (half an E4M3 ulp), unbiased roundings that
        // mostly cancel in the sums, so the loss of this tiny random model (about ln 400 = 6
        // nats) moves by far less than 2^-3 of itself; 2% is the bound, and it must move at all.
        assert!(
            (loss - reference).abs() < 0.02 * reference && loss != reference,
            "{scaling}: FP8 base {loss} vs f32 {reference}"
        );
        let tokens = generate(&model, &flags);
        assert!(!tokens.is_empty() && tokens.len() <= 8, "{scaling}: {tokens:?}");
        assert!(tokens.iter().all(|&t| t < 400), "{scaling}: {tokens:?}");
        if scaling == "block" {
            assert_eq!(eval(&exported, &flags).0, loss, "exported codes used as stored");
            assert_eq!(generate(&exported, &flags), tokens, "exported codes used as stored");
            // Under an FP8 precision the activations of the rest are FP8 too.
            let (fp8_run, _) = eval(&model, &[&flags[..], &["--precision", "fp8-block"]].concat());
            assert!((fp8_run - reference).abs() < 0.02 * reference, "fp8-block: {fp8_run}");
        }
    }
    // Adapters trained on the FP8 base, evaluated and generated with on it.
    let text = fixture("text/finetune.txt");
    let out = tmp.path().join("run");
    ok(&fp8(&[
        "train",
        "--init-from",
        s(&model),
        "--text",
        s(&text),
        "--out",
        s(&out),
        "--seq",
        "16",
        "--batch",
        "4",
        "--lr",
        "1e-2",
        "--steps",
        "20",
        "--precision",
        "fp32",
        "--lora-rank",
        "8",
        "--base-precision",
        "fp8",
        "--quiet",
    ]));
    let adapter = out.join("fp32/adapter");
    let fp8_base = ["--base-precision", "fp8", "--lora", s(&adapter)];
    let (tuned, _) = eval(&model, &fp8_base);
    let (tuned_f32, _) = eval(&model, &["--lora", s(&adapter)]);
    // The adapters learned the text they were trained on, on either base.
    assert!(
        tuned < reference - 0.1,
        "LoRA on the FP8 base {tuned} vs base {reference}"
    );
    assert!((tuned - tuned_f32).abs() < 0.02 * tuned, "{tuned} vs {tuned_f32}");
    let tokens = generate(&model, &fp8_base);
    assert!(!tokens.is_empty() && tokens.iter().all(|&t| t < 400), "{tokens:?}");
}
