//! `--base-precision fp8|bf16 [--base-scaling block|tensor]`: how the linear weights of a loaded
//! Hugging Face model are held, shared by `fp8 train --init-from`, `fp8 eval` and `fp8 generate`.

use fp8_engine::amp::Precision;
use fp8_engine::hf::{HfConfig, HfModelDir};
use fp8_engine::model::{FrozenDtype, LlamaModel, Recompute};
use fp8_engine::nn::BaseScaling;
use fp8_engine::plan::BasePrecision;
use fp8_engine::tensor::Dtype;

use crate::error::CliError;

/// The flags; both optional so that a scaling given without an FP8 base is caught, not ignored.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BaseArgs {
    /// How the decoder's linear weights are held: fp8 loads each one straight into E4M3 codes
    /// (tensor by tensor, no f32 copy kept; an HF FP8 checkpoint is used as stored) and freezes
    /// it; bf16 (the default) keeps the checkpoint's values as every run does.
    #[arg(long, value_name = "fp8|bf16")]
    base_precision: Option<String>,
    /// Scales of the FP8 base: block (128x128 blocks, the HF layout; the default) or tensor (one
    /// per tensor). Only with --base-precision fp8.
    #[arg(long, value_name = "block|tensor")]
    base_scaling: Option<String>,
    /// How frozen embeddings, norms and head are held: checkpoint (the default: at the width of
    /// their checkpoint tensors, 2 bytes a value for bf16 or fp16, f32 tensors stay f32) or f32.
    /// The values are the same either way; trained ones keep f32 masters.
    #[arg(long, value_name = "checkpoint|f32")]
    frozen_dtype: Option<String>,
}

impl BaseArgs {
    /// Whether either flag was given.
    pub fn given(&self) -> bool {
        self.base_precision.is_some() || self.base_scaling.is_some() || self.frozen_dtype.is_some()
    }

    /// `--frozen-dtype`, checkpoint when not given.
    pub fn frozen_dtype(&self) -> Result<FrozenDtype, CliError> {
        Ok(self
            .frozen_dtype
            .as_deref()
            .map(str::parse)
            .transpose()?
            .unwrap_or_default())
    }

    /// The dtype the planner assumes for frozen embeddings, norms and head of a model of `config`.
    pub fn planned_frozen_dtype(&self, config: &HfConfig) -> Result<Dtype, CliError> {
        Ok(self.frozen_dtype()?.planned(config))
    }

    /// Holds the frozen embeddings, norms and head of `model`, loaded from `hf`, as
    /// `--frozen-dtype` says (after LoRA froze them, or evaluation did).
    pub fn hold_frozen(&self, model: &mut LlamaModel, hf: &HfModelDir) -> Result<(), CliError> {
        model.hold_frozen(hf, self.frozen_dtype()?)?;
        Ok(())
    }

    /// The planner's view of the flags; a `--base-scaling` without `--base-precision fp8` is an
    /// error naming both flags.
    pub fn plan_base(&self) -> Result<BasePrecision, CliError> {
        let base = match self.base_precision.as_deref() {
            Some("fp8") => BasePrecision::Fp8,
            Some("bf16") | None => BasePrecision::Same,
            Some(other) => return Err(CliError(format!("--base-precision {other}: expected fp8 or bf16"))),
        };
        if let (Some(scaling), BasePrecision::Same) = (&self.base_scaling, base) {
            return Err(CliError(format!(
                "--base-scaling {scaling} sets the scales of an FP8 base and needs --base-precision fp8 (the base is {})",
                self.base_precision.as_deref().unwrap_or("bf16, the default")
            )));
        }
        Ok(base)
    }

    /// The FP8 base's scaling, or `None` for the base as loaded.
    pub fn fp8_scaling(&self) -> Result<Option<BaseScaling>, CliError> {
        if self.plan_base()? == BasePrecision::Same {
            return Ok(None);
        }
        let scaling = match &self.base_scaling {
            Some(text) => text.parse()?,
            None => BaseScaling::default(),
        };
        Ok(Some(scaling))
    }

    /// Loads `hf` for `precision` with the base these flags ask for; `tool` prefixes the line
    /// on stderr that says what an FP8 base load did.
    pub fn load(
        &self,
        hf: &HfModelDir,
        precision: &Precision,
        recompute: Recompute,
        tool: &str,
    ) -> Result<LlamaModel, CliError> {
        match self.fp8_scaling()? {
            None => Ok(LlamaModel::from_hf(hf, precision, recompute)?),
            Some(scaling) => {
                let (model, report) = LlamaModel::from_hf_fp8_base(hf, precision, recompute, scaling)?;
                eprintln!(
                    "{tool}: FP8 base ({} scales): {} tensors quantized at load, {} used as stored, {:.1} MiB of codes \
                     and scales, at most {} values in f32 at once",
                    scaling.name(),
                    report.quantized,
                    report.used_as_stored,
                    report.fp8_bytes as f64 / (1 << 20) as f64,
                    report.peak_f32_values
                );
                Ok(model)
            }
        }
    }
}
