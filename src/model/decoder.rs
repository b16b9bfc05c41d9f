//! The decoder-only model: forward to logits, f32 cross-entropy, backward.

use super::config::ModelConfig;
use super::grad_ready::GradReady;
use super::{ends, head};
use crate::amp::Precision;
use crate::data::IGNORE_INDEX as IGNORE;
use crate::dispatch::Backend;
use crate::error::{Error, Result};
use crate::nn::{
    Fp8TensorStats, LayerNorm, Linear, Module, NormConfig, Parameter, RMSNorm, Tensor, TransformerLayer, VisitLinears,
};
use crate::scaling::DelayedSlot;
use crate::tensor::{DeviceKind, Dtype};

/// Seed streams of the model's parts, so adding a part never changes another's init.
const SEED_TOKENS: u64 = 1;
const SEED_POSITIONS: u64 = 2;
const SEED_HEAD: u64 = 3;
const SEED_LAYERS: u64 = 100;

enum FinalNorm {
    Layer(LayerNorm),
    Rms(RMSNorm),
}

impl FinalNorm {
    fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        match self {
            FinalNorm::Layer(n) => n.forward(x),
            FinalNorm::Rms(n) => n.forward(x),
        }
    }

    fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        match self {
            FinalNorm::Layer(n) => n.backward(dy),
            FinalNorm::Rms(n) => n.backward(dy),
        }
    }

    fn clear_saved(&mut self) {
        match self {
            FinalNorm::Layer(n) => n.clear_saved(),
            FinalNorm::Rms(n) => n.clear_saved(),
        }
    }

    fn module(&mut self) -> &mut dyn Module {
        match self {
            FinalNorm::Layer(n) => n,
            FinalNorm::Rms(n) => n,
        }
    }

    fn module_ref(&self) -> &dyn Module {
        match self {
            FinalNorm::Layer(n) => n,
            FinalNorm::Rms(n) => n,
        }
    }
}

/// What backward needs from the last forward.
struct Saved {
    ids: Vec<u32>,
    targets: Vec<u32>,
    seq: usize,
    /// Final-norm output (the tied head's input).
    normed: Tensor,
    /// f32 logits `[rows, vocab]` and their log-sum-exp `[rows, 1]`, where the layers ran.
    logits: Tensor,
    lse: Tensor,
}

/// Token + position embeddings, `layers` transformer layers, final norm, head, cross-entropy.
///
/// Parameters: `embed.tokens [vocab, hidden]`, `embed.positions [max_seq, hidden]`,
/// `layers.N.*`, `final_norm.*`, `head.weight [vocab, hidden]` (absent when tied).
/// The head runs in the policy's high-precision dtype (bf16 under FP8), as is usual for LM heads.
pub struct DecoderModel {
    config: ModelConfig,
    precision: Precision,
    dtype: Dtype,
    tokens: Parameter,
    positions: Parameter,
    layers: Vec<TransformerLayer>,
    final_norm: FinalNorm,
    head: Option<Linear>,
    saved: Option<Saved>,
    /// Where its ops run.
    backend: Backend,
}

impl DecoderModel {
    /// A model with every parameter drawn deterministically from `seed`.
    pub fn new(config: &ModelConfig, precision: &Precision, seed: u64) -> Result<Self> {
        config.validate()?;
        precision.validate()?;
        let h = config.hidden;
        let std = 1.0 / (h as f64).sqrt();
        let tokens = Parameter::new(
            "embed.tokens",
            &[config.vocab, h],
            crate::nn::init_normal(crate::nn::child_seed(seed, SEED_TOKENS), config.vocab * h, std),
        )?;
        let positions = Parameter::new(
            "embed.positions",
            &[config.max_seq, h],
            crate::nn::init_normal(
                crate::nn::child_seed(seed, SEED_POSITIONS),
                config.max_seq * h,
                0.1 * std,
            ),
        )?;
        let layers = (0..config.layers)
            .map(|i| {
                TransformerLayer::new(
                    &format!("layers.{i}"),
                    &config.layer_config(i),
                    precision,
                    crate::nn::child_seed(seed, SEED_LAYERS + i as u64),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = NormConfig::default();
        let final_norm = if config.rmsnorm {
            FinalNorm::Rms(RMSNorm::new("final_norm", h, norm, precision)?)
        } else {
            FinalNorm::Layer(LayerNorm::new("final_norm", h, norm, precision)?)
        };
        let head = (!config.tied_head)
            .then(|| {
                Linear::new_high_precision(
                    "head",
                    h,
                    config.vocab,
                    false,
                    precision,
                    crate::nn::child_seed(seed, SEED_HEAD),
                )
            })
            .transpose()?;
        Ok(DecoderModel {
            config: config.clone(),
            precision: precision.clone(),
            dtype: precision.compute_dtype(),
            tokens,
            positions,
            layers,
            final_norm,
            head,
            saved: None,
            backend: Backend::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The precision policy every layer runs under.
    pub fn precision(&self) -> &Precision {
        &self.precision
    }

    fn check_batch(&self, ids: &[u32], batch: usize, seq: usize, what: &'static str) -> Result<()> {
        if seq > self.config.max_seq {
            return Err(Error::InvalidSetting {
                setting: "seq",
                value: seq.to_string(),
                reason: format!("the model has {} positions", self.config.max_seq),
            });
        }
        if seq == 0 || ids.len() != batch * seq {
            return Err(Error::ShapeMismatch {
                what,
                rows: batch,
                cols: seq,
                expected: batch * seq,
                got: ids.len(),
            });
        }
        Ok(())
    }

    /// Token plus position embeddings of `ids` (`seq` positions a sequence), rounded to the
    /// compute dtype, where the layers run (`ends`): `round(token + position)` on either side.
    fn embed(&mut self, ids: &[u32], seq: usize) -> Result<Tensor> {
        let (h, rows, device) = (self.config.hidden, ids.len(), self.backend.resident_device());
        let tokens = ends::embed_tokens(&self.backend, &mut self.tokens, ids, (rows, h), self.dtype, device)?;
        let positions = ends::embed_tokens(
            &self.backend,
            &mut self.positions,
            &position_ids(rows, seq),
            (rows, h),
            self.dtype,
            device,
        )?;
        let mut x = self.backend.output_at(device, rows, h)?;
        self.backend
            .kernels()
            .residual_add(tokens.values(), positions.values(), self.dtype, x.values_mut())?;
        Ok(x)
    }

    /// Runs the layers, final norm and head; returns (final-norm output, f32 logits), on a GPU
    /// (unless `FP8_CUDA_RESIDENT=0`) on the device from the embeddings to the logits.
    fn logits(&mut self, ids: &[u32], batch: usize, seq: usize) -> Result<(Tensor, Tensor)> {
        let mut x = self.embed(ids, seq)?;
        for layer in &mut self.layers {
            x = layer.forward(&x, batch, seq)?;
        }
        let normed = self.final_norm.forward(&x)?;
        let logits = head::logits(&self.backend, self.head.as_mut(), &normed, &self.tokens, self.dtype)?;
        Ok((normed, logits))
    }

    /// Forward on `inputs` `[batch, seq]` and the mean cross-entropy against `targets`
    /// (positions whose target is [`IGNORE`] are not scored). Keeps what [`backward`](Self::backward) needs.
    pub fn forward_loss(&mut self, inputs: &[u32], targets: &[u32], batch: usize, seq: usize) -> Result<f32> {
        self.check_batch(inputs, batch, seq, "model inputs [batch, seq]")?;
        self.check_batch(targets, batch, seq, "model targets [batch, seq]")?;
        let (normed, logits) = self.logits(inputs, batch, seq)?;
        let (loss, lse) = ends::loss(&self.backend, &logits, targets, IGNORE)?;
        self.saved = Some(Saved {
            ids: inputs.to_vec(),
            targets: targets.to_vec(),
            seq,
            normed,
            logits,
            lse,
        });
        Ok(loss)
    }

    /// Backward from the last `forward_loss` with `d loss = dloss` (the loss scale divided by the
    /// micro-batch count); accumulates every parameter gradient.
    pub fn backward(&mut self, dloss: f32) -> Result<()> {
        self.backward_with(dloss, &mut |_| Ok(()))
    }

    /// [`backward`](Self::backward), handing the head, the final norm and each layer (last
    /// first) to `ready` once its gradients are final; the embeddings are final at the return
    /// (a tied head adds to the token table until the end).
    pub fn backward_with(&mut self, dloss: f32, ready: GradReady) -> Result<()> {
        let Saved {
            ids,
            targets,
            seq,
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
            ready(head)?;
        }
        let mut dx = self.final_norm.backward(&dnormed)?;
        ready(self.final_norm.module())?;
        for layer in self.layers.iter_mut().rev() {
            dx = layer.backward(&dx)?;
            ready(layer)?;
        }
        let positions = position_ids(ids.len(), seq);
        ends::embedding_backward(&self.backend, &mut self.tokens, &ids, &dx, self.dtype)?;
        ends::embedding_backward(&self.backend, &mut self.positions, &positions, &dx, self.dtype)
    }

    /// The most likely next token at every position of `inputs` `[batch, seq]` (forward only;
    /// nothing is kept for backward). FP8 scaling state is left as it was.
    pub fn predict(&mut self, inputs: &[u32], batch: usize, seq: usize) -> Result<Vec<u32>> {
        self.check_batch(inputs, batch, seq, "model inputs [batch, seq]")?;
        let vocab = self.config.vocab;
        self.evaluation(|m| {
            Ok(ends::argmax_rows(
                m.logits(inputs, batch, seq)?.1.into_host()?.data(),
                vocab,
            ))
        })
    }

    /// Mean loss on `inputs`/`targets` and the most likely token at every position, without
    /// keeping anything for backward and without touching the FP8 scaling state (held-out evaluation).
    pub fn evaluate_loss(
        &mut self,
        inputs: &[u32],
        targets: &[u32],
        batch: usize,
        seq: usize,
    ) -> Result<(f32, Vec<u32>)> {
        let (losses, predictions) = self.evaluate_losses(inputs, &[targets], batch, seq)?;
        Ok((losses[0], predictions))
    }

    /// [`evaluate_loss`](Self::evaluate_loss) against several target sets over one forward pass:
    /// the mean loss for each set (e.g. all positions and the answer alone) and the predictions.
    pub fn evaluate_losses(
        &mut self,
        inputs: &[u32],
        target_sets: &[&[u32]],
        batch: usize,
        seq: usize,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        self.check_batch(inputs, batch, seq, "model inputs [batch, seq]")?;
        for targets in target_sets {
            self.check_batch(targets, batch, seq, "model targets [batch, seq]")?;
        }
        self.evaluation(|m| {
            let logits = m.logits(inputs, batch, seq)?.1;
            ends::evaluate(&m.backend, logits, target_sets, IGNORE)
        })
    }

    /// Runs a forward-only `pass`, then puts the FP8 slots back as they were and drops
    /// everything the forward saved for backward, whether or not `pass` failed.
    fn evaluation<T>(&mut self, pass: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let slots = self.snapshot_fp8_slots();
        let copies = crate::nn::weight_copy_states(self);
        let result = pass(self);
        self.restore_fp8_slots(slots);
        crate::nn::defer_weight_records(self, &copies);
        self.clear_saved();
        result
    }

    fn snapshot_fp8_slots(&mut self) -> Vec<DelayedSlot> {
        let mut slots = Vec::new();
        self.visit_fp8_slots(&mut |_, slot| slots.push(slot.clone()));
        slots
    }

    fn restore_fp8_slots(&mut self, slots: Vec<DelayedSlot>) {
        let mut it = slots.into_iter();
        self.visit_fp8_slots(&mut |_, slot| {
            if let Some(saved) = it.next() {
                *slot = saved;
            }
        });
    }

    /// Drops what the last forward kept for backward, in every part of the model.
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

/// The position of each of `rows` tokens in its sequence of `seq` (the position table's ids).
fn position_ids(rows: usize, seq: usize) -> Vec<u32> {
    (0..rows).map(|r| (r % seq.max(1)) as u32).collect()
}

impl Module for DecoderModel {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        f(&mut self.tokens);
        f(&mut self.positions);
        for layer in &mut self.layers {
            layer.visit_parameters(f);
        }
        self.final_norm.module().visit_parameters(f);
        if let Some(head) = &mut self.head {
            head.visit_parameters(f);
        }
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
        self.final_norm.module().check_against_cpu(on);
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
            + self.final_norm.module_ref().saved_activation_bytes()
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

impl VisitLinears for DecoderModel {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        for layer in &mut self.layers {
            layer.visit_linears(f);
        }
        if let Some(head) = &mut self.head {
            f(head);
        }
    }
}

impl DecoderModel {
    /// Moves every module to `device` (stops at the first that cannot move).
    fn move_modules(&mut self, device: DeviceKind) -> Result<()> {
        self.backend = Backend::on(device);
        ends::tables_home([&mut self.tokens, &mut self.positions])?;
        for layer in &mut self.layers {
            layer.to_device(device)?;
        }
        self.final_norm.module().to_device(device)?;
        match &mut self.head {
            Some(head) => head.to_device(device),
            None => Ok(()),
        }
    }
}
