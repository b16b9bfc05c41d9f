//! The hook a model's backward calls with each group of parameters whose gradients are final,
//! so a data-parallel step can reduce them while backward goes on (`docs/distributed.md`,
//! Overlap).

use crate::error::Result;
use crate::nn::{Module, Parameter};

/// Called by [`super::LanguageModel::backward_with`] with each group of trainable parameters whose
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
