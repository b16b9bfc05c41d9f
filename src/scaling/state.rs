//! The delayed-scaling state of a model: per module, three forward slots
//! (input, weight, output) and two backward slots (output gradient, input
//! gradient), each a [`DelayedSlot`]. One call after the forward pass and one
//! after the backward pass update every slot of that pass.
//!
//! Current, block and MXFP8 scaling derive their scales from the tensor being
//! cast and carry nothing from one step to the next, so they need no state: the
//! scales live in the quantized tensor.
//!
//! Serializable for checkpoints; f32 values are written as shortest round-trip
//! strings so scales and histories (inf and NaN included) come back bit for bit.

use serde::{Deserialize, Serialize};

use super::delayed::DelayedSlot;
use super::recipe::{DelayedScaling, TensorRole};
use crate::error::{Error, Result};

/// The five delayed-scaling slots of one linear module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleScaling {
    /// Forward: `X`.
    pub input: DelayedSlot,
    /// Forward: `W`.
    pub weight: DelayedSlot,
    /// Forward: `Y`.
    pub output: DelayedSlot,
    /// Backward: `dY`.
    pub output_grad: DelayedSlot,
    /// Backward: `dX`.
    pub input_grad: DelayedSlot,
}

impl ModuleScaling {
    /// Fresh slots: scale 1.0, history of `history_len` zeros.
    pub fn new(history_len: usize) -> Self {
        let slot = DelayedSlot::new(history_len);
        ModuleScaling {
            input: slot.clone(),
            weight: slot.clone(),
            output: slot.clone(),
            output_grad: slot.clone(),
            input_grad: slot,
        }
    }

    /// The slot of `role`.
    pub fn slot(&self, role: TensorRole) -> &DelayedSlot {
        match role {
            TensorRole::Input => &self.input,
            TensorRole::Weight => &self.weight,
            TensorRole::Output => &self.output,
            TensorRole::OutputGrad => &self.output_grad,
            TensorRole::InputGrad => &self.input_grad,
        }
    }

    /// The slot of `role`, mutable.
    pub fn slot_mut(&mut self, role: TensorRole) -> &mut DelayedSlot {
        match role {
            TensorRole::Input => &mut self.input,
            TensorRole::Weight => &mut self.weight,
            TensorRole::Output => &mut self.output,
            TensorRole::OutputGrad => &mut self.output_grad,
            TensorRole::InputGrad => &mut self.input_grad,
        }
    }
}

/// Element-wise `into[i] = fmaxf(into[i], other[i])`: the max-reduce of one
/// rank's amaxes into another's (NaN ignored, as CUDA's `fmaxf`).
pub fn fmax_reduce(into: &mut [f32], other: &[f32]) {
    for (a, &b) in into.iter_mut().zip(other) {
        *a = a.max(b);
    }
}

/// Delayed-scaling state for every module of a model.
///
/// ```
/// use fp8_engine::quantize::quantize_per_tensor;
/// use fp8_engine::scaling::{DelayedScaling, ScalingState, TensorRole};
///
/// let mut state = ScalingState::new(DelayedScaling::default(), 1)?;
/// let x = vec![0.5f32, -2.0, 1.0, 0.25];
/// for _step in 0..2 {
///     // Forward: cast with the slot's scale, record the amax the cast measured.
///     let role = TensorRole::Input;
///     let scale = state.scale(0, role)?;
///     let (q, amax) = quantize_per_tensor(&x, 2, 2, state.recipe().format.for_role(role), scale, false)?;
///     state.record_cast(0, role, amax)?;
///     state.update_forward(); // after the forward pass
///     state.update_backward(); // after the backward pass (no backward casts here)
///     assert_eq!(q.dequantize::<f32>()?, x); // these values are exact in E4M3
/// }
/// assert_eq!(state.scale(0, TensorRole::Input)?, 224.0); // 448 / amax 2
/// # Ok::<(), fp8_engine::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "StateRepr")]
pub struct ScalingState {
    recipe: DelayedScaling,
    modules: Vec<ModuleScaling>,
}

/// The serialized form, checked before it becomes a [`ScalingState`].
#[derive(Deserialize)]
struct StateRepr {
    recipe: DelayedScaling,
    modules: Vec<ModuleScaling>,
}

impl TryFrom<StateRepr> for ScalingState {
    type Error = Error;

    fn try_from(repr: StateRepr) -> Result<Self> {
        repr.recipe.validate()?;
        let len = repr.recipe.amax_history_len;
        for (index, module) in repr.modules.iter().enumerate() {
            for role in TensorRole::FORWARD.into_iter().chain(TensorRole::BACKWARD) {
                let got = module.slot(role).history.len();
                if got != len {
                    return Err(Error::InvalidRecipe {
                        setting: "amax_history_len",
                        value: len.to_string(),
                        reason: format!("module {index} slot {role:?} holds a history of {got} entries"),
                    });
                }
            }
        }
        Ok(ScalingState {
            recipe: repr.recipe,
            modules: repr.modules,
        })
    }
}

impl ScalingState {
    /// Fresh state for `num_modules` modules under a validated `recipe`.
    pub fn new(recipe: DelayedScaling, num_modules: usize) -> Result<Self> {
        recipe.validate()?;
        let modules = vec![ModuleScaling::new(recipe.amax_history_len); num_modules];
        Ok(ScalingState { recipe, modules })
    }

    /// The recipe every slot follows.
    pub fn recipe(&self) -> &DelayedScaling {
        &self.recipe
    }

    /// Every module's slots.
    pub fn modules(&self) -> &[ModuleScaling] {
        &self.modules
    }

    fn module_mut(&mut self, module: usize) -> Result<&mut ModuleScaling> {
        let modules = self.modules.len();
        self.modules
            .get_mut(module)
            .ok_or(Error::NoSuchModule { module, modules })
    }

    /// The slot of `role` in `module`.
    pub fn slot(&self, module: usize, role: TensorRole) -> Result<&DelayedSlot> {
        let modules = self.modules.len();
        self.modules
            .get(module)
            .map(|m| m.slot(role))
            .ok_or(Error::NoSuchModule { module, modules })
    }

    /// The scale the next cast of `role` in `module` must use.
    pub fn scale(&self, module: usize, role: TensorRole) -> Result<f32> {
        Ok(self.slot(module, role)?.scale)
    }

    /// Records a cast of `role` in `module` that used [`Self::scale`] and measured `amax`.
    pub fn record_cast(&mut self, module: usize, role: TensorRole, amax: f32) -> Result<()> {
        self.module_mut(module)?.slot_mut(role).record_cast(amax);
        Ok(())
    }

    /// The update after the forward pass, single process (no reduction needed).
    pub fn update_forward(&mut self) {
        self.update_forward_with(|_| {});
    }

    /// The update after the backward pass, single process.
    pub fn update_backward(&mut self) {
        self.update_backward_with(|_| {});
    }

    /// The update after the forward pass; with `reduce_amax`, `reduce` first
    /// max-reduces this step's amaxes (`[input, weight, output]` per module, in
    /// module order) across the data-parallel group in place.
    pub fn update_forward_with(&mut self, reduce: impl FnOnce(&mut [f32])) {
        self.update_pass(&TensorRole::FORWARD, reduce);
    }

    /// The update after the backward pass; `reduce` sees `[output_grad, input_grad]` per module.
    pub fn update_backward_with(&mut self, reduce: impl FnOnce(&mut [f32])) {
        self.update_pass(&TensorRole::BACKWARD, reduce);
    }

    /// This step's amaxes of `roles`, in the order `reduce` sees them.
    pub fn current_amaxes(&self, roles: &[TensorRole]) -> Vec<f32> {
        let mut amaxes = Vec::with_capacity(self.modules.len() * roles.len());
        for module in &self.modules {
            amaxes.extend(roles.iter().map(|&role| module.slot(role).current_amax()));
        }
        amaxes
    }

    fn update_pass(&mut self, roles: &[TensorRole], reduce: impl FnOnce(&mut [f32])) {
        if self.recipe.reduce_amax {
            // One buffer for the whole pass: one all-reduce per pass, as TE does.
            let mut amaxes = self.current_amaxes(roles);
            reduce(&mut amaxes);
            let mut reduced = amaxes.into_iter();
            for module in &mut self.modules {
                for &role in roles {
                    if let Some(amax) = reduced.next() {
                        module.slot_mut(role).set_current_amax(amax);
                    }
                }
            }
        }
        let recipe = &self.recipe;
        for module in &mut self.modules {
            for &role in roles {
                module.slot_mut(role).update(recipe, recipe.format.for_role(role));
            }
        }
    }
}
