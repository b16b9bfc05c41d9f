//! `fp8 train --init-from DIR --text FILE`: the data and checks of a fine-tune of a loaded
//! Hugging Face model (the loop itself is the one `fp8 train` runs for its own model).

use std::path::{Path, PathBuf};

use fp8_engine::amp::Precision;
use fp8_engine::data::Dataset;
use fp8_engine::data::token_windows::{DataOrder, TokenWindows};
use fp8_engine::hf::HfModelDir;
use fp8_engine::model::{LlamaModel, LoraConfig, read_adapter_config};
use fp8_engine::nn::LoraSettings;
use fp8_engine::plan::{BasePrecision, LoraPlan};
use fp8_engine::tensor::Dtype;
use fp8_engine::train::gpu_preflight::GpuNeed;
use fp8_engine::train::session::RunConfig;

use crate::base_args::BaseArgs;
use crate::error::CliError;

/// How the fine-tuning text is cut and ordered (`--seq`, `--data-order`, `--seed`, `--max-text-bytes`).
pub struct TextWindows<'a> {
    pub seq: usize,
    pub order: &'a str,
    pub seed: u64,
    pub max_bytes: u64,
}

/// The text of `path` tokenized by the model's tokenizer without special tokens, in windows.
pub fn token_data(path: &Path, hf: &HfModelDir, w: &TextWindows) -> Result<Dataset, CliError> {
    let order: DataOrder = w.order.parse()?;
    let bytes = fp8_engine::io::read_regular(path, w.max_bytes, " (raise it with --max-text-bytes)")?;
    let text = String::from_utf8(bytes).map_err(|err| {
        CliError(format!(
            "{}: not UTF-8 text (byte {})",
            path.display(),
            err.utf8_error().valid_up_to()
        ))
    })?;
    let ids = hf.tokenizer()?.encode(&text, false)?;
    let source = format!("{} tokenized by {}", path.display(), hf.config.architecture.hf_name());
    let windows = TokenWindows::new(&ids, w.seq, hf.config.vocab_size, order, w.seed, source)?;
    Ok(Dataset::Tokens(windows))
}

/// Batch shapes under every precision and the memory the fine-tune needs (planned with its base
/// precision and adapters, as `fp8 plan` plans them) against the host's; returns what it needs
/// on a GPU, planned the same way (`train::gpu_preflight`).
pub fn preflight(
    precisions: &[Precision],
    config: &RunConfig,
    data: &Dataset,
    hf: &HfModelDir,
    base: &BaseArgs,
    lora: &LoraArgs,
) -> Result<Vec<GpuNeed>, CliError> {
    let held = held(hf, base, lora)?;
    let (base, lora, frozen) = held.clone();
    fp8_engine::train::preflight::check_fine_tune(precisions, config, data, &hf.config, base, lora, frozen)?;
    Ok(fp8_engine::train::gpu_preflight::fine_tune_needs(
        precisions, config, data, &hf.config, held,
    )?)
}

/// How the fine-tune holds its base, as the planner takes it: base precision, adapters, frozen
/// dtype.
fn held(
    hf: &HfModelDir,
    base: &BaseArgs,
    lora: &LoraArgs,
) -> Result<(BasePrecision, Option<LoraPlan>, Dtype), CliError> {
    Ok((base.plan_base()?, lora.plan()?, base.planned_frozen_dtype(&hf.config)?))
}

/// `--lora-rank R [--lora-alpha A] [--lora-dropout P] [--lora-targets LIST]` or `--lora-from DIR`.
#[derive(clap::Args, Debug, Clone)]
pub struct LoraArgs {
    /// Train LoRA adapters of this rank on --lora-targets, every other weight frozen (no
    /// gradient, no optimizer state); under FP8 the rank must be a multiple of 16. The adapters
    /// are written in PEFT's layout to OUT/PRECISION/adapter; --save-hf writes the merged model.
    #[arg(long, value_name = "R", requires = "init_from", conflicts_with = "lora_from")]
    lora_rank: Option<usize>,
    /// LoRA alpha: the update is scaled by alpha / rank (default: the rank, a scale of 1).
    #[arg(long, value_name = "A", requires = "lora_rank")]
    lora_alpha: Option<f32>,
    /// LoRA dropout on the adapters' input during training (masks drawn from --seed).
    #[arg(long, value_name = "P", default_value_t = 0.0, requires = "lora_rank")]
    lora_dropout: f32,
    /// Projections that get adapters, comma-separated: q_proj, k_proj, v_proj, o_proj,
    /// gate_proj, up_proj, down_proj.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "q_proj,k_proj,v_proj,o_proj",
        requires = "lora_rank"
    )]
    lora_targets: String,
    /// Continue training the LoRA adapters of this PEFT directory (its rank, alpha, dropout
    /// and targets).
    #[arg(long, value_name = "DIR", requires = "init_from")]
    lora_from: Option<PathBuf>,
}

impl LoraArgs {
    /// The adapters the flags ask for, as the planner counts them.
    pub fn plan(&self) -> Result<Option<LoraPlan>, CliError> {
        if let Some(dir) = &self.lora_from {
            let lora = read_adapter_config(dir)?;
            return Ok(Some(LoraPlan {
                rank: lora.settings.rank,
                targets: lora.targets,
            }));
        }
        let Some(rank) = self.lora_rank else {
            return Ok(None);
        };
        Ok(Some(LoraPlan {
            rank,
            targets: fp8_engine::plan::parse_targets(&self.lora_targets)?,
        }))
    }

    /// Adds the adapters the flags ask for to `model` (freezing the rest), seeded by `seed`;
    /// returns their configuration, or `None` for a full fine-tune.
    pub fn attach(&self, model: &mut LlamaModel, seed: u64) -> Result<Option<LoraConfig>, CliError> {
        if let Some(dir) = &self.lora_from {
            return Ok(Some(model.load_adapter(dir)?));
        }
        let Some(rank) = self.lora_rank else {
            return Ok(None);
        };
        let settings = LoraSettings {
            rank,
            alpha: self.lora_alpha.unwrap_or(rank as f32),
            dropout: self.lora_dropout,
        };
        let lora = LoraConfig::new(settings, &self.lora_targets)?;
        model.enable_lora(&lora, seed)?;
        Ok(Some(lora))
    }
}
