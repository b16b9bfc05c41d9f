//! Host-side argument logic shared by the layer-op launchers (`convert.rs`,
//! `norm.rs`, ...): length checks against the op's shape, dtype codes, and the
//! grid sizes of the kernels' layouts. Pure functions, tested without a GPU.

use super::params::{FP8_DTYPE_BF16, FP8_DTYPE_F16, FP8_DTYPE_F32, FP8_FORMAT_E4M3, FP8_FORMAT_E5M2};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::tensor::Dtype;

/// Dynamic shared memory a block may use without an opt-in attribute, on every target GPU.
pub(crate) const SHARED_LIMIT: usize = 48 * 1024;

/// Most blocks in the y and z dimensions of a grid (the driver's limit).
pub(crate) const GRID_YZ_LIMIT: usize = 65_535;

/// `rows * cols`, or a typed error naming the kernel when it overflows.
pub(crate) fn elements(kernel: &'static str, rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or_else(|| Error::KernelArgs {
        kernel,
        detail: format!("{rows} x {cols} elements overflow usize"),
    })
}

/// Checks that a buffer named `what` holds the `expected` elements the shape needs.
pub(crate) fn check_len(kernel: &'static str, what: &str, len: usize, expected: usize) -> Result<()> {
    if len == expected {
        return Ok(());
    }
    Err(Error::KernelArgs {
        kernel,
        detail: format!("{what} has {len} elements, the shape needs {expected}"),
    })
}

/// The kernels' code of a compute dtype (`FP8_DTYPE_*`).
pub(crate) fn dtype_code(dtype: Dtype) -> u32 {
    match dtype {
        Dtype::F32 => FP8_DTYPE_F32,
        Dtype::Bf16 => FP8_DTYPE_BF16,
        Dtype::F16 => FP8_DTYPE_F16,
    }
}

/// The kernels' code of an FP8 format (`FP8_FORMAT_*`).
pub(crate) fn format_code(format: Fp8Format) -> u32 {
    match format {
        Fp8Format::E4M3 => FP8_FORMAT_E4M3,
        Fp8Format::E5M2 => FP8_FORMAT_E5M2,
    }
}

/// Rows per partial sum in the CPU twins' row reductions (norm dgamma/dbeta,
/// the cross-entropy loss): ~32 K values per partial, 1..=1024 rows. The same
/// number as the CPU ops' blocking, so the GPU adds the same partials in the
/// same order; if the two ever drift apart, results stay within the reduction
/// bound, only further from the CPU's bits.
pub(crate) fn rows_per_partial(cols: usize) -> usize {
    (32 * 1024 / cols.max(1)).clamp(1, 1024)
}

/// Blocks of a grid-stride elementwise kernel over `n` elements: one element
/// per thread, at most 32 blocks per SM (beyond that each thread loops), at least one.
pub(crate) fn stride_blocks(multiprocessors: u32, n: usize) -> u32 {
    let cap = multiprocessors.max(1) as u64 * 32;
    (n as u64).div_ceil(super::launch::THREADS as u64).clamp(1, cap) as u32
}

/// Slack after f32 rows kept in dynamic shared memory: ptxas reads the last elements of a
/// row as one aligned 16-byte vector (`LDS.128` in the loop remainder of
/// `fp8_attention_forward`'s sm_90a SASS), so up to 3 floats past the row's end;
/// compute-sanitizer memcheck flagged it on the first GPU run.
pub(crate) const SHARED_TAIL_FLOATS: usize = 4;

/// Dynamic shared bytes of `floats` f32 values and the tail's slack, in whole 16-byte vectors.
pub(crate) fn shared_row_bytes(floats: usize) -> usize {
    floats
        .saturating_add(SHARED_TAIL_FLOATS)
        .next_multiple_of(SHARED_TAIL_FLOATS)
        .saturating_mul(size_of::<f32>())
}

/// One block per row (row kernels), refused past the grid's x limit.
pub(crate) fn row_blocks(kernel: &'static str, rows: usize) -> Result<u32> {
    super::launch::tile_blocks(kernel, rows as u64)
}

/// A `u32` kernel argument, or a typed error naming what overflowed.
pub(crate) fn to_u32(kernel: &'static str, what: &str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| Error::KernelArgs {
        kernel,
        detail: format!("{what} {value} exceeds 2^32-1"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked_against_the_shape_with_the_values_in_the_error() {
        assert!(check_len("k", "x", 12, 12).is_ok());
        let err = check_len("k", "x", 11, 12).unwrap_err();
        assert_eq!(
            err,
            Error::KernelArgs {
                kernel: "k",
                detail: "x has 11 elements, the shape needs 12".into()
            }
        );
        assert!(elements("k", usize::MAX, 2).is_err());
        assert_eq!(elements("k", 3, 5).unwrap(), 15);
    }

    #[test]
    fn dtype_and_format_codes_are_the_headers() {
        assert_eq!(dtype_code(Dtype::F32), 0);
        assert_eq!(dtype_code(Dtype::Bf16), 1);
        assert_eq!(dtype_code(Dtype::F16), 2);
        assert_eq!(format_code(Fp8Format::E4M3), 0);
        assert_eq!(format_code(Fp8Format::E5M2), 1);
    }

    #[test]
    fn partial_rows_follow_the_cpu_blocking() {
        assert_eq!(rows_per_partial(0), 1024);
        assert_eq!(rows_per_partial(32), 1024);
        assert_eq!(rows_per_partial(768), 42);
        assert_eq!(rows_per_partial(4096), 8);
        assert_eq!(rows_per_partial(1 << 20), 1);
    }

    #[test]
    fn grid_stride_blocks_cover_small_tensors_and_cap_large_ones() {
        assert_eq!(stride_blocks(132, 0), 1);
        assert_eq!(stride_blocks(132, 256), 1);
        assert_eq!(stride_blocks(132, 257), 2);
        assert_eq!(stride_blocks(132, 1 << 30), 132 * 32);
        assert_eq!(stride_blocks(0, 1 << 30), 32);
    }

    #[test]
    fn u32_arguments_overflow_into_an_error() {
        assert_eq!(to_u32("k", "seq", 7).unwrap(), 7);
        assert!(to_u32("k", "seq", u32::MAX as usize + 1).is_err());
        assert!(row_blocks("k", 1 << 31).is_err());
        assert_eq!(row_blocks("k", 5).unwrap(), 5);
    }
}
