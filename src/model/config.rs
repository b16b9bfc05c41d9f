//! The model's shape and options.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::nn::{Activation, NormKind, TransformerConfig};

/// Which layers recompute their activations in backward instead of keeping them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Recompute {
    /// Keep every activation (fastest, most memory).
    #[default]
    None,
    /// Every layer keeps only its input.
    Every,
    /// Layers 0, n, 2n, ... recompute; the others keep everything.
    EveryNth(usize),
}

impl Recompute {
    /// Whether layer `index` recomputes.
    pub fn applies_to(self, index: usize) -> bool {
        match self {
            Recompute::None => false,
            Recompute::Every => true,
            Recompute::EveryNth(n) => n > 0 && index.is_multiple_of(n),
        }
    }
}

impl FromStr for Recompute {
    type Err = Error;

    /// `none`, `every`, or `every-N` (N >= 1).
    fn from_str(text: &str) -> Result<Self> {
        let bad = || Error::InvalidSetting {
            setting: "recompute",
            value: text.to_string(),
            reason: "expected none, every or every-N with N >= 1".to_string(),
        };
        match text {
            "none" => Ok(Recompute::None),
            "every" | "all" => Ok(Recompute::Every),
            _ => match text.strip_prefix("every-").and_then(|n| n.parse::<usize>().ok()) {
                Some(n) if n >= 1 => Ok(Recompute::EveryNth(n)),
                _ => Err(bad()),
            },
        }
    }
}

/// Shape and options of a [`DecoderModel`](super::DecoderModel).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest sequence (rows of the position table).
    pub max_seq: usize,
    /// Model width (a multiple of 16 under FP8).
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Transformer layers.
    pub layers: usize,
    /// MLP width (a multiple of 16 under FP8).
    pub ffn_hidden: usize,
    /// `gelu` or `swiglu`.
    pub swiglu: bool,
    /// RMSNorm instead of LayerNorm.
    pub rmsnorm: bool,
    /// The output head reuses the token embedding.
    pub tied_head: bool,
    /// Which layers recompute.
    pub recompute: Recompute,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            vocab: 16,
            max_seq: 32,
            hidden: 64,
            heads: 4,
            layers: 2,
            ffn_hidden: 256,
            swiglu: false,
            rmsnorm: false,
            tied_head: false,
            recompute: Recompute::None,
        }
    }
}

impl ModelConfig {
    /// Checks the sizes make a model.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting: &'static str, value: usize, reason: &str| {
            Err(Error::InvalidSetting {
                setting,
                value: value.to_string(),
                reason: reason.to_string(),
            })
        };
        if self.vocab == 0 {
            return bad("vocab", self.vocab, "must be at least 1");
        }
        if self.max_seq == 0 {
            return bad("max_seq", self.max_seq, "must be at least 1");
        }
        if self.hidden == 0 || self.heads == 0 || !self.hidden.is_multiple_of(self.heads) {
            return bad(
                "hidden",
                self.hidden,
                &format!("must be a positive multiple of heads ({})", self.heads),
            );
        }
        if self.ffn_hidden == 0 {
            return bad("ffn_hidden", self.ffn_hidden, "must be at least 1");
        }
        Ok(())
    }

    /// The configuration of layer `index`.
    pub fn layer_config(&self, index: usize) -> TransformerConfig {
        TransformerConfig {
            hidden: self.hidden,
            heads: self.heads,
            ffn_hidden: self.ffn_hidden,
            activation: if self.swiglu {
                Activation::SwiGlu
            } else {
                Activation::Gelu
            },
            norm: if self.rmsnorm {
                NormKind::RmsNorm
            } else {
                NormKind::LayerNorm
            },
            recompute: self.recompute.applies_to(index),
            ..TransformerConfig::default()
        }
    }
}
