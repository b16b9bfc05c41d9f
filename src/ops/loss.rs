//! Softmax cross-entropy over rows of logits, in f32.
//!
//! Row `r` of `logits [rows, vocab]` with target `t_r`:
//! `lse_r = log sum_j exp(logits_rj)` (max-subtracted), `loss_r = lse_r - logits_{r, t_r}`;
//! the loss is the mean over rows whose target is not `ignore` (0 when every row is ignored,
//! so a fully padded micro-batch contributes nothing instead of NaN).
//! Backward: `dlogits_rj = dloss / count * (exp(logits_rj - lse_r) - [j == t_r])`, zero on ignored rows.

use rayon::prelude::*;

use super::check::{len, rows_per_task};
use crate::error::{Error, Result};

/// Rows and the number of rows that count, after checking every length and target.
pub(crate) fn check(
    what: &'static str,
    logits: usize,
    targets: &[u32],
    vocab: usize,
    ignore: u32,
) -> Result<(usize, usize)> {
    if vocab == 0 {
        return Err(Error::InvalidShape {
            what,
            reason: "vocab is 0".into(),
        });
    }
    let rows = targets.len();
    len("cross-entropy logits [rows, vocab]", rows, vocab, logits)?;
    let mut count = 0;
    for (position, &t) in targets.iter().enumerate() {
        if t == ignore {
            continue;
        }
        if t as usize >= vocab {
            return Err(Error::IndexOutOfRange {
                what: "cross-entropy target",
                index: t.into(),
                position,
                len: vocab,
            });
        }
        count += 1;
    }
    Ok((rows, count))
}

/// Mean cross-entropy of `logits [targets.len(), vocab]` against `targets`, skipping rows whose
/// target is `ignore` (`u32::MAX`: none). Writes the per-row log-sum-exp into `lse` (every row,
/// ignored ones too) for the backward.
pub fn cross_entropy_forward(
    logits: &[f32],
    targets: &[u32],
    vocab: usize,
    ignore: u32,
    lse: &mut [f32],
) -> Result<f32> {
    let (rows, count) = check("cross-entropy forward", logits.len(), targets, vocab, ignore)?;
    len("cross-entropy lse", rows, 1, lse.len())?;
    let block = rows_per_task(vocab);
    // Per-block sums added in block order: the same loss on any thread count.
    let partial: Vec<f32> = lse
        .par_chunks_mut(block)
        .zip(logits.par_chunks(block * vocab).zip(targets.par_chunks(block)))
        .map(|(lb, (xb, tb))| {
            let mut sum = 0.0f32;
            for ((l, row), &t) in lb.iter_mut().zip(xb.chunks(vocab)).zip(tb) {
                let m = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                *l = m + row.iter().map(|&x| (x - m).exp()).sum::<f32>().ln();
                if t != ignore {
                    sum += *l - row[t as usize];
                }
            }
            sum
        })
        .collect();
    if count == 0 {
        return Ok(0.0);
    }
    Ok(partial.iter().sum::<f32>() / count as f32)
}

/// Gradient of [`cross_entropy_forward`]'s mean loss times `dloss`; overwrites `dlogits`.
pub fn cross_entropy_backward(
    logits: &[f32],
    targets: &[u32],
    vocab: usize,
    ignore: u32,
    lse: &[f32],
    dloss: f32,
    dlogits: &mut [f32],
) -> Result<()> {
    let (rows, count) = check("cross-entropy backward", logits.len(), targets, vocab, ignore)?;
    len("cross-entropy lse", rows, 1, lse.len())?;
    len("cross-entropy dlogits [rows, vocab]", rows, vocab, dlogits.len())?;
    let g = dloss / count.max(1) as f32;
    let block = rows_per_task(vocab);
    dlogits
        .par_chunks_mut(block * vocab)
        .zip(logits.par_chunks(block * vocab))
        .zip(lse.par_chunks(block).zip(targets.par_chunks(block)))
        .for_each(|((db, xb), (lb, tb))| {
            for ((drow, row), (&l, &t)) in db.chunks_mut(vocab).zip(xb.chunks(vocab)).zip(lb.iter().zip(tb)) {
                if t == ignore {
                    drow.fill(0.0);
                    continue;
                }
                for (d, &x) in drow.iter_mut().zip(row) {
                    *d = g * (x - l).exp();
                }
                drow[t as usize] -= g;
            }
        });
    Ok(())
}
