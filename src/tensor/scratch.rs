//! Recycled f32 buffers for the activations and gradients of a training step.
//!
//! A step allocates the same sizes every time: a fresh zeroed buffer costs a memset (and, once
//! the allocator has handed large blocks back to the system, page faults), spent on values the
//! op then overwrites (memset ~4.5% of an fp32 layer step, docs/benchmarks.md). Buffers that die
//! in a step (a consumed output, a saved input after its backward) come back here; the next
//! allocation of the same length takes one.
//!
//! Per thread, bounded ([`MAX_BUFFERS`], [`MAX_BYTES`]: the oldest go first), and outside the
//! memory ledger: the ledger counts what the model holds (saved activations, weight copies), and
//! these buffers are free memory kept for reuse, as an allocator keeps it.

use std::cell::RefCell;

/// At most this many buffers are kept per thread.
const MAX_BUFFERS: usize = 48;
/// At most this many bytes (of capacity) are kept per thread: a layer of the issue-20 model
/// (hidden 256, FFN 1024, 1024 tokens) frees tens of MiB per step.
const MAX_BYTES: usize = 96 << 20;
/// Smaller buffers are not kept: the allocator serves them without a memset worth saving.
const MIN_VALUES: usize = 1024;

thread_local! {
    static POOL: RefCell<Pool> = const { RefCell::new(Pool { buffers: Vec::new(), bytes: 0 }) };
}

struct Pool {
    /// Oldest first.
    buffers: Vec<Vec<f32>>,
    bytes: usize,
}

impl Pool {
    /// The kept buffer of exactly `len` values kept last, removed.
    fn take(&mut self, len: usize) -> Option<Vec<f32>> {
        let i = self.buffers.iter().rposition(|b| b.len() == len)?;
        let buffer = self.buffers.remove(i);
        self.bytes -= bytes(&buffer);
        Some(buffer)
    }

    fn keep(&mut self, buffer: Vec<f32>) {
        let size = bytes(&buffer);
        if buffer.len() < MIN_VALUES || size > MAX_BYTES {
            return;
        }
        while !self.buffers.is_empty() && (self.buffers.len() >= MAX_BUFFERS || self.bytes + size > MAX_BYTES) {
            let oldest = self.buffers.remove(0);
            self.bytes -= bytes(&oldest);
        }
        self.bytes += size;
        self.buffers.push(buffer);
    }
}

fn bytes(buffer: &Vec<f32>) -> usize {
    4 * buffer.capacity()
}

/// `len` values for an output its op overwrites entirely (a GEMM with beta = 0, a norm's
/// output): a recycled buffer holding stale values, or a fresh zeroed one. Never for an
/// output that is accumulated into or written in part.
pub(crate) fn overwritten(len: usize) -> Vec<f32> {
    POOL.with_borrow_mut(|pool| pool.take(len))
        .unwrap_or_else(|| vec![0.0; len])
}

/// An empty vector with room for `len` values, to fill with `extend` (no stale value can be read).
pub(crate) fn empty_with_room(len: usize) -> Vec<f32> {
    match POOL.with_borrow_mut(|pool| pool.take(len)) {
        Some(mut buffer) => {
            buffer.clear();
            buffer
        }
        None => Vec::with_capacity(len),
    }
}

/// A copy of `values`, in a recycled buffer where one of their length is kept.
pub(crate) fn copy_of(values: &[f32]) -> Vec<f32> {
    let mut copy = empty_with_room(values.len());
    copy.extend_from_slice(values);
    copy
}

/// Gives `buffer` back for a later [`overwritten`] or [`empty_with_room`] of its length.
pub(crate) fn recycle(buffer: Vec<f32>) {
    POOL.with_borrow_mut(|pool| pool.keep(buffer));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept() -> (usize, usize) {
        POOL.with_borrow(|pool| (pool.buffers.len(), pool.bytes))
    }

    #[test]
    fn a_recycled_buffer_serves_the_next_request_of_its_length() {
        let buffer = vec![7.0f32; 4096];
        let address = buffer.as_ptr();
        recycle(buffer);
        // Another length gets a fresh zeroed buffer and leaves the kept one.
        let other = overwritten(2048);
        assert!(other.iter().all(|&v| v == 0.0));
        assert_ne!(other.as_ptr(), address);
        let again = overwritten(4096);
        assert_eq!((again.as_ptr(), again.len()), (address, 4096));
        assert_eq!(kept(), (0, 0));
        recycle(again);
        let empty = empty_with_room(4096);
        assert_eq!((empty.as_ptr(), empty.len()), (address, 0));
        assert!(empty.capacity() >= 4096);
    }

    #[test]
    fn the_pool_stays_within_its_bounds_dropping_the_oldest() {
        let small = vec![1.0f32; MIN_VALUES - 1];
        recycle(small);
        assert_eq!(kept(), (0, 0), "small buffers are not kept");
        for i in 0..MAX_BUFFERS + 5 {
            recycle(vec![i as f32; MIN_VALUES]);
        }
        let (count, bytes) = kept();
        assert_eq!((count, bytes), (MAX_BUFFERS, MAX_BUFFERS * 4 * MIN_VALUES));
        // The newest is served first; the five oldest were dropped.
        assert_eq!(overwritten(MIN_VALUES)[0], (MAX_BUFFERS + 4) as f32);
        let big = MAX_BYTES / 4 / 2;
        recycle(vec![0.5; big]);
        recycle(vec![0.25; big]);
        recycle(vec![0.125; big]);
        let (_, bytes) = kept();
        assert!(bytes <= MAX_BYTES, "{bytes} bytes kept");
        assert_eq!(overwritten(big)[0], 0.125);
        assert_eq!(overwritten(big)[0], 0.25);
        assert!(
            overwritten(big).iter().all(|&v| v == 0.0),
            "the oldest big one was dropped"
        );
        recycle(vec![0.0; MAX_BYTES / 4 + 1]);
        assert!(kept().1 <= MAX_BYTES, "a buffer over the bound is not kept");
    }
}

#[cfg(test)]
mod layer_tests {
    use super::recycle;
    use crate::amp::Precision;
    use crate::nn::{Module, TransformerConfig, TransformerLayer};
    use crate::tensor::Tensor;

    fn values(rows: usize, cols: usize, seed: f32) -> Tensor {
        let data = (0..rows * cols).map(|i| (i as f32 * seed).sin()).collect();
        Tensor::new(data, rows, cols).unwrap()
    }

    /// Two steps (the weights marked updated between them, so their copies are remade): the
    /// outputs, dX and every parameter gradient, as bits. `poison` runs before each step.
    fn two_steps(precision: &Precision, poison: &dyn Fn()) -> Vec<u32> {
        let config = TransformerConfig {
            hidden: 32,
            heads: 2,
            ffn_hidden: 64,
            ..TransformerConfig::default()
        };
        let (batch, seq) = (2, 16);
        let mut layer = TransformerLayer::new("layer", &config, precision, 11).unwrap();
        let mut bits = Vec::new();
        for step in 0..2 {
            let seed = 0.3 + step as f32 * 0.17;
            let (x, dy) = (values(batch * seq, 32, seed), values(batch * seq, 32, seed + 0.5));
            layer.visit_parameters(&mut |p| {
                p.zero_grad();
                p.mark_updated();
            });
            poison();
            bits.extend(
                layer
                    .forward(&x, batch, seq)
                    .unwrap()
                    .data()
                    .iter()
                    .map(|v| v.to_bits()),
            );
            poison();
            bits.extend(layer.backward(&dy).unwrap().data().iter().map(|v| v.to_bits()));
            layer.visit_parameters(&mut |p| bits.extend(p.grad().iter().map(|v| v.to_bits())));
        }
        bits
    }

    /// Recycled buffers hold stale values: with the pool full of NaN buffers of every size a
    /// layer step allocates (32 tokens x 32, x 96, x 64; the weights' sizes coincide), a layer
    /// gives the bits it gives without them. A stale value read anywhere would show as a NaN.
    #[test]
    fn stale_recycled_buffers_leave_a_layer_step_unchanged() {
        let poison = || {
            for len in [32 * 32, 32 * 96, 32 * 64] {
                for _ in 0..6 {
                    recycle(vec![f32::NAN; len]);
                }
            }
        };
        for name in ["fp32", "bf16", "fp8-delayed"] {
            let precision: Precision = name.parse().unwrap();
            let plain = two_steps(&precision, &|| {});
            assert_eq!(plain, two_steps(&precision, &poison), "{name}");
        }
    }
}
