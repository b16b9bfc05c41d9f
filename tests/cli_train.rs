//! `fp8 train` end to end: the files it promises (summary.json with its keys,
//! metrics.jsonl per precision with one line per step, loss.png, a checkpoint),
//! and a one-line error with exit code 1 for impossible requests.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

fn fp8(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp8"))
        .args(args)
        .output()
        .expect("run fp8")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fp8-cli-train-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

const SMALL: &[&str] = &[
    "train", "--steps", "3", "--hidden", "32", "--heads", "2", "--layers", "1", "--batch", "16", "--digits", "2",
    "--quiet",
];

#[test]
fn train_writes_summary_metrics_plot_and_checkpoints() {
    let out_dir = scratch("files");
    let out_arg = out_dir.to_str().expect("utf-8 path");
    let mut args = SMALL.to_vec();
    args.extend(["--compare", "fp32,fp8-delayed", "--out", out_arg]);
    let out = fp8(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("fp8-delayed") && stdout.contains("held-out loss"),
        "{stdout}"
    );

    let summary: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out_dir.join("summary.json")).expect("summary")).expect("json");
    for precision in ["fp32", "fp8-delayed"] {
        let entry = &summary[precision];
        for key in [
            "final_train_loss",
            "heldout_loss",
            "heldout_answer_loss",
            "heldout_accuracy",
            "tokens_per_s",
            "peak_bytes",
        ] {
            assert!(entry.get(key).is_some(), "{precision} lacks {key}: {entry}");
        }
        let metrics = fs::read_to_string(out_dir.join(precision).join("metrics.jsonl")).expect("metrics");
        let lines: Vec<serde_json::Value> = metrics
            .lines()
            .map(|l| serde_json::from_str(l).expect("line"))
            .collect();
        assert_eq!(lines.len(), 3);
        for (step, line) in lines.iter().enumerate() {
            assert_eq!(line["step"], step as u64);
            for key in ["loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "fp8"] {
                assert!(line.get(key).is_some(), "step {step} lacks {key}");
            }
        }
        let fp8_slots = lines[0]["fp8"].as_array().expect("fp8 list").len();
        assert_eq!(
            fp8_slots > 0,
            precision.starts_with("fp8"),
            "{precision}: {fp8_slots} FP8 slots"
        );
        assert!(out_dir.join(precision).join("checkpoint.safetensors").is_file());
        // Model FLOP/s = tokens/s x (6 N + 6 L seq h); no MFU on the CPU (no known peak).
        let per_token = small_model_flops_per_token();
        let (rate, tokens) = (entry["model_flop_per_s"].as_f64(), entry["tokens_per_s"].as_f64());
        let (rate, tokens) = (rate.expect("model_flop_per_s"), tokens.expect("tokens_per_s"));
        assert!((rate / (tokens * per_token) - 1.0).abs() < 1e-12, "{entry}");
        assert!(entry["mfu"].is_null(), "{entry}");
        assert!(stdout.contains("model FLOPs:"), "{stdout}");
    }
    let png = fs::read(out_dir.join("loss.png")).expect("loss.png");
    assert_eq!(&png[1..4], b"PNG");
}

#[test]
fn impossible_requests_fail_with_one_line() {
    let dir = scratch("errors");
    let out_arg = dir.to_str().expect("utf-8 path");
    for extra in [
        vec!["--compare", "fp32,fp32"],
        vec!["--precision", "fp9"],
        vec!["--device", "cuda"],
        vec!["--compare", "fp32,bf16", "--resume", "nowhere.safetensors"],
        vec!["--precision", "fp32", "--resume", "nowhere.safetensors"],
        vec!["--precision", "fp8-delayed", "--ffn", "40"],
        vec!["--micro-batches", "3"],
        vec!["--precision", "fp32", "--history-len", "16"],
        vec!["--precision", "fp8-delayed", "--history-len", "0"],
        vec!["--precision", "fp8-delayed", "--margin", "-1"],
    ] {
        let mut args = SMALL.to_vec();
        args.extend(["--out", out_arg]);
        args.extend(extra.iter().copied());
        let out = fp8(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
        // Progress notes may come first; the failure itself is the last line, and the only error line.
        let last = stderr.trim().lines().last().unwrap_or_default();
        assert!(last.starts_with("fp8: error: "), "{extra:?}: {stderr}");
        assert_eq!(stderr.matches("fp8: error").count(), 1, "{extra:?}: {stderr}");
    }
}

#[test]
fn delayed_recipe_options_reach_every_slot() {
    let out_dir = scratch("history");
    let out_arg = out_dir.to_str().expect("utf-8 path");
    let mut args = SMALL.to_vec();
    args.extend([
        "--precision",
        "fp8-delayed",
        "--history-len",
        "16",
        "--algo",
        "most-recent",
        "--out",
        out_arg,
    ]);
    let out = fp8(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = fs::read(out_dir.join("fp8-delayed").join("checkpoint.safetensors")).expect("checkpoint");
    let tensors = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let histories: Vec<Vec<usize>> = tensors
        .tensors()
        .into_iter()
        .filter(|(name, _)| name.starts_with("fp8.") && name.ends_with(".history"))
        .map(|(_, view)| view.shape().to_vec())
        .collect();
    assert!(!histories.is_empty(), "no FP8 slot in the checkpoint");
    assert!(histories.iter().all(|shape| shape == &[16]), "{histories:?}");
}

/// The FP8 slots of step `step` in `dir/fp8-delayed/metrics.jsonl` as (name, amax, scale).
fn slot_scales(dir: &std::path::Path, step: usize) -> Vec<(String, f64, f64)> {
    let metrics = fs::read_to_string(dir.join("fp8-delayed").join("metrics.jsonl")).expect("metrics");
    let line: serde_json::Value = serde_json::from_str(metrics.lines().nth(step).expect("step")).expect("json");
    line["fp8"]
        .as_array()
        .expect("fp8 list")
        .iter()
        .map(|s| {
            let num = |key: &str| s[key].as_f64().unwrap_or(f64::NAN);
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                num("amax"),
                num("scale"),
            )
        })
        .collect()
}

#[test]
fn margin_divides_every_delayed_scale_by_its_power_of_two() {
    let runs: Vec<PathBuf> = ["0", "2"]
        .iter()
        .map(|margin| {
            let dir = scratch(&format!("margin-{margin}"));
            let mut args = SMALL.to_vec();
            args.extend(["--precision", "fp8-delayed", "--margin", margin]);
            args.extend(["--out", dir.to_str().expect("utf-8 path")]);
            let out = fp8(&args);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            dir
        })
        .collect();
    // Step 0 casts with the initial scales in both runs, so it observes the same amaxes; step 1
    // then uses fp8_max * 2^-margin / amax: exactly a quarter with margin 2.
    let first = slot_scales(&runs[0], 0);
    let (plain, margin2) = (slot_scales(&runs[0], 1), slot_scales(&runs[1], 1));
    assert_eq!(first, slot_scales(&runs[1], 0));
    let mut checked = 0;
    for ((slot, amax0, _), ((_, _, s0), (_, _, s2))) in first.iter().zip(plain.iter().zip(&margin2)) {
        if *amax0 > 0.0 && amax0.is_finite() {
            // Scales are f32 written in their shortest form: compare them as f32, where /4 is exact.
            assert_eq!(
                *s2 as f32,
                *s0 as f32 / 4.0,
                "{slot}: scale {s0} without margin, {s2} with margin 2"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no slot saw a non-zero amax at step 0");
}

/// Training FLOPs per token of `SMALL`'s model, counted by hand: one layer 32 wide, FFN 128
/// (4 x hidden), on 2-digit addition (vocabulary 12, sequences of 8 tokens): 6 N for the
/// matmul weights (q, k, v, output projection, the two MLP matrices, the head) plus
/// 6 L seq h for causal attention.
fn small_model_flops_per_token() -> f64 {
    let (layers, hidden, ffn, vocab, seq) = (1.0, 32.0, 128.0, 12.0, 8.0);
    let weights = layers * (4.0 * hidden * hidden + 2.0 * hidden * ffn) + vocab * hidden;
    6.0 * weights + 6.0 * layers * seq * hidden
}
