//! A bounded fuzz loop (proptest) over the readers that take untrusted bytes:
//! the safetensors reader (header check, parse, inspect, quantize, dequantize)
//! and the checkpoint reader. Inputs are random bytes and mutations of valid
//! files (flipped bytes, truncation, a rewritten header length); every one must
//! give `Ok` or a typed `Err`, never a panic, abort or unbounded allocation.
//!
//! Runs in every `cargo test` (so in CI) with a fixed case count:
//! `FUZZ_CASES` (default 96 per target) raises it for a longer session, e.g.
//! `FUZZ_CASES=5000 cargo test --release --test fuzz_readers` (81 s on two
//! cores, no crash found). Inputs that fail are kept below as named
//! regression tests.

use std::fs;
use std::path::PathBuf;

use fp8_engine::amp::Precision;
use fp8_engine::amp::loss_scaler::DynamicLossScaler;
use fp8_engine::data::{DataStream, SplitMix64};
use fp8_engine::model::{DecoderModel, ModelConfig};
use fp8_engine::tools::inspect::inspect_bytes;
use fp8_engine::tools::safetensors_io::{OutTensor, parse, serialize};
use fp8_engine::tools::safetensors_quant::{FileRecipe, QuantizeOptions, dequantize_bytes, quantize_bytes};
use fp8_engine::train::adamw::{AdamW, AdamWConfig};
use fp8_engine::train::checkpoint::{TrainProgress, load_checkpoint, save_checkpoint};
use proptest::prelude::*;
use safetensors::Dtype;

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fp8-fuzz-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A valid file with an F32, a BF16 and an FP8 tensor and metadata.
fn valid_safetensors() -> Vec<u8> {
    let f32s: Vec<u8> = (0..256).flat_map(|i| (i as f32 * 0.5 - 60.0).to_le_bytes()).collect();
    let bf16s: Vec<u8> = (0..64u16).flat_map(|i| (0x3f80 + i).to_le_bytes()).collect();
    let tensors = vec![
        (
            "a".to_string(),
            OutTensor {
                dtype: Dtype::F32,
                shape: vec![16, 16],
                data: f32s.into(),
            },
        ),
        (
            "b".to_string(),
            OutTensor {
                dtype: Dtype::BF16,
                shape: vec![4, 16],
                data: bf16s.into(),
            },
        ),
        (
            "c".to_string(),
            OutTensor {
                dtype: Dtype::F8_E4M3,
                shape: vec![8],
                data: vec![0x38; 8].into(),
            },
        ),
    ];
    let metadata = [("k".to_string(), "v".to_string())].into_iter().collect();
    serialize(&tensors, metadata, "fuzz").unwrap()
}

/// Every reader of safetensors bytes; only panics fail.
fn read_everything(bytes: &[u8]) {
    if let Ok(file) = parse(bytes, "fuzz") {
        for (_, view) in file.tensors.tensors() {
            let _ = fp8_engine::tools::safetensors_io::float_values(&view);
        }
    }
    let _ = inspect_bytes(bytes, "fuzz", Some((bytes, "fuzz")));
    for recipe in [FileRecipe::Current, FileRecipe::Block1x128, FileRecipe::Mxfp8] {
        if let Ok((quantized, _)) = quantize_bytes(bytes, "fuzz", &QuantizeOptions::new(recipe)) {
            let _ = dequantize_bytes(&quantized, "fuzz");
        }
    }
    let _ = dequantize_bytes(bytes, "fuzz");
    let path = scratch(&format!("st-{:?}", std::thread::current().id()));
    fs::write(&path, bytes).unwrap();
    let _ = fp8_engine::io::read_safetensors(&path);
}

/// Applies `edits` (position, byte) and an optional truncation to `base`.
fn mutate(base: &[u8], edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    let mut bytes = base.to_vec();
    for &(at, value) in edits {
        if !bytes.is_empty() {
            let at = at % bytes.len();
            bytes[at] = value;
        }
    }
    if let Some(cut) = cut {
        bytes.truncate(cut % (bytes.len() + 1));
    }
    bytes
}

fn small_model() -> DecoderModel {
    let config = ModelConfig {
        vocab: 12,
        max_seq: 8,
        hidden: 16,
        heads: 2,
        layers: 1,
        ffn_hidden: 32,
        ..ModelConfig::default()
    };
    DecoderModel::new(&config, &"fp8-delayed".parse::<Precision>().unwrap(), 1).unwrap()
}

fn valid_checkpoint() -> Vec<u8> {
    let path = scratch("valid.ckpt");
    let progress = TrainProgress {
        step: 0,
        data: DataStream::new(3),
        rng: SplitMix64::new(4),
        config: serde_json::json!({"fuzz": true}),
    };
    let optimizer = AdamW::new(AdamWConfig::default()).unwrap();
    save_checkpoint(
        &path,
        &mut small_model(),
        &optimizer,
        &DynamicLossScaler::disabled(),
        &progress,
    )
    .unwrap();
    fs::read(&path).unwrap()
}

fn load(bytes: &[u8]) {
    let path = scratch(&format!("ckpt-{:?}", std::thread::current().id()));
    fs::write(&path, bytes).unwrap();
    let mut optimizer = AdamW::new(AdamWConfig::default()).unwrap();
    let _ = load_checkpoint(
        &path,
        &mut small_model(),
        &mut optimizer,
        &mut DynamicLossScaler::disabled(),
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_crash_the_safetensors_readers(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        read_everything(&bytes);
    }

    #[test]
    fn mutated_safetensors_never_crash_the_readers(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<usize>()),
        header_len in proptest::option::of(any::<u64>()),
    ) {
        let mut bytes = mutate(&valid_safetensors(), &edits, cut);
        if let (Some(len), true) = (header_len, bytes.len() >= 8) {
            bytes[..8].copy_from_slice(&len.to_le_bytes());
        }
        read_everything(&bytes);
    }

    #[test]
    fn mutated_checkpoints_never_crash_the_checkpoint_reader(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        load(&mutate(&valid_checkpoint(), &edits, cut));
    }
}

/// The unmodified files load: the loop above exercises readers that accept valid input.
#[test]
fn the_fuzz_seeds_are_valid() {
    assert!(parse(&valid_safetensors(), "seed").is_ok());
    let path = scratch("seed.ckpt");
    fs::write(&path, valid_checkpoint()).unwrap();
    let mut optimizer = AdamW::new(AdamWConfig::default()).unwrap();
    load_checkpoint(
        &path,
        &mut small_model(),
        &mut optimizer,
        &mut DynamicLossScaler::disabled(),
    )
    .unwrap();
}

/// Regression (from the adversarial probe, not a fuzz find): a header length of u64::MAX once
/// meant reading the whole file before rejecting it.
#[test]
fn regression_header_length_max() {
    let mut bytes = valid_safetensors();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let path = scratch("max-header");
    fs::write(&path, &bytes).unwrap();
    let err = fp8_engine::io::read_safetensors(&path).unwrap_err().to_string();
    assert!(err.contains("header length"), "{err}");
}
