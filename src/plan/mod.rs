//! The memory planner behind `fp8 plan`: the bytes a fine-tune of a Llama-family model needs, by
//! the memory ledger's categories ([`MemoryCategory`]), computed from the config alone, before
//! anything is loaded.
//!
//! For full training (no LoRA, base in the run's precision) the plan follows the CPU backend's
//! ledger term by term (`train::session` accounts parameters, masters, gradients, AdamW moments
//! and weight caches after every step, and the activations saved by each forward), so the planned
//! peak matches the measured one (tests/plan.rs); so do LoRA and the FP8-only frozen base
//! (docs/finetune.md says what each term assumes). [`plan_decoder`] plans the built-in decoder of
//! `fp8 train` the same way.

mod activations;
mod decoder;
mod device;
mod fit;
mod lora;

pub use decoder::plan_decoder;
pub use device::{decoder_device_copies, device_copies};
pub use fit::{Change, Suggestion, cheapest_fit};
pub use lora::{LoraTarget, lora_parameter_count, parse_targets};

use crate::amp::Precision;
use crate::hf::HfConfig;
use crate::memory::MemoryCategory;
use crate::scaling::Recipe;
use crate::tensor::Dtype;

/// How the frozen base weights are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BasePrecision {
    /// The run's own compute dtype (full training keeps f32 masters; a LoRA base keeps bf16).
    Same,
    /// Every decoder linear weight frozen as E4M3 codes with 128x128 block scales, one layout
    /// kept (`--base-precision fp8`; per-tensor scales differ only by the few scale bytes).
    Fp8,
}

/// LoRA adapters on some linears of every layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraPlan {
    /// The rank R: A is `[R, in]`, B is `[out, R]`.
    pub rank: usize,
    /// The linears that get adapters.
    pub targets: Vec<LoraTarget>,
}

/// Everything besides the model that decides the memory of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanSettings {
    /// The run's precision.
    pub precision: Precision,
    /// How frozen linear weights are held (only meaningful when they are frozen: LoRA or FP8 base).
    pub base: BasePrecision,
    /// LoRA adapters, if any; with them every base weight is frozen.
    pub lora: Option<LoraPlan>,
    /// The dtype frozen embeddings, norms and head are held in (`--frozen-dtype`: the
    /// checkpoint's, [`crate::model::FrozenDtype::planned`], or f32); trained ones keep f32 masters.
    pub frozen_dtype: Dtype,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Every layer keeps only its input and recomputes the rest in backward.
    pub recompute: bool,
    /// More than one micro-batch per step: the step's gradient sum is held beside each
    /// micro-batch's own gradient (`train::accumulate`), one more f32 per trainable value.
    pub accumulate: bool,
}

/// The planned memory of one configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Every value of the model (embeddings, norms and head included; the head once if tied).
    pub parameters: u128,
    /// The values that get gradients and optimizer state.
    pub trainable_parameters: u128,
    /// Peak bytes by category, in [`MemoryCategory::ALL`] order.
    pub bytes: [(MemoryCategory, u128); MemoryCategory::COUNT],
}

impl MemoryPlan {
    /// All categories together (everything in a plan is live at the peak: the end of a forward);
    /// saturates, as a plan of absurd sizes does.
    pub fn total_bytes(&self) -> u128 {
        self.bytes.iter().fold(0u128, |sum, (_, b)| sum.saturating_add(*b))
    }

    /// Bytes of one category.
    pub fn category(&self, category: MemoryCategory) -> u128 {
        self.bytes.iter().find(|(c, _)| *c == category).map_or(0, |(_, b)| *b)
    }
}

/// Activation bytes of the loss for `tokens` tokens over `vocab`: the input and target ids (8
/// bytes a token), the f32 logits and their log-sum-exp. A resident GPU run keeps the ids in
/// host memory and the rest on the device (`train::gpu_preflight`). Saturates, as a plan of
/// absurd sizes does.
pub fn loss_activation_bytes(tokens: u128, vocab: u128) -> u128 {
    tokens.saturating_mul(vocab.saturating_mul(4).saturating_add(12))
}

/// Shape of one linear of a layer: `[out, in]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinearShape {
    pub(crate) out: u128,
    pub(crate) inp: u128,
}

/// The linears of one Llama layer as the engine builds them: fused q/k/v, o, fused gate/up, down.
pub(crate) fn layer_linears(c: &HfConfig) -> [LinearShape; 4] {
    let (h, f) = (c.hidden_size as u128, c.intermediate_size as u128);
    let (q, kv) = q_kv_widths(c);
    [
        LinearShape {
            out: q + 2 * kv,
            inp: h,
        },
        LinearShape { out: h, inp: q },
        LinearShape { out: 2 * f, inp: h },
        LinearShape { out: h, inp: f },
    ]
}

pub(crate) fn q_kv_widths(c: &HfConfig) -> (u128, u128) {
    let d = c.head_dim as u128;
    (c.num_attention_heads as u128 * d, c.num_key_value_heads as u128 * d)
}

/// Bytes of a weight's FP8 scales, one layout, under `recipe`.
pub(crate) fn weight_scale_bytes(recipe: &Recipe, w: LinearShape) -> u128 {
    match recipe {
        Recipe::Delayed(_) | Recipe::Current(_) => 4,
        Recipe::Block(_) => 4 * w.out.div_ceil(128) * w.inp.div_ceil(128),
        Recipe::Mxfp8(_) => w.out * w.inp.div_ceil(32),
    }
}

/// Bytes of the cached compute copies of one trainable weight under `precision`: the FP8 codes of
/// `W` and `W^T` with their scales, or the one 16/32-bit copy of `W` (read transposed by dgrad).
fn weight_cache(precision: &Precision, w: LinearShape) -> u128 {
    let t = LinearShape { out: w.inp, inp: w.out };
    match precision {
        Precision::Fp8(recipe) => 2 * w.out * w.inp + weight_scale_bytes(recipe, w) + weight_scale_bytes(recipe, t),
        // One copy: the backward reads it transposed in place (`nn::linear_gemms`).
        other => w.out * w.inp * other.compute_dtype().bytes() as u128,
    }
}

/// Bytes of the weight caches of every LoRA adapter's A `[R, in]` and B `[out, R]` (they are
/// linears of the run's precision).
fn adapter_caches(config: &HfConfig, settings: &PlanSettings) -> u128 {
    settings.lora.as_ref().map_or(0, |l| {
        config.num_hidden_layers as u128
            * l.targets
                .iter()
                .map(|t| {
                    let w = lora::target_shape(*t, config);
                    let a = LinearShape {
                        out: l.rank as u128,
                        inp: w.inp,
                    };
                    let b = LinearShape {
                        out: w.out,
                        inp: l.rank as u128,
                    };
                    weight_cache(&settings.precision, a) + weight_cache(&settings.precision, b)
                })
                .sum::<u128>()
    })
}

/// The checkpoint tensors of one layer's linears, `[out, in]` each: q, k, v, o, gate, up, down.
pub(crate) fn hf_linear_segments(c: &HfConfig) -> [LinearShape; 7] {
    use LoraTarget::*;
    [QProj, KProj, VProj, OProj, GateProj, UpProj, DownProj].map(|t| lora::target_shape(t, c))
}

/// Values of the linear weights of the whole model (what an FP8 base or LoRA freezes).
pub fn linear_weight_count(c: &HfConfig) -> u128 {
    c.num_hidden_layers as u128 * layer_linears(c).iter().map(|w| w.out * w.inp).sum::<u128>()
}

/// Values of the embedding table(s), the norms' weights and a separate head: what LoRA and an FP8
/// base freeze besides the linears, held at [`PlanSettings::frozen_dtype`].
pub fn embedding_norm_head_count(c: &HfConfig) -> u128 {
    let (h, v) = (c.hidden_size as u128, c.vocab_size as u128);
    let tables = if c.tie_word_embeddings { 1 } else { 2 };
    tables * v * h + (2 * c.num_hidden_layers as u128 + 1) * h
}

/// The plan of `settings` for the model of `config`.
pub fn plan(config: &HfConfig, settings: &PlanSettings) -> MemoryPlan {
    let parameters = config.parameter_count();
    let precision = &settings.precision;
    let dtype = precision.compute_dtype().bytes() as u128;
    let layers = config.num_hidden_layers as u128;
    let (h, v) = (config.hidden_size as u128, config.vocab_size as u128);
    let head = (!config.tie_word_embeddings).then_some(LinearShape { out: v, inp: h });
    // LoRA on the base as loaded keeps every base value in f32 (frozen, under parameters) with
    // the compute copies and weight caches of full training.
    let frozen_base = settings.base == BasePrecision::Fp8;
    let lora_values = settings.lora.as_ref().map_or(0, |l| lora_parameter_count(config, l));
    // With LoRA the embeddings, norms and head are frozen: held at `frozen_dtype`, the rest of
    // the frozen values (linear weights, biases) in f32. A separate head held in 16 bits of the
    // head GEMM's dtype is its own operand (no cache); held in the other one (an fp16 checkpoint
    // in a bf16 run, or any in fp32) it keeps its compute copy as before.
    let narrowable = embedding_norm_head_count(config);
    let frozen_narrow = settings.lora.is_some() && settings.frozen_dtype != Dtype::F32;
    let head_cache_of = |p: &Precision, w| match frozen_narrow && settings.frozen_dtype == p.compute_dtype() {
        true => 0,
        false => weight_cache(p, w),
    };
    let frozen_bytes = |values: u128| {
        let held = if settings.lora.is_some() {
            settings.frozen_dtype.bytes() as u128
        } else {
            4
        };
        held * narrowable + 4 * (values - narrowable)
    };
    let mut bytes = [0u128; MemoryCategory::COUNT];
    let mut set =
        |c: MemoryCategory, b: u128| bytes[MemoryCategory::ALL.iter().position(|x| *x == c).unwrap_or(0)] += b;
    // The gradients, and with accumulation the step's running sum beside them.
    let gradient_copies = if settings.accumulate { 2 } else { 1 };
    let trainable;
    if !frozen_base {
        // Full training, as the session's ledger counts it: f32 masters and gradients, two f32
        // moments, a compute copy of every value, and the GEMMs' weight caches (the head's in
        // high precision).
        trainable = if settings.lora.is_some() {
            lora_values
        } else {
            parameters
        };
        if settings.lora.is_some() {
            set(MemoryCategory::Parameters, frozen_bytes(parameters));
        }
        let mut cache: u128 = layers
            * layer_linears(config)
                .iter()
                .map(|w| weight_cache(precision, *w))
                .sum::<u128>();
        // LoRA's A [R, in] and B [out, R] are linears too, with their own caches.
        cache += adapter_caches(config, settings);
        let head_cache = head.map_or(0, |w| head_cache_of(&precision.without_fp8(), w));
        // A compute-dtype copy of every trainable value (frozen values are read as they are).
        let compute = if dtype == 4 { 0 } else { trainable * dtype };
        set(MemoryCategory::MasterWeights, 4 * trainable);
        set(MemoryCategory::Gradients, gradient_copies * 4 * trainable);
        set(MemoryCategory::OptimizerState, 8 * trainable);
        if precision.is_fp8() {
            cache += head_cache;
            set(MemoryCategory::Parameters, compute);
            set(MemoryCategory::Fp8Copies, cache);
        } else {
            set(MemoryCategory::Parameters, compute.max(cache + head_cache));
        }
    } else {
        // An FP8 base, as `LlamaModel::from_hf_fp8_base` holds it: every decoder linear weight
        // frozen as E4M3 codes (1 byte a value) with 128x128 block scales per checkpoint tensor
        // (the segments of a fused q/k/v or gate/up linear are quantized apart). With LoRA every
        // other value (embeddings, norms, head) is frozen too, at `frozen_dtype` (biases in
        // f32); without it they are trained.
        let linear = linear_weight_count(config);
        let other = parameters - linear;
        trainable = if settings.lora.is_some() { lora_values } else { other };
        let segments = hf_linear_segments(config);
        let scales: u128 = segments
            .iter()
            .map(|w| 4 * w.out.div_ceil(128) * w.inp.div_ceil(128))
            .sum();
        set(MemoryCategory::Fp8Copies, linear + layers * scales);
        // The dgrad GEMM reads W^T K-major: made from one segment's codes at a time in backward
        // (a 128x128 block transposes with its own scale) and dropped after its GEMM.
        set(
            MemoryCategory::Workspace,
            segments.iter().map(|w| w.out * w.inp).max().unwrap_or(0),
        );
        let cache = adapter_caches(config, settings) + head.map_or(0, |w| head_cache_of(&precision.without_fp8(), w));
        let frozen_other = if settings.lora.is_some() {
            frozen_bytes(other)
        } else {
            0
        };
        let compute = if dtype == 4 { 0 } else { trainable * dtype };
        set(MemoryCategory::MasterWeights, 4 * trainable);
        set(MemoryCategory::Gradients, gradient_copies * 4 * trainable);
        set(MemoryCategory::OptimizerState, 8 * trainable);
        if precision.is_fp8() {
            set(MemoryCategory::Parameters, frozen_other + compute);
            set(MemoryCategory::Fp8Copies, cache);
        } else {
            set(MemoryCategory::Parameters, frozen_other + compute.max(cache));
        }
    }
    set(MemoryCategory::Activations, activations::saved_bytes(config, settings));
    MemoryPlan {
        parameters,
        trainable_parameters: trainable,
        bytes: std::array::from_fn(|i| (MemoryCategory::ALL[i], bytes[i])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama2_7b() -> HfConfig {
        HfConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}"#,
        )
        .unwrap()
    }

    fn settings(precision: &str) -> PlanSettings {
        PlanSettings {
            precision: precision.parse().unwrap(),
            base: BasePrecision::Same,
            lora: None,
            frozen_dtype: Dtype::F32,
            micro_batch: 1,
            seq: 2048,
            recompute: true,
            accumulate: false,
        }
    }

    #[test]
    fn llama2_7b_counts_are_the_published_ones() {
        let c = llama2_7b();
        let p = plan(&c, &settings("bf16"));
        assert_eq!(p.parameters, 6_738_415_616);
        assert_eq!(p.trainable_parameters, 6_738_415_616);
        // LoRA r16 on q,k,v,o: 4 targets x 16 x (4096 + 4096) x 32 layers.
        let lora = LoraPlan {
            rank: 16,
            targets: parse_targets("q_proj,k_proj,v_proj,o_proj").unwrap(),
        };
        let p = plan(
            &c,
            &PlanSettings {
                lora: Some(lora),
                base: BasePrecision::Fp8,
                ..settings("fp8-block")
            },
        );
        assert_eq!(p.trainable_parameters, 16_777_216);
        assert_eq!(p.category(MemoryCategory::OptimizerState), 8 * 16_777_216);
    }

    #[test]
    fn an_fp8_base_holds_the_linears_in_about_a_byte_each() {
        let c = llama2_7b();
        let lora = Some(LoraPlan {
            rank: 16,
            targets: parse_targets("q_proj,v_proj").unwrap(),
        });
        let bf16 = plan(
            &c,
            &PlanSettings {
                lora: lora.clone(),
                ..settings("bf16")
            },
        );
        let fp8 = plan(
            &c,
            &PlanSettings {
                lora,
                base: BasePrecision::Fp8,
                ..settings("bf16")
            },
        );
        let linear = linear_weight_count(&c);
        let fp8_base = fp8.category(MemoryCategory::Fp8Copies);
        assert!(
            fp8_base > linear && fp8_base < linear + linear / 1000,
            "{fp8_base} vs {linear}"
        );
        assert!(bf16.total_bytes() - fp8.total_bytes() > linear * 9 / 10);
    }
}
