//! `max |x|` with `fmaxf` semantics: NaN elements ignored, inf kept, 0 for an
//! empty or all-NaN input.

use rayon::prelude::*;

use crate::convert::HighPrecision;

/// Elements per parallel chunk.
const CHUNK: usize = 1 << 16;

/// Single-threaded amax over 8 independent lanes, so the compiler can keep a
/// vector of running maxima. Max is order-independent here (NaN ignored, all
/// inputs non-negative), so the lanes give exactly the sequential result.
pub(crate) fn amax_serial<T: HighPrecision>(src: &[T]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = src.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x.to_f32().abs());
        }
    }
    let tail = chunks.remainder().iter().fold(0.0f32, |m, x| m.max(x.to_f32().abs()));
    lanes.into_iter().fold(tail, f32::max)
}

/// `max |x|` over `src`, multithreaded.
pub fn amax<T: HighPrecision>(src: &[T]) -> f32 {
    src.par_chunks(CHUNK).map(amax_serial).reduce(|| 0.0, f32::max)
}
