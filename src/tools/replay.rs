//! `fp8 recipe replay`: runs the delayed-scaling update (`docs/numerics.md`, delayed scaling) over an
//! amax trace, one amax per training step, and reports the scale in force
//! after each step's update. Used to choose a history length and algorithm
//! from the amax trace of a real run.

use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::scaling::{DelayedScaling, DelayedSlot};

/// One step of a replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayStep {
    /// Step number, counting from 1.
    pub step: usize,
    /// The step's amax, as read.
    pub amax: f32,
    /// The scale after this step's update: the one step `step + 1` casts with.
    pub scale: f32,
}

/// Parses a trace: one amax per line (`nan`, `inf`, `0` and any f32 decimal
/// accepted, surrounding spaces ignored); blank lines and lines starting with
/// `#` are skipped. A negative amax or a non-number is an error naming the line.
pub fn parse_amax_trace(text: &str) -> Result<Vec<f32>> {
    let mut amaxes = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let invalid = |reason| Error::InvalidLine {
            line: index + 1,
            text: trimmed.to_string(),
            reason,
        };
        let amax: f32 = trimmed.parse().map_err(|_| invalid("not a number"))?;
        if amax < 0.0 {
            return Err(invalid("an amax is a magnitude and cannot be negative"));
        }
        amaxes.push(amax);
    }
    Ok(amaxes)
}

/// Replays `amaxes` through one delayed-scaling slot of `format` under
/// `recipe` (validated first). Step N's amax lands in `history[0]`, then the
/// update runs, exactly as after a forward or backward pass.
pub fn replay(recipe: &DelayedScaling, format: Fp8Format, amaxes: &[f32]) -> Result<Vec<ReplayStep>> {
    recipe.validate()?;
    let mut slot = DelayedSlot::new(recipe.amax_history_len);
    Ok(amaxes
        .iter()
        .enumerate()
        .map(|(index, &amax)| {
            slot.set_current_amax(amax);
            slot.update(recipe, format);
            ReplayStep {
                step: index + 1,
                amax,
                scale: slot.scale,
            }
        })
        .collect())
}

/// One line per step, `step amax scale`, numbers in Rust's shortest
/// round-trip form (`{}`), so each parses back to the same f32.
pub fn render(steps: &[ReplayStep]) -> String {
    let mut out = String::with_capacity(steps.len() * 24);
    for s in steps {
        out.push_str(&format!("{} {} {}\n", s.step, s.amax, s.scale));
    }
    out
}
