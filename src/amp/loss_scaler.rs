//! Dynamic loss scaling (`docs/training.md`, dynamic loss scaling): the loss is multiplied by `scale` before
//! backward so small fp16 gradients do not flush to zero; the gradients are
//! divided by it again before clipping and the optimizer step.
//!
//! * Start at 2^16. After `growth_interval` (2000) consecutive finite steps the
//!   scale doubles (only if the result is finite).
//! * A step whose gradients hold an inf or NaN is skipped and the scale halves,
//!   the growth tracker restarts at zero.
//! * On for the fp16 policy; bf16, FP8 and f32 may use it too. Disabled, the
//!   scale is 1 and no step is ever skipped.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Settings of a [`DynamicLossScaler`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScalerConfig {
    /// Scale of the first step.
    pub init_scale: f32,
    /// Multiplier after `growth_interval` finite steps in a row.
    pub growth_factor: f32,
    /// Multiplier after a step with inf/NaN gradients.
    pub backoff_factor: f32,
    /// Consecutive finite steps before the scale grows.
    pub growth_interval: u32,
}

impl Default for LossScalerConfig {
    /// The documented values: 2^16, x2, x0.5, every 2000 steps.
    fn default() -> Self {
        LossScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl LossScalerConfig {
    /// Checks the ranges: finite scale > 0, growth > 1, backoff in (0, 1), interval >= 1.
    pub fn validate(&self) -> Result<()> {
        let invalid = |setting: &'static str, value: String, reason: &str| {
            Err(Error::InvalidSetting {
                setting,
                value,
                reason: reason.to_string(),
            })
        };
        if !(self.init_scale.is_finite() && self.init_scale > 0.0) {
            return invalid("init_scale", self.init_scale.to_string(), "must be finite and > 0");
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return invalid(
                "growth_factor",
                self.growth_factor.to_string(),
                "must be finite and > 1",
            );
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return invalid("backoff_factor", self.backoff_factor.to_string(), "must be in (0, 1)");
        }
        if self.growth_interval == 0 {
            return invalid("growth_interval", "0".to_string(), "must be >= 1");
        }
        Ok(())
    }
}

/// What a checkpoint saves of a scaler (scale and growth tracker).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScalerState {
    /// Whether scaling is on.
    pub enabled: bool,
    /// The current scale (exact through JSON).
    #[serde(with = "crate::scaling::exact_f32")]
    pub scale: f32,
    /// Consecutive finite steps since the last change of scale.
    pub growth_tracker: u32,
}

/// The scaler: settings plus its state.
#[derive(Clone, Debug, PartialEq)]
pub struct DynamicLossScaler {
    config: LossScalerConfig,
    state: LossScalerState,
}

impl DynamicLossScaler {
    /// An enabled scaler at `config.init_scale`.
    pub fn new(config: LossScalerConfig) -> Result<Self> {
        config.validate()?;
        Ok(DynamicLossScaler {
            config,
            state: LossScalerState {
                enabled: true,
                scale: config.init_scale,
                growth_tracker: 0,
            },
        })
    }

    /// A scaler that does nothing: scale 1, gradients untouched, no step ever skipped.
    pub fn disabled() -> Self {
        DynamicLossScaler {
            config: LossScalerConfig::default(),
            state: LossScalerState {
                enabled: false,
                scale: 1.0,
                growth_tracker: 0,
            },
        }
    }

    /// Whether scaling is on.
    pub fn is_enabled(&self) -> bool {
        self.state.enabled
    }

    /// What the loss is multiplied by before backward (the seed of the backward pass).
    pub fn scale(&self) -> f32 {
        self.state.scale
    }

    /// The settings.
    pub fn config(&self) -> &LossScalerConfig {
        &self.config
    }

    /// The state, for checkpoints.
    pub fn state(&self) -> LossScalerState {
        self.state
    }

    /// Restores a saved state; a scale that is not finite and positive is an error.
    pub fn set_state(&mut self, state: LossScalerState) -> Result<()> {
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(Error::InvalidScale { value: state.scale });
        }
        self.state = state;
        Ok(())
    }

    /// Multiplies every value of `grad` (one parameter's gradient) by `1/scale` (rounded once, in
    /// f64 then to f32, like PyTorch) and says whether all of them are finite. Call it on every
    /// gradient of the model before the step. Disabled: touches nothing and returns true.
    pub fn unscale_and_check(&self, grad: &mut [f32]) -> bool {
        if !self.state.enabled {
            return true;
        }
        let inv_scale = (1.0 / self.state.scale as f64) as f32;
        let mut finite = true;
        for g in grad {
            *g *= inv_scale;
            finite &= g.is_finite();
        }
        finite
    }

    /// `1/scale` as [`Self::unscale_and_check`] multiplies by; `None` when disabled.
    pub fn inv_scale(&self) -> Option<f32> {
        self.state.enabled.then(|| (1.0 / self.state.scale as f64) as f32)
    }

    /// Ends a step: backs off after inf/NaN gradients (the caller skipped the step), otherwise
    /// counts a finite step and grows the scale after `growth_interval` of them.
    pub fn update(&mut self, found_inf: bool) {
        if !self.state.enabled {
            return;
        }
        let c = &self.config;
        if found_inf {
            // The floor keeps 1/scale finite after a very long run of bad steps.
            self.state.scale = (self.state.scale * c.backoff_factor).max(f32::MIN_POSITIVE);
            self.state.growth_tracker = 0;
            return;
        }
        self.state.growth_tracker += 1;
        if self.state.growth_tracker >= c.growth_interval {
            let grown = self.state.scale * c.growth_factor;
            if grown.is_finite() {
                self.state.scale = grown;
            }
            self.state.growth_tracker = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn config(interval: u32) -> LossScalerConfig {
        LossScalerConfig {
            growth_interval: interval,
            ..LossScalerConfig::default()
        }
    }

    #[test]
    fn defaults_are_the_spec_values() {
        let s = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        assert_eq!(s.scale(), 65536.0);
        assert_eq!(s.config().growth_factor, 2.0);
        assert_eq!(s.config().backoff_factor, 0.5);
        assert_eq!(s.config().growth_interval, 2000);
    }

    #[test]
    fn grows_after_exactly_the_interval_of_finite_steps() {
        let mut s = DynamicLossScaler::new(config(3)).unwrap();
        for step in 1..=7 {
            s.update(false);
            let growths = step / 3;
            assert_eq!(s.scale(), 65536.0 * 2f32.powi(growths), "after {step} finite steps");
        }
    }

    #[test]
    fn inf_backs_off_and_restarts_the_growth_count() {
        let mut s = DynamicLossScaler::new(config(3)).unwrap();
        s.update(false);
        s.update(false);
        s.update(true);
        assert_eq!(s.scale(), 32768.0);
        assert_eq!(s.state().growth_tracker, 0);
        s.update(false);
        s.update(false);
        assert_eq!(
            s.scale(),
            32768.0,
            "two finite steps after a backoff are not an interval"
        );
        s.update(false);
        assert_eq!(s.scale(), 65536.0);
    }

    #[test]
    fn unscale_divides_and_reports_inf_and_nan() {
        let s = DynamicLossScaler::new(config(10)).unwrap();
        let mut g = vec![65536.0, -131072.0, 3.0];
        assert!(s.unscale_and_check(&mut g));
        assert_eq!(g, vec![1.0, -2.0, 3.0 / 65536.0]);
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            let mut g = vec![1.0, bad, 4.0];
            assert!(!s.unscale_and_check(&mut g));
            assert_eq!(g[2], 4.0 / 65536.0, "values after a non-finite one are unscaled too");
        }
    }

    #[test]
    fn a_huge_initial_scale_backs_off_until_the_fp16_gradients_are_finite() {
        // fp16 gradients of a scaled loss: true gradient 3.0 times the scale overflows fp16
        // (max 65504) until scale * 3 <= 65504, i.e. scale <= 2^14 for powers of two.
        let mut s = DynamicLossScaler::new(LossScalerConfig {
            init_scale: 2f32.powi(40),
            ..config(2000)
        })
        .unwrap();
        let true_grad = [3.0f32, -0.5, 1e-3];
        let mut skipped = 0;
        loop {
            let scaled: Vec<f32> = true_grad
                .iter()
                .map(|g| f16::from_f32(g * s.scale()).to_f32())
                .collect();
            let mut g = scaled;
            let finite = s.unscale_and_check(&mut g);
            s.update(!finite);
            if finite {
                for (got, want) in g.iter().zip(true_grad) {
                    assert!((got - want).abs() <= want.abs() * 1e-3, "{got} vs {want}");
                }
                break;
            }
            skipped += 1;
            assert!(skipped < 100, "never became finite");
        }
        // Independent count: halvings from 2^40 until 3 * scale fits in fp16.
        let mut scale = 2f64.powi(40);
        let mut expected = 0;
        while 3.0 * scale > 65504.0 {
            scale /= 2.0;
            expected += 1;
        }
        assert_eq!(skipped, expected);
        assert_eq!(s.scale() as f64, scale);
    }

    #[test]
    fn disabled_is_scale_one_and_never_skips() {
        let mut s = DynamicLossScaler::disabled();
        let mut g = vec![f32::NAN, 2.0];
        assert!(s.unscale_and_check(&mut g));
        assert_eq!(g[1], 2.0);
        s.update(true);
        assert_eq!(s.scale(), 1.0);
        assert!(!s.is_enabled());
    }

    #[test]
    fn growth_stops_below_infinity_and_state_round_trips() {
        let mut s = DynamicLossScaler::new(LossScalerConfig {
            init_scale: f32::MAX,
            ..config(1)
        })
        .unwrap();
        s.update(false);
        assert_eq!(s.scale(), f32::MAX);
        let json = serde_json::to_string(&s.state()).unwrap();
        let back: LossScalerState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s.state());
        let mut t = DynamicLossScaler::new(config(1)).unwrap();
        t.set_state(back).unwrap();
        assert_eq!(t.state(), s.state());
        assert_eq!(t.scale(), f32::MAX);
        assert!(t.set_state(LossScalerState { scale: 0.0, ..back }).is_err());
    }

    #[test]
    fn bad_settings_are_errors() {
        for c in [
            LossScalerConfig {
                init_scale: 0.0,
                ..config(1)
            },
            LossScalerConfig {
                growth_factor: 1.0,
                ..config(1)
            },
            LossScalerConfig {
                backoff_factor: 1.0,
                ..config(1)
            },
            config(0),
        ] {
            assert!(DynamicLossScaler::new(c).is_err());
        }
    }
}
