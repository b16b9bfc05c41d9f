//! A small decoder-only transformer built from the crate's public layers: token
//! and learned position embeddings, N [`TransformerLayer`](crate::nn::TransformerLayer)s,
//! a final norm and an output head (tied to the embedding or separate), with an
//! f32 cross-entropy loss. It is what `fp8 train` trains.

mod config;
mod decoder;
mod head;
mod hf_names;
mod llama;

pub use config::{ModelConfig, Recompute};
pub use decoder::DecoderModel;
pub use hf_names::{HfSources, HfTensor, hf_names};
pub use llama::LlamaModel;
