//! A pool of reusable buffers keyed by element count: the staged op arms
//! (`dispatch::cuda_ops`) lease a device buffer per op argument, so without a
//! pool one training step would allocate and free thousands of buffers
//! (a layer's forward + backward stages ~40 tensors). Host-side logic only (it
//! holds any value `B`), so it is unit-tested without a GPU.
//!
//! Buffers of one length are interchangeable; a returned buffer is kept while
//! its length has fewer than `per_len` spares, it is at most `max_buffer_bytes`
//! and the pool's bytes stay under `limit_bytes`, else it is handed back to the
//! caller to free.

use std::collections::HashMap;

/// Spare buffers by length, with a cap on the bytes held.
#[derive(Debug)]
pub(crate) struct SizePool<B> {
    spares: HashMap<usize, Vec<B>>,
    element_bytes: u64,
    held_bytes: u64,
    limit_bytes: u64,
    per_len: usize,
    max_buffer_bytes: u64,
}

impl<B> SizePool<B> {
    /// A pool of buffers of `element_bytes` per element, holding at most `limit_bytes` in at
    /// most `per_len` spares of each length, none larger than `max_buffer_bytes`.
    pub(crate) fn new(element_bytes: usize, limit_bytes: u64, per_len: usize, max_buffer_bytes: u64) -> Self {
        SizePool {
            spares: HashMap::new(),
            element_bytes: element_bytes as u64,
            held_bytes: 0,
            limit_bytes,
            per_len,
            max_buffer_bytes,
        }
    }

    fn bytes(&self, len: usize) -> u64 {
        (len as u64).saturating_mul(self.element_bytes)
    }

    /// A spare buffer of exactly `len` elements, if one is held.
    pub(crate) fn take(&mut self, len: usize) -> Option<B> {
        let spare = self.spares.get_mut(&len)?.pop()?;
        self.held_bytes -= self.bytes(len);
        Some(spare)
    }

    /// Keeps `buffer` (of `len` elements) for a later [`Self::take`], or gives it back when the
    /// pool is full for that length or in bytes, or the buffer is too large to keep (the
    /// caller then frees it).
    pub(crate) fn give(&mut self, len: usize, buffer: B) -> Option<B> {
        let bytes = self.bytes(len);
        if bytes > self.max_buffer_bytes {
            return Some(buffer);
        }
        let spares = self.spares.entry(len).or_default();
        if spares.len() >= self.per_len || self.held_bytes.saturating_add(bytes) > self.limit_bytes {
            return Some(buffer);
        }
        spares.push(buffer);
        self.held_bytes += bytes;
        None
    }

    /// Bytes of the spares held now.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_reused_for_the_same_length_only() {
        let mut pool = SizePool::new(4, 1 << 20, 4, 1 << 20);
        assert_eq!(pool.take(8), None);
        assert_eq!(pool.give(8, "a"), None);
        assert_eq!(pool.held_bytes(), 32);
        assert_eq!(pool.take(9), None, "another length is another buffer");
        assert_eq!(pool.take(8), Some("a"));
        assert_eq!((pool.take(8), pool.held_bytes()), (None, 0));
    }

    #[test]
    fn the_pool_keeps_at_most_per_len_spares_and_limit_bytes() {
        let mut pool = SizePool::new(4, 100, 2, 100);
        assert_eq!(pool.give(5, 1), None);
        assert_eq!(pool.give(5, 2), None);
        assert_eq!(pool.give(5, 3), Some(3), "a third spare of one length is freed");
        assert_eq!(pool.held_bytes(), 40);
        assert_eq!(pool.give(10, 4), None, "40 + 40 bytes fit in 100");
        assert_eq!(pool.give(6, 5), Some(5), "80 + 24 bytes would exceed 100");
        assert_eq!(pool.take(10), Some(4));
        assert_eq!(pool.give(6, 5), None, "40 + 24 bytes fit once a spare is taken");
    }

    #[test]
    fn a_buffer_over_the_size_cap_is_never_kept() {
        let mut pool = SizePool::new(4, 1 << 20, 4, 64);
        assert_eq!(pool.give(16, "at the cap"), None);
        assert_eq!(pool.give(17, "over it"), Some("over it"));
        assert_eq!((pool.take(17), pool.held_bytes()), (None, 64));
    }

    #[test]
    fn spares_of_one_length_come_back_last_in_first_out() {
        let mut pool = SizePool::new(1, 1 << 10, 8, 1 << 10);
        for b in 0..3 {
            assert_eq!(pool.give(16, b), None);
        }
        assert_eq!(
            [pool.take(16), pool.take(16), pool.take(16)],
            [Some(2), Some(1), Some(0)]
        );
    }
}
