//! Transformer layers with forward and backward on the CPU reference backend,
//! and the parameter type the training stack updates.
//!
//! Every layer has `new(name, dims/options..., &Precision, seed)`, `forward`,
//! `backward` (returns dX, accumulates f32 parameter gradients) and implements
//! [`Module`]. See `docs/layers.md` for which GEMMs each layer runs in which format.
//!
//! | layer | parameters |
//! |---|---|
//! | [`Linear`] | `weight [out, in]`, `bias [out]` |
//! | [`LayerNorm`], [`RMSNorm`] | `weight` (gamma), `bias` (beta, LayerNorm only) |
//! | [`LayerNormLinear`] | `norm.*`, `linear.*` |
//! | [`LayerNormMLP`] | `norm.*`, `fc1.*`, `fc2.*` |
//! | [`MultiheadAttention`] | `qkv.*`, `proj.*` |
//! | [`TransformerLayer`] | `attn.*`, `mlp.*` |
//! | [`GroupedQueryAttention`] | `qkv.*`, `o_proj.*` (rotary, grouped-query) |
//! | [`LlamaLayer`] | `attn.*`, `mlp.*` (Llama family) |
//! | [`LoraAdapter`] (on a [`Linear`]) | `MODULE.lora_A.weight [r, in]`, `MODULE.lora_B.weight [out, r]` |

mod attention;
mod columns;
mod frozen_fp8;
mod gqa_attention;
mod init;
mod layernorm_linear;
mod linear;
mod linear_gemms;
mod linears;
mod llama_layer;
mod lora;
mod mlp;
mod norm;
mod param;
mod replay;
mod transformer;

pub(crate) use init::{child_seed, normal as init_normal, with_deferred_linear_weights, without_draws};

/// FP8 GEMMs need every K (in, out features and the token count) to be a multiple of this.
pub use crate::gemm::FP8_K_MULTIPLE as FP8_DIM_MULTIPLE;
pub use crate::scaling::Fp8TensorStats;
pub use crate::tensor::Tensor;
pub use attention::MultiheadAttention;
pub use frozen_fp8::{BaseScaling, FrozenFp8Weight, quantize_weight as quantize_frozen_weight};
pub use gqa_attention::{GqaConfig, GroupedQueryAttention, KvCache};
pub use layernorm_linear::LayerNormLinear;
pub use linear::Linear;
pub(crate) use linear_gemms::WeightSliceCast;
pub use linears::VisitLinears;
pub(crate) use linears::{defer_weight_records, weight_copy_states};
pub use llama_layer::LlamaLayer;
pub use lora::{LoraAdapter, LoraSettings};
pub use mlp::{Activation, LayerNormMLP};
pub use norm::{LayerNorm, NormConfig, NormKind, RMSNorm};
pub(crate) use param::out_of_memory;
pub use param::{Module, Parameter};
pub use transformer::{TransformerConfig, TransformerLayer};

use crate::error::Error;

/// The error of a backward that has no forward to go with.
pub(crate) fn no_forward(layer: &str) -> Error {
    Error::LayerShape {
        layer: layer.to_string(),
        detail: "backward called without a forward before it".into(),
    }
}
