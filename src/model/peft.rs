//! LoRA adapters in PEFT's layout: a directory with `adapter_config.json` (`peft_type` LORA, `r`,
//! `lora_alpha`, `lora_dropout`, `target_modules`) and `adapter_model.safetensors` holding f32
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` `[r, in]` and
//! `...lora_B.weight` `[out, r]`, so `peft.PeftModel.from_pretrained(base, DIR)` loads it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use serde_json::{Value, json};

use super::llama::LlamaModel;
use super::lora_targets::LoraConfig;
use crate::error::{Error, Result};
use crate::io::{read_regular, write_atomic};
use crate::nn::LoraSettings;
use crate::tools::safetensors_io::{OutTensor, float_values, parse, read_file, serialize};

/// The config file of an adapter directory.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The weights file of an adapter directory.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// What PEFT puts before a module's name inside the wrapped model.
const PEFT_PREFIX: &str = "base_model.model.";

fn invalid(path: &Path, reason: String) -> Error {
    Error::InvalidFile {
        path: path.display().to_string(),
        reason,
    }
}

impl LlamaModel {
    /// Writes the adapters to `dir` in PEFT's layout (see the module docs). `lora` is the run's
    /// configuration; `base` names the base model in the config (`base_model_name_or_path`).
    pub fn save_adapter(&mut self, lora: &LoraConfig, base: &str, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|err| Error::Io {
            path: dir.display().to_string(),
            message: format!("cannot create the directory: {err}"),
        })?;
        let mut tensors = Vec::new();
        self.visit_adapters(&mut |a| {
            for p in [a.a(), a.b()] {
                tensors.push((
                    format!("{PEFT_PREFIX}{}", p.name()),
                    p.shape().to_vec(),
                    p.value().to_vec(),
                ));
            }
        });
        if tensors.is_empty() {
            return Err(Error::InvalidSetting {
                setting: "lora",
                value: "save".into(),
                reason: "the model has no LoRA adapters".into(),
            });
        }
        let named: Vec<(String, OutTensor<'_>)> = tensors
            .iter()
            .map(|(name, shape, values)| {
                let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let tensor = OutTensor {
                    dtype: Dtype::F32,
                    shape: shape.clone(),
                    data: Cow::Owned(data),
                };
                (name.clone(), tensor)
            })
            .collect();
        let path = dir.join(ADAPTER_WEIGHTS);
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_atomic(&path, &serialize(&named, metadata, &path.display().to_string())?)?;
        let s = &lora.settings;
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": s.rank,
            "lora_alpha": s.alpha,
            "lora_dropout": s.dropout,
            "target_modules": lora.targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
        });
        let text = serde_json::to_string_pretty(&config).map_err(|err| invalid(dir, err.to_string()))?;
        write_atomic(&dir.join(ADAPTER_CONFIG), text.as_bytes())
    }

    /// Adds the adapters saved in `dir` (PEFT's layout) to this model, freezing the rest, and
    /// returns their configuration. Every adapter tensor must be present with its shape.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<LoraConfig> {
        let lora = read_adapter_config(dir)?;
        self.enable_lora(&lora, 0)?;
        let path = dir.join(ADAPTER_WEIGHTS);
        let bytes = read_file(&path)?;
        let file = parse(&bytes, &path.display().to_string())?;
        let mut result = Ok(());
        let mut loaded = 0usize;
        self.visit_adapters(&mut |a| {
            a.visit_parameters(&mut |p| {
                if result.is_err() {
                    return;
                }
                let name = format!("{PEFT_PREFIX}{}", p.name());
                let values = match file.tensors.tensor(&name) {
                    Ok(view) if view.shape() == p.shape() => float_values(&view).map(|v| v.to_f32()),
                    Ok(view) => {
                        result = Err(invalid(
                            &path,
                            format!("{name} has shape {:?}, expected {:?}", view.shape(), p.shape()),
                        ));
                        return;
                    }
                    Err(_) => {
                        result = Err(invalid(&path, format!("no tensor {name}")));
                        return;
                    }
                };
                match values {
                    Some(v) => {
                        p.set_value(v);
                        p.mark_updated();
                        loaded += 1;
                    }
                    None => result = Err(invalid(&path, format!("{name} is not f32, bf16 or f16"))),
                }
            });
        });
        result?;
        if loaded != file.tensors.len() {
            return Err(invalid(
                &path,
                format!(
                    "{} tensors, {loaded} match the adapters of the config",
                    file.tensors.len()
                ),
            ));
        }
        Ok(lora)
    }
}

/// The rank, alpha, dropout and targets of an adapter directory's `adapter_config.json`.
pub fn read_adapter_config(dir: &Path) -> Result<LoraConfig> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = read_regular(&path, 1 << 20, "")?;
    let config: Value =
        serde_json::from_slice(&text).map_err(|err| invalid(&path, format!("not valid JSON: {err}")))?;
    let field = |key: &str| config.get(key).ok_or_else(|| invalid(&path, format!("no \"{key}\"")));
    if field("peft_type")?.as_str() != Some("LORA") {
        return Err(invalid(&path, "peft_type is not LORA".into()));
    }
    let number = |key: &str| {
        field(key)?
            .as_f64()
            .ok_or_else(|| invalid(&path, format!("\"{key}\" is not a number")))
    };
    let targets: Vec<&str> = field("target_modules")?
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .ok_or_else(|| invalid(&path, "\"target_modules\" is not a list of names".into()))?;
    let settings = LoraSettings {
        rank: number("r")? as usize,
        alpha: number("lora_alpha")? as f32,
        dropout: config.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0) as f32,
    };
    LoraConfig::new(settings, &targets.join(","))
}
