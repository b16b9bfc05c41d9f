//! Between a [`LlamaModel`]'s parameters and a Hugging Face checkpoint: each engine parameter is
//! one HF tensor or the row-wise concatenation of several (the fused q/k/v projection is
//! `[q_proj; k_proj; v_proj]`, the SwiGLU `fc1` is `[gate_proj; up_proj]`; weights are
//! `[out, in]`, so stacking rows is stacking output features).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use serde_json::Value;

use super::config::Recompute;
use super::llama::LlamaModel;
use crate::amp::Precision;
use crate::error::{Error, Result};
use crate::hf::{HfConfig, HfModelDir};
use crate::io::{read_regular, write_atomic};
use crate::nn::Parameter;
use crate::tools::safetensors_io::{OutTensor, serialize};

/// Files copied next to a saved checkpoint when the source has them.
const SIDE_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// One engine parameter and the HF tensors it stacks by rows, with the rows of each.
pub type HfSources = (String, Vec<(String, usize)>);

/// One tensor as a checkpoint stores it: HF name, shape, f32 values.
pub type HfTensor = (String, Vec<usize>, Vec<f32>);

/// The sources of every parameter of `config`'s model.
pub fn hf_names(config: &HfConfig) -> Vec<HfSources> {
    let (h, d, ffn) = (config.hidden_size, config.head_dim, config.intermediate_size);
    let (q_rows, kv_rows) = (config.num_attention_heads * d, config.num_key_value_heads * d);
    let one = |name: String, rows: usize| vec![(name, rows)];
    let mut map = vec![(
        "embed.tokens".to_string(),
        one("model.embed_tokens.weight".into(), config.vocab_size),
    )];
    for i in 0..config.num_hidden_layers {
        let (e, p) = (format!("layers.{i}"), format!("model.layers.{i}"));
        let qkv = |suffix: &str| {
            [("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)]
                .iter()
                .map(|(proj, rows)| (format!("{p}.self_attn.{proj}.{suffix}"), *rows))
                .collect()
        };
        map.push((
            format!("{e}.attn.qkv.norm.weight"),
            one(format!("{p}.input_layernorm.weight"), h),
        ));
        map.push((format!("{e}.attn.qkv.linear.weight"), qkv("weight")));
        if config.qkv_bias {
            map.push((format!("{e}.attn.qkv.linear.bias"), qkv("bias")));
        }
        map.push((
            format!("{e}.attn.o_proj.weight"),
            one(format!("{p}.self_attn.o_proj.weight"), h),
        ));
        map.push((
            format!("{e}.mlp.norm.weight"),
            one(format!("{p}.post_attention_layernorm.weight"), h),
        ));
        map.push((
            format!("{e}.mlp.fc1.weight"),
            vec![
                (format!("{p}.mlp.gate_proj.weight"), ffn),
                (format!("{p}.mlp.up_proj.weight"), ffn),
            ],
        ));
        map.push((
            format!("{e}.mlp.fc2.weight"),
            one(format!("{p}.mlp.down_proj.weight"), h),
        ));
    }
    map.push(("final_norm.weight".to_string(), one("model.norm.weight".into(), h)));
    if !config.tie_word_embeddings {
        map.push((
            "head.weight".to_string(),
            one("lm_head.weight".into(), config.vocab_size),
        ));
    }
    map
}

fn internal(name: &str, reason: String) -> Error {
    Error::InvalidTensor {
        name: name.to_string(),
        reason,
    }
}

impl LlamaModel {
    /// Every checkpoint parameter, frozen or not: all but the LoRA adapters (`MODULE.lora_A.weight`,
    /// `MODULE.lora_B.weight`), which are no tensors of the base checkpoint.
    fn visit_base_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.visit_all_parameters(&mut |p| {
            if !(p.name().ends_with(".lora_A.weight") || p.name().ends_with(".lora_B.weight")) {
                f(p)
            }
        });
    }

    /// The model of the checkpoint directory `dir` (already opened and checked), every weight
    /// widened to f32 once. Errors name a missing or mis-shaped tensor.
    pub fn from_hf(dir: &HfModelDir, precision: &Precision, recompute: Recompute) -> Result<Self> {
        // Every parameter is loaded next, so nothing is drawn (`load_hf` checks that each one is).
        let mut model = crate::nn::without_draws(|| LlamaModel::new(&dir.config, precision, recompute, 0))?;
        model.load_hf(dir)?;
        Ok(model)
    }

    /// Replaces every parameter with the checkpoint's values.
    pub fn load_hf(&mut self, dir: &HfModelDir) -> Result<()> {
        let loaded = self.load_hf_values(dir)?;
        let expected = hf_names(self.config()).len();
        if loaded != expected {
            return Err(internal(
                "model",
                format!("{loaded} parameters loaded, the checkpoint map has {expected}"),
            ));
        }
        Ok(())
    }

    /// Replaces every parameter a visitor sees (all but frozen FP8 weights) with the
    /// checkpoint's values, one at a time; returns how many were loaded.
    pub(crate) fn load_hf_values(&mut self, dir: &HfModelDir) -> Result<usize> {
        let sources: HashMap<String, Vec<(String, usize)>> = hf_names(self.config()).into_iter().collect();
        let mut result = Ok(());
        let mut loaded = 0usize;
        self.visit_base_parameters(&mut |p| {
            if result.is_err() {
                return;
            }
            let Some(names) = sources.get(p.name()) else {
                result = Err(internal(p.name(), "no Hugging Face tensor maps to it".into()));
                return;
            };
            // A parameter of one tensor takes the widened vector as it is (no second copy of a
            // 1 GiB embedding); a fused one stacks its tensors.
            let mut values = Vec::new();
            for (name, _) in names {
                match dir.read_f32(name) {
                    Ok(v) if values.is_empty() => values = v,
                    Ok(v) => values.extend(v),
                    Err(err) => {
                        result = Err(err);
                        return;
                    }
                }
            }
            if values.len() != p.len() {
                result = Err(internal(
                    p.name(),
                    format!(
                        "its checkpoint tensors hold {} values, the parameter {:?} needs {}",
                        values.len(),
                        p.shape(),
                        p.len()
                    ),
                ));
                return;
            }
            p.set_value(values);
            p.mark_updated();
            loaded += 1;
        });
        result?;
        Ok(loaded)
    }

    /// The parameters as `(HF name, shape, f32 values)`, each fused parameter cut back into its
    /// HF tensors.
    pub fn hf_tensors(&mut self) -> Result<Vec<HfTensor>> {
        // A frozen FP8 base is saved as the f32 values its codes stand for.
        self.thaw_fp8_base()?;
        let map: HashMap<String, Vec<(String, usize)>> = hf_names(self.config()).into_iter().collect();
        let mut out = Vec::new();
        let mut result = Ok(());
        self.visit_base_parameters(&mut |p| {
            let Some(names) = map.get(p.name()) else {
                result = Err(internal(p.name(), "no Hugging Face tensor maps to it".into()));
                return;
            };
            let rows: usize = names.iter().map(|(_, r)| r).sum();
            let cols = p.len() / rows.max(1);
            if rows * cols != p.len() {
                result = Err(internal(
                    p.name(),
                    format!("{} values do not split into {rows} rows", p.len()),
                ));
                return;
            }
            // One read of the whole parameter (a download where it lives on a GPU), sliced.
            let values = match p.widened_copy() {
                Ok(values) => values,
                Err(e) => {
                    result = Err(e);
                    return;
                }
            };
            let mut start = 0;
            for &(ref name, part_rows) in names {
                let shape = if p.shape().len() == 2 {
                    vec![part_rows, cols]
                } else {
                    vec![part_rows]
                };
                out.push((
                    name.clone(),
                    shape,
                    values[start * cols..(start + part_rows) * cols].to_vec(),
                ));
                start += part_rows;
            }
        });
        result?;
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Writes a directory `transformers` loads: `config.json` (the source's, with f32 weights and
    /// no quantization), `model.safetensors` in f32 with the HF names, and the tokenizer and
    /// generation files copied from `source`.
    pub fn save_hf(&mut self, source: &Path, out: &Path) -> Result<()> {
        std::fs::create_dir_all(out).map_err(|err| Error::Io {
            path: out.display().to_string(),
            message: format!("cannot create the directory: {err}"),
        })?;
        let tensors = self.hf_tensors()?;
        let named: Vec<(String, OutTensor<'_>)> = tensors
            .iter()
            .map(|(name, shape, values)| {
                (
                    name.clone(),
                    OutTensor {
                        dtype: Dtype::F32,
                        shape: shape.clone(),
                        data: Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
                    },
                )
            })
            .collect();
        let path = out.join("model.safetensors");
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = serialize(&named, metadata, &path.display().to_string())?;
        write_atomic(&path, &bytes)?;
        write_atomic(&out.join("config.json"), &saved_config(source)?)?;
        for name in SIDE_FILES {
            let src = source.join(name);
            if src.is_file() {
                let bytes = read_regular(&src, crate::hf::MAX_TOKENIZER_BYTES, "")?;
                write_atomic(&out.join(name), &bytes)?;
            }
        }
        Ok(())
    }
}

/// The source `config.json` with the dtype set to float32 and any quantization dropped.
fn saved_config(source: &Path) -> Result<Vec<u8>> {
    let path = source.join("config.json");
    let text = read_regular(&path, 1 << 20, "")?;
    let mut config: Value = serde_json::from_slice(&text).map_err(|err| Error::InvalidFile {
        path: path.display().to_string(),
        reason: format!("not valid JSON: {err}"),
    })?;
    if let Some(object) = config.as_object_mut() {
        object.remove("quantization_config");
        for key in ["dtype", "torch_dtype"] {
            if object.contains_key(key) {
                object.insert(key.to_string(), Value::from("float32"));
            }
        }
    }
    let mut bytes = serde_json::to_vec_pretty(&config).map_err(|err| Error::InvalidFile {
        path: path.display().to_string(),
        reason: format!("cannot serialize: {err}"),
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}
