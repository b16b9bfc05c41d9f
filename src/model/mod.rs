//! A small decoder-only transformer built from the crate's public layers: token
//! and learned position embeddings, N [`TransformerLayer`](crate::nn::TransformerLayer)s,
//! a final norm and an output head (tied to the embedding or separate), with an
//! f32 cross-entropy loss. It is what `fp8 train` trains.
//!
//! [`LlamaModel`] is the Llama family (Llama, Mistral, Qwen2) read from Hugging Face
//! checkpoints: evaluation on text, cached generation, fine-tuning and saving back.

mod config;
mod decoder;
mod device_move;
mod ends;
#[cfg(test)]
mod ends_tests;
pub mod flops;
mod fp8_base;
mod frozen_width;
mod generate;
mod grad_ready;
mod head;
mod hf_names;
mod language_model;
mod llama;
mod lora_targets;
mod peft;
mod text_eval;

pub use config::{ModelConfig, Recompute};
pub use decoder::DecoderModel;
pub use fp8_base::Fp8BaseLoad;
pub use frozen_width::FrozenDtype;
pub use generate::Sampler;
pub use hf_names::{HfSources, HfTensor, hf_names};
pub use language_model::{GradReady, LanguageModel};
pub use llama::LlamaModel;
pub use lora_targets::{LoraConfig, LoraTarget, trainable_parameters as lora_trainable_parameters};
pub use peft::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, read_adapter_config};
pub use text_eval::{TextLoss, text_windows, window_batch};
