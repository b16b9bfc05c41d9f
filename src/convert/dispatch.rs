//! Routes one slice conversion to the kernel of an instruction set, single-threaded.
//! Element types other than f32/bf16/f16 (a user's own `HighPrecision`) run scalar.

#[cfg(target_arch = "x86_64")]
use std::any::TypeId;

#[cfg(target_arch = "x86_64")]
use half::{bf16, f16};

use super::{HighPrecision, Isa, scalar};
use crate::format::{Fp8Format, Overflow};

/// `src` as a `&[U]` when `T` is `U`.
#[cfg(target_arch = "x86_64")]
fn as_slice_of<T: 'static, U: 'static>(src: &[T]) -> Option<&[U]> {
    // SAFETY: `T` and `U` are the same type, so the layout and length are the same.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts(src.as_ptr().cast(), src.len()) })
}

/// `dst` as a `&mut [U]` when `T` is `U`.
#[cfg(target_arch = "x86_64")]
fn as_mut_slice_of<T: 'static, U: 'static>(dst: &mut [T]) -> Option<&mut [U]> {
    if TypeId::of::<T>() == TypeId::of::<U>() {
        // SAFETY: `T` and `U` are the same type, and `dst`'s borrow moves into the result.
        Some(unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast(), dst.len()) })
    } else {
        None
    }
}

/// Runs `$kernel` on `$slice` seen as its concrete element type (f32, bf16 or
/// f16), or `$fallback` for any other type.
#[cfg(target_arch = "x86_64")]
macro_rules! with_concrete_type {
    ($cast:ident, $slice:expr, |$s:ident| $kernel:expr, $fallback:expr) => {
        if let Some($s) = $cast::<_, f32>($slice) {
            $kernel
        } else if let Some($s) = $cast::<_, bf16>($slice) {
            $kernel
        } else if let Some($s) = $cast::<_, f16>($slice) {
            $kernel
        } else {
            $fallback
        }
    };
}

/// Quantizes on `isa`; `src` and `dst` have the same length.
///
/// # Safety
/// `isa.is_available()` is true.
pub(super) unsafe fn quantize<T: HighPrecision>(
    isa: Isa,
    src: &[T],
    dst: &mut [u8],
    format: Fp8Format,
    scale: f32,
    overflow: Overflow,
) -> f32 {
    debug_assert_eq!(src.len(), dst.len());
    match isa {
        Isa::Scalar => scalar::quantize(src, dst, format, scale, overflow),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => with_concrete_type!(
            as_slice_of,
            src,
            // SAFETY: the caller guarantees AVX2 and F16C.
            |s| unsafe { super::avx2::quantize(s, dst, format, scale, overflow) },
            scalar::quantize(src, dst, format, scale, overflow)
        ),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => with_concrete_type!(
            as_slice_of,
            src,
            // SAFETY: the caller guarantees AVX-512F/BW, AVX2 and F16C.
            |s| unsafe { super::avx512::quantize(s, dst, format, scale, overflow) },
            scalar::quantize(src, dst, format, scale, overflow)
        ),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => unreachable!("{isa} is never available off x86-64"),
    }
}

/// Dequantizes on `isa`; `src` and `dst` have the same length.
///
/// # Safety
/// `isa.is_available()` is true.
pub(super) unsafe fn dequantize<T: HighPrecision>(
    isa: Isa,
    src: &[u8],
    dst: &mut [T],
    format: Fp8Format,
    scale_inv: f32,
) {
    debug_assert_eq!(src.len(), dst.len());
    match isa {
        Isa::Scalar => scalar::dequantize(src, dst, format, scale_inv),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => with_concrete_type!(
            as_mut_slice_of,
            &mut *dst,
            // SAFETY: the caller guarantees AVX2 and F16C.
            |d| unsafe { super::avx2::dequantize(src, d, format, scale_inv) },
            scalar::dequantize(src, dst, format, scale_inv)
        ),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => with_concrete_type!(
            as_mut_slice_of,
            &mut *dst,
            // SAFETY: the caller guarantees AVX-512F/BW, AVX2 and F16C.
            |d| unsafe { super::avx512::dequantize(src, d, format, scale_inv) },
            scalar::dequantize(src, dst, format, scale_inv)
        ),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => unreachable!("{isa} is never available off x86-64"),
    }
}
