//! Training data that needs no download: a seeded synthetic task
//! ([`addition`]) and character-level text from any file ([`text`]).
//!
//! Both hand out [`Batch`]es of `[batch, seq]` token ids, with next-token
//! targets and [`IGNORE_INDEX`] where no loss is taken. Where the data is in
//! a stream is a [`DataStream`] (RNG state + counter), saved in checkpoints so
//! a resumed run sees the same batches.

pub mod addition;
pub mod rng;
mod source;
pub mod text;
pub mod token_windows;

pub use rng::{DataStream, SplitMix64};
pub use source::Dataset;

/// Target of a position that takes no loss.
pub const IGNORE_INDEX: u32 = u32::MAX;

/// Token ids and next-token targets, both row-major `[batch, seq]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Input token ids.
    pub inputs: Vec<u32>,
    /// Target ids (the next token) or [`IGNORE_INDEX`].
    pub targets: Vec<u32>,
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// First position of each row whose target belongs to the answer: exact-match accuracy and
    /// the answer loss look only at positions from here on (0 for text, where all positions count).
    pub answer_start: usize,
}

impl Batch {
    /// Positions that take a loss (targets that are not [`IGNORE_INDEX`]).
    pub fn counted_targets(&self) -> usize {
        counted(&self.targets)
    }

    /// The targets with every position before `answer_start` ignored: the answer loss's targets.
    pub fn answer_targets(&self) -> Vec<u32> {
        let mut targets = self.targets.clone();
        if self.seq > 0 {
            for row in targets.chunks_mut(self.seq) {
                row[..self.answer_start.min(self.seq)].fill(IGNORE_INDEX);
            }
        }
        targets
    }
}

/// Targets in `targets` that take a loss (not [`IGNORE_INDEX`]).
pub fn counted(targets: &[u32]) -> usize {
    targets.iter().filter(|&&t| t != IGNORE_INDEX).count()
}

/// Share of sequences whose predicted token equals the target at every counted answer position
/// (from `batch.answer_start` on).
///
/// `predicted` is the argmax at each position of a forward pass over `batch.inputs`
/// (teacher forcing). For the addition task this equals exact match under greedy decoding:
/// if every answer position is right given a right prefix, greedy decoding writes exactly
/// those tokens, and the first wrong position would be wrong in both. A sequence with no
/// counted position is not scored; `None` if no sequence is, or if the lengths do not fit.
pub fn exact_match_accuracy(predicted: &[u32], batch: &Batch) -> Option<f64> {
    if predicted.len() != batch.targets.len() || batch.targets.len() != batch.batch * batch.seq || batch.seq == 0 {
        return None;
    }
    let (mut scored, mut correct) = (0usize, 0usize);
    for (pred, target) in predicted.chunks(batch.seq).zip(batch.targets.chunks(batch.seq)) {
        let counted: Vec<(u32, u32)> = pred
            .iter()
            .zip(target)
            .skip(batch.answer_start)
            .filter(|(_, t)| **t != IGNORE_INDEX)
            .map(|(p, t)| (*p, *t))
            .collect();
        if counted.is_empty() {
            continue;
        }
        scored += 1;
        correct += counted.iter().all(|(p, t)| p == t) as usize;
    }
    (scored > 0).then(|| correct as f64 / scored as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_match_needs_every_counted_position() {
        let batch = Batch {
            inputs: vec![0; 9],
            targets: vec![
                IGNORE_INDEX,
                1,
                2,
                IGNORE_INDEX,
                3,
                4,
                IGNORE_INDEX,
                IGNORE_INDEX,
                IGNORE_INDEX,
            ],
            batch: 3,
            seq: 3,
            answer_start: 0,
        };
        assert_eq!(batch.counted_targets(), 4);
        // Row 0 right (prompt position wrong, ignored), row 1 one digit wrong, row 2 not scored.
        let predicted = [7, 1, 2, 5, 3, 9, 0, 0, 0];
        assert_eq!(exact_match_accuracy(&predicted, &batch), Some(0.5));
        assert_eq!(exact_match_accuracy(&predicted[..8], &batch), None);
        let unscored = Batch {
            targets: vec![IGNORE_INDEX; 9],
            ..batch
        };
        assert_eq!(exact_match_accuracy(&predicted, &unscored), None);
    }

    #[test]
    fn positions_before_the_answer_count_for_the_loss_only() {
        // Two rows of 4: the prompt (positions 0-1) has targets too, the answer is positions 2-3.
        let batch = Batch {
            inputs: vec![0; 8],
            targets: vec![5, 6, 1, 2, 7, 8, 3, 4],
            batch: 2,
            seq: 4,
            answer_start: 2,
        };
        assert_eq!(
            batch.answer_targets(),
            [IGNORE_INDEX, IGNORE_INDEX, 1, 2, IGNORE_INDEX, IGNORE_INDEX, 3, 4]
        );
        // Both rows have wrong prompt predictions; row 0's answer is right, row 1's is not.
        let predicted = [0, 0, 1, 2, 0, 0, 3, 9];
        assert_eq!(exact_match_accuracy(&predicted, &batch), Some(0.5));
        let whole_row = Batch {
            answer_start: 0,
            ..batch
        };
        assert_eq!(exact_match_accuracy(&predicted, &whole_row), Some(0.0));
    }
}
