//! Slice conversions for the hot paths: high precision -> FP8 with a scale and
//! a fused amax, and FP8 -> high precision with a scale.
//!
//! `q = cast(x * scale)` with round-to-nearest-even; the amax is `max |x|` of
//! the *unscaled* input with `fmaxf` semantics (NaN ignored, inf kept).
//! Dequantization is `f32(q) * scale_inv`, rounded to the destination type.
//!
//! Every instruction set ([`Isa`]) gives the same bits as [`scalar`], NaN
//! outputs included. [`quantize`]/[`dequantize`] pick [`Isa::best`] and split
//! long slices over rayon; [`quantize_on`]/[`dequantize_on`] run one thread on
//! the instruction set you name.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod dispatch;
mod element;
#[cfg(target_arch = "x86_64")]
mod encode_params;
mod isa;
pub mod scalar;
mod self_check;
mod to_bf16;

pub use element::HighPrecision;
pub use isa::Isa;
pub use to_bf16::fp8_to_bf16;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::{Fp8Format, Overflow};

/// Slices shorter than this run on one thread. Napkin math: AVX2 converts
/// ~3 G elements/s per thread, so 1 Mi elements take ~350 us on one thread;
/// waking rayon's workers costs ~10 us on bare metal but ~50 us measured on
/// the 2-vCPU VM of `docs/benchmarks.md`, where a split of 256 Ki elements
/// was slower than one thread and 1 Mi broke even. At 1 Mi the overhead is at
/// most ~15% of the work even there, and large tensors (16 Mi) gain.
pub const PARALLEL_MIN_LEN: usize = 1 << 20;

/// Elements per rayon task above the threshold: 64 Ki elements (256 KiB of f32
/// in, 64 KiB of FP8 out) keep a task in L2 and leave enough tasks to balance.
const PARALLEL_CHUNK_LEN: usize = 1 << 16;

fn check_lengths(what: &'static str, src: usize, dst: usize) -> Result<()> {
    if src == dst {
        Ok(())
    } else {
        Err(Error::LengthMismatch { what, src, dst })
    }
}

/// A scale (or scale_inv) must be finite and positive.
pub(crate) fn check_scale(value: f32) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidScale { value })
    }
}

/// Quantizes `src` into `dst` as `cast(x * scale)`; returns the amax of `src`.
///
/// Runs on [`Isa::best`], over rayon's pool when `src` has at least
/// [`PARALLEL_MIN_LEN`] elements. The result is the same bits as [`scalar::quantize`].
///
/// ```
/// use fp8_engine::convert::quantize;
/// use fp8_engine::format::{Fp8Format, Overflow};
///
/// let x = [1.0f32, -2.5, 1000.0];
/// let mut q = [0u8; 3];
/// let amax = quantize(&x, &mut q, Fp8Format::E4M3, 0.5, Overflow::Saturate)?;
/// assert_eq!(amax, 1000.0);
/// assert_eq!(Fp8Format::E4M3.decode(q[2]), 448.0);
/// # Ok::<(), fp8_engine::Error>(())
/// ```
pub fn quantize<T: HighPrecision>(
    src: &[T],
    dst: &mut [u8],
    format: Fp8Format,
    scale: f32,
    overflow: Overflow,
) -> Result<f32> {
    check_lengths("quantize", src.len(), dst.len())?;
    check_scale(scale)?;
    let isa = Isa::best();
    // SAFETY (both calls): `Isa::best` only returns available instruction sets.
    if src.len() < PARALLEL_MIN_LEN {
        return Ok(unsafe { dispatch::quantize(isa, src, dst, format, scale, overflow) });
    }
    // Every chunk amax is >= +0 and never NaN, so max is exact in any order.
    Ok(src
        .par_chunks(PARALLEL_CHUNK_LEN)
        .zip(dst.par_chunks_mut(PARALLEL_CHUNK_LEN))
        .map(|(s, d)| unsafe { dispatch::quantize(isa, s, d, format, scale, overflow) })
        .reduce(|| 0.0, f32::max))
}

/// Dequantizes `src` into `dst` as `decode(q) * scale_inv`.
///
/// Runs on [`Isa::best`], over rayon's pool when `src` has at least
/// [`PARALLEL_MIN_LEN`] elements. The result is the same bits as [`scalar::dequantize`].
pub fn dequantize<T: HighPrecision>(src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) -> Result<()> {
    check_lengths("dequantize", src.len(), dst.len())?;
    check_scale(scale_inv)?;
    let isa = Isa::best();
    // SAFETY (both calls): `Isa::best` only returns available instruction sets.
    if src.len() < PARALLEL_MIN_LEN {
        unsafe { dispatch::dequantize(isa, src, dst, format, scale_inv) };
    } else {
        src.par_chunks(PARALLEL_CHUNK_LEN)
            .zip(dst.par_chunks_mut(PARALLEL_CHUNK_LEN))
            .for_each(|(s, d)| unsafe { dispatch::dequantize(isa, s, d, format, scale_inv) });
    }
    Ok(())
}

/// [`quantize`] on one thread with the given instruction set (as asked: no
/// self-check, unlike [`Isa::best`]).
///
/// Errors: [`Error::LengthMismatch`], [`Error::InvalidScale`], and
/// [`Error::IsaUnavailable`] when this CPU cannot run `isa`.
pub fn quantize_on<T: HighPrecision>(
    isa: Isa,
    src: &[T],
    dst: &mut [u8],
    format: Fp8Format,
    scale: f32,
    overflow: Overflow,
) -> Result<f32> {
    check_lengths("quantize", src.len(), dst.len())?;
    check_scale(scale)?;
    isa.ensure_available()?;
    // SAFETY: `isa` was just checked to be available.
    Ok(unsafe { dispatch::quantize(isa, src, dst, format, scale, overflow) })
}

/// [`dequantize`] on one thread with the given instruction set.
///
/// Errors: [`Error::LengthMismatch`], [`Error::InvalidScale`], and
/// [`Error::IsaUnavailable`] when this CPU cannot run `isa`.
pub fn dequantize_on<T: HighPrecision>(
    isa: Isa,
    src: &[u8],
    dst: &mut [T],
    format: Fp8Format,
    scale_inv: f32,
) -> Result<()> {
    check_lengths("dequantize", src.len(), dst.len())?;
    check_scale(scale_inv)?;
    isa.ensure_available()?;
    // SAFETY: `isa` was just checked to be available.
    unsafe { dispatch::dequantize(isa, src, dst, format, scale_inv) };
    Ok(())
}
