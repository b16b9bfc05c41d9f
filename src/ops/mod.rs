//! CPU reference ops the transformer layers are built from: norms, activations,
//! the attention core, the loss and the embedding lookup.
//!
//! Conventions shared by every op (see `docs/ops.md`):
//! * buffers are row-major `f32` slices; statistics, softmax and reductions run in f32;
//! * every length is checked against the shape, mismatches are typed errors;
//! * parameter gradients (`dgamma`, `dbeta`, `dtable`) are accumulated (`+=`) so
//!   micro-batches add up, input gradients (`dx`, `dq`, ...) are overwritten;
//! * reductions over rows use a fixed blocking, so results do not depend on the
//!   number of threads;
//! * NaN and infinite inputs never panic (they propagate into the outputs).

pub mod activation;
pub mod attention;
pub mod attention_cached;
mod attention_product;
mod check;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
mod fast_exp;
pub mod loss;
pub mod norm;
pub mod optim;
pub mod rope;
mod softmax_exp;

/// The activation dtype now lives next to `Tensor`; re-exported for the old path.
pub use crate::tensor::Dtype;
pub use activation::{gelu_backward, gelu_forward, swiglu_backward, swiglu_forward};
pub use attention::{AttentionShape, attention_backward, attention_forward};
pub use attention_cached::{CachedAttentionShape, attention_cached};
pub use dropout::{DropoutMask, dropout, dropout_add};
pub use embedding::{embedding_backward, embedding_forward};
pub use loss::{cross_entropy_backward, cross_entropy_forward};
pub use norm::{NormShape, layernorm_backward, layernorm_forward, rmsnorm_backward, rmsnorm_forward};
pub use optim::{AdamWStep, adamw_update, sum_of_squares, unscale_and_check};
pub use rope::{RopeFrequencyScaling, RopeShape, RopeTable, inv_freq, rope_backward, rope_forward};
