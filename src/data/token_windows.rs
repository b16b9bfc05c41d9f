//! Fine-tuning data from a text tokenized by a model's own tokenizer: consecutive
//! non-overlapping windows of `seq` tokens (the short tail dropped), each predicting its tokens
//! 1.. (as `fp8 eval` scores them). Batches take windows in order or in a seeded shuffle; the
//! held-out evaluation is every window of the text.

use std::str::FromStr;

use super::{Batch, DataStream, IGNORE_INDEX, SplitMix64};
use crate::error::{Error, Result};

/// Which window goes where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOrder {
    /// Window `i` of batch `b` is window `b * batch + i`, wrapping around the text.
    Sequential,
    /// As sequential over a permutation of the windows drawn anew for each pass over the text.
    Shuffled,
}

impl FromStr for DataOrder {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text {
            "sequential" => Ok(DataOrder::Sequential),
            "shuffled" => Ok(DataOrder::Shuffled),
            _ => Err(Error::InvalidSetting {
                setting: "data-order",
                value: text.to_string(),
                reason: "expected sequential or shuffled".into(),
            }),
        }
    }
}

/// The windows of a tokenized text.
#[derive(Clone, Debug)]
pub struct TokenWindows {
    /// `count * seq` ids.
    ids: Vec<u32>,
    seq: usize,
    count: usize,
    vocab: usize,
    order: DataOrder,
    seed: u64,
    source: String,
}

impl TokenWindows {
    /// Windows of `seq` tokens of `ids` (every id below `vocab`); `source` names the text and
    /// tokenizer in logs; `seed` fixes the shuffle.
    pub fn new(ids: &[u32], seq: usize, vocab: usize, order: DataOrder, seed: u64, source: String) -> Result<Self> {
        if seq < 2 || ids.len() < seq {
            return Err(Error::InvalidSetting {
                setting: "seq",
                value: seq.to_string(),
                reason: format!(
                    "needs at least 2 tokens and one window; the text has {} tokens",
                    ids.len()
                ),
            });
        }
        if let Some((position, &id)) = ids.iter().enumerate().find(|(_, id)| **id as usize >= vocab) {
            return Err(Error::IndexOutOfRange {
                what: "token id",
                index: u64::from(id),
                position,
                len: vocab,
            });
        }
        let count = ids.len() / seq;
        Ok(TokenWindows {
            ids: ids[..count * seq].to_vec(),
            seq,
            count,
            vocab,
            order,
            seed,
            source,
        })
    }

    /// Windows in the text.
    pub fn windows(&self) -> usize {
        self.count
    }

    /// Tokens per window.
    pub fn seq_len(&self) -> usize {
        self.seq
    }

    /// The model's vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The order of the windows.
    pub fn order(&self) -> DataOrder {
        self.order
    }

    fn window(&self, index: usize) -> &[u32] {
        &self.ids[index * self.seq..][..self.seq]
    }

    /// The window at position `k` of the data order.
    fn window_at(&self, k: u64) -> usize {
        let (pass, slot) = (k / self.count as u64, (k % self.count as u64) as usize);
        match self.order {
            DataOrder::Sequential => slot,
            DataOrder::Shuffled => {
                // Fisher-Yates from a generator fixed by the seed and the pass.
                let mut rng = SplitMix64::new(self.seed ^ pass.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut perm: Vec<usize> = (0..self.count).collect();
                for i in (1..self.count).rev() {
                    perm.swap(i, rng.below(i as u64 + 1) as usize);
                }
                perm[slot]
            }
        }
    }

    fn batch_of(&self, windows: &[usize], padding: usize) -> Batch {
        let rows = (windows.len() + padding) * self.seq;
        let (mut inputs, mut targets) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for &w in windows {
            let w = self.window(w);
            inputs.extend_from_slice(w);
            targets.extend_from_slice(&w[1..]);
            targets.push(IGNORE_INDEX);
        }
        inputs.resize(rows, 0);
        targets.resize(rows, IGNORE_INDEX);
        Batch {
            inputs,
            targets,
            batch: windows.len() + padding,
            seq: self.seq,
            answer_start: 0,
        }
    }

    /// The next `batch` windows in the data order.
    pub fn train_batch(&self, stream: &mut DataStream, batch: usize) -> Batch {
        let first = stream.batches * batch as u64;
        let windows: Vec<usize> = (0..batch as u64).map(|i| self.window_at(first + i)).collect();
        stream.batches += 1;
        self.batch_of(&windows, 0)
    }

    /// Every window in text order, in batches of `batch` (the last one padded with unscored
    /// windows, so every batch has the same token count).
    pub fn heldout_batches(&self, batch: usize) -> Vec<Batch> {
        let all: Vec<usize> = (0..self.count).collect();
        all.chunks(batch.max(1))
            .map(|c| self.batch_of(c, batch.max(1) - c.len()))
            .collect()
    }

    /// Short description for logs.
    pub fn describe(&self) -> String {
        format!(
            "{}, {} windows of {} tokens, {}",
            self.source,
            self.count,
            self.seq,
            match self.order {
                DataOrder::Sequential => "sequential",
                DataOrder::Shuffled => "shuffled",
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_wraps_shuffled_permutes_each_pass_and_heldout_pads() {
        let ids: Vec<u32> = (0..23).collect();
        let data = TokenWindows::new(&ids, 4, 30, DataOrder::Sequential, 1, "t".into()).unwrap();
        assert_eq!(data.windows(), 5);
        let mut stream = DataStream::new(0);
        let firsts = |b: &Batch| b.inputs.chunks(4).map(|w| w[0]).collect::<Vec<_>>();
        assert_eq!(firsts(&data.train_batch(&mut stream, 3)), vec![0, 4, 8]);
        assert_eq!(firsts(&data.train_batch(&mut stream, 3)), vec![12, 16, 0]);
        let b = data.train_batch(&mut stream, 3);
        assert_eq!(&b.targets[..4], &[5, 6, 7, IGNORE_INDEX]);
        let shuffled = TokenWindows::new(&ids, 4, 30, DataOrder::Shuffled, 1, "t".into()).unwrap();
        let mut stream = DataStream::new(0);
        let pass: Vec<u32> = (0..5)
            .flat_map(|_| firsts(&shuffled.train_batch(&mut stream, 1)))
            .collect();
        let mut sorted = pass.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 4, 8, 12, 16], "one pass visits every window once");
        let next: Vec<u32> = (0..5)
            .flat_map(|_| firsts(&shuffled.train_batch(&mut stream, 1)))
            .collect();
        assert_ne!(pass, next, "each pass draws its own order");
        let held = data.heldout_batches(2);
        assert_eq!(held.len(), 3);
        assert_eq!(held[2].batch, 2);
        assert_eq!(held[2].counted_targets(), 3);
        assert!(TokenWindows::new(&ids, 4, 20, DataOrder::Sequential, 1, "t".into()).is_err());
        assert!("random".parse::<DataOrder>().is_err());
    }
}
