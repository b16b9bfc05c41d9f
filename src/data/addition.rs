//! A synthetic task generated from a seed: multi-digit addition.
//!
//! Each problem is one fixed-length character sequence, `a+b=c` with `a` and
//! `b` zero-padded to `digits` digits and the sum to `digits + 1`:
//! `"042+917=0959"` (or, with `reverse_answer`, the sum least significant
//! digit first, `"042+917=9590"`, which a causal model learns much faster:
//! each answer digit then depends only on digits already seen and one carry).
//!
//! The model reads the sequence minus its last token and predicts the next
//! token at every position. By default every position takes a loss, as in any
//! language model: the operand digits are random, so the loss cannot fall below
//! [`AdditionTask::loss_floor`] (`(2 * digits - 1) * ln 10 / seq_len`), the way
//! a text's entropy bounds a language model's loss. With `prompt_loss: false`
//! only the answer digits take a loss (the other targets are [`IGNORE_INDEX`])
//! and the floor is 0. Either way, [`Batch::answer_start`] marks the answer, so
//! the answer loss and exact-match accuracy are reported on their own.
//!
//! The split is a property of the problem: a keyed hash of `(a, b)` puts a
//! fixed share of all problems in the held-out set, and training draws
//! reject them, so the two never overlap.

use std::collections::HashSet;

use super::{Batch, DataStream, IGNORE_INDEX, SplitMix64};
use crate::error::{Error, Result};

/// Token of `+`.
pub const PLUS: u32 = 10;
/// Token of `=`.
pub const EQUALS: u32 = 11;
/// Digits 0-9, `+`, `=`.
pub const VOCAB_SIZE: usize = 12;

/// Spaces at most this large are enumerated to build the held-out set; larger ones are sampled.
const ENUMERATE_LIMIT: u64 = 1 << 20;

/// Settings of the task.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdditionConfig {
    /// Digits of each operand (1 to 9).
    pub digits: usize,
    /// Share of all problems that are held out, in (0, 0.5].
    pub heldout_fraction: f64,
    /// Held-out problems to evaluate on (fewer if the held-out share of the space is smaller).
    pub heldout_size: usize,
    /// Write the sum least significant digit first.
    pub reverse_answer: bool,
    /// Take a loss on the prompt (operand digits, `+`, `=`) too, not only on the answer.
    pub prompt_loss: bool,
}

impl Default for AdditionConfig {
    /// 3-digit operands, 10% held out, 512 held-out problems, reversed answers, loss on every position.
    fn default() -> Self {
        AdditionConfig {
            digits: 3,
            heldout_fraction: 0.1,
            heldout_size: 512,
            reverse_answer: true,
            prompt_loss: true,
        }
    }
}

/// The task: its settings, seed, and the held-out problems.
#[derive(Clone, Debug)]
pub struct AdditionTask {
    config: AdditionConfig,
    /// Keys the split hash, so another seed gives another split.
    split_key: u64,
    heldout: Vec<(u64, u64)>,
}

impl AdditionTask {
    /// The task fixed by `config` and `seed`.
    pub fn new(config: AdditionConfig, seed: u64) -> Result<Self> {
        let invalid = |setting: &'static str, value: String, reason: &str| {
            Err(Error::InvalidSetting {
                setting,
                value,
                reason: reason.to_string(),
            })
        };
        if !(1..=9).contains(&config.digits) {
            return invalid("digits", config.digits.to_string(), "must be 1 to 9");
        }
        if !(config.heldout_fraction > 0.0 && config.heldout_fraction <= 0.5) {
            return invalid(
                "heldout_fraction",
                config.heldout_fraction.to_string(),
                "must be in (0, 0.5]",
            );
        }
        if config.heldout_size == 0 {
            return invalid("heldout_size", "0".to_string(), "must be >= 1");
        }
        let mut seeds = SplitMix64::new(seed);
        let mut task = AdditionTask {
            config,
            split_key: seeds.next_u64(),
            heldout: Vec::new(),
        };
        task.heldout = task.pick_heldout(&mut seeds.fork());
        if task.heldout.is_empty() {
            return invalid(
                "heldout_fraction",
                config.heldout_fraction.to_string(),
                &format!("holds out no problem of the {} with this seed", task.problem_count()),
            );
        }
        Ok(task)
    }

    /// The settings.
    pub fn config(&self) -> &AdditionConfig {
        &self.config
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        VOCAB_SIZE
    }

    /// Length of a model input (the full problem minus its last token).
    pub fn seq_len(&self) -> usize {
        3 * self.config.digits + 2
    }

    /// Position of the first answer target in a row: the one that reads `=`.
    pub fn answer_start(&self) -> usize {
        2 * self.config.digits + 1
    }

    /// The lowest mean loss any model can reach, in nats per target: the operand digits after the
    /// first one are uniformly random (`ln 10` each), everything else follows from the inputs. 0
    /// without `prompt_loss`. (Close to exact: held-out problems never appear in training, which
    /// makes the operands' distribution slightly non-uniform.)
    pub fn loss_floor(&self) -> f64 {
        if !self.config.prompt_loss {
            return 0.0;
        }
        let random_digits = 2 * self.config.digits - 1;
        random_digits as f64 * 10f64.ln() / self.seq_len() as f64
    }

    /// Number of distinct problems, `(10^digits)^2`.
    pub fn problem_count(&self) -> u64 {
        self.operand_limit() * self.operand_limit()
    }

    fn operand_limit(&self) -> u64 {
        10u64.pow(self.config.digits as u32)
    }

    /// Whether `a + b` belongs to the held-out split.
    pub fn is_heldout(&self, a: u64, b: u64) -> bool {
        let index = a * self.operand_limit() + b;
        let hash = SplitMix64::new(self.split_key ^ index).next_u64();
        // The top 53 bits as a uniform value in [0, 1).
        ((hash >> 11) as f64 / (1u64 << 53) as f64) < self.config.heldout_fraction
    }

    /// The held-out problems, in evaluation order.
    pub fn heldout_problems(&self) -> &[(u64, u64)] {
        &self.heldout
    }

    fn pick_heldout(&self, rng: &mut SplitMix64) -> Vec<(u64, u64)> {
        let limit = self.operand_limit();
        let want = self.config.heldout_size;
        if self.problem_count() <= ENUMERATE_LIMIT {
            let mut all: Vec<(u64, u64)> = (0..limit)
                .flat_map(|a| (0..limit).map(move |b| (a, b)))
                .filter(|&(a, b)| self.is_heldout(a, b))
                .collect();
            // Fisher-Yates, then the first `want`.
            for i in (1..all.len()).rev() {
                all.swap(i, rng.below(i as u64 + 1) as usize);
            }
            all.truncate(want);
            return all;
        }
        // More than 2^20 problems: random draws find `want` distinct held-out ones quickly (repeats are
        // rare); the attempt cap only guards against a tiny held-out share.
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(want);
        for _ in 0..want.saturating_mul(1 << 12) {
            if out.len() == want {
                break;
            }
            let pair = (rng.below(limit), rng.below(limit));
            if self.is_heldout(pair.0, pair.1) && seen.insert(pair) {
                out.push(pair);
            }
        }
        out
    }

    /// All tokens of the problem `a + b` (`3 * digits + 3` of them).
    pub fn encode(&self, a: u64, b: u64) -> Vec<u32> {
        let d = self.config.digits;
        let digits = |mut x: u64, n: usize| {
            let mut out = vec![0u32; n];
            for slot in out.iter_mut().rev() {
                *slot = (x % 10) as u32;
                x /= 10;
            }
            out
        };
        let mut answer = digits(a + b, d + 1);
        if self.config.reverse_answer {
            answer.reverse();
        }
        let mut tokens = digits(a, d);
        tokens.push(PLUS);
        tokens.extend(digits(b, d));
        tokens.push(EQUALS);
        tokens.extend(answer);
        tokens
    }

    /// The text of tokens (`0-9`, `+`, `=`, `?` for anything else).
    pub fn render(tokens: &[u32]) -> String {
        tokens
            .iter()
            .map(|&t| match t {
                0..=9 => char::from(b'0' + t as u8),
                PLUS => '+',
                EQUALS => '=',
                _ => '?',
            })
            .collect()
    }

    /// One row of a batch: inputs and targets of problem `a + b`.
    fn push_row(&self, a: u64, b: u64, inputs: &mut Vec<u32>, targets: &mut Vec<u32>) {
        let tokens = self.encode(a, b);
        let answer_start = self.answer_start();
        let n = tokens.len();
        inputs.extend_from_slice(&tokens[..n - 1]);
        targets.extend((0..n - 1).map(|position| {
            if self.config.prompt_loss || position >= answer_start {
                tokens[position + 1]
            } else {
                IGNORE_INDEX
            }
        }));
    }

    fn batch_of(&self, problems: &[(u64, u64)]) -> Batch {
        let seq = self.seq_len();
        let mut inputs = Vec::with_capacity(problems.len() * seq);
        let mut targets = Vec::with_capacity(problems.len() * seq);
        for &(a, b) in problems {
            self.push_row(a, b, &mut inputs, &mut targets);
        }
        Batch {
            inputs,
            targets,
            batch: problems.len(),
            seq,
            answer_start: self.answer_start(),
        }
    }

    /// The next training batch of `batch` problems drawn from `stream` (never held-out ones).
    pub fn train_batch(&self, stream: &mut DataStream, batch: usize) -> Batch {
        let limit = self.operand_limit();
        let problems: Vec<(u64, u64)> = (0..batch)
            .map(|_| {
                loop {
                    let (a, b) = (stream.rng.below(limit), stream.rng.below(limit));
                    if !self.is_heldout(a, b) {
                        break (a, b);
                    }
                }
            })
            .collect();
        stream.batches += 1;
        self.batch_of(&problems)
    }

    /// The held-out problems in batches of at most `batch` (`batch = 0` is taken as 1).
    pub fn heldout_batches(&self, batch: usize) -> Vec<Batch> {
        self.heldout.chunks(batch.max(1)).map(|c| self.batch_of(c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::exact_match_accuracy;

    /// Reads a, b and the answer back from a rendered problem with plain string parsing.
    fn parse(text: &str, reversed: bool) -> (u64, u64, u64) {
        let (lhs, answer) = text.split_once('=').unwrap();
        let (a, b) = lhs.split_once('+').unwrap();
        let answer: String = if reversed {
            answer.chars().rev().collect()
        } else {
            answer.to_string()
        };
        (a.parse().unwrap(), b.parse().unwrap(), answer.parse().unwrap())
    }

    fn row_problem(task: &AdditionTask, batch: &Batch, row: usize) -> (u64, u64, u64) {
        let seq = batch.seq;
        let mut tokens = batch.inputs[row * seq..(row + 1) * seq].to_vec();
        tokens.push(batch.targets[(row + 1) * seq - 1]);
        parse(&AdditionTask::render(&tokens), task.config().reverse_answer)
    }

    #[test]
    fn encodes_the_fixed_layout() {
        let plain = AdditionTask::new(
            AdditionConfig {
                reverse_answer: false,
                ..AdditionConfig::default()
            },
            1,
        )
        .unwrap();
        assert_eq!(AdditionTask::render(&plain.encode(42, 917)), "042+917=0959");
        let reversed = AdditionTask::new(AdditionConfig::default(), 1).unwrap();
        assert_eq!(AdditionTask::render(&reversed.encode(42, 917)), "042+917=9590");
        assert_eq!(AdditionTask::render(&reversed.encode(999, 999)), "999+999=8991");
        assert_eq!(reversed.seq_len(), 11);
    }

    #[test]
    fn train_batches_hold_correct_sums_targets_per_the_prompt_loss_and_no_heldout_problem() {
        for (reverse_answer, prompt_loss) in [(false, false), (true, false), (false, true), (true, true)] {
            let config = AdditionConfig {
                digits: 2,
                heldout_fraction: 0.2,
                heldout_size: 64,
                reverse_answer,
                prompt_loss,
            };
            let task = AdditionTask::new(config, 99).unwrap();
            let heldout: HashSet<(u64, u64)> = task.heldout_problems().iter().copied().collect();
            let mut stream = DataStream::new(5);
            for _ in 0..20 {
                let batch = task.train_batch(&mut stream, 16);
                assert_eq!((batch.batch, batch.seq, batch.inputs.len()), (16, 8, 128));
                // 2+1+2 prompt characters, then position 5 (reading `=`) predicts the first answer digit.
                assert_eq!(batch.answer_start, 5);
                for row in 0..16 {
                    let (a, b, sum) = row_problem(&task, &batch, row);
                    assert_eq!(a + b, sum);
                    assert!(!task.is_heldout(a, b) && !heldout.contains(&(a, b)));
                    let inputs = &batch.inputs[row * 8..(row + 1) * 8];
                    let targets = &batch.targets[row * 8..(row + 1) * 8];
                    if prompt_loss {
                        // Every target is the next input: the same sequence shifted by one.
                        assert_eq!(&inputs[1..], &targets[..7]);
                    } else {
                        assert!(targets[..5].iter().all(|&t| t == IGNORE_INDEX));
                        assert_eq!(&inputs[6..], &targets[5..7]);
                    }
                    assert!(targets[5..].iter().all(|&t| t < 10));
                }
                let answer = batch.answer_targets();
                assert_eq!(answer.iter().filter(|&&t| t != IGNORE_INDEX).count(), 16 * 3);
            }
            assert_eq!(stream.batches, 20);
        }
    }

    #[test]
    fn loss_floor_is_ln10_per_random_operand_target() {
        for digits in 1..=4 {
            let config = AdditionConfig {
                digits,
                heldout_size: 8,
                ..AdditionConfig::default()
            };
            let task = AdditionTask::new(config, 4).unwrap();
            let batch = task.train_batch(&mut DataStream::new(2), 4);
            // The Bayes predictor pays ln 10 on a target exactly when it is an operand digit that
            // the inputs cannot determine: any digit before `=` except the very first token.
            let row = &batch.targets[..batch.seq];
            let random = row
                .iter()
                .enumerate()
                .filter(|&(position, &t)| position < task.answer_start() && t < 10)
                .count();
            assert_eq!(random, 2 * digits - 1);
            let floor = random as f64 * 10f64.ln() / batch.seq as f64;
            assert!((task.loss_floor() - floor).abs() < 1e-12);
            let answer_only = AdditionTask::new(
                AdditionConfig {
                    prompt_loss: false,
                    ..config
                },
                4,
            )
            .unwrap();
            assert_eq!(answer_only.loss_floor(), 0.0);
        }
    }

    #[test]
    fn heldout_set_is_distinct_held_out_and_the_share_is_about_right() {
        let task = AdditionTask::new(AdditionConfig::default(), 3).unwrap();
        let problems = task.heldout_problems();
        assert_eq!(problems.len(), 512);
        assert_eq!(problems.iter().collect::<HashSet<_>>().len(), 512);
        assert!(problems.iter().all(|&(a, b)| task.is_heldout(a, b)));
        let share = (0..1000u64).filter(|&i| task.is_heldout(i, (i * 7919) % 1000)).count();
        assert!(
            (60..=140).contains(&share),
            "{share} of 1000 held out, expected about 100"
        );
        let batches = task.heldout_batches(100);
        assert_eq!(batches.len(), 6);
        assert_eq!(batches[5].batch, 12);
        // A perfect predictor (the targets themselves) scores 1.
        for b in &batches {
            assert_eq!(exact_match_accuracy(&b.targets, b), Some(1.0));
        }
    }

    #[test]
    fn large_spaces_are_sampled_and_small_ones_enumerated() {
        let big = AdditionTask::new(
            AdditionConfig {
                digits: 6,
                heldout_size: 100,
                ..AdditionConfig::default()
            },
            8,
        )
        .unwrap();
        assert_eq!(big.heldout_problems().len(), 100);
        assert!(big.heldout_problems().iter().all(|&(a, b)| big.is_heldout(a, b)));
        let tiny = AdditionTask::new(
            AdditionConfig {
                digits: 1,
                heldout_fraction: 0.5,
                heldout_size: 1000,
                ..AdditionConfig::default()
            },
            8,
        )
        .unwrap();
        let expected = (0..10u64)
            .flat_map(|a| (0..10u64).map(move |b| (a, b)))
            .filter(|&(a, b)| tiny.is_heldout(a, b))
            .count();
        assert_eq!(tiny.heldout_problems().len(), expected);
    }

    #[test]
    fn same_seed_same_data_other_seed_other_split() {
        let a = AdditionTask::new(AdditionConfig::default(), 11).unwrap();
        let b = AdditionTask::new(AdditionConfig::default(), 11).unwrap();
        let c = AdditionTask::new(AdditionConfig::default(), 12).unwrap();
        assert_eq!(a.heldout_problems(), b.heldout_problems());
        assert_ne!(a.heldout_problems(), c.heldout_problems());
        let (mut s1, mut s2) = (DataStream::new(1), DataStream::new(1));
        let first = a.train_batch(&mut s1, 8);
        assert_eq!(first, b.train_batch(&mut s2, 8));
        // A stream restored from its saved state continues identically.
        let mut restored = s1;
        assert_eq!(a.train_batch(&mut s1, 8), a.train_batch(&mut restored, 8));
    }

    #[test]
    fn bad_settings_are_errors() {
        for config in [
            AdditionConfig {
                digits: 0,
                ..AdditionConfig::default()
            },
            AdditionConfig {
                digits: 10,
                ..AdditionConfig::default()
            },
            AdditionConfig {
                heldout_fraction: 0.0,
                ..AdditionConfig::default()
            },
            AdditionConfig {
                heldout_fraction: 0.9,
                ..AdditionConfig::default()
            },
            AdditionConfig {
                heldout_size: 0,
                ..AdditionConfig::default()
            },
        ] {
            assert!(matches!(
                AdditionTask::new(config, 0),
                Err(Error::InvalidSetting { .. })
            ));
        }
    }
}
