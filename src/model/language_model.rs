//! What the training loop needs from a model, so one loop trains the toy decoder and a loaded
//! Llama-family checkpoint alike.

use super::decoder::DecoderModel;
use super::llama::LlamaModel;
use crate::error::Result;
use crate::nn::{Module, Parameter, VisitLinears};

/// Called by [`LanguageModel::backward_with`] with each group of trainable parameters whose
/// gradients backward has just finished (no later op of this backward touches them).
///
/// Groups come in reverse visiting order: each group's parameters, visited in their own order,
/// are the run of trainable parameters just before the previous group's in the model's
/// [`Module::visit_parameters`] order. Parameters no group named (a tied embedding that the
/// last op still adds to, the first parameters) are final when backward returns.
pub type GradReady<'a> = &'a mut dyn FnMut(&mut dyn Module) -> Result<()>;

/// A module seen through its trainable parameters only (a LoRA model's frozen base weights
/// are skipped, as the model's own [`Module::visit_parameters`] skips them).
pub(crate) struct TrainableOnly<'a>(pub &'a mut dyn Module);

impl Module for TrainableOnly<'_> {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.0.visit_parameters(&mut |p| {
            if !p.is_frozen() {
                f(p)
            }
        });
    }
}

/// A causal language model with a loss, its backward and a forward-only evaluation; its
/// linear layers can be visited (the training step drives their delayed-scaling updates).
pub trait LanguageModel: Module + VisitLinears {
    /// Forward on `inputs` `[batch, seq]` and the mean cross-entropy against `targets`; keeps
    /// what [`backward`](Self::backward) needs.
    fn forward_loss(&mut self, inputs: &[u32], targets: &[u32], batch: usize, seq: usize) -> Result<f32>;

    /// Backward from the last forward with `d loss = dloss`; accumulates every gradient.
    fn backward(&mut self, dloss: f32) -> Result<()>;

    /// [`backward`](Self::backward) that hands each group of finished gradients to `ready` as
    /// soon as it is final (see [`GradReady`]), so a data-parallel step can reduce them while
    /// earlier layers still run backward. Same arithmetic, same bits as `backward`.
    fn backward_with(&mut self, dloss: f32, ready: GradReady) -> Result<()>;

    /// Mean loss against each target set and the most likely token at every position, forward
    /// only, FP8 scaling state untouched.
    fn evaluate_losses(
        &mut self,
        inputs: &[u32],
        target_sets: &[&[u32]],
        batch: usize,
        seq: usize,
    ) -> Result<(Vec<f32>, Vec<u32>)>;
}

macro_rules! language_model {
    ($ty:ty) => {
        impl LanguageModel for $ty {
            fn forward_loss(&mut self, inputs: &[u32], targets: &[u32], batch: usize, seq: usize) -> Result<f32> {
                <$ty>::forward_loss(self, inputs, targets, batch, seq)
            }

            fn backward(&mut self, dloss: f32) -> Result<()> {
                <$ty>::backward_with(self, dloss, &mut |_| Ok(()))
            }

            fn backward_with(&mut self, dloss: f32, ready: GradReady) -> Result<()> {
                <$ty>::backward_with(self, dloss, ready)
            }

            fn evaluate_losses(
                &mut self,
                inputs: &[u32],
                target_sets: &[&[u32]],
                batch: usize,
                seq: usize,
            ) -> Result<(Vec<f32>, Vec<u32>)> {
                <$ty>::evaluate_losses(self, inputs, target_sets, batch, seq)
            }
        }
    };
}

language_model!(DecoderModel);
language_model!(LlamaModel);
