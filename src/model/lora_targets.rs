//! Which Llama-family projections carry LoRA adapters, and how they sit in the engine's fused
//! layers: q/k/v share one linear layer (`attn.qkv.linear`, rows `[q; k; v]`) and gate/up share
//! `mlp.fc1` (rows `[gate; up]`), so each target is a row range of one layer. Adapters are named
//! after the Hugging Face modules (`model.layers.{i}.self_attn.q_proj`), PEFT's names without its
//! `base_model.model.` prefix.

use std::str::FromStr;

use super::llama::LlamaModel;
use crate::error::{Error, Result};
use crate::hf::HfConfig;
use crate::nn::{Linear, LoraAdapter, LoraSettings, VisitLinears, child_seed};

/// A projection LoRA can adapt, by its Hugging Face module name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    QProj,
    /// `self_attn.k_proj`.
    KProj,
    /// `self_attn.v_proj`.
    VProj,
    /// `self_attn.o_proj`.
    OProj,
    /// `mlp.gate_proj`.
    GateProj,
    /// `mlp.up_proj`.
    UpProj,
    /// `mlp.down_proj`.
    DownProj,
}

impl LoraTarget {
    /// Every target, in layer order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// The module's short name, e.g. `q_proj` (PEFT's `target_modules` entries).
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }

    fn block(self) -> &'static str {
        match self {
            LoraTarget::QProj | LoraTarget::KProj | LoraTarget::VProj | LoraTarget::OProj => "self_attn",
            _ => "mlp",
        }
    }

    /// `(engine layer suffix, first row, rows, in features)` of this projection in a layer of
    /// `config`.
    fn place(self, c: &HfConfig) -> (&'static str, usize, usize, usize) {
        let (q, kv, h, ffn) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.hidden_size,
            c.intermediate_size,
        );
        match self {
            LoraTarget::QProj => ("attn.qkv.linear", 0, q, h),
            LoraTarget::KProj => ("attn.qkv.linear", q, kv, h),
            LoraTarget::VProj => ("attn.qkv.linear", q + kv, kv, h),
            LoraTarget::OProj => ("attn.o_proj", 0, h, q),
            LoraTarget::GateProj => ("mlp.fc1", 0, ffn, h),
            LoraTarget::UpProj => ("mlp.fc1", ffn, ffn, h),
            LoraTarget::DownProj => ("mlp.fc2", 0, h, ffn),
        }
    }
}

impl FromStr for LoraTarget {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        LoraTarget::ALL
            .into_iter()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| Error::InvalidSetting {
                setting: "lora-targets",
                value: s.to_string(),
                reason: "expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj".into(),
            })
    }
}

/// A LoRA run: rank, alpha, dropout and the adapted projections of every layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank, alpha and dropout.
    pub settings: LoraSettings,
    /// Adapted projections (sorted, no repeats).
    pub targets: Vec<LoraTarget>,
}

impl LoraConfig {
    /// Targets from a comma-separated list such as `q_proj,v_proj`.
    pub fn new(settings: LoraSettings, targets: &str) -> Result<Self> {
        settings.validate()?;
        let mut targets = targets
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .map(str::parse)
            .collect::<Result<Vec<LoraTarget>>>()?;
        targets.sort();
        targets.dedup();
        if targets.is_empty() {
            return Err(Error::InvalidSetting {
                setting: "lora-targets",
                value: String::new(),
                reason: "name at least one projection".into(),
            });
        }
        Ok(LoraConfig { settings, targets })
    }
}

/// The number of trainable values of LoRA with `rank` on `targets` of every layer of `config`:
/// `rank * (in + out)` per adapted projection (for the memory planner; base weights are frozen).
pub fn trainable_parameters(config: &HfConfig, rank: usize, targets: &[LoraTarget]) -> u64 {
    let per_layer: u64 = targets
        .iter()
        .map(|t| {
            let (_, _, out, inp) = t.place(config);
            (rank * (inp + out)) as u64
        })
        .sum();
    per_layer * config.num_hidden_layers as u64
}

/// The layer index `i` of an engine layer named `layers.{i}.<suffix>`.
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("layers.")?;
    let (index, suffix) = rest.split_once('.')?;
    Some((index.parse().ok()?, suffix))
}

impl LlamaModel {
    /// Freezes every parameter (no gradient, no optimizer state) and adds a LoRA adapter, drawn
    /// from `seed`, on each of `lora.targets` in every layer: from now on the trainable parameters
    /// ([`Module::visit_parameters`]) are the adapters only. Errors if adapters are already on.
    pub fn enable_lora(&mut self, lora: &LoraConfig, seed: u64) -> Result<()> {
        if self.lora_enabled() {
            return Err(Error::InvalidSetting {
                setting: "lora",
                value: "enable".into(),
                reason: "the model already has LoRA adapters".into(),
            });
        }
        self.visit_all_parameters(&mut |p| p.freeze());
        let config = self.config().clone();
        let mut result = Ok(());
        self.visit_linears(&mut |linear: &mut Linear| {
            let Some((layer, suffix)) = layer_of(linear.name()).map(|(i, s)| (i, s.to_string())) else {
                return;
            };
            for (k, target) in lora.targets.iter().enumerate() {
                let (at, offset, rows, inp) = target.place(&config);
                if at != suffix || result.is_err() {
                    continue;
                }
                let module = format!("model.layers.{layer}.{}.{}", target.block(), target.name());
                let seed = child_seed(child_seed(seed, layer as u64), k as u64);
                result = LoraAdapter::new(&module, offset, rows, inp, &lora.settings, linear.precision(), seed)
                    .and_then(|a| linear.add_adapter(a));
            }
        });
        result
    }

    /// Whether LoRA adapters are on.
    pub fn lora_enabled(&mut self) -> bool {
        let mut any = false;
        self.visit_linears(&mut |l| any |= !l.adapters().is_empty());
        any
    }

    /// Calls `f` on every adapter, layer by layer in target order.
    pub fn visit_adapters(&mut self, f: &mut dyn FnMut(&mut LoraAdapter)) {
        self.visit_linears(&mut |l| l.adapters_mut().iter_mut().for_each(&mut *f));
    }

    /// Folds every adapter into its base weight (`W + (alpha / r) B A`, see
    /// [`LoraAdapter::merge_into`]) and removes them; the parameters stay frozen. Used before
    /// saving the merged model. A frozen FP8 weight with adapters is widened to f32 first.
    pub fn merge_lora(&mut self) -> Result<()> {
        let mut result = Ok(());
        self.visit_linears(&mut |l| {
            if result.is_ok() {
                result = l.merge_adapters();
            }
        });
        result
    }
}
