//! What the CLI tests on the tiny Hugging Face checkpoints share: fixture paths, running `fp8`,
//! the references `scripts/fixtures/make_llama_references.py` wrote, a run's per-step losses.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// `tests/fixtures/hf/REL`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(rel)
}

/// Runs the `fp8` binary with `args`.
pub fn fp8(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp8")).args(args).output().unwrap()
}

/// `models/NAME/commands.json`: transformers' eval loss, greedy tokens and fine-tune losses.
pub fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(&format!("models/{name}/commands.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The `loss` of every line of `DIR/metrics.jsonl`.
pub fn losses(dir: &Path) -> Vec<f64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["loss"].as_f64().unwrap())
        .collect()
}
