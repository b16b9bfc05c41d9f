//! LoRA arithmetic for the planner: which linears take adapters and how many values they add.
//! An adapter on a linear `[out, in]` is A `[R, in]` and B `[out, R]`, one per target per layer.

use std::fmt;

use super::{LinearShape, LoraPlan, q_kv_widths};
use crate::error::{Error, Result};
use crate::hf::HfConfig;

/// A linear of a Llama layer, by its Hugging Face name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoraTarget {
    /// `q_proj`: hidden -> query heads.
    Q,
    /// `k_proj`: hidden -> key heads.
    K,
    /// `v_proj`: hidden -> value heads.
    V,
    /// `o_proj`: query heads -> hidden.
    O,
    /// `gate_proj`: hidden -> ffn.
    Gate,
    /// `up_proj`: hidden -> ffn.
    Up,
    /// `down_proj`: ffn -> hidden.
    Down,
}

const NAMES: [(LoraTarget, &str); 7] = [
    (LoraTarget::Q, "q_proj"),
    (LoraTarget::K, "k_proj"),
    (LoraTarget::V, "v_proj"),
    (LoraTarget::O, "o_proj"),
    (LoraTarget::Gate, "gate_proj"),
    (LoraTarget::Up, "up_proj"),
    (LoraTarget::Down, "down_proj"),
];

impl LoraTarget {
    /// The Hugging Face module name.
    pub fn hf_name(self) -> &'static str {
        NAMES.iter().find(|(t, _)| *t == self).map_or("", |(_, n)| n)
    }

    /// The weight shape `[out, in]` of this linear in a model of `c`.
    pub(crate) fn shape(self, c: &HfConfig) -> LinearShape {
        let (h, f) = (c.hidden_size as u128, c.intermediate_size as u128);
        let (q, kv) = q_kv_widths(c);
        let (out, inp) = match self {
            LoraTarget::Q => (q, h),
            LoraTarget::K | LoraTarget::V => (kv, h),
            LoraTarget::O => (h, q),
            LoraTarget::Gate | LoraTarget::Up => (f, h),
            LoraTarget::Down => (h, f),
        };
        LinearShape { out, inp }
    }
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hf_name())
    }
}

/// `q_proj,k_proj,...` (each at most once) into targets, in the order given.
pub fn parse_targets(text: &str) -> Result<Vec<LoraTarget>> {
    let mut targets = Vec::new();
    for name in text.split(',').map(str::trim) {
        let target = NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(t, _)| *t)
            .ok_or_else(|| Error::InvalidSetting {
                setting: "lora-targets",
                value: name.to_string(),
                reason: format!(
                    "expected a comma-separated list of {}",
                    NAMES.map(|(_, n)| n).join(", ")
                ),
            })?;
        if targets.contains(&target) {
            return Err(Error::InvalidSetting {
                setting: "lora-targets",
                value: name.to_string(),
                reason: "named twice".to_string(),
            });
        }
        targets.push(target);
    }
    Ok(targets)
}

/// Trainable values of `lora` on every layer of `c`: `R * (in + out)` per target per layer.
pub fn lora_parameter_count(c: &HfConfig, lora: &LoraPlan) -> u128 {
    let per_layer: u128 = lora
        .targets
        .iter()
        .map(|t| {
            let s = t.shape(c);
            lora.rank as u128 * (s.inp + s.out)
        })
        .sum();
    c.num_hidden_layers as u128 * per_layer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_in_order_and_reject_unknown_or_repeated_names() {
        assert_eq!(
            parse_targets("q_proj, v_proj,down_proj").unwrap(),
            [LoraTarget::Q, LoraTarget::V, LoraTarget::Down]
        );
        let err = parse_targets("q_proj,qkv").unwrap_err().to_string();
        assert!(err.contains("qkv") && err.contains("gate_proj"), "{err}");
        assert!(parse_targets("q_proj,q_proj").is_err());
        assert!(parse_targets("").is_err());
    }

    #[test]
    fn gqa_targets_use_the_key_value_width() {
        let c = HfConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
                "vocab_size": 50}"#,
        )
        .unwrap();
        let lora = LoraPlan {
            rank: 4,
            targets: parse_targets("k_proj,down_proj").unwrap(),
        };
        // k: [16, 64], down: [64, 96].
        assert_eq!(lora_parameter_count(&c, &lora), 3 * 4 * ((64 + 16) + (96 + 64)));
    }
}
