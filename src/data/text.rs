//! Character-level language modelling on any UTF-8 text file.
//!
//! The vocabulary is the file's distinct characters in code-point order. The
//! last `heldout_fraction` of the file (at least one window) is held out;
//! training windows start anywhere in the rest, drawn from a seeded stream;
//! held-out windows tile the tail without overlap, so evaluation is fixed.

use std::path::Path;

use super::{Batch, DataStream};
use crate::error::{Error, Result};

/// The largest text file read by default: tokenizing takes about 20 bytes of memory per
/// character (chars, vocabulary sort, ids, split), so 64 MiB of text needs about 1.3 GB.
pub const DEFAULT_MAX_TEXT_BYTES: u64 = 64 << 20;

/// A tokenized text with its vocabulary and split.
#[derive(Clone, Debug)]
pub struct TextDataset {
    vocab: Vec<char>,
    train: Vec<u32>,
    heldout: Vec<u32>,
    seq: usize,
}

impl TextDataset {
    /// Reads `path` (UTF-8, a regular file of at most [`DEFAULT_MAX_TEXT_BYTES`]) and splits it;
    /// see [`TextDataset::from_text`].
    pub fn from_file(path: &Path, seq: usize, heldout_fraction: f64) -> Result<Self> {
        Self::from_file_limited(path, seq, heldout_fraction, DEFAULT_MAX_TEXT_BYTES)
    }

    /// [`TextDataset::from_file`] with a file of at most `max_bytes`.
    pub fn from_file_limited(path: &Path, seq: usize, heldout_fraction: f64, max_bytes: u64) -> Result<Self> {
        let bytes = crate::io::read_regular(path, max_bytes, " (raise it with --max-text-bytes)")?;
        let text = String::from_utf8(bytes).map_err(|err| Error::InvalidFile {
            path: path.display().to_string(),
            reason: format!("not UTF-8 text (byte {})", err.utf8_error().valid_up_to()),
        })?;
        Self::from_text(&text, seq, heldout_fraction).map_err(|err| match err {
            Error::InvalidFile { reason, .. } => Error::InvalidFile {
                path: path.display().to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Tokenizes `text` for windows of `seq` inputs; both parts must hold at least one
    /// window (`seq + 1` characters: inputs plus the last target).
    pub fn from_text(text: &str, seq: usize, heldout_fraction: f64) -> Result<Self> {
        if seq == 0 {
            return Err(Error::InvalidSetting {
                setting: "seq_len",
                value: "0".to_string(),
                reason: "must be >= 1".to_string(),
            });
        }
        if !(heldout_fraction > 0.0 && heldout_fraction < 1.0) {
            return Err(Error::InvalidSetting {
                setting: "heldout_fraction",
                value: heldout_fraction.to_string(),
                reason: "must be in (0, 1)".to_string(),
            });
        }
        let window = seq.checked_add(1).ok_or_else(|| Error::InvalidSetting {
            setting: "seq_len",
            value: seq.to_string(),
            reason: "too large".to_string(),
        })?;
        let chars: Vec<char> = text.chars().collect();
        let mut vocab = chars.clone();
        vocab.sort_unstable();
        vocab.dedup();
        let heldout_len = ((chars.len() as f64 * heldout_fraction).ceil() as usize).max(window);
        if chars.len() < heldout_len + window {
            return Err(Error::InvalidFile {
                path: "<text>".to_string(),
                reason: format!(
                    "{} characters are too few: sequence length {seq} with held-out fraction {heldout_fraction} \
                     needs at least {} ({window} to train on, {heldout_len} held out)",
                    chars.len(),
                    heldout_len + window
                ),
            });
        }
        let ids: Vec<u32> = chars
            .iter()
            .map(|c| vocab.binary_search(c).expect("every character is in the vocabulary") as u32)
            .collect();
        let split = ids.len() - heldout_len;
        Ok(TextDataset {
            train: ids[..split].to_vec(),
            heldout: ids[split..].to_vec(),
            vocab,
            seq,
        })
    }

    /// Distinct characters.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The characters, indexed by token id.
    pub fn vocab(&self) -> &[char] {
        &self.vocab
    }

    /// Inputs per window.
    pub fn seq_len(&self) -> usize {
        self.seq
    }

    /// Characters in the training part.
    pub fn train_len(&self) -> usize {
        self.train.len()
    }

    /// Characters in the held-out part.
    pub fn heldout_len(&self) -> usize {
        self.heldout.len()
    }

    /// Token ids of `text`; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.chars()
            .map(|c| {
                self.vocab
                    .binary_search(&c)
                    .map(|i| i as u32)
                    .map_err(|_| Error::InvalidSetting {
                        setting: "prompt",
                        value: c.escape_default().to_string(),
                        reason: "character not in the training text's vocabulary".to_string(),
                    })
            })
            .collect()
    }

    /// The text of token ids (`\u{fffd}` for an id outside the vocabulary).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| self.vocab.get(i as usize).copied().unwrap_or('\u{fffd}'))
            .collect()
    }

    fn batch_of(&self, source: &[u32], starts: &[usize]) -> Batch {
        let mut inputs = Vec::with_capacity(starts.len() * self.seq);
        let mut targets = Vec::with_capacity(starts.len() * self.seq);
        for &s in starts {
            inputs.extend_from_slice(&source[s..s + self.seq]);
            targets.extend_from_slice(&source[s + 1..s + self.seq + 1]);
        }
        Batch {
            inputs,
            targets,
            batch: starts.len(),
            seq: self.seq,
            answer_start: 0,
        }
    }

    /// `batch` windows starting at uniformly drawn positions of the training part.
    pub fn train_batch(&self, stream: &mut DataStream, batch: usize) -> Batch {
        let positions = (self.train.len() - self.seq) as u64;
        let starts: Vec<usize> = (0..batch).map(|_| stream.rng.below(positions) as usize).collect();
        stream.batches += 1;
        self.batch_of(&self.train, &starts)
    }

    /// Every non-overlapping window of the held-out part, in order, in batches of at most `batch`.
    pub fn heldout_batches(&self, batch: usize) -> Vec<Batch> {
        let windows = (self.heldout.len() - 1) / self.seq;
        let starts: Vec<usize> = (0..windows).map(|w| w * self.seq).collect();
        starts
            .chunks(batch.max(1))
            .map(|c| self.batch_of(&self.heldout, c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::IGNORE_INDEX;

    const TEXT: &str = "the quick brown fox jumps over the lazy dog. ÄÖÜ sphinx of black quartz, judge my vow.\n";

    #[test]
    fn vocab_round_trips_and_split_sizes_follow_the_fraction() {
        let data = TextDataset::from_text(TEXT, 8, 0.25).unwrap();
        let distinct: std::collections::BTreeSet<char> = TEXT.chars().collect();
        assert_eq!(data.vocab(), distinct.into_iter().collect::<Vec<_>>().as_slice());
        let n = TEXT.chars().count();
        assert_eq!(data.train_len() + data.heldout_len(), n);
        assert_eq!(data.heldout_len(), (n as f64 * 0.25).ceil() as usize);
        assert_eq!(data.decode(&data.encode(TEXT).unwrap()), TEXT);
        assert!(data.encode("€").is_err());
    }

    #[test]
    fn train_windows_are_shifted_pairs_from_the_training_part() {
        let data = TextDataset::from_text(TEXT, 8, 0.25).unwrap();
        let train_text: String = TEXT.chars().take(data.train_len()).collect();
        let mut stream = DataStream::new(4);
        for _ in 0..50 {
            let batch = data.train_batch(&mut stream, 4);
            assert_eq!((batch.batch, batch.seq), (4, 8));
            assert!(batch.targets.iter().all(|&t| t != IGNORE_INDEX));
            for row in 0..4 {
                let inputs = data.decode(&batch.inputs[row * 8..row * 8 + 8]);
                let targets = data.decode(&batch.targets[row * 8..row * 8 + 8]);
                let window = format!("{inputs}{}", targets.chars().last().unwrap());
                assert!(
                    train_text.contains(&window),
                    "{window:?} is not a window of the training part"
                );
                assert_eq!(
                    inputs.chars().skip(1).collect::<String>(),
                    targets.chars().take(7).collect::<String>()
                );
            }
        }
        assert_eq!(stream.batches, 50);
    }

    #[test]
    fn heldout_windows_tile_the_tail() {
        let data = TextDataset::from_text(TEXT, 5, 0.3).unwrap();
        let tail: Vec<char> = TEXT.chars().skip(data.train_len()).collect();
        let batches = data.heldout_batches(2);
        let windows: usize = batches.iter().map(|b| b.batch).sum();
        assert_eq!(windows, (tail.len() - 1) / 5);
        let first: String = tail[..5].iter().collect();
        assert_eq!(data.decode(&batches[0].inputs[..5]), first);
        let second: String = tail[5..10].iter().collect();
        assert_eq!(data.decode(&batches[0].inputs[5..10]), second);
    }

    #[test]
    fn too_short_text_and_bad_settings_are_errors() {
        let err = TextDataset::from_text("abcdefg", 4, 0.1).unwrap_err();
        assert!(err.to_string().contains("too few"), "{err}");
        assert!(TextDataset::from_text(TEXT, 0, 0.1).is_err());
        assert!(TextDataset::from_text(TEXT, 4, 1.0).is_err());
        // Exactly enough: one window each.
        assert!(TextDataset::from_text("abcdefghij", 4, 0.1).is_ok());
    }

    #[test]
    fn files_are_read_and_non_utf8_is_named() {
        let dir = std::env::temp_dir().join(format!("fp8-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.txt");
        std::fs::write(&good, TEXT).unwrap();
        assert_eq!(
            TextDataset::from_file(&good, 8, 0.2).unwrap().vocab_size(),
            TextDataset::from_text(TEXT, 8, 0.2).unwrap().vocab_size()
        );
        let bad = dir.join("bad.txt");
        std::fs::write(&bad, [b'a', 0xff, b'b']).unwrap();
        let err = TextDataset::from_file(&bad, 1, 0.5).unwrap_err().to_string();
        assert!(err.contains("bad.txt") && err.contains("UTF-8"), "{err}");
        let short = dir.join("short.txt");
        std::fs::write(&short, "ab").unwrap();
        let err = TextDataset::from_file(&short, 4, 0.5).unwrap_err().to_string();
        assert!(err.contains("short.txt"), "{err}");
        assert!(TextDataset::from_file(&dir.join("missing.txt"), 4, 0.5).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
