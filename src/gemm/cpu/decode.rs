//! Operands as f32 without their scales: FP8 codes, bf16 and f16 widen
//! exactly, so every product of two decoded values is exact in f32
//! (at most 11 + 11 significant bits <= 24).
//!
//! The decoded copies live in buffers kept per thread across calls: a fresh
//! multi-megabyte buffer costs a page fault per 4 KiB on every GEMM (the
//! allocator hands large freed blocks back to the kernel), a reused one nothing.
//! A kept buffer keeps its whole length when it serves a shorter request (a [`Kept`] views a
//! prefix), so it is zeroed once, when it first grows, not again on every longer request.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

use rayon::prelude::*;

use super::super::operand::Operand;
use super::transpose::transpose_into;
use crate::convert::{self, HighPrecision};
use crate::error::Result;

/// Elements per parallel widening chunk.
const CHUNK: usize = 1 << 16;
/// Decoded buffers a thread keeps: the two operands of one GEMM and B's transpose
/// (`transpose.rs`) or packed copy (`packed.rs`), taken while B's decoded copy is still held.
const KEPT: usize = 3;
/// Largest buffer kept (64 MiB of f32): bigger ones are freed, so a rare huge GEMM does not
/// hold its operands' size for the rest of the run.
const KEPT_MAX_ELEMENTS: usize = 1 << 24;

thread_local! {
    static BUFFERS: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// The f32 values of an operand: borrowed (plain f32) or decoded into a kept buffer.
pub(super) enum Unscaled<'a> {
    Borrowed(&'a [f32]),
    Decoded(Kept),
}

impl Deref for Unscaled<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            Unscaled::Borrowed(values) => values,
            Unscaled::Decoded(values) => values,
        }
    }
}

/// The first `len` values of a buffer this thread keeps; handed back to the thread's buffers
/// when dropped.
pub(super) struct Kept {
    values: Vec<f32>,
    len: usize,
}

impl Deref for Kept {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.values[..self.len]
    }
}

impl DerefMut for Kept {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.values[..self.len]
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if self.values.capacity() <= KEPT_MAX_ELEMENTS {
            let values = std::mem::take(&mut self.values);
            // `try_with`: a value dropped while the thread exits has nowhere to go.
            let _ = BUFFERS.try_with(|kept| {
                let mut kept = kept.borrow_mut();
                if kept.len() < KEPT {
                    kept.push(values);
                }
            });
        }
    }
}

/// A buffer of `len` values, reusing one this thread kept (the longest, which most often
/// fits). Its contents are unspecified (a reused buffer keeps old values instead of paying
/// a pass of zeros): every caller overwrites all of them. Only growth past the longest kept
/// length is zeroed.
pub(super) fn buffer(len: usize) -> Kept {
    let mut values = BUFFERS
        .try_with(|kept| {
            let mut kept = kept.borrow_mut();
            let longest = (0..kept.len()).max_by_key(|&i| kept[i].len());
            longest.map(|i| kept.swap_remove(i))
        })
        .ok()
        .flatten()
        .unwrap_or_default();
    if values.len() < len {
        values.resize(len, 0.0);
    }
    Kept { values, len }
}

/// Every element of `op` as f32, row-major `rows x K`; plain f32 is borrowed.
pub(super) fn unscaled<'a>(op: &Operand<'a>) -> Result<Unscaled<'a>> {
    Ok(match op {
        Operand::Fp8(format, q) => {
            let mut values = buffer(q.data().len());
            // A scale_inv of 1 decodes the codes exactly (SIMD, parallel for big tensors).
            convert::dequantize(q.data(), &mut values, *format, 1.0)?;
            Unscaled::Decoded(values)
        }
        Operand::F32(m) => Unscaled::Borrowed(m.data),
        Operand::Bf16(m) => Unscaled::Decoded(widen(m.data)),
        Operand::F16(m) => Unscaled::Decoded(widen(m.data)),
    })
}

/// `values` (`[rows, cols]` row-major) as `[cols, rows]`, in a kept buffer.
pub(super) fn transposed(values: &[f32], rows: usize, cols: usize) -> Unscaled<'static> {
    let mut out = buffer(values.len());
    transpose_into(values, rows, cols, &mut out);
    Unscaled::Decoded(out)
}

fn widen<T: HighPrecision>(src: &[T]) -> Kept {
    let mut values = buffer(src.len());
    values
        .par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d = s.to_f32()));
    values
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Mat;
    use half::bf16;

    /// A decoded operand's buffer is reused by the next call on the thread, and holds exactly
    /// the next operand's values (nothing left over from a longer previous one).
    #[test]
    fn decoded_buffers_are_reused_with_the_new_values_only() {
        let long: Vec<bf16> = (0..4096).map(|i| bf16::from_f32(i as f32)).collect();
        let short: Vec<bf16> = (0..100).map(|i| bf16::from_f32(-(i as f32))).collect();
        let first = unscaled(&Operand::Bf16(Mat::new(&long, 64, 64).unwrap())).unwrap();
        let first_ptr = first.as_ptr();
        drop(first);
        let second = unscaled(&Operand::Bf16(Mat::new(&short, 10, 10).unwrap())).unwrap();
        assert_eq!(second.as_ptr(), first_ptr, "the kept buffer is reused");
        let want: Vec<f32> = short.iter().map(|v| v.to_f32()).collect();
        assert_eq!(&*second, &want[..]);
    }
}
