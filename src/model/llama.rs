//! The Llama-family decoder (Llama, Mistral, Qwen2) built from an [`HfConfig`]: token embedding,
//! [`LlamaLayer`]s with rotary grouped-query attention and SwiGLU MLPs, a final RMSNorm and a tied
//! or separate head, with an f32 cross-entropy loss; forward, backward and cached generation.

use super::config::Recompute;
use super::grad_ready::{GradReady, TrainableOnly};
use super::{ends, head};
use crate::amp::Precision;
use crate::data::IGNORE_INDEX as IGNORE;
use crate::dispatch::{Backend, RopeTable};
use crate::error::{Error, Result};
use crate::hf::HfConfig;
use crate::nn::VisitLinears;
use crate::nn::{
    Fp8TensorStats, GqaConfig, KvCache, Linear, LlamaLayer, Module, NormConfig, NormKind, Parameter, RMSNorm, Tensor,
};
use crate::scaling::DelayedSlot;
use crate::tensor::{DeviceKind, Dtype};

const SEED_TOKENS: u64 = 1;
const SEED_HEAD: u64 = 3;
const SEED_LAYERS: u64 = 100;
/// Positions the rotary table starts with; it grows on demand up to `max_position_embeddings`
/// (a 128k-position table of a 128-wide head is 64 MiB, worth building only when used).
const INITIAL_ROPE_POSITIONS: usize = 4096;

struct Saved {
    ids: Vec<u32>,
    targets: Vec<u32>,
    normed: Tensor,
    /// f32 logits `[rows, vocab]` and their log-sum-exp `[rows, 1]`, where the layers ran.
    logits: Tensor,
    lse: Tensor,
}

/// A Llama-family causal LM. Parameters: `embed.tokens [vocab, hidden]`, `layers.N.*`
/// ([`LlamaLayer`]), `final_norm.weight`, `head.weight [vocab, hidden]` (absent when tied).
/// [`super::hf_names`] maps them to the Hugging Face tensor names. The head runs in the policy's
/// high-precision dtype (bf16 under FP8).
pub struct LlamaModel {
    config: HfConfig,
    precision: Precision,
    dtype: Dtype,
    tokens: Parameter,
    layers: Vec<LlamaLayer>,
    final_norm: RMSNorm,
    head: Option<Linear>,
    inv_freq: Vec<f32>,
    rope: RopeTable,
    saved: Option<Saved>,
    backend: Backend,
}

impl LlamaModel {
    /// A model of `config`'s shape with every parameter drawn from `seed` (norm weights 1).
    pub fn new(config: &HfConfig, precision: &Precision, recompute: Recompute, seed: u64) -> Result<Self> {
        precision.validate()?;
        let h = config.hidden_size;
        let std = 1.0 / (h.max(1) as f64).sqrt();
        let tokens = Parameter::new(
            "embed.tokens",
            &[config.vocab_size, h],
            crate::nn::init_normal(crate::nn::child_seed(seed, SEED_TOKENS), config.vocab_size * h, std),
        )?;
        let norm = NormConfig {
            kind: NormKind::RmsNorm,
            eps: config.rms_norm_eps as f32,
            zero_centered_gamma: false,
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let gqa = GqaConfig {
                    hidden: h,
                    heads: config.num_attention_heads,
                    kv_heads: config.num_key_value_heads,
                    head_dim: config.head_dim,
                    qkv_bias: config.qkv_bias,
                    norm,
                    recompute: recompute.applies_to(i),
                };
                LlamaLayer::new(
                    &format!("layers.{i}"),
                    &gqa,
                    config.intermediate_size,
                    precision,
                    crate::nn::child_seed(seed, SEED_LAYERS + i as u64),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let head = (!config.tie_word_embeddings)
            .then(|| {
                Linear::new_high_precision(
                    "head",
                    h,
                    config.vocab_size,
                    false,
                    precision,
                    crate::nn::child_seed(seed, SEED_HEAD),
                )
            })
            .transpose()?;
        let inv_freq = config.rope.inv_freq();
        let rope = RopeTable::new(&inv_freq, config.max_position_embeddings.min(INITIAL_ROPE_POSITIONS));
        Ok(LlamaModel {
            config: config.clone(),
            precision: precision.clone(),
            dtype: precision.compute_dtype(),
            tokens,
            layers,
            final_norm: RMSNorm::new("final_norm", h, norm, precision)?,
            head,
            inv_freq,
            rope,
            saved: None,
            backend: Backend::default(),
        })
    }

    /// The checkpoint configuration.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The precision policy every layer runs under.
    pub fn precision(&self) -> &Precision {
        &self.precision
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.config.vocab_size
    }

    /// Grows the rotary table to cover positions `0..positions`.
    fn ensure_positions(&mut self, positions: usize) -> Result<()> {
        let max = self.config.max_position_embeddings;
        if positions > max {
            return Err(Error::InvalidSetting {
                setting: "seq",
                value: positions.to_string(),
                reason: format!("the model has max_position_embeddings = {max}"),
            });
        }
        if let Some(window) = self.config.sliding_window
            && positions > window
        {
            return Err(Error::InvalidSetting {
                setting: "seq",
                value: positions.to_string(),
                reason: format!("sequences past the sliding window ({window}) are not supported"),
            });
        }
        if positions > self.rope.positions() {
            let grown = positions.next_power_of_two().min(max);
            self.rope = RopeTable::new(&self.inv_freq, grown);
        }
        Ok(())
    }

    fn check_batch(&mut self, ids: &[u32], batch: usize, seq: usize, what: &'static str) -> Result<()> {
        if seq == 0 || ids.len() != batch.saturating_mul(seq) {
            return Err(Error::ShapeMismatch {
                what,
                rows: batch,
                cols: seq,
                expected: batch.saturating_mul(seq),
                got: ids.len(),
            });
        }
        self.ensure_positions(seq)
    }

    /// Token embeddings of `ids` on `device`, rounded to the compute dtype, `rows` rows (on the
    /// host, rows past `ids.len()` are zero padding) (`ends::embed_tokens`).
    fn embed(&mut self, ids: &[u32], rows: usize, device: DeviceKind) -> Result<Tensor> {
        let h = self.config.hidden_size;
        let mut x = ends::embed_tokens(&self.backend, &mut self.tokens, ids, (rows, h), self.dtype, device)?;
        self.backend.kernels().round(x.values_mut(), self.dtype)?;
        Ok(x)
    }

    /// Final norm and head over `x`, where it lives; returns (final-norm output, f32 logits).
    fn head_logits(&mut self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let normed = self.final_norm.forward(x)?;
        let logits = head::logits(&self.backend, self.head.as_mut(), &normed, &self.tokens, self.dtype)?;
        Ok((normed, logits))
    }

    /// On a GPU (unless `FP8_CUDA_RESIDENT=0`) the embeddings, the layers, the final norm and the
    /// head run on device tensors (as `DecoderModel`).
    fn logits(&mut self, ids: &[u32], batch: usize, seq: usize) -> Result<(Tensor, Tensor)> {
        let mut x = self.embed(ids, ids.len(), self.backend.resident_device())?;
        for layer in &mut self.layers {
            x = layer.forward(&x, batch, seq, &self.rope)?;
        }
        self.head_logits(&x)
    }

    /// Forward on `inputs` `[batch, seq]` and the mean cross-entropy against `targets`
    /// ([`IGNORE`] targets are not scored); keeps what [`backward`](Self::backward) needs.
    pub fn forward_loss(&mut self, inputs: &[u32], targets: &[u32], batch: usize, seq: usize) -> Result<f32> {
        self.check_batch(inputs, batch, seq, "model inputs [batch, seq]")?;
        self.check_batch(targets, batch, seq, "model targets [batch, seq]")?;
        let (normed, logits) = self.logits(inputs, batch, seq)?;
        let (loss, lse) = ends::loss(&self.backend, &logits, targets, IGNORE)?;
        self.saved = Some(Saved {
            ids: inputs.to_vec(),
            targets: targets.to_vec(),
            normed,
            logits,
            lse,
        });
        Ok(loss)
    }

    /// Backward from the last `forward_loss` with `d loss = dloss`; accumulates every gradient.
    pub fn backward(&mut self, dloss: f32) -> Result<()> {
        self.backward_with(dloss, &mut |_| Ok(()))
    }

    /// [`backward`](Self::backward), handing the head, the final norm and each layer (last
    /// first) to `ready` once their trainable gradients are final; the token table is final at
    /// the return (a tied head adds to it until the end).
    pub fn backward_with(&mut self, dloss: f32, ready: GradReady) -> Result<()> {
        let Saved {
            ids,
            targets,
            normed,
            logits,
            lse,
        } = self.saved.take().ok_or_else(|| Error::InvalidSetting {
            setting: "backward",
            value: "called".into(),
            reason: "no forward_loss before it".into(),
        })?;
        let dlogits = ends::loss_backward(&self.backend, &logits, &targets, IGNORE, &lse, dloss)?;
        // Done with: freed before the head's and the layers' backward, whose peaks they would
        // add to (262 MB of f32 logits at 2048 tokens of a 32000-token vocabulary).
        drop((logits, lse));
        let (backend, head) = (&self.backend, self.head.as_mut());
        let dnormed = head::logits_backward(backend, head, dlogits, &normed, &mut self.tokens, self.dtype)?;
        if let Some(head) = &mut self.head {
            ready(&mut TrainableOnly(head))?;
        }
        let mut dx = self.final_norm.backward(&dnormed)?;
        ready(&mut TrainableOnly(&mut self.final_norm))?;
        for layer in self.layers.iter_mut().rev() {
            dx = layer.backward(&dx, &self.rope)?;
            ready(&mut TrainableOnly(layer))?;
        }
        ends::embedding_backward(&self.backend, &mut self.tokens, &ids, &dx, self.dtype)
    }

    /// f32 logits `[batch * seq, vocab]` of `inputs`, forward only (nothing kept, FP8 scaling
    /// state untouched).
    pub fn forward_logits(&mut self, inputs: &[u32], batch: usize, seq: usize) -> Result<Vec<f32>> {
        self.check_batch(inputs, batch, seq, "model inputs [batch, seq]")?;
        self.evaluation(|m| Ok(m.logits(inputs, batch, seq)?.1.into_host()?.into_data()))
    }

    /// Mean loss against each target set and the most likely token at every position, over one
    /// forward-only pass (nothing kept, FP8 scaling state untouched).
    pub fn evaluate_losses(
        &mut self,
        inputs: &[u32],
        target_sets: &[&[u32]],
        batch: usize,
        seq: usize,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        for targets in target_sets {
            self.check_batch(targets, batch, seq, "model targets [batch, seq]")?;
        }
        self.check_batch(inputs, batch, seq, "model inputs [batch, seq]")?;
        self.evaluation(|m| {
            let logits = m.logits(inputs, batch, seq)?.1;
            ends::evaluate(&m.backend, logits, target_sets, IGNORE)
        })
    }

    /// One empty key/value cache per layer, for [`forward_cached`](Self::forward_cached).
    pub fn new_cache(&self) -> Vec<KvCache> {
        vec![KvCache::default(); self.layers.len()]
    }

    /// Logits `[ids.len(), vocab]` of the next tokens `ids` of one sequence after those in `cache`
    /// (generation); appends them to the cache. Forward only, FP8 scaling state untouched. Under
    /// FP8 the rows are padded with zeros to the multiple of 16 the GEMMs need.
    pub fn forward_cached(&mut self, ids: &[u32], cache: &mut [KvCache]) -> Result<Vec<f32>> {
        if cache.len() != self.layers.len() {
            return Err(Error::LengthMismatch {
                what: "key/value caches and layers",
                src: cache.len(),
                dst: self.layers.len(),
            });
        }
        let past = cache.first().map_or(0, KvCache::len);
        self.ensure_positions(past + ids.len())?;
        let multiple = if self.precision.is_fp8() {
            crate::nn::FP8_DIM_MULTIPLE
        } else {
            1
        };
        let rows = ids.len().div_ceil(multiple) * multiple;
        self.evaluation(|m| {
            // Generation's cached attention runs on host values.
            let mut x = m.embed(ids, rows, DeviceKind::Cpu)?;
            for (layer, c) in m.layers.iter_mut().zip(cache.iter_mut()) {
                x = layer.forward_cached(&x, ids.len(), c, &m.rope)?;
            }
            let h = m.config.hidden_size;
            let real = Tensor::new(x.data()[..ids.len() * h].to_vec(), ids.len(), h)?;
            Ok(m.head_logits(&real)?.1.into_host()?.into_data())
        })
    }

    /// Runs a forward-only `pass`, then puts the FP8 slots back and drops what it saved.
    fn evaluation<T>(&mut self, pass: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let mut slots = Vec::new();
        self.visit_fp8_slots(&mut |_, slot| slots.push(slot.clone()));
        let copies = crate::nn::weight_copy_states(self);
        self.visit_linears(&mut |l| l.set_lora_dropout(false));
        let result = pass(self);
        self.visit_linears(&mut |l| l.set_lora_dropout(true));
        let mut it = slots.into_iter();
        self.visit_fp8_slots(&mut |_, slot| {
            if let Some(saved) = it.next() {
                *slot = saved;
            }
        });
        crate::nn::defer_weight_records(self, &copies);
        self.clear_saved();
        result
    }

    fn clear_saved(&mut self) {
        self.saved = None;
        for layer in &mut self.layers {
            layer.clear_saved();
        }
        if let Some(head) = &mut self.head {
            head.clear_saved();
        }
        self.final_norm.clear_saved();
    }
}

impl LlamaModel {
    /// Every parameter, frozen or not (LoRA adapters included), in the checkpoint order.
    pub fn visit_all_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        f(&mut self.tokens);
        for layer in &mut self.layers {
            layer.visit_parameters(f);
        }
        self.final_norm.visit_parameters(f);
        if let Some(head) = &mut self.head {
            head.visit_parameters(f);
        }
    }
}

impl Module for LlamaModel {
    /// The trainable parameters: all of them, or only the LoRA adapters once
    /// [`LlamaModel::enable_lora`] froze the rest.
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.visit_all_parameters(&mut |p| {
            if !p.is_frozen() {
                f(p)
            }
        });
    }

    fn frozen_parameter_count(&mut self) -> usize {
        let mut count = 0;
        self.visit_all_parameters(&mut |p| count += if p.is_frozen() { p.len() } else { 0 });
        count
    }

    fn frozen_parameter_bytes(&mut self) -> usize {
        let mut bytes = 0;
        self.visit_all_parameters(&mut |p| bytes += if p.is_frozen() { p.held_bytes() } else { 0 });
        bytes
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        let from = self.backend.device();
        super::device_move::all_or_nothing(from, device, |d| self.move_modules(d))
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, "model");
        for layer in &mut self.layers {
            layer.check_against_cpu(on);
        }
        self.final_norm.check_against_cpu(on);
        if let Some(head) = &mut self.head {
            head.check_against_cpu(on);
        }
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        for layer in &mut self.layers {
            layer.visit_fp8_slots(f);
        }
        if let Some(head) = &mut self.head {
            head.visit_fp8_slots(f);
        }
    }

    fn saved_activation_bytes(&self) -> usize {
        let own = self.saved.as_ref().map_or(0, |s| {
            s.ids.len() * 8 + (s.logits.len() + s.lse.len()) * 4 + s.normed.len() * self.dtype.bytes()
        });
        own + self.layers.iter().map(|l| l.saved_activation_bytes()).sum::<usize>()
            + self.final_norm.saved_activation_bytes()
            + self.head.as_ref().map_or(0, |h| h.saved_activation_bytes())
    }

    fn weight_cache_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.weight_cache_bytes()).sum::<usize>()
            + self.head.as_ref().map_or(0, |h| h.weight_cache_bytes())
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        for layer in &self.layers {
            layer.collect_fp8_stats(out);
        }
    }
}

impl VisitLinears for LlamaModel {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        for layer in &mut self.layers {
            layer.visit_linears(f);
        }
        if let Some(head) = &mut self.head {
            f(head);
        }
    }
}

impl LlamaModel {
    /// Moves every module to `device` (stops at the first that cannot move).
    fn move_modules(&mut self, device: DeviceKind) -> Result<()> {
        self.backend = Backend::on(device);
        ends::tables_home([&mut self.tokens])?;
        for layer in &mut self.layers {
            layer.to_device(device)?;
        }
        self.final_norm.to_device(device)?;
        match &mut self.head {
            Some(head) => head.to_device(device),
            None => Ok(()),
        }
    }
}
