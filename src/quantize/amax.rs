//! `max |x|` with `fmaxf` semantics: NaN elements ignored, inf kept, 0 for an
//! empty or all-NaN input.

use rayon::prelude::*;

use crate::convert::HighPrecision;

/// Elements per parallel chunk.
const CHUNK: usize = 1 << 16;

/// `if v > m { v } else { m }`: a NaN `v` compares false and is ignored, the
/// `fmaxf` result for a non-NaN running max, in one `maxps` (where `f32::max`
/// needs a NaN fix-up around it).
#[inline(always)]
fn max_ignoring_nan(m: f32, v: f32) -> f32 {
    if v > m { v } else { m }
}

/// Single-threaded amax over 16 independent lanes, so the compiler keeps
/// vectors of running maxima. Max is order-independent here (NaN ignored, all
/// inputs non-negative), so the lanes give exactly the sequential result.
pub(crate) fn amax_serial<T: HighPrecision>(src: &[T]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = src.chunks_exact(16);
    for chunk in &mut chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane = max_ignoring_nan(*lane, x.to_f32().abs());
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0.0f32, |m, x| max_ignoring_nan(m, x.to_f32().abs()));
    lanes.into_iter().fold(tail, max_ignoring_nan)
}

/// `max |x|` over `src`, multithreaded.
pub fn amax<T: HighPrecision>(src: &[T]) -> f32 {
    src.par_chunks(CHUNK).map(amax_serial).reduce(|| 0.0, f32::max)
}
