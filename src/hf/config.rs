//! `config.json` of a Hugging Face Llama-family checkpoint, in both dialects:
//! the legacy one (`rope_theta`, `rope_scaling`, `torch_dtype`) that most
//! published checkpoints use, and the transformers-5 one (`rope_parameters`,
//! `dtype`). Fields the engine does not model are ignored when they cannot
//! change the computation (`use_cache`, `initializer_range`, ...); a known
//! field with a value the engine cannot compute is an error naming it.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The model families the engine loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`.
    Llama,
    /// `MistralForCausalLM` (a Llama with an optional sliding window).
    Mistral,
    /// `Qwen2ForCausalLM` (a Llama with q/k/v biases).
    Qwen2,
}

impl Architecture {
    /// The `architectures[0]` string of `config.json`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// The `model_type` string of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }

    fn from_hf_name(name: &str) -> Option<Self> {
        [Architecture::Llama, Architecture::Mistral, Architecture::Qwen2]
            .into_iter()
            .find(|a| a.hf_name() == name)
    }
}

/// How rotary frequencies are rescaled for long contexts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_scaling: null` or `rope_type: "default"`).
    None,
    /// Positions divided by `factor` (equivalently every frequency).
    Linear { factor: f64 },
    /// Llama 3.1's per-frequency interpolation between `factor` and 1.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// Rotary position embedding settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base of the frequencies, `theta^(-2i/d)`.
    pub theta: f64,
    /// Long-context rescaling.
    pub scaling: RopeScaling,
    /// Leading dimensions of each head that rotate (`head_dim` unless `partial_rotary_factor` < 1).
    pub rotary_dim: usize,
}

/// Fine-grained FP8 weights (`quantization_config.quant_method = "fp8"`): linear weights stored as
/// E4M3 codes with one f32 `weight_scale_inv` per `[block_rows, block_cols]` block.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Quantization {
    /// `weight_block_size`, `[128, 128]` in every published checkpoint.
    pub block: [usize; 2],
    /// Module name fragments left in high precision (`modules_to_not_convert`).
    pub modules_to_not_convert: Vec<String>,
}

/// The parts of `config.json` that determine the computation.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// Model family.
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than the query heads).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Rows of the embedding table.
    pub vocab_size: usize,
    /// Longest position the model was trained for.
    pub max_position_embeddings: usize,
    /// The epsilon inside RMSNorm's square root.
    pub rms_norm_eps: f64,
    /// Rotary embeddings.
    pub rope: RopeConfig,
    /// The head reuses `model.embed_tokens.weight` (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    /// q, k and v projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Mistral's sliding attention window, if any: sequences up to this length attend fully.
    pub sliding_window: Option<usize>,
    /// `torch_dtype` / `dtype`, e.g. `bfloat16`.
    pub dtype: Option<String>,
    /// Fine-grained FP8 checkpoint layout, if the weights are stored that way.
    pub fp8: Option<Fp8Quantization>,
}

impl RopeConfig {
    /// The rotary frequencies in f32, as transformers computes them (see [`crate::ops::rope`]).
    pub fn inv_freq(&self) -> Vec<f32> {
        use crate::ops::rope::{RopeFrequencyScaling as S, inv_freq};
        let scaling = match self.scaling {
            RopeScaling::None => S::None,
            RopeScaling::Linear { factor } => S::Linear { factor: factor as f32 },
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => S::Llama3 {
                factor: factor as f32,
                low_freq_factor: low_freq_factor as f32,
                high_freq_factor: high_freq_factor as f32,
                original_max_position_embeddings: original_max_position_embeddings as f32,
            },
        };
        inv_freq(self.theta as f32, self.rotary_dim, scaling)
    }
}

fn unsupported(field: &str, value: &Value, why: &str) -> Error {
    Error::InvalidSetting {
        setting: "config.json",
        value: format!("{field} = {value}"),
        reason: why.to_string(),
    }
}

fn missing(field: &str) -> Error {
    Error::InvalidSetting {
        setting: "config.json",
        value: field.to_string(),
        reason: "required field is missing".to_string(),
    }
}

/// Reads typed fields out of a JSON object, naming the field in every error.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => Err(unsupported(key, v, "expected a non-negative integer")),
            },
        }
    }

    fn positive(&self, key: &str) -> Result<usize> {
        match self.usize_opt(key)? {
            Some(0) => Err(unsupported(key, &Value::from(0), "must be at least 1")),
            Some(n) => Ok(n),
            None => Err(missing(key)),
        }
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(x),
                _ => Err(unsupported(key, v, "expected a finite number")),
            },
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(unsupported(key, v, "expected true or false")),
        }
    }

    fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(unsupported(key, v, "expected a string")),
        }
    }
}

impl HfConfig {
    /// Parses `config.json` text.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|err| Error::InvalidSetting {
            setting: "config.json",
            value: String::new(),
            reason: format!("not valid JSON: {err}"),
        })?;
        let Value::Object(map) = value else {
            return Err(unsupported("config.json", &value, "expected a JSON object"));
        };
        Self::from_map(&map)
    }

    fn from_map(map: &Map<String, Value>) -> Result<Self> {
        let f = Fields(map);
        let architecture = architecture(&f)?;
        let hidden_size = f.positive("hidden_size")?;
        let num_attention_heads = f.positive("num_attention_heads")?;
        let num_key_value_heads = f.usize_opt("num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(unsupported(
                "num_key_value_heads",
                &Value::from(num_key_value_heads),
                &format!("must divide num_attention_heads = {num_attention_heads}"),
            ));
        }
        let head_dim = match f.usize_opt("head_dim")? {
            Some(d) => d,
            None if hidden_size.is_multiple_of(num_attention_heads) => hidden_size / num_attention_heads,
            None => {
                return Err(unsupported(
                    "hidden_size",
                    &Value::from(hidden_size),
                    &format!("not divisible by num_attention_heads = {num_attention_heads} and no head_dim given"),
                ));
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(unsupported(
                "head_dim",
                &Value::from(head_dim),
                "must be even and non-zero",
            ));
        }
        check_activation(&f)?;
        let qkv_bias = biases(&f, architecture)?;
        let rope = rope(&f, head_dim)?;
        let sliding_window = sliding_window(&f, architecture)?;
        let config = HfConfig {
            architecture,
            hidden_size,
            intermediate_size: f.positive("intermediate_size")?,
            num_hidden_layers: f.positive("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: f.positive("vocab_size")?,
            max_position_embeddings: f.usize_opt("max_position_embeddings")?.unwrap_or(2048),
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            rope,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            qkv_bias,
            sliding_window,
            dtype: f.str_opt("dtype")?.or(f.str_opt("torch_dtype")?).map(str::to_string),
            fp8: fp8_quantization(&f)?,
        };
        if config.rms_norm_eps <= 0.0 {
            return Err(unsupported(
                "rms_norm_eps",
                &Value::from(config.rms_norm_eps),
                "must be positive",
            ));
        }
        Ok(config)
    }

    /// Query heads served by one key/value head.
    pub fn kv_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Number of trainable values, embeddings and head included (the head once if tied).
    pub fn parameter_count(&self) -> u128 {
        let (h, i, d) = (
            self.hidden_size as u128,
            self.intermediate_size as u128,
            self.head_dim as u128,
        );
        let q = self.num_attention_heads as u128 * d;
        let kv = self.num_key_value_heads as u128 * d;
        let attention = h * q + 2 * h * kv + q * h + if self.qkv_bias { q + 2 * kv } else { 0 };
        let layer = attention + 3 * h * i + 2 * h;
        let embed = self.vocab_size as u128 * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        self.num_hidden_layers as u128 * layer + embed + head + h
    }
}

fn architecture(f: &Fields<'_>) -> Result<Architecture> {
    let Some(list) = f.get("architectures") else {
        return Err(missing("architectures"));
    };
    let name = list
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .ok_or_else(|| unsupported("architectures", list, "expected a list of architecture names"))?;
    Architecture::from_hf_name(name).ok_or_else(|| {
        unsupported(
            "architectures",
            list,
            "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM",
        )
    })
}

fn check_activation(f: &Fields<'_>) -> Result<()> {
    for key in ["hidden_act", "hidden_activation"] {
        if let Some(act) = f.str_opt(key)?
            && act != "silu"
            && act != "swish"
        {
            return Err(unsupported(
                key,
                &Value::from(act),
                "only silu (SwiGLU MLP) is supported",
            ));
        }
    }
    Ok(())
}

/// Llama and Mistral have no biases (Llama's `attention_bias` would add one to `o_proj` too);
/// Qwen2 always has q/k/v biases and none elsewhere.
fn biases(f: &Fields<'_>, architecture: Architecture) -> Result<bool> {
    for key in ["attention_bias", "mlp_bias"] {
        if f.bool_or(key, false)? {
            return Err(unsupported(
                key,
                &Value::Bool(true),
                "biases on these projections are not supported",
            ));
        }
    }
    Ok(architecture == Architecture::Qwen2)
}

fn sliding_window(f: &Fields<'_>, architecture: Architecture) -> Result<Option<usize>> {
    match architecture {
        Architecture::Mistral => f.usize_opt("sliding_window"),
        // Qwen2 configs carry a window that only applies with use_sliding_window = true.
        Architecture::Qwen2 if f.bool_or("use_sliding_window", false)? => Err(unsupported(
            "use_sliding_window",
            &Value::Bool(true),
            "sliding-window attention is not supported for Qwen2",
        )),
        _ => Ok(None),
    }
}

fn rope(f: &Fields<'_>, head_dim: usize) -> Result<RopeConfig> {
    // transformers 5 nests everything in rope_parameters; legacy files split it in two.
    let (params, where_) = match f.get("rope_parameters") {
        Some(Value::Object(p)) => (Some(p), "rope_parameters"),
        Some(v) => return Err(unsupported("rope_parameters", v, "expected an object")),
        None => match f.get("rope_scaling") {
            Some(Value::Object(p)) => (Some(p), "rope_scaling"),
            Some(v) => return Err(unsupported("rope_scaling", v, "expected an object or null")),
            None => (None, "rope_scaling"),
        },
    };
    let nested = params.map(Fields);
    // The nested object's theta wins (transformers 5); legacy files keep it at the top level.
    let theta = match &nested {
        Some(p) if p.get("rope_theta").is_some() => p.f64_or("rope_theta", 10000.0)?,
        _ => f.f64_or("rope_theta", 10000.0)?,
    };
    if theta <= 1.0 {
        return Err(unsupported("rope_theta", &Value::from(theta), "must be greater than 1"));
    }
    let scaling = match &nested {
        None => RopeScaling::None,
        Some(p) => {
            let kind = p.str_opt("rope_type")?.or(p.str_opt("type")?).unwrap_or("default");
            let num = |key: &str| -> Result<f64> {
                match p.get(key) {
                    Some(v) => match v.as_f64() {
                        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
                        _ => Err(unsupported(&format!("{where_}.{key}"), v, "expected a positive number")),
                    },
                    None => Err(missing(&format!("{where_}.{key}"))),
                }
            };
            match kind {
                "default" => RopeScaling::None,
                "linear" => RopeScaling::Linear { factor: num("factor")? },
                "llama3" => {
                    let (low, high) = (num("low_freq_factor")?, num("high_freq_factor")?);
                    if high <= low {
                        return Err(unsupported(
                            &format!("{where_}.high_freq_factor"),
                            &Value::from(high),
                            "must exceed low_freq_factor",
                        ));
                    }
                    RopeScaling::Llama3 {
                        factor: num("factor")?,
                        low_freq_factor: low,
                        high_freq_factor: high,
                        original_max_position_embeddings: num("original_max_position_embeddings")?,
                    }
                }
                other => {
                    return Err(unsupported(
                        &format!("{where_}.rope_type"),
                        &Value::from(other),
                        "supported: default, linear, llama3",
                    ));
                }
            }
        }
    };
    let factor = f.f64_or("partial_rotary_factor", 1.0)?;
    if factor <= 0.0 || factor > 1.0 {
        return Err(unsupported(
            "partial_rotary_factor",
            &Value::from(factor),
            "must be in (0, 1]",
        ));
    }
    // transformers rounds the rotary width down: int(head_dim * factor).
    let rotary_dim = (head_dim as f64 * factor) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(unsupported(
            "partial_rotary_factor",
            &Value::from(factor),
            &format!("gives an odd or zero rotary width {rotary_dim} for head_dim {head_dim}"),
        ));
    }
    Ok(RopeConfig {
        theta,
        scaling,
        rotary_dim,
    })
}

fn fp8_quantization(f: &Fields<'_>) -> Result<Option<Fp8Quantization>> {
    let Some(q) = f.get("quantization_config") else {
        return Ok(None);
    };
    let Value::Object(q) = q else {
        return Err(unsupported("quantization_config", q, "expected an object"));
    };
    let q = Fields(q);
    match q.str_opt("quant_method")? {
        Some("fp8") => {}
        Some(other) => {
            return Err(unsupported(
                "quantization_config.quant_method",
                &Value::from(other),
                "only fine-grained fp8 checkpoints are supported",
            ));
        }
        None => return Err(missing("quantization_config.quant_method")),
    }
    if let Some(scheme) = q.str_opt("activation_scheme")?
        && scheme != "dynamic"
    {
        return Err(unsupported(
            "quantization_config.activation_scheme",
            &Value::from(scheme),
            "only dynamic activation scaling is supported",
        ));
    }
    let block = match q.get("weight_block_size") {
        Some(v) => match v.as_array().map(|a| a.iter().map(Value::as_u64).collect::<Vec<_>>()) {
            Some(b) if b.len() == 2 && b.iter().all(|x| x.is_some_and(|n| n > 0)) => {
                [b[0].unwrap_or(1) as usize, b[1].unwrap_or(1) as usize]
            }
            _ => {
                return Err(unsupported(
                    "quantization_config.weight_block_size",
                    v,
                    "expected [rows, cols]",
                ));
            }
        },
        None => {
            return Err(unsupported(
                "quantization_config.weight_block_size",
                &Value::Null,
                "per-tensor fp8 checkpoints are not supported; expected block scales such as [128, 128]",
            ));
        }
    };
    let modules_to_not_convert = match q.get("modules_to_not_convert") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|m| m.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                unsupported(
                    "quantization_config.modules_to_not_convert",
                    v,
                    "expected a list of names",
                )
            })?,
    };
    Ok(Some(Fp8Quantization {
        block,
        modules_to_not_convert,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3: &str = r#"{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 400,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true
    }"#;

    #[test]
    fn legacy_llama3_dialect() {
        let c = HfConfig::from_json(LLAMA3).unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!((c.head_dim, c.kv_group(), c.rope.rotary_dim), (16, 2, 16));
        assert_eq!(c.rope.theta, 500000.0);
        assert!(matches!(c.rope.scaling, RopeScaling::Llama3 { factor: 8.0, .. }));
        assert!(c.tie_word_embeddings && !c.qkv_bias);
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
        let f = c.rope.inv_freq();
        assert_eq!(f.len(), 8);
        // The lowest frequency's wavelength (2 pi / 500000^(-14/16)) is far past 8192: divided by 8.
        assert_eq!(f[7], 1.0 / 500000f32.powf(14.0 / 16.0) / 8.0);
    }

    #[test]
    fn transformers5_dialect_reads_the_same() {
        let v5 = r#"{
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 400, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "tie_word_embeddings": true, "dtype": "bfloat16"
        }"#;
        assert_eq!(HfConfig::from_json(v5).unwrap(), HfConfig::from_json(LLAMA3).unwrap());
    }

    #[test]
    fn parameter_count_matches_a_hand_count() {
        let c = HfConfig::from_json(LLAMA3).unwrap();
        // per layer: q 64x64, k,v 64x32 each, o 64x64, mlp 3x64x176, two norms of 64.
        let layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64;
        assert_eq!(c.parameter_count(), (2 * layer + 400 * 64 + 64) as u128);
    }

    #[test]
    fn llama2_7b_parameter_count_is_exact() {
        let c = HfConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
                "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000,
                "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": false}"#,
        )
        .unwrap();
        assert_eq!(c.parameter_count(), 6_738_415_616);
    }

    fn with(field: &str, value: &str) -> Result<HfConfig> {
        let mut v: Value = serde_json::from_str(LLAMA3).unwrap();
        v[field] = serde_json::from_str(value).unwrap();
        HfConfig::from_json(&v.to_string())
    }

    fn err(field: &str, value: &str) -> String {
        with(field, value).unwrap_err().to_string()
    }

    #[test]
    fn unsupported_values_name_their_field() {
        assert!(err("architectures", r#"["GPT2LMHeadModel"]"#).contains("GPT2LMHeadModel"));
        assert!(err("hidden_act", r#""gelu""#).contains("hidden_act"));
        assert!(err("attention_bias", "true").contains("attention_bias"));
        assert!(err("rope_scaling", r#"{"rope_type": "yarn", "factor": 4.0}"#).contains("rope_scaling.rope_type"));
        assert!(err("num_key_value_heads", "3").contains("num_key_value_heads"));
        assert!(err("hidden_size", "-4").contains("hidden_size"));
        assert!(err("quantization_config", r#"{"quant_method": "gptq"}"#).contains("quant_method"));
        let mut v: Value = serde_json::from_str(LLAMA3).unwrap();
        v.as_object_mut().unwrap().remove("vocab_size");
        assert!(
            HfConfig::from_json(&v.to_string())
                .unwrap_err()
                .to_string()
                .contains("vocab_size")
        );
    }

    #[test]
    fn defaults_and_variants() {
        let c = with("num_key_value_heads", "null").unwrap();
        assert_eq!(c.num_key_value_heads, 4);
        let c = with("rope_scaling", r#"{"type": "linear", "factor": 2.0}"#).unwrap();
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 2.0 });
        let c = with("partial_rotary_factor", "0.5").unwrap();
        assert_eq!(c.rope.rotary_dim, 8);
        let c = with("architectures", r#"["Qwen2ForCausalLM"]"#).unwrap();
        assert!(c.qkv_bias);
        let c = with("quantization_config", r#"{"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}"#).unwrap();
        assert_eq!(c.fp8.unwrap().block, [128, 128]);
        assert!(err("quantization_config", r#"{"quant_method": "fp8"}"#).contains("weight_block_size"));
    }
}
