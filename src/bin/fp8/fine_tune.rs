//! `fp8 train --init-from DIR --text FILE`: the data and checks of a fine-tune of a loaded
//! Hugging Face model (the loop itself is the one `fp8 train` runs for its own model).

use std::path::Path;

use fp8_engine::amp::Precision;
use fp8_engine::data::Dataset;
use fp8_engine::data::token_windows::{DataOrder, TokenWindows};
use fp8_engine::hf::HfModelDir;
use fp8_engine::train::session::RunConfig;

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

/// Batch shapes under every precision and the memory the fine-tune needs.
pub fn preflight(
    precisions: &[Precision],
    config: &RunConfig,
    data: &Dataset,
    hf: &HfModelDir,
) -> Result<(), CliError> {
    fp8_engine::train::preflight::check_fine_tune(precisions, config, data, &hf.config)?;
    Ok(())
}
