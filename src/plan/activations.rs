//! Bytes of the activations a Llama-family model saves in one forward for its backward: the peak
//! of the activations category, reached at the end of the forward.
//!
//! Per layer and token, at the compute dtype (d bytes), as the layers keep them: the attention
//! norm's input (h) and its f32 rstd, the q/k/v GEMM input (h), the rotated q, the k and v repeated
//! to every query head, the attention output (4 x q width) plus an f32 log-sum-exp per head, the
//! o-projection input (q width), the MLP norm's input (h) and rstd, the gate/up input (h), the
//! gate/up output (2 ffn) and the down input (ffn). GEMM inputs of FP8 layers are kept as FP8 codes
//! with their scales (1 byte a value). With recompute a layer keeps only its input (h).

use super::{LinearShape, PlanSettings, layer_linears, q_kv_widths};
use crate::amp::Precision;
use crate::hf::HfConfig;
use crate::scaling::Recipe;

/// Bytes of one saved GEMM input `[tokens, in]` under `precision`.
fn gemm_input(precision: &Precision, tokens: u128, inp: u128) -> u128 {
    match precision {
        Precision::Fp8(recipe) => {
            tokens * inp
                + match recipe {
                    Recipe::Delayed(_) | Recipe::Current(_) => 4,
                    Recipe::Block(_) => 4 * tokens * inp.div_ceil(128),
                    Recipe::Mxfp8(_) => tokens * inp.div_ceil(32),
                }
        }
        other => tokens * inp * other.compute_dtype().bytes() as u128,
    }
}

/// Bytes one layer saves when it keeps everything.
fn full_layer(c: &HfConfig, s: &PlanSettings, tokens: u128) -> u128 {
    let p = &s.precision;
    let d = p.compute_dtype().bytes() as u128;
    let (h, f) = (c.hidden_size as u128, c.intermediate_size as u128);
    let (q, _) = q_kv_widths(c);
    let heads = c.num_attention_heads as u128;
    let rms_norm = tokens * h * d + 4 * tokens;
    let linears = layer_linears(c);
    // A frozen FP8 base linear (planned) needs no input for its backward (dX = dY W); the base
    // as loaded still saves it today, LoRA or not. A LoRA target also keeps its input for A's
    // weight gradient and A's output for B's.
    let frozen = s.base == super::BasePrecision::Fp8;
    let linear_inputs: u128 = if frozen {
        0
    } else {
        linears.iter().map(|w| gemm_input(p, tokens, w.inp)).sum()
    };
    let lora: u128 = s.lora.as_ref().map_or(0, |l| {
        l.targets
            .iter()
            .map(|t| {
                let LinearShape { inp, .. } = super::lora::target_shape(*t, c);
                tokens * (inp + l.rank as u128) * d
            })
            .sum()
    });
    let attention = 4 * tokens * q * d + 4 * heads * tokens;
    let mlp = tokens * 2 * f * d;
    2 * rms_norm + attention + mlp + linear_inputs + lora
}

/// Bytes the whole model saves in one forward of `settings.micro_batch` sequences.
pub(super) fn saved_bytes(c: &HfConfig, s: &PlanSettings) -> u128 {
    let tokens = s.micro_batch as u128 * s.seq as u128;
    let d = s.precision.compute_dtype().bytes() as u128;
    let (h, v) = (c.hidden_size as u128, c.vocab_size as u128);
    let layer = if s.recompute {
        tokens * h * d
    } else {
        full_layer(c, s, tokens)
    };
    // The model's own: input and target ids (8), f32 logits and log-sum-exp, the final norm's
    // output and its saved input with rstd, and the head's input when the head is a separate linear.
    let own = super::loss_activation_bytes(tokens, v) + tokens * h * d + (tokens * h * d + 4 * tokens);
    let head = if c.tie_word_embeddings { 0 } else { tokens * h * d };
    c.num_hidden_layers as u128 * layer + own + head
}
