//! Learning-rate schedules: constant or cosine decay, both after an optional
//! linear warmup. Computed in f64 and rounded to f32 once.
//!
//! Steps count from 0. During warmup (`step < warmup_steps`) the rate climbs
//! linearly to the peak: `peak * (step + 1) / warmup_steps`, so step 0 already
//! moves the weights. Cosine then decays from the peak to `min_lr` at
//! `total_steps` and stays there.

use std::f64::consts::PI;
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The shape of the schedule after warmup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// The peak rate throughout.
    Constant,
    /// Half a cosine period from the peak down to `min_lr`.
    Cosine,
}

impl FromStr for ScheduleKind {
    type Err = Error;

    /// `constant` or `cosine` (case-insensitive).
    fn from_str(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "constant" => Ok(ScheduleKind::Constant),
            "cosine" => Ok(ScheduleKind::Cosine),
            _ => Err(Error::InvalidSetting {
                setting: "lr schedule",
                value: text.to_string(),
                reason: "expected constant or cosine".to_string(),
            }),
        }
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScheduleKind::Constant => "constant",
            ScheduleKind::Cosine => "cosine",
        })
    }
}

/// A learning rate for every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// Constant or cosine.
    pub kind: ScheduleKind,
    /// The rate at the end of warmup.
    pub peak_lr: f32,
    /// Steps of linear warmup (0: none).
    pub warmup_steps: u64,
    /// Length of the run; cosine reaches `min_lr` here.
    pub total_steps: u64,
    /// Floor of the cosine decay.
    pub min_lr: f32,
}

impl LrSchedule {
    /// A checked schedule: finite rates with `0 <= min_lr <= peak_lr`, `warmup_steps <= total_steps`.
    pub fn new(kind: ScheduleKind, peak_lr: f32, warmup_steps: u64, total_steps: u64, min_lr: f32) -> Result<Self> {
        let invalid = |setting: &'static str, value: String, reason: &str| {
            Err(Error::InvalidSetting {
                setting,
                value,
                reason: reason.to_string(),
            })
        };
        if !(peak_lr.is_finite() && peak_lr >= 0.0) {
            return invalid("lr", peak_lr.to_string(), "must be finite and >= 0");
        }
        if !(min_lr.is_finite() && min_lr >= 0.0 && min_lr <= peak_lr) {
            return invalid("min_lr", min_lr.to_string(), "must be finite, >= 0 and <= the peak lr");
        }
        if warmup_steps > total_steps {
            return invalid(
                "warmup_steps",
                warmup_steps.to_string(),
                &format!("must not exceed the total of {total_steps} steps"),
            );
        }
        Ok(LrSchedule {
            kind,
            peak_lr,
            warmup_steps,
            total_steps,
            min_lr,
        })
    }

    /// The rate of step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f32 {
        let peak = self.peak_lr as f64;
        if step < self.warmup_steps {
            return (peak * (step + 1) as f64 / self.warmup_steps as f64) as f32;
        }
        match self.kind {
            ScheduleKind::Constant => self.peak_lr,
            ScheduleKind::Cosine => {
                let span = (self.total_steps - self.warmup_steps).max(1) as f64;
                let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
                let min = self.min_lr as f64;
                (min + 0.5 * (peak - min) * (1.0 + (PI * progress).cos())) as f32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names() {
        assert_eq!("cosine".parse::<ScheduleKind>().unwrap(), ScheduleKind::Cosine);
        assert_eq!("Constant".parse::<ScheduleKind>().unwrap(), ScheduleKind::Constant);
        assert!(matches!(
            "linear".parse::<ScheduleKind>(),
            Err(Error::InvalidSetting { .. })
        ));
        assert_eq!(
            ScheduleKind::Cosine.to_string().parse::<ScheduleKind>().unwrap(),
            ScheduleKind::Cosine
        );
    }

    #[test]
    fn constant_with_warmup_ramps_then_holds() {
        let s = LrSchedule::new(ScheduleKind::Constant, 0.4, 4, 100, 0.0).unwrap();
        let lrs: Vec<f32> = (0..6).map(|t| s.lr_at(t)).collect();
        assert_eq!(lrs, vec![0.1, 0.2, 0.3, 0.4, 0.4, 0.4]);
        assert_eq!(s.lr_at(1000), 0.4);
    }

    #[test]
    fn cosine_starts_at_the_peak_passes_the_midpoint_and_ends_at_the_floor() {
        let s = LrSchedule::new(ScheduleKind::Cosine, 1.0, 10, 110, 0.1).unwrap();
        assert_eq!(s.lr_at(9), 1.0);
        assert_eq!(s.lr_at(10), 1.0);
        assert!((s.lr_at(60) - 0.55).abs() < 1e-6, "{}", s.lr_at(60));
        assert!((s.lr_at(110) - 0.1).abs() < 1e-7);
        assert!((s.lr_at(500) - 0.1).abs() < 1e-7);
        for t in 10..110 {
            assert!(s.lr_at(t + 1) <= s.lr_at(t), "not decreasing at {t}");
        }
    }

    #[test]
    fn cosine_without_warmup_or_length_does_not_divide_by_zero() {
        let s = LrSchedule::new(ScheduleKind::Cosine, 1.0, 0, 0, 0.0).unwrap();
        assert_eq!(s.lr_at(0), 1.0);
        assert!(s.lr_at(1).abs() < 1e-7);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(LrSchedule::new(ScheduleKind::Cosine, f32::NAN, 0, 10, 0.0).is_err());
        assert!(LrSchedule::new(ScheduleKind::Cosine, 0.1, 0, 10, 0.2).is_err());
        assert!(LrSchedule::new(ScheduleKind::Cosine, 0.1, 11, 10, 0.0).is_err());
        assert!(LrSchedule::new(ScheduleKind::Constant, -0.1, 0, 10, 0.0).is_err());
    }
}
