//! Gradient clipping by global L2 norm (over every gradient of a module).
//!
//! The squares are summed in f64: 1e8 f32 squares in f32 would lose about
//! log2(1e8) ~ 27 bits of the small ones; f64's 53 bits keep the sum good to
//! f32 precision. The clip coefficient `max_norm / (norm + 1e-6)` (PyTorch's)
//! is computed in f64, rounded to f32 once, and multiplies every gradient.

use crate::dispatch::Backend;
use crate::error::{Error, Result};
use crate::nn::Module;

/// Guards the division when the norm is zero, as PyTorch does.
const NORM_EPS: f64 = 1e-6;

/// L2 norm of several slices together, accumulated in f64 (NaN if any value is NaN,
/// inf if any is inf and none is NaN).
pub fn global_norm_of<'a>(slices: impl IntoIterator<Item = &'a [f32]>) -> f64 {
    slices.into_iter().map(sum_of_squares).sum::<f64>().sqrt()
}

fn sum_of_squares(values: &[f32]) -> f64 {
    // The CPU backend's op: no error is possible on host slices.
    Backend::default().kernels().sum_squares(values).unwrap_or(f64::NAN)
}

/// Global L2 norm of every gradient of `module`.
pub fn grad_norm(module: &mut dyn Module) -> f64 {
    grad_norm_on(Backend::default(), module).unwrap_or(f64::NAN)
}

/// [`grad_norm`] with the sums of squares on `backend`.
pub(crate) fn grad_norm_on(backend: Backend, module: &mut dyn Module) -> Result<f64> {
    let mut sum = 0.0f64;
    let mut result = Ok(());
    module.visit_parameters(&mut |p| match backend.kernels().sum_squares(p.grad()) {
        Ok(s) => sum += s,
        Err(e) => result = Err(e),
    });
    result.map(|()| sum.sqrt())
}

/// Scales all gradients so their global norm is at most `max_norm` and returns the norm
/// before clipping. A non-finite norm is returned as is and the gradients are left alone
/// (such a step is skipped by the loss scaler or reported by the caller, never "clipped" into NaN).
pub fn clip_grad_norm(module: &mut dyn Module, max_norm: f32) -> Result<f64> {
    clip_grad_norm_on(Backend::default(), module, max_norm)
}

/// [`clip_grad_norm`] with the norm computed on `backend`.
pub(crate) fn clip_grad_norm_on(backend: Backend, module: &mut dyn Module, max_norm: f32) -> Result<f64> {
    check_max_norm(max_norm)?;
    let norm = grad_norm_on(backend, module)?;
    if let Some(coef) = clip_coefficient(norm, max_norm) {
        module.visit_parameters(&mut |p| p.grad_mut().iter_mut().for_each(|g| *g *= coef));
    }
    Ok(norm)
}

/// A clipping threshold must be finite and > 0.
pub(crate) fn check_max_norm(max_norm: f32) -> Result<()> {
    if max_norm.is_finite() && max_norm > 0.0 {
        return Ok(());
    }
    Err(Error::InvalidSetting {
        setting: "max_grad_norm",
        value: max_norm.to_string(),
        reason: "must be finite and > 0".to_string(),
    })
}

/// The factor that brings gradients of global norm `norm` down to `max_norm`, if they are above
/// it: `max_norm / (norm + 1e-6)` in f64, rounded to f32 once. None for a non-finite norm.
pub(crate) fn clip_coefficient(norm: f64, max_norm: f32) -> Option<f32> {
    if !norm.is_finite() {
        return None;
    }
    let coef = max_norm as f64 / (norm + NORM_EPS);
    (coef < 1.0).then_some(coef as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::test_util::ParamList;

    fn module(a: Vec<f32>, b: Vec<f32>) -> ParamList {
        let mut m = ParamList::new(&[
            ("a", &[a.len()], vec![0.0; a.len()]),
            ("b", &[b.len()], vec![0.0; b.len()]),
        ]);
        m.params[0].grad_mut().copy_from_slice(&a);
        m.params[1].grad_mut().copy_from_slice(&b);
        m
    }

    #[test]
    fn norm_spans_all_parameters() {
        let mut m = module(vec![3.0, 0.0], vec![4.0]);
        assert_eq!(grad_norm(&mut m), 5.0);
        assert_eq!(global_norm_of([[3.0f32].as_slice(), &[4.0]]), 5.0);
    }

    #[test]
    fn norm_of_many_small_values_is_accurate() {
        // 1e6 values of 1e-3 and one of 1: a running f32 sum drifts by ~1e-3 (each 1e-6 added to ~1.5 is
        // rounded to a multiple of 2^-23 ~ 1.2e-7); f64 stays within ~1e-10 of sqrt(1 + 1e6 * 1e-6).
        let mut m = module(vec![1e-3; 1_000_000], vec![1.0]);
        let norm = grad_norm(&mut m);
        let expected = (1.0f64 + 1e6 * (1e-3f32 as f64).powi(2)).sqrt();
        assert!((norm - expected).abs() < 1e-9, "{norm} vs {expected}");
    }

    #[test]
    fn clipping_scales_to_the_max_norm_and_keeps_direction() {
        let mut m = module(vec![3.0, 0.0], vec![4.0]);
        let before = clip_grad_norm(&mut m, 1.0).unwrap();
        assert_eq!(before, 5.0);
        let after = grad_norm(&mut m);
        assert!((after - 1.0).abs() < 1e-6, "{after}");
        assert!((m.params[0].grad()[0] / m.params[1].grad()[0] - 0.75).abs() < 1e-6);
    }

    #[test]
    fn a_norm_below_the_limit_is_left_alone() {
        let mut m = module(vec![0.3], vec![0.4]);
        assert!((clip_grad_norm(&mut m, 1.0).unwrap() - 0.5).abs() < 1e-7);
        assert_eq!(m.params[0].grad(), vec![0.3]);
    }

    #[test]
    fn non_finite_norms_are_reported_without_touching_gradients() {
        let mut m = module(vec![f32::INFINITY, 1.0], vec![2.0]);
        assert_eq!(clip_grad_norm(&mut m, 1.0).unwrap(), f64::INFINITY);
        assert_eq!(m.params[1].grad(), vec![2.0]);
        let mut m = module(vec![f32::NAN], vec![f32::INFINITY]);
        assert!(clip_grad_norm(&mut m, 1.0).unwrap().is_nan());
        assert!(clip_grad_norm(&mut m, 0.0).is_err());
        assert!(clip_grad_norm(&mut m, f32::NAN).is_err());
    }
}
