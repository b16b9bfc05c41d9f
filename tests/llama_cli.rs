//! `fp8 eval` and `fp8 generate` on the tiny Llama, Mistral and Qwen2 checkpoints against what
//! `transformers` computes (tests/fixtures/hf/models/*/commands.json, written by
//! scripts/fixtures/make_llama_references.py: eval loss in float64, greedy tokens).

mod hf_cli;
use hf_cli::{fixture, fp8, reference};

use serde_json::Value;

const MODELS: [&str; 3] = ["llama", "mistral", "qwen2"];

fn ok_json(args: &[&str]) -> Value {
    let out = fp8(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
fn eval(name: &str, precision: &str) -> Value {
    let model = fixture(&format!("models/{name}"));
    let text = fixture("text/finetune.txt");
    ok_json(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
        "--seq",
        "16",
        "--precision",
        precision,
        "--json",
    ])
}

#[test]
fn eval_loss_matches_transformers_under_each_precision() {
    for name in MODELS {
        let r = reference(name);
        let want = r["eval_loss"].as_f64().unwrap();
        for (precision, tolerance) in [("fp32", 1e-4), ("bf16", 0.01), ("fp8-current", 0.03)] {
            let got = eval(name, precision);
            assert_eq!(got.as_object().unwrap().len(), 3, "{got}");
            assert_eq!(got["tokens"], r["eval_tokens"], "{name}");
            let loss = got["loss"].as_f64().unwrap();
            let rel = (loss - want).abs() / want;
            assert!(rel <= tolerance, "{name} {precision}: {loss} vs {want} ({rel:e})");
            let ppl = got["perplexity"].as_f64().unwrap();
            assert!((ppl - loss.exp()).abs() <= 1e-9 * ppl);
        }
    }
}

#[test]
fn greedy_generation_matches_transformers() {
    for name in MODELS {
        let r = reference(name);
        let model = fixture(&format!("models/{name}"));
        let got = ok_json(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            r["prompt"].as_str().unwrap(),
            "--max-new-tokens",
            "8",
            "--temperature",
            "0",
            "--json",
        ]);
        assert_eq!(got["tokens"], r["greedy"], "{name}");
        assert!(got["text"].is_string());
    }
}

#[test]
fn sampling_is_seeded_and_streams_text() {
    let model = fixture("models/qwen2");
    let args = |seed: &'static str| {
        vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "The engine",
            "--max-new-tokens",
            "12",
            "--temperature",
            "1.5",
            "--top-p",
            "0.9",
            "--seed",
            seed,
        ]
    };
    let (a, b, c) = (fp8(&args("1")), fp8(&args("1")), fp8(&args("2")));
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(a.stdout, b.stdout);
    assert_ne!(a.stdout, c.stdout);
    assert!(String::from_utf8_lossy(&a.stdout).starts_with("The engine"));
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let model = fixture("models/llama");
    let text = fixture("text/finetune.txt");
    let (m, t) = (model.to_str().unwrap(), text.to_str().unwrap());
    for (args, needle) in [
        (vec!["eval", "--model", m, "--text", t, "--seq", "100000"], "seq"),
        (vec!["eval", "--model", m, "--text", t, "--seq", "1"], "at least 2"),
        (vec!["eval", "--model", m, "--text", "/nonexistent.txt"], "nonexistent"),
        (vec!["eval", "--model", t, "--text", t], "config.json"),
        (vec!["eval", "--model", m, "--text", t, "--precision", "fp7"], "fp7"),
        (vec!["generate", "--model", m, "--prompt", "x", "--top-p", "0"], "top-p"),
        (
            vec!["generate", "--model", m, "--prompt", "x", "--temperature", "-1"],
            "temperature",
        ),
    ] {
        let out = fp8(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.starts_with("fp8: error:") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}
