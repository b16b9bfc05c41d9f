//! Hugging Face model directories: `config.json` (both dialects), memory-mapped
//! `model.safetensors` or sharded checkpoints with the fine-grained FP8 layout,
//! `tokenizer.json`, and the stop tokens of `generation_config.json`.
//!
//! ```no_run
//! use fp8_engine::hf::HfModelDir;
//!
//! let dir = HfModelDir::open("models/tiny-llama".as_ref())?;
//! println!("{:?}, {} parameters", dir.config.architecture, dir.config.parameter_count());
//! let embed = dir.read_f32("model.embed_tokens.weight")?; // bf16/f16/FP8 widened to f32
//! let ids = dir.tokenizer()?.encode("Hello", false)?;
//! # let _ = (embed, ids);
//! # Ok::<(), fp8_engine::Error>(())
//! ```

mod config;
mod fp8_export;
mod generation_config;
mod shards;
mod tokenizer;
mod weights;

use std::path::{Path, PathBuf};

pub use config::{Architecture, Fp8Quantization, HfConfig, RopeConfig, RopeScaling};
pub use fp8_export::{Fp8ExportSummary, HF_FP8_BLOCK, write_hf_fp8};
pub use generation_config::stop_ids;
pub use shards::{Shards, TensorEntry};
pub use tokenizer::{HfTokenizer, MAX_TOKENIZER_BYTES, TokenStream};
pub use weights::{ExpectedTensor, check_checkpoint, expected_tensors, read_f32, scale_inv_name};

use crate::error::{Error, Result};

/// `config.json` files above this are refused (published ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// An opened model directory whose checkpoint matches its config.
pub struct HfModelDir {
    /// The directory.
    pub dir: PathBuf,
    /// The parsed `config.json`.
    pub config: HfConfig,
    /// The memory-mapped tensors.
    pub shards: Shards,
}

impl HfModelDir {
    /// Reads `config.json`, maps the checkpoint and checks that it holds exactly the tensors the
    /// config needs (names, shapes, dtypes); nothing is converted yet.
    pub fn open(dir: &Path) -> Result<Self> {
        let config_path = dir.join("config.json");
        let bytes = crate::io::read_regular(&config_path, MAX_CONFIG_BYTES, "")?;
        let config = HfConfig::from_json(&String::from_utf8_lossy(&bytes)).map_err(|err| Error::InvalidFile {
            path: config_path.display().to_string(),
            reason: err.to_string(),
        })?;
        let shards = Shards::open_dir(dir)?;
        check_checkpoint(&shards, &config)?;
        Ok(HfModelDir {
            dir: dir.to_path_buf(),
            config,
            shards,
        })
    }

    /// Tensor `name` widened to f32 (its shape was checked at open).
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let shape = self.shards.entry(name)?.shape.clone();
        read_f32(&self.shards, &self.config, name, &shape)
    }

    /// The directory's tokenizer.
    pub fn tokenizer(&self) -> Result<HfTokenizer> {
        HfTokenizer::from_dir(&self.dir)
    }
}
