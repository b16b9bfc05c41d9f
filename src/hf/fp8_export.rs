//! Writes a model directory as a fine-grained FP8 checkpoint in the Hugging Face
//! layout: every linear weight of the decoder layers as `F8_E4M3` codes plus an
//! F32 `weight_scale_inv` per 128x128 block, everything else copied unchanged,
//! and `config.json` with `quantization_config = {quant_method: "fp8",
//! weight_block_size: [128, 128], activation_scheme: "dynamic"}`. That is the
//! layout of the published FP8 checkpoints, so the Python ecosystem's FP8
//! loaders read it unchanged, and so does [`super::HfModelDir`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use serde_json::{Value, json};

use super::HfModelDir;
use super::weights::{expected_tensors, scale_inv_name};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::io::{read_regular, write_atomic};
use crate::quantize::{ScaleRule, quantize_128x128};
use crate::tools::safetensors_io::{OutTensor, serialize};

/// Block edge of the published layout.
pub const HF_FP8_BLOCK: usize = 128;

/// Files copied next to the checkpoint when present (tokenizer and generation settings).
const SIDE_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// What [`write_hf_fp8`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fp8ExportSummary {
    /// Weights stored as E4M3 + block scales.
    pub quantized: Vec<String>,
    /// Tensors copied in their checkpoint dtype.
    pub copied: Vec<String>,
    /// Side files copied (tokenizer, generation config).
    pub side_files: Vec<String>,
}

/// Quantizes `model`'s decoder linear weights to E4M3 with 128x128 block scales (`pow2`: scales
/// floored to powers of two) and writes the directory `out` (created if needed). Weights whose name
/// contains one of `keep` stay in their checkpoint dtype (they go into `modules_to_not_convert`).
pub fn write_hf_fp8(model: &HfModelDir, out: &Path, pow2: bool, keep: &[String]) -> Result<Fp8ExportSummary> {
    if model.config.fp8.is_some() {
        return Err(Error::InvalidFile {
            path: model.dir.join("config.json").display().to_string(),
            reason: "the checkpoint is already a fine-grained FP8 checkpoint".to_string(),
        });
    }
    if out.exists() && std::fs::canonicalize(out).ok() == std::fs::canonicalize(&model.dir).ok() {
        return Err(Error::Io {
            path: out.display().to_string(),
            message: "the output directory is the input directory".to_string(),
        });
    }
    std::fs::create_dir_all(out).map_err(|err| Error::Io {
        path: out.display().to_string(),
        message: format!("cannot create the directory: {err}"),
    })?;
    let rule = ScaleRule {
        format: Fp8Format::E4M3,
        power_2_scale: pow2,
        amax_epsilon: 0.0,
    };
    let mut summary = Fp8ExportSummary::default();
    let mut tensors: Vec<(String, OutTensor<'_>)> = Vec::new();
    for t in expected_tensors(&model.config) {
        let entry = model.shards.entry(&t.name)?;
        if t.quantizable && !keep.iter().any(|k| t.name.contains(k.as_str())) {
            let (rows, cols) = (t.shape[0], t.shape[1]);
            let values = model.read_f32(&t.name)?;
            let mut codes = vec![0u8; rows * cols];
            let mut scale_inv = vec![0f32; rows.div_ceil(HF_FP8_BLOCK) * cols.div_ceil(HF_FP8_BLOCK)];
            quantize_128x128(&values, rows, cols, &rule, &mut codes, &mut scale_inv)?;
            let scales_shape = vec![rows.div_ceil(HF_FP8_BLOCK), cols.div_ceil(HF_FP8_BLOCK)];
            tensors.push((
                scale_inv_name(&t.name),
                OutTensor {
                    dtype: Dtype::F32,
                    shape: scales_shape,
                    data: Cow::Owned(scale_inv.iter().flat_map(|s| s.to_le_bytes()).collect()),
                },
            ));
            tensors.push((
                t.name.clone(),
                OutTensor {
                    dtype: Dtype::F8_E4M3,
                    shape: t.shape.clone(),
                    data: Cow::Owned(codes),
                },
            ));
            summary.quantized.push(t.name);
        } else {
            tensors.push((
                t.name.clone(),
                OutTensor {
                    dtype: entry.dtype,
                    shape: entry.shape.clone(),
                    data: Cow::Borrowed(model.shards.bytes(&t.name)?),
                },
            ));
            summary.copied.push(t.name);
        }
    }
    let path = out.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = serialize(&tensors, metadata, &path.display().to_string())?;
    write_atomic(&path, &bytes)?;
    write_atomic(&out.join("config.json"), &fp8_config(model, keep)?)?;
    for name in SIDE_FILES {
        let src = model.dir.join(name);
        if src.is_file() {
            let bytes = read_regular(&src, super::MAX_TOKENIZER_BYTES, "")?;
            write_atomic(&out.join(name), &bytes)?;
            summary.side_files.push(name.to_string());
        }
    }
    Ok(summary)
}

/// The input's `config.json` with the FP8 `quantization_config` added (every other field kept).
fn fp8_config(model: &HfModelDir, keep: &[String]) -> Result<Vec<u8>> {
    let path = model.dir.join("config.json");
    let text = read_regular(&path, 1 << 20, "")?;
    let mut config: Value = serde_json::from_slice(&text).map_err(|err| Error::InvalidFile {
        path: path.display().to_string(),
        reason: format!("not valid JSON: {err}"),
    })?;
    let mut quantization = json!({
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [HF_FP8_BLOCK, HF_FP8_BLOCK],
    });
    if !keep.is_empty() {
        quantization["modules_to_not_convert"] = json!(keep);
    }
    config["quantization_config"] = quantization;
    let mut bytes = serde_json::to_vec_pretty(&config).map_err(|err| Error::InvalidFile {
        path: path.display().to_string(),
        reason: format!("cannot serialize: {err}"),
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}
