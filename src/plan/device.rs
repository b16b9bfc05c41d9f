//! What a run on a GPU holds there beside the plan's categories: with resident layers (the
//! default) a trainable linear weight and bias, a norm's gamma and beta, a LoRA adapter, the
//! embedding tables and the output head keep their f32 master values and gradients on the
//! device (`nn::param`, `model::ends`, `docs/cuda-backend.md`), a second copy of each beside the
//! optimizer's arenas (the plan's master weights and gradients). The ledger books them as
//! workspace; so does this.
//!
//! fp32 keeps them in host memory (its GEMM finishes there). A linear frozen in FP8 keeps a
//! trainable bias's values and gradient on the device too. Earlier micro-batches' gradient sums stay where the gradients are: one more
//! copy of the gradients while micro-batches accumulate.
//!
//! With `FP8_CUDA_ARENA_VIEWS=1` (opt-in until a GPU run validates it) the master values and
//! gradients kept on the device are the arenas' own ranges (`train::adamw_arena`): only the
//! accumulation sums are copies.

use super::{PlanSettings, layer_linears, lora_parameter_count};
use crate::hf::HfConfig;
use crate::model::ModelConfig;
use crate::tensor::Dtype;

/// Bytes of device values and device gradients (`values` and `grads` trainable f32 values kept
/// there), with the accumulation sum beside the gradients.
fn copies(values: u128, grads: u128, accumulate: bool) -> u128 {
    copies_beside(
        values,
        grads,
        accumulate,
        crate::backend::cuda::env_switch::arena_views(),
    )
}

/// [`copies`], with the values and gradients held in the arenas' ranges (`in_arenas`) or in
/// copies of their own.
fn copies_beside(values: u128, grads: u128, accumulate: bool, in_arenas: bool) -> u128 {
    let sums = if accumulate { 4u128.saturating_mul(grads) } else { 0 };
    match in_arenas {
        true => sums,
        false => 4u128
            .saturating_mul(values)
            .saturating_add(4u128.saturating_mul(grads))
            .saturating_add(sums),
    }
}

/// Device copies of a fine-tune of `config` under `settings` ([`super::plan`]'s model).
pub fn device_copies(config: &HfConfig, settings: &PlanSettings) -> u128 {
    if settings.precision.compute_dtype() == Dtype::F32 {
        return 0;
    }
    if let Some(lora) = &settings.lora {
        // Only the adapters train (with or without dropout, on the device).
        let adapters = lora_parameter_count(config, lora);
        return copies(adapters, adapters, settings.accumulate);
    }
    let (h, layers) = (config.hidden_size as u128, config.num_hidden_layers as u128);
    let norms = (2 * layers + 1) * h;
    // The token table, and a separate head (a tied one is the table).
    let tables = if config.tie_word_embeddings { 1 } else { 2 } * config.vocab_size as u128 * h;
    let (q, kv) = super::q_kv_widths(config);
    let biases = if config.qkv_bias { layers * (q + 2 * kv) } else { 0 };
    let linears = match settings.base {
        // The FP8 base freezes every decoder linear (its codes are the plan's FP8 copies); their
        // biases train.
        super::BasePrecision::Fp8 => 0,
        super::BasePrecision::Same => layers * layer_linears(config).iter().map(|w| w.out * w.inp).sum::<u128>(),
    };
    let trained = linears + norms + tables + biases;
    copies(trained, trained, settings.accumulate)
}

/// Device copies of the built-in decoder of `fp8 train` ([`super::plan_decoder`]'s model).
pub fn decoder_device_copies(model: &ModelConfig, dtype: Dtype, accumulate: bool) -> u128 {
    if dtype == Dtype::F32 {
        return 0;
    }
    let h = model.hidden as u128;
    let linears = super::decoder::decoder_linears(model);
    let layers = model.layers as u128;
    let weights = layers.saturating_mul(linears.iter().map(|w| w.out * w.inp).sum::<u128>());
    let biases = layers.saturating_mul(linears.iter().map(|w| w.out).sum::<u128>());
    let norm = if model.rmsnorm { h } else { 2 * h };
    let norms = (2 * layers + 1).saturating_mul(norm);
    // Token and position tables, and a separate head (without a bias; a tied one is the table).
    let vocab = model.vocab as u128;
    let head = if model.tied_head { 0 } else { vocab };
    let tables = (vocab + model.max_seq as u128 + head).saturating_mul(h);
    let values = weights
        .saturating_add(biases)
        .saturating_add(norms)
        .saturating_add(tables);
    copies(values, values, accumulate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amp::Precision;
    use crate::model::DecoderModel;
    use crate::nn::Module;
    use crate::plan::{BasePrecision, LoraPlan, parse_targets};

    /// The decoder's count follows the model's own parameters: every value and gradient, biases
    /// included.
    #[test]
    fn the_decoder_copies_are_its_parameters() {
        for (swiglu, rmsnorm, tied_head) in [(false, false, false), (true, true, true), (true, false, false)] {
            let model = ModelConfig {
                layers: 2,
                hidden: 32,
                heads: 2,
                ffn_hidden: 48,
                vocab: 40,
                max_seq: 16,
                swiglu,
                rmsnorm,
                tied_head,
                ..ModelConfig::default()
            };
            let precision: Precision = "bf16".parse().unwrap();
            let mut m = DecoderModel::new(&model, &precision, 1).unwrap();
            let (mut grads, mut biases) = (0u128, 0u128);
            m.visit_parameters(&mut |p| {
                let n = p.len() as u128;
                let name = p.name();
                grads += n;
                // Biases: 1-D parameters of linears (norms' gamma and beta are 1-D too).
                let norm = name.contains("norm") || name.contains("ln");
                if p.shape().len() == 1 && !norm {
                    biases += n;
                }
            });
            assert!(biases > 0, "the decoder has biases");
            // Values and gradients alike, biases' values included.
            let want = 8 * grads;
            let got = decoder_device_copies(&model, Dtype::Bf16, false);
            assert_eq!(got, want, "swiglu {swiglu} rmsnorm {rmsnorm} tied {tied_head}");
            assert_eq!(decoder_device_copies(&model, Dtype::Bf16, true), want + 4 * grads);
            assert_eq!(
                decoder_device_copies(&model, Dtype::F32, false),
                0,
                "fp32 keeps them home"
            );
        }
    }

    #[test]
    fn values_and_gradients_in_arena_ranges_leave_only_the_accumulation_sums() {
        let (values, grads) = (10, 12);
        assert_eq!(copies_beside(values, grads, false, false), 4 * (10 + 12));
        assert_eq!(copies_beside(values, grads, true, false), 4 * (10 + 12 + 12));
        assert_eq!(copies_beside(values, grads, false, true), 0);
        assert_eq!(copies_beside(values, grads, true, true), 4 * 12);
    }

    #[test]
    fn a_fine_tune_counts_what_it_trains() {
        let c = crate::plan::lora::tests::tiny_gqa_config();
        let settings = |precision: &str, base, lora| PlanSettings {
            precision: precision.parse().unwrap(),
            base,
            lora,
            frozen_dtype: Dtype::Bf16,
            micro_batch: 1,
            seq: 16,
            recompute: false,
            accumulate: false,
        };
        let lora = LoraPlan {
            rank: 4,
            targets: parse_targets("q_proj,v_proj").unwrap(),
        };
        let adapters = lora_parameter_count(&c, &lora);
        assert_eq!(
            device_copies(&c, &settings("bf16", BasePrecision::Fp8, Some(lora.clone()))),
            8 * adapters
        );
        assert_eq!(
            device_copies(&c, &settings("fp32", BasePrecision::Same, Some(lora.clone()))),
            0
        );
        // Full training: every value (the config has no biases).
        let full = device_copies(&c, &settings("bf16", BasePrecision::Same, None));
        assert_eq!(full, 8 * c.parameter_count());
        // An FP8 base without LoRA trains the norms, the embedding and the (untied) head.
        let fp8_base = device_copies(&c, &settings("fp8-block", BasePrecision::Fp8, None));
        let (table, head) = (50 * 64, 50 * 64);
        assert_eq!(fp8_base, 8 * ((2 * 3 + 1) * 64 + table + head));
        // Biases (Qwen2's q/k/v): values and gradients, under an FP8 base too; frozen under LoRA.
        let with_bias = HfConfig::from_json(
            r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
                "vocab_size": 50}"#,
        )
        .unwrap();
        assert!(with_bias.qkv_bias);
        let biases = 3 * (64 + 2 * 16);
        let full_with_bias = device_copies(&with_bias, &settings("bf16", BasePrecision::Same, None));
        assert_eq!(full_with_bias, 8 * with_bias.parameter_count());
        assert_eq!(full_with_bias, full + 8 * biases);
        let fp8_base_with_bias = device_copies(&with_bias, &settings("fp8-block", BasePrecision::Fp8, None));
        assert_eq!(fp8_base_with_bias, fp8_base + 8 * biases);
    }
}
