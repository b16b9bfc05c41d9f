//! Precision of a training run and how `auto` picks one per device.

use std::fmt;
use std::str::FromStr;

use crate::device::{Device, PrecisionPolicy};
use crate::error::{Error, Result};
use crate::scaling::{BlockScaling, CurrentScaling, DelayedScaling, Mxfp8Scaling, Recipe};
use crate::tensor::Dtype;

/// The FP8 scaling recipe of an FP8 run: `Delayed`, `Current`, `Block` or `Mxfp8`
/// (the crate's [`Recipe`] under the name the layers use).
pub type Fp8Recipe = Recipe;

/// How the GEMMs of a model compute. Norms, softmax, losses and reductions run in
/// f32 under every precision (`docs/numerics.md`, mixed precision); master weights and gradients are always f32.
#[derive(Clone, Debug, PartialEq)]
pub enum Precision {
    /// Plain f32 everywhere (the reference).
    Fp32,
    /// bf16 GEMM inputs and activations, f32 accumulation.
    Bf16,
    /// fp16 GEMM inputs and activations, f32 accumulation; needs dynamic loss scaling.
    Fp16,
    /// FP8 GEMM inputs (E4M3 forward, E5M2 or E4M3 backward per the recipe), bf16 activations.
    Fp8(Fp8Recipe),
}

/// Every name [`PrecisionChoice::from_str`] accepts, for messages.
pub const PRECISION_NAMES: &str = "auto, fp32, bf16, fp16, fp8-delayed, fp8-current, fp8-block, mxfp8";

impl Precision {
    /// `fp32`, `bf16`, `fp16`, `fp8-delayed`, `fp8-current`, `fp8-block` or `mxfp8`.
    pub fn name(&self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8(Recipe::Delayed(_)) => "fp8-delayed",
            Precision::Fp8(Recipe::Current(_)) => "fp8-current",
            Precision::Fp8(Recipe::Block(_)) => "fp8-block",
            Precision::Fp8(Recipe::Mxfp8(_)) => "mxfp8",
        }
    }

    /// The dtype activations are stored in: bf16 under FP8 and bf16, f16 under fp16, f32 under fp32.
    pub fn compute_dtype(&self) -> Dtype {
        match self {
            Precision::Fp32 => Dtype::F32,
            Precision::Fp16 => Dtype::F16,
            Precision::Bf16 | Precision::Fp8(_) => Dtype::Bf16,
        }
    }

    /// Whether training needs a dynamic loss scaler (fp16 only: its range is too narrow for gradients).
    pub fn needs_loss_scaling(&self) -> bool {
        matches!(self, Precision::Fp16)
    }

    /// Whether GEMMs run in FP8.
    pub fn is_fp8(&self) -> bool {
        matches!(self, Precision::Fp8(_))
    }

    /// The same precision without FP8 GEMMs (FP8 becomes bf16): for layers kept in high precision.
    pub fn without_fp8(&self) -> Precision {
        match self {
            Precision::Fp8(_) => Precision::Bf16,
            other => other.clone(),
        }
    }

    /// Checks the recipe's settings.
    pub fn validate(&self) -> Result<()> {
        match self {
            Precision::Fp8(recipe) => recipe.validate(),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;

    /// A fixed precision by name, each FP8 recipe with its default settings.
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            "fp8" | "fp8-delayed" => Ok(Precision::Fp8(Recipe::Delayed(DelayedScaling::default()))),
            "fp8-current" => Ok(Precision::Fp8(Recipe::Current(CurrentScaling::default()))),
            "fp8-block" => Ok(Precision::Fp8(Recipe::Block(BlockScaling::default()))),
            "mxfp8" => Ok(Precision::Fp8(Recipe::Mxfp8(Mxfp8Scaling::default()))),
            _ => Err(Error::UnknownPrecision {
                name: text.to_string(),
                expected: PRECISION_NAMES,
            }),
        }
    }
}

/// What the user asked for.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum PrecisionChoice {
    /// Pick by device: FP8 delayed scaling on sm_89+, bf16 on sm_80/86, fp16 on sm_75, FP8 on the CPU.
    #[default]
    Auto,
    /// This precision, or an error where the device cannot run it.
    Fixed(Precision),
}

impl FromStr for PrecisionChoice {
    type Err = Error;

    /// `auto` or a [`Precision`] name.
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "auto" => Ok(PrecisionChoice::Auto),
            _ => text.parse().map(PrecisionChoice::Fixed),
        }
    }
}

impl From<Precision> for PrecisionChoice {
    fn from(precision: Precision) -> Self {
        PrecisionChoice::Fixed(precision)
    }
}

/// The precision a compute capability can run, from the device capability table.
fn gpu_default(cc: (u32, u32)) -> Result<(Precision, &'static str)> {
    let (policy, why) = PrecisionPolicy::for_compute_capability(cc).ok_or_else(|| Error::PrecisionUnsupported {
        precision: "any".into(),
        device: format!("sm_{}{}", cc.0, cc.1),
        reason: "the engine needs sm_75 or newer (fp16 tensor cores)".into(),
    })?;
    let precision = match policy {
        PrecisionPolicy::Fp8Hybrid => Precision::Fp8(Recipe::Delayed(DelayedScaling::default())),
        PrecisionPolicy::Bf16 => Precision::Bf16,
        PrecisionPolicy::Fp16LossScaling => Precision::Fp16,
    };
    Ok((precision, why))
}

/// The precision to train in on `device`, and why it was chosen (for the log).
///
/// On the CPU every precision is emulated, so a fixed choice is taken as is and
/// `auto` means FP8 delayed scaling. On a GPU, `auto` follows the capability
/// table; a fixed FP8 choice on a GPU without FP8 tensor cores, or bf16 below
/// sm_80, is an error.
pub fn resolve(choice: &PrecisionChoice, device: &Device) -> Result<(Precision, String)> {
    let cc = match device {
        Device::Cpu(_) => None,
        Device::Cuda(gpu) => Some(gpu.info().compute_capability),
    };
    resolve_for(choice, cc)
}

/// [`resolve`] for a compute capability (`None`: the CPU backend).
pub fn resolve_for(choice: &PrecisionChoice, cc: Option<(u32, u32)>) -> Result<(Precision, String)> {
    match (choice, cc) {
        (PrecisionChoice::Auto, None) => Ok((
            Precision::Fp8(Recipe::Delayed(DelayedScaling::default())),
            "auto on the CPU backend: FP8 delayed scaling, emulated bit-exactly".into(),
        )),
        (PrecisionChoice::Auto, Some(cc)) => {
            let (precision, why) = gpu_default(cc)?;
            Ok((
                precision.clone(),
                format!("auto on sm_{}{}: {} ({why})", cc.0, cc.1, precision.name()),
            ))
        }
        (PrecisionChoice::Fixed(precision), None) => {
            precision.validate()?;
            Ok((
                precision.clone(),
                format!("{} as asked (CPU backend, emulated)", precision.name()),
            ))
        }
        (PrecisionChoice::Fixed(precision), Some(cc)) => {
            precision.validate()?;
            let (best, why) = gpu_default(cc)?;
            let device = format!("sm_{}{}", cc.0, cc.1);
            let unsupported = |reason: String| Error::PrecisionUnsupported {
                precision: precision.name().into(),
                device: device.clone(),
                reason,
            };
            match precision {
                Precision::Fp8(recipe) => {
                    if !best.is_fp8() {
                        return Err(unsupported(format!("no FP8 tensor cores ({why}); use {}", best.name())));
                    }
                    if matches!(recipe, Recipe::Mxfp8(_)) && cc.0 < 10 {
                        return Err(unsupported("MXFP8 needs Blackwell (sm_100 or newer)".into()));
                    }
                }
                Precision::Bf16 if best == Precision::Fp16 => {
                    return Err(unsupported(format!("no bf16 tensor cores ({why}); use fp16")));
                }
                _ => {}
            }
            Ok((precision.clone(), format!("{} as asked on {device}", precision.name())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(name: &str) -> PrecisionChoice {
        name.parse().unwrap()
    }

    #[test]
    fn names_round_trip() {
        for name in [
            "fp32",
            "bf16",
            "fp16",
            "fp8-delayed",
            "fp8-current",
            "fp8-block",
            "mxfp8",
        ] {
            let precision: Precision = name.parse().unwrap();
            assert_eq!(precision.name(), name);
        }
        assert_eq!(fixed("auto"), PrecisionChoice::Auto);
        let err = "fp4".parse::<PrecisionChoice>().unwrap_err().to_string();
        assert!(err.contains("fp4") && err.contains("mxfp8"), "{err}");
    }

    #[test]
    fn auto_follows_the_capability_table() {
        let pick = |cc| resolve_for(&PrecisionChoice::Auto, cc).unwrap().0.name();
        assert_eq!(pick(Some((9, 0))), "fp8-delayed");
        assert_eq!(pick(Some((8, 9))), "fp8-delayed");
        assert_eq!(pick(Some((8, 6))), "bf16");
        assert_eq!(pick(Some((8, 0))), "bf16");
        assert_eq!(pick(Some((7, 5))), "fp16");
        assert_eq!(pick(None), "fp8-delayed");
        assert!(resolve_for(&PrecisionChoice::Auto, Some((7, 0))).is_err());
    }

    #[test]
    fn fp8_on_a_gpu_without_fp8_is_an_error_naming_it() {
        let err = resolve_for(&fixed("fp8-current"), Some((8, 0)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("fp8-current") && err.contains("sm_80"), "{err}");
        assert!(resolve_for(&fixed("bf16"), Some((7, 5))).is_err());
        assert!(resolve_for(&fixed("mxfp8"), Some((9, 0))).is_err());
        assert!(resolve_for(&fixed("mxfp8"), Some((10, 0))).is_ok());
        // The CPU emulates everything.
        assert_eq!(resolve_for(&fixed("fp16"), None).unwrap().0, Precision::Fp16);
    }

    #[test]
    fn dtypes_and_loss_scaling() {
        assert_eq!(fixed_precision("fp8-block").compute_dtype(), Dtype::Bf16);
        assert_eq!(fixed_precision("fp16").compute_dtype(), Dtype::F16);
        assert_eq!(fixed_precision("fp32").compute_dtype(), Dtype::F32);
        assert!(fixed_precision("fp16").needs_loss_scaling());
        assert!(!fixed_precision("bf16").needs_loss_scaling());
    }

    fn fixed_precision(name: &str) -> Precision {
        name.parse().unwrap()
    }
}
