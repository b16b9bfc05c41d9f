//! The training data of a run: the built-in addition task or a text file, behind one type.

use std::path::Path;

use super::addition::{AdditionConfig, AdditionTask};
use super::text::TextDataset;
use super::token_windows::TokenWindows;
use super::{Batch, DataStream};
use crate::error::Result;

/// Where a run's batches come from.
#[derive(Clone, Debug)]
pub enum Dataset {
    /// The seeded multi-digit addition task (exact-match accuracy on its held-out split).
    Addition(AdditionTask),
    /// Character-level text (held-out tail; no accuracy).
    Text(TextDataset),
    /// A text tokenized by a model's tokenizer, for fine-tuning (held out: every window).
    Tokens(TokenWindows),
}

impl Dataset {
    /// The addition task fixed by `config` and `seed`.
    pub fn addition(config: AdditionConfig, seed: u64) -> Result<Self> {
        AdditionTask::new(config, seed).map(Dataset::Addition)
    }

    /// Windows of `seq` characters of the file at `path`, its last 10% held out.
    pub fn text(path: &Path, seq: usize) -> Result<Self> {
        TextDataset::from_file(path, seq, 0.1).map(Dataset::Text)
    }

    /// [`Dataset::text`] reading at most `max_bytes` of the file.
    pub fn text_limited(path: &Path, seq: usize, max_bytes: u64) -> Result<Self> {
        TextDataset::from_file_limited(path, seq, 0.1, max_bytes).map(Dataset::Text)
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        match self {
            Dataset::Addition(t) => t.vocab_size(),
            Dataset::Text(t) => t.vocab_size(),
            Dataset::Tokens(t) => t.vocab_size(),
        }
    }

    /// Tokens per sequence.
    pub fn seq_len(&self) -> usize {
        match self {
            Dataset::Addition(t) => t.seq_len(),
            Dataset::Text(t) => t.seq_len(),
            Dataset::Tokens(t) => t.seq_len(),
        }
    }

    /// The next `batch` training sequences from `stream`.
    pub fn train_batch(&self, stream: &mut DataStream, batch: usize) -> Batch {
        match self {
            Dataset::Addition(t) => t.train_batch(stream, batch),
            Dataset::Text(t) => t.train_batch(stream, batch),
            Dataset::Tokens(t) => t.train_batch(stream, batch),
        }
    }

    /// The held-out split in batches of at most `batch`.
    pub fn heldout_batches(&self, batch: usize) -> Vec<Batch> {
        match self {
            Dataset::Addition(t) => t.heldout_batches(batch),
            Dataset::Text(t) => t.heldout_batches(batch),
            Dataset::Tokens(t) => t.heldout_batches(batch),
        }
    }

    /// Whether exact-match accuracy means something (the addition task).
    pub fn has_accuracy(&self) -> bool {
        matches!(self, Dataset::Addition(_))
    }

    /// The lowest loss any model can reach on the data, where it is known (the addition task).
    pub fn loss_floor(&self) -> Option<f64> {
        match self {
            Dataset::Addition(t) => Some(t.loss_floor()),
            Dataset::Text(_) | Dataset::Tokens(_) => None,
        }
    }

    /// Short description for logs.
    pub fn describe(&self) -> String {
        match self {
            Dataset::Addition(t) => format!(
                "addition, {} digits, seq {}, vocab {}, loss on {} (floor {:.4})",
                t.config().digits,
                t.seq_len(),
                t.vocab_size(),
                if t.config().prompt_loss {
                    "every position"
                } else {
                    "the answer"
                },
                t.loss_floor()
            ),
            Dataset::Text(t) => format!(
                "text, seq {}, vocab {}, {} training chars",
                t.seq_len(),
                t.vocab_size(),
                t.train_len()
            ),
            Dataset::Tokens(t) => t.describe(),
        }
    }
}
