//! Loss of a [`LlamaModel`] on a tokenized text: consecutive non-overlapping windows of `seq`
//! tokens (a final shorter window is dropped), each scoring its `seq - 1` next-token predictions;
//! the loss is the mean over every predicted position of every window.

use super::llama::LlamaModel;
use crate::data::IGNORE_INDEX;
use crate::error::{Error, Result};

/// Tokens per forward pass of an evaluation (windows are batched up to this).
const EVAL_TOKENS_PER_PASS: usize = 4096;

/// The mean next-token loss of a text.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TextLoss {
    /// Tokens in the evaluated windows (`windows * seq`).
    pub tokens: usize,
    /// Windows evaluated.
    pub windows: usize,
    /// Predicted positions (`windows * (seq - 1)`).
    pub predicted: usize,
    /// Mean cross-entropy in nats.
    pub loss: f64,
}

impl TextLoss {
    /// `exp(loss)`.
    pub fn perplexity(&self) -> f64 {
        self.loss.exp()
    }
}

/// The `ids.len() / seq` windows of `seq` tokens (`seq >= 2`: a window must predict something).
pub fn text_windows(ids: &[u32], seq: usize) -> Result<Vec<&[u32]>> {
    if seq < 2 {
        return Err(Error::InvalidSetting {
            setting: "seq",
            value: seq.to_string(),
            reason: "a window needs at least 2 tokens to predict one".into(),
        });
    }
    if ids.len() < seq {
        return Err(Error::InvalidSetting {
            setting: "seq",
            value: seq.to_string(),
            reason: format!("the text has {} tokens, fewer than one window", ids.len()),
        });
    }
    Ok(ids.chunks_exact(seq).collect())
}

/// Model inputs and targets `[windows.len() + padding, seq]` of windows of `seq` tokens: each
/// window predicts its own tokens 1.., its last position is not scored; `padding` extra windows
/// of token 0 are not scored at all.
pub fn window_batch(windows: &[&[u32]], seq: usize, padding: usize) -> (Vec<u32>, Vec<u32>) {
    let rows = (windows.len() + padding) * seq;
    let (mut inputs, mut targets) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for w in windows {
        inputs.extend_from_slice(w);
        targets.extend_from_slice(&w[1..]);
        targets.push(IGNORE_INDEX);
    }
    inputs.resize(rows, 0);
    targets.resize(rows, IGNORE_INDEX);
    (inputs, targets)
}

/// Windows per pass: about [`EVAL_TOKENS_PER_PASS`] tokens, and under FP8 a window count whose
/// token count is a multiple of 16 (the GEMMs need it; missing windows are padded).
fn windows_per_pass(seq: usize, fp8: bool) -> usize {
    let base = (EVAL_TOKENS_PER_PASS / seq).max(1);
    if !fp8 {
        return base;
    }
    let step = crate::nn::FP8_DIM_MULTIPLE / gcd(seq, crate::nn::FP8_DIM_MULTIPLE);
    base.div_ceil(step) * step
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl LlamaModel {
    /// The mean next-token loss over the windows of `seq` tokens of `ids`; `progress` is called
    /// with (windows done, windows) after every pass. Forward only, FP8 scaling state untouched.
    pub fn evaluate_text(
        &mut self,
        ids: &[u32],
        seq: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<TextLoss> {
        let windows = text_windows(ids, seq)?;
        let per_pass = windows_per_pass(seq, self.precision().is_fp8());
        let (mut sum, mut done) = (0f64, 0usize);
        for chunk in windows.chunks(per_pass) {
            let padding = if self.precision().is_fp8() {
                per_pass - chunk.len()
            } else {
                0
            };
            let (inputs, targets) = window_batch(chunk, seq, padding);
            let (losses, _) = self.evaluate_losses(&inputs, &[&targets], chunk.len() + padding, seq)?;
            sum += f64::from(losses[0]) * (chunk.len() * (seq - 1)) as f64;
            done += chunk.len();
            progress(done, windows.len());
        }
        let predicted = windows.len() * (seq - 1);
        Ok(TextLoss {
            tokens: windows.len() * seq,
            windows: windows.len(),
            predicted,
            loss: sum / predicted as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_drop_the_short_tail_and_score_all_but_the_last_position() {
        let ids: Vec<u32> = (0..11).collect();
        let w = text_windows(&ids, 4).unwrap();
        assert_eq!(w, vec![&[0, 1, 2, 3][..], &[4, 5, 6, 7][..]]);
        let (inputs, targets) = window_batch(&w, 4, 1);
        assert_eq!(inputs, vec![0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0]);
        let i = IGNORE_INDEX;
        assert_eq!(targets, vec![1, 2, 3, i, 5, 6, 7, i, i, i, i, i]);
        assert!(text_windows(&ids, 12).unwrap_err().to_string().contains("11 tokens"));
        assert!(text_windows(&ids, 1).is_err());
        assert_eq!(windows_per_pass(24, true) * 24 % 16, 0);
        assert_eq!(windows_per_pass(4096, true), 1);
        assert_eq!(windows_per_pass(5, true) % 16, 0);
    }
}
