//! Operands as f32 without their scales: FP8 codes, bf16 and f16 widen
//! exactly, so every product of two decoded values is exact in f32
//! (at most 11 + 11 significant bits <= 24).

use std::borrow::Cow;

use rayon::prelude::*;

use super::super::operand::Operand;
use crate::convert::{self, HighPrecision};
use crate::error::Result;

/// Elements per parallel widening chunk.
const CHUNK: usize = 1 << 16;

/// Every element of `op` as f32, row-major `rows x K`; plain f32 is borrowed.
pub(super) fn unscaled<'a>(op: &Operand<'a>) -> Result<Cow<'a, [f32]>> {
    Ok(match op {
        Operand::Fp8(format, q) => {
            let mut values = vec![0.0f32; q.data().len()];
            // A scale_inv of 1 decodes the codes exactly (SIMD, parallel for big tensors).
            convert::dequantize(q.data(), &mut values, *format, 1.0)?;
            Cow::Owned(values)
        }
        Operand::F32(m) => Cow::Borrowed(m.data),
        Operand::Bf16(m) => Cow::Owned(widen(m.data)),
        Operand::F16(m) => Cow::Owned(widen(m.data)),
    })
}

fn widen<T: HighPrecision>(src: &[T]) -> Vec<f32> {
    let mut values = vec![0.0f32; src.len()];
    values
        .par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d = s.to_f32()));
    values
}
