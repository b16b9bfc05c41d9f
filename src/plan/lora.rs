//! LoRA arithmetic for the planner: which linears take adapters and how many values they add.
//! An adapter on a linear `[out, in]` is A `[R, in]` and B `[out, R]`, one per target per layer.

use super::{LinearShape, LoraPlan, q_kv_widths};
use crate::error::{Error, Result};
use crate::hf::HfConfig;
pub use crate::model::LoraTarget;

/// The weight shape `[out, in]` of the projection `t` in a model of `c`.
pub(crate) fn target_shape(t: LoraTarget, c: &HfConfig) -> LinearShape {
    let (h, f) = (c.hidden_size as u128, c.intermediate_size as u128);
    let (q, kv) = q_kv_widths(c);
    let (out, inp) = match t {
        LoraTarget::QProj => (q, h),
        LoraTarget::KProj | LoraTarget::VProj => (kv, h),
        LoraTarget::OProj => (h, q),
        LoraTarget::GateProj | LoraTarget::UpProj => (f, h),
        LoraTarget::DownProj => (h, f),
    };
    LinearShape { out, inp }
}

/// `q_proj,k_proj,...` (each at most once) into targets, in the order given.
pub fn parse_targets(text: &str) -> Result<Vec<LoraTarget>> {
    let mut targets = Vec::new();
    for name in text.split(',').map(str::trim) {
        let target: LoraTarget = name.parse()?;
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

/// Trainable values of `lora` on every layer of `c`: `R * (in + out)` per target per layer,
/// counted by the model's own LoRA code ([`crate::model::lora_trainable_parameters`]).
pub fn lora_parameter_count(c: &HfConfig, lora: &LoraPlan) -> u128 {
    crate::model::lora_trainable_parameters(c, lora.rank, &lora.targets) as u128
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn targets_parse_in_order_and_reject_unknown_or_repeated_names() {
        assert_eq!(
            parse_targets("q_proj, v_proj,down_proj").unwrap(),
            [LoraTarget::QProj, LoraTarget::VProj, LoraTarget::DownProj]
        );
        let err = parse_targets("q_proj,qkv").unwrap_err().to_string();
        assert!(err.contains("qkv") && err.contains("gate_proj"), "{err}");
        assert!(parse_targets("q_proj,q_proj").is_err());
        assert!(parse_targets("").is_err());
    }

    /// A 3-layer Llama with grouped queries (8 heads over 2 key-value heads), 64 wide.
    pub(crate) fn tiny_gqa_config() -> HfConfig {
        HfConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
                "vocab_size": 50}"#,
        )
        .unwrap()
    }

    #[test]
    fn gqa_targets_use_the_key_value_width() {
        let c = tiny_gqa_config();
        let lora = LoraPlan {
            rank: 4,
            targets: parse_targets("k_proj,down_proj").unwrap(),
        };
        // k: [16, 64], down: [64, 96].
        assert_eq!(lora_parameter_count(&c, &lora), 3 * 4 * ((64 + 16) + (96 + 64)));
    }
}
