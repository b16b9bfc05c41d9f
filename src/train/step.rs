//! The optimizer half of a training step, in the order of `docs/training.md`:
//! unscale the gradients and check them for inf/NaN, clip by global norm, then
//! update with AdamW, or skip the update if a gradient was not finite; last,
//! let the loss scaler grow or back off.

use crate::amp::loss_scaler::DynamicLossScaler;
use crate::dispatch::Backend;
use crate::error::Result;
use crate::nn::Module;

use super::adamw::AdamW;
use super::clip::{clip_grad_norm_on, grad_norm_on};

/// What happened to one step's gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutcome {
    /// Global L2 norm of the unscaled gradients before clipping (inf/NaN on a skipped step).
    pub grad_norm: f64,
    /// Whether the update was skipped because a gradient was inf or NaN.
    pub skipped: bool,
    /// The loss scale this step's backward ran with.
    pub loss_scale: f32,
    /// The learning rate the update used.
    pub lr: f32,
}

/// Unscales, checks, clips (if `max_grad_norm` is set) and applies the gradients of `model`.
/// With a disabled scaler nothing is ever skipped: a NaN gradient reaches the weights, and
/// the returned norm says so.
pub fn apply_gradients(
    model: &mut dyn Module,
    scaler: &mut DynamicLossScaler,
    optimizer: &mut AdamW,
    lr: f32,
    max_grad_norm: Option<f32>,
) -> Result<StepOutcome> {
    let backend = optimizer.backend();
    let checked = check_and_clip_with(model, scaler, Some(&mut *optimizer), backend, max_grad_norm, &mut Ok)?;
    if !checked.skipped {
        optimizer.step_checked(model, lr)?;
    }
    Ok(checked.finish(scaler, lr))
}

/// The gradients of one step, unscaled, checked and (when finite) clipped: what decides
/// whether the optimizer runs.
pub(crate) struct Checked {
    grad_norm: f64,
    /// Whether a gradient was inf or NaN: the update is skipped.
    pub(crate) skipped: bool,
    loss_scale: f32,
}

impl Checked {
    /// Lets the loss scaler grow or back off (after the update, or instead of it).
    pub(crate) fn finish(self, scaler: &mut DynamicLossScaler, lr: f32) -> StepOutcome {
        scaler.update(self.skipped);
        StepOutcome {
            grad_norm: self.grad_norm,
            skipped: self.skipped,
            loss_scale: self.loss_scale,
            lr,
        }
    }
}

/// [`check_and_clip`] on the device arenas of `optimizer` where it keeps them (the gradients
/// copied there once, `AdamW::check_and_clip_on_arenas`), else on `backend` parameter by
/// parameter.
pub(crate) fn check_and_clip_with(
    model: &mut dyn Module,
    scaler: &DynamicLossScaler,
    optimizer: Option<&mut AdamW>,
    backend: Backend,
    max_grad_norm: Option<f32>,
    agree: &mut dyn FnMut(bool) -> Result<bool>,
) -> Result<Checked> {
    if let Some(optimizer) = optimizer
        && let Some((finite, grad_norm)) =
            optimizer.check_and_clip_on_arenas(model, scaler.inv_scale(), max_grad_norm, agree)?
    {
        return Ok(Checked {
            grad_norm,
            skipped: !finite,
            loss_scale: scaler.scale(),
        });
    }
    check_and_clip(model, scaler, backend, max_grad_norm, agree)
}

/// The first half of a step: unscales and checks the gradients, turns the verdict into the
/// group's with `agree`, and clips finite gradients; the caller then updates (unless skipped)
/// and calls [`Checked::finish`].
pub(crate) fn check_and_clip(
    model: &mut dyn Module,
    scaler: &DynamicLossScaler,
    backend: Backend,
    max_grad_norm: Option<f32>,
    agree: &mut dyn FnMut(bool) -> Result<bool>,
) -> Result<Checked> {
    let loss_scale = scaler.scale();
    let mut finite = true;
    let mut result = Ok(());
    if let Some(inv_scale) = scaler.inv_scale() {
        // Every gradient is unscaled, also after a non-finite one.
        model.visit_parameters(
            &mut |p| match backend.kernels().unscale_and_check(p.grad_mut(), inv_scale) {
                Ok(ok) => finite &= ok,
                Err(e) => result = Err(e),
            },
        );
        result?;
        finite = agree(finite)?;
    }
    let grad_norm = match (finite, max_grad_norm) {
        (true, Some(max)) => clip_grad_norm_on(backend, model, max)?,
        _ => grad_norm_on(backend, model)?,
    };
    Ok(Checked {
        grad_norm,
        skipped: !finite,
        loss_scale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amp::loss_scaler::LossScalerConfig;
    use crate::train::adamw::AdamWConfig;
    use crate::train::test_util::ParamList;

    fn setup() -> (ParamList, DynamicLossScaler, AdamW) {
        let model = ParamList::new(&[("w", &[2], vec![1.0, -1.0])]);
        let scaler = DynamicLossScaler::new(LossScalerConfig {
            init_scale: 1024.0,
            ..LossScalerConfig::default()
        })
        .unwrap();
        (model, scaler, AdamW::new(AdamWConfig::default()).unwrap())
    }

    #[test]
    fn a_finite_step_unscales_before_clipping_and_updates() {
        let (mut model, mut scaler, mut opt) = setup();
        // Unscaled gradient (3, 4): norm 5. Clipping a scaled norm of 5120 would give another answer.
        model.params[0]
            .grad_mut()
            .copy_from_slice(&[3.0 * 1024.0, 4.0 * 1024.0]);
        let out = apply_gradients(&mut model, &mut scaler, &mut opt, 0.1, Some(1.0)).unwrap();
        assert_eq!(out.grad_norm, 5.0);
        assert!(!out.skipped);
        assert_eq!(out.loss_scale, 1024.0);
        let g = &model.params[0].grad();
        assert!(((g[0] as f64).hypot(g[1] as f64) - 1.0).abs() < 1e-6);
        assert_eq!(opt.steps_taken(), 1);
        assert_eq!(model.params[0].version(), 1);
        assert_eq!(scaler.state().growth_tracker, 1);
    }

    #[test]
    fn an_inf_gradient_skips_the_update_and_backs_off() {
        let (mut model, mut scaler, mut opt) = setup();
        model.params[0].grad_mut().copy_from_slice(&[f32::INFINITY, 1.0]);
        let out = apply_gradients(&mut model, &mut scaler, &mut opt, 0.1, Some(1.0)).unwrap();
        assert!(out.skipped);
        assert_eq!(out.grad_norm, f64::INFINITY);
        assert_eq!(model.params[0].value(), vec![1.0, -1.0]);
        assert_eq!(model.params[0].version(), 0);
        assert_eq!(opt.steps_taken(), 0);
        assert_eq!(scaler.scale(), 512.0);
    }
}
