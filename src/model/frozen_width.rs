//! `--frozen-dtype checkpoint|f32`: the width frozen embeddings, norms and head are held at.
//!
//! A frozen parameter needs no f32 master: its values are the checkpoint's, and a bf16 or fp16
//! value widens to f32 exactly, so holding it at the checkpoint's width changes no number while
//! halving its bytes. The decoder's linear weights are not touched here (an FP8 base holds them
//! as codes; a LoRA base on the checkpoint as loaded keeps them in f32).

use std::fmt;
use std::str::FromStr;

use super::hf_names::hf_names;
use super::llama::LlamaModel;
use crate::error::{Error, Result};
use crate::hf::{HfConfig, HfModelDir};
use crate::nn::Parameter;
use crate::tensor::Dtype;

/// How frozen embeddings, norms and head are held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrozenDtype {
    /// At the width of their checkpoint tensors: bf16 or fp16 (2 bytes a value); f32 tensors stay f32.
    #[default]
    Checkpoint,
    /// In f32 (4 bytes a value), as loaded.
    F32,
}

impl FrozenDtype {
    /// `"checkpoint"` or `"f32"`.
    pub fn name(self) -> &'static str {
        match self {
            FrozenDtype::Checkpoint => "checkpoint",
            FrozenDtype::F32 => "f32",
        }
    }

    /// The dtype a frozen tensor stored as `stored` in the checkpoint is held in.
    fn held(self, stored: safetensors::Dtype) -> Dtype {
        match (self, stored) {
            (FrozenDtype::Checkpoint, safetensors::Dtype::BF16) => Dtype::Bf16,
            (FrozenDtype::Checkpoint, safetensors::Dtype::F16) => Dtype::F16,
            _ => Dtype::F32,
        }
    }

    /// The dtype a planner assumes from `config.json` alone (its `dtype`/`torch_dtype`, the
    /// dtype of every tensor in the common case).
    pub fn planned(self, config: &HfConfig) -> Dtype {
        match (self, config.dtype.as_deref()) {
            (FrozenDtype::Checkpoint, Some("bfloat16")) => Dtype::Bf16,
            (FrozenDtype::Checkpoint, Some("float16")) => Dtype::F16,
            _ => Dtype::F32,
        }
    }
}

impl fmt::Display for FrozenDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FrozenDtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "checkpoint" => Ok(FrozenDtype::Checkpoint),
            "f32" => Ok(FrozenDtype::F32),
            _ => Err(Error::UnknownFormat {
                name: s.to_string(),
                expected: "checkpoint, f32",
            }),
        }
    }
}

/// Whether `p` is an embedding table, a norm's weight or the head (not a decoder linear).
fn is_embedding_norm_or_head(p: &Parameter) -> bool {
    let name = p.name();
    name == "embed.tokens" || name == "head.weight" || name.ends_with("norm.weight")
}

impl LlamaModel {
    /// Freezes the embeddings, norms and head (evaluation and generation train nothing).
    pub fn freeze_embeddings_norms_head(&mut self) {
        self.visit_all_parameters(&mut |p| {
            if is_embedding_norm_or_head(p) {
                p.freeze();
            }
        });
    }

    /// Holds every frozen embedding table, norm weight and head of this model, loaded from
    /// `dir`, as `frozen` says: at the dtype of its checkpoint tensor (bf16 or f16) or in f32.
    /// Trainable ones keep their f32 masters. Returns the bytes they hold afterwards.
    pub fn hold_frozen(&mut self, dir: &HfModelDir, frozen: FrozenDtype) -> Result<usize> {
        let sources: std::collections::HashMap<String, Vec<(String, usize)>> =
            hf_names(self.config()).into_iter().collect();
        self.hold_frozen_by(&mut |p| {
            let stored: Vec<Dtype> = match sources.get(p.name()) {
                Some(names) => names
                    .iter()
                    .map(|(name, _)| Ok(frozen.held(dir.shards.entry(name)?.dtype)))
                    .collect::<Result<_>>()?,
                None => Vec::new(),
            };
            // One dtype for all its tensors (a parameter here is one tensor), else f32.
            Ok(match stored.split_first() {
                Some((first, rest)) if rest.iter().all(|d| d == first) => *first,
                _ => Dtype::F32,
            })
        })
    }

    /// Holds every frozen embedding table, norm weight and head in `dtype`, whatever they were
    /// loaded from (each value must be exactly a `dtype` value); returns the bytes they hold.
    pub fn hold_frozen_as(&mut self, dtype: Dtype) -> Result<usize> {
        self.hold_frozen_by(&mut |_| Ok(dtype))
    }

    fn hold_frozen_by(&mut self, dtype_of: &mut dyn FnMut(&Parameter) -> Result<Dtype>) -> Result<usize> {
        let mut result = Ok(());
        let mut bytes = 0;
        self.visit_all_parameters(&mut |p| {
            if result.is_err() || !p.is_frozen() || !is_embedding_norm_or_head(p) {
                return;
            }
            result = dtype_of(p).and_then(|dtype| p.hold_frozen_in(dtype));
            bytes += p.held_bytes();
        });
        result.map(|()| bytes)
    }
}
