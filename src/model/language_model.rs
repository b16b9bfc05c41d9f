//! What the training loop needs from a model, so one loop trains the toy decoder and a loaded
//! Llama-family checkpoint alike.

use super::decoder::DecoderModel;
pub use super::grad_ready::GradReady;
use super::llama::LlamaModel;
use crate::error::Result;
use crate::nn::{Module, VisitLinears};

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
