//! Launchers of `cuda/loss.cu`: softmax cross-entropy forward/backward (f32
//! log-sum-exp, ignored targets) and the argmax of each row. Twins:
//! `ops::cross_entropy_forward/backward` within the reduction bound of
//! `docs/numerics.md` (the loss is summed in the twin's order: partials of the
//! same row blocks, then the partials in order), and the greedy decoder's
//! left-to-right argmax (same indices).

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::launch;
use super::op_args::{check_len, elements, row_blocks, rows_per_partial, stride_blocks, to_u32};
use super::params::{Fp8CrossEntropyParams, Fp8EltwiseParams};
use crate::error::Result;
use crate::memory::MemoryCategory;

const MODULE: &str = "loss";

/// The twin's own checks of a cross-entropy call (`ops::loss::check`, so the errors are the
/// same); returns the rows that count (target != ignore).
pub(crate) fn counted_rows(
    what: &'static str,
    logits: usize,
    targets: &[u32],
    vocab: usize,
    ignore: u32,
) -> Result<usize> {
    crate::ops::loss::check(what, logits, targets, vocab, ignore).map(|(_, count)| count)
}

/// The gradient factor of every counted row: `dloss / max(count, 1)`, as the twin rounds it.
pub(crate) fn grad_factor(dloss: f32, count: usize) -> f32 {
    dloss / count.max(1) as f32
}

impl CudaDevice {
    fn ce_params(
        &self,
        kernel: &'static str,
        logits: &DeviceBuffer<f32>,
        targets: &DeviceBuffer<u32>,
        vocab: usize,
        ignore: u32,
        count: usize,
    ) -> Result<Fp8CrossEntropyParams> {
        Ok(Fp8CrossEntropyParams {
            logits: logits.address(self),
            targets: targets.address(self),
            rows: targets.len() as u64,
            vocab: vocab as u64,
            ignore,
            count: to_u32(kernel, "counted rows", count)?,
            rows_per_block: to_u32(kernel, "rows per partial", rows_per_partial(vocab))?,
            ..Default::default()
        })
    }

    /// Mean cross-entropy of `logits [targets.len(), vocab]` over the rows whose target is not
    /// `ignore`, written to `loss[0]` (0 when no row counts), and the per-row log-sum-exp into
    /// `lse` (every row). Targets are checked on the host (the twin's errors) and uploaded.
    /// Twin of `ops::cross_entropy_forward`.
    pub fn cross_entropy_forward(
        &self,
        logits: &DeviceBuffer<f32>,
        targets: &[u32],
        vocab: usize,
        ignore: u32,
        lse: &mut DeviceBuffer<f32>,
        loss: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "cross_entropy_forward";
        let count = counted_rows("cross-entropy forward", logits.len(), targets, vocab, ignore)?;
        check_len(K, "lse", lse.len(), targets.len())?;
        check_len(K, "loss", loss.len(), 1)?;
        let targets_dev = self.upload(targets, MemoryCategory::Workspace)?;
        let mut row_loss = self.alloc_zeros::<f32>(targets.len().max(1), MemoryCategory::Workspace)?;
        let mut p = self.ce_params(K, logits, &targets_dev, vocab, ignore, count)?;
        p.lse = lse.address_mut(self);
        p.row_loss = row_loss.address_mut(self);
        p.loss = loss.address_mut(self);
        if !targets.is_empty() {
            launch(self, MODULE, "fp8_cross_entropy_rows", row_blocks(K, targets.len())?, p)?;
        }
        launch(self, MODULE, "fp8_cross_entropy_mean", 1, p)
    }

    /// `dlogits = dloss / count * (softmax(logits) - onehot(target))`, 0 on ignored rows,
    /// from the forward's `lse`. Twin of `ops::cross_entropy_backward`.
    #[allow(clippy::too_many_arguments)]
    pub fn cross_entropy_backward(
        &self,
        logits: &DeviceBuffer<f32>,
        targets: &[u32],
        vocab: usize,
        ignore: u32,
        lse: &DeviceBuffer<f32>,
        dloss: f32,
        dlogits: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "cross_entropy_backward";
        let count = counted_rows("cross-entropy backward", logits.len(), targets, vocab, ignore)?;
        check_len(K, "lse", lse.len(), targets.len())?;
        check_len(K, "dlogits", dlogits.len(), logits.len())?;
        if targets.is_empty() {
            return Ok(());
        }
        let targets_dev = self.upload(targets, MemoryCategory::Workspace)?;
        let mut p = self.ce_params(K, logits, &targets_dev, vocab, ignore, count)?;
        p.lse = lse.address(self);
        p.dlogits = dlogits.address_mut(self);
        p.grad = grad_factor(dloss, count);
        let blocks = stride_blocks(self.info().multiprocessors, logits.len());
        launch(self, MODULE, "fp8_cross_entropy_backward", blocks, p)
    }

    /// `out[r]` = the first index of the largest value of row `r` of `logits [rows, cols]`
    /// (NaN never wins; a NaN first element gives 0), as the greedy decoder's argmax.
    pub fn argmax(
        &self,
        logits: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        out: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        const K: &str = "argmax";
        check_len(K, "logits", logits.len(), elements(K, rows, cols)?)?;
        check_len(K, "indices", out.len(), rows)?;
        if rows == 0 {
            return Ok(());
        }
        let params = Fp8EltwiseParams {
            a: logits.address(self),
            out: out.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            ..Default::default()
        };
        launch(self, MODULE, "fp8_argmax", row_blocks(K, rows)?, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_and_counted_like_the_twin() {
        assert_eq!(counted_rows("ce", 12, &[0, 3, 1], 4, 3).unwrap(), 2);
        assert_eq!(counted_rows("ce", 12, &[0, 2, 1], 4, u32::MAX).unwrap(), 3);
        let mut lse = vec![0.0; 3];
        let cpu = crate::ops::cross_entropy_forward(&[0.0; 12], &[0, 7, 1], 4, u32::MAX, &mut lse).unwrap_err();
        assert_eq!(
            counted_rows("cross-entropy forward", 12, &[0, 7, 1], 4, u32::MAX).unwrap_err(),
            cpu
        );
        assert!(counted_rows("ce", 11, &[0, 1, 2], 4, 9).is_err());
        assert!(counted_rows("ce", 0, &[], 0, 9).is_err());
    }

    #[test]
    fn the_gradient_factor_never_divides_by_zero() {
        assert_eq!(grad_factor(1.0, 4), 0.25);
        assert_eq!(grad_factor(3.0, 0), 3.0);
    }
}
