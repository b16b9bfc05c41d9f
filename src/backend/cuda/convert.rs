//! Launchers of `cuda/convert.cu`: dtype conversion (optionally transposed),
//! the transpose of 16-bit values (twin: `gemm::Mat::k_major`), the residual add, the
//! rounding to a dtype in place, the column-range copy and the column sum. Each is the GPU
//! twin of a CPU op with the same bits: `dispatch::plain::convert` / `convert_transposed`
//! (f32 values to bf16/fp16 storage, round to nearest even), `ops::elementwise::residual_add`,
//! `Dtype::round_slice`, `ops::elementwise::copy_columns` and
//! `ops::elementwise::column_sum_accumulate`.

use cudarc::driver::DeviceRepr;

use super::buffer::{DeviceBuffer, DeviceElement};
use super::context::CudaDevice;
use super::launch::{launch, tile_blocks};
use super::op_args::{check_len, dtype_code, elements, stride_blocks};
use super::params::{Fp8CopyColumnsParams, Fp8EltwiseParams};
use crate::error::{Error, Result};
use crate::ops::elementwise::ColumnCopy;
use crate::tensor::Dtype;

const MODULE: &str = "convert";
/// Side of the transpose kernel's square tile (`TILE` in `cuda/convert.cu`).
const TRANSPOSE_TILE: usize = 32;

/// Blocks of the transposing conversion: one per 32 x 32 tile.
pub(crate) fn transpose_tiles(rows: usize, cols: usize) -> usize {
    rows.div_ceil(TRANSPOSE_TILE) * cols.div_ceil(TRANSPOSE_TILE)
}

/// Blocks of the column sum: one thread per column.
pub(crate) fn column_sum_blocks(cols: usize) -> usize {
    cols.div_ceil(super::launch::THREADS as usize).max(1)
}

impl CudaDevice {
    /// `dst = T(src)` for `[rows, cols]` f32 values, or `dst [cols, rows] = T(src)^T` when
    /// `transpose`. Twin of `dispatch::plain::convert` / `convert_transposed`: same bits.
    pub fn convert<T: DeviceElement>(
        &self,
        src: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        transpose: bool,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        const K: &str = "convert";
        let Some(params) = self.matrix_copy_params(K, src, rows, cols, dst)? else {
            return Ok(());
        };
        if transpose {
            let blocks = tile_blocks(K, transpose_tiles(rows, cols) as u64)?;
            launch(
                self,
                MODULE,
                &format!("fp8_convert_transpose_{}", T::SUFFIX),
                blocks,
                params,
            )
        } else {
            let blocks = stride_blocks(self.info().multiprocessors, rows * cols);
            launch(self, MODULE, &format!("fp8_convert_{}", T::SUFFIX), blocks, params)
        }
    }

    /// `dst [cols, rows] = src [rows, cols]^T` for 16-bit values (bf16 or fp16), bits moved
    /// as they are. Twin: `gemm::Mat::k_major` of the transposed view.
    pub fn transpose_16<T: DeviceRepr>(
        &self,
        src: &DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        const K: &str = "transpose_16";
        if size_of::<T>() != 2 {
            return Err(Error::KernelArgs {
                kernel: K,
                detail: format!("{}-byte elements; the kernel moves 2-byte values", size_of::<T>()),
            });
        }
        self.transpose_bits(K, "fp8_transpose_16", src, rows, cols, dst)
    }

    /// `dst [cols, rows] = src [rows, cols]^T` for bytes (FP8 codes, moved as they are).
    /// Twin: `quantize::transpose_codes`.
    pub fn transpose_8(
        &self,
        src: &DeviceBuffer<u8>,
        rows: usize,
        cols: usize,
        dst: &mut DeviceBuffer<u8>,
    ) -> Result<()> {
        self.transpose_bits("transpose_8", "fp8_transpose_8", src, rows, cols, dst)
    }

    /// The launch both transposes share (`transpose_bits<T>` in `cuda/convert.cu`): `kernel` over
    /// the tiles of `src [rows, cols]`, nothing for an empty matrix; `what` names it in errors.
    fn transpose_bits<T: DeviceRepr>(
        &self,
        what: &'static str,
        kernel: &str,
        src: &DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let Some(params) = self.matrix_copy_params(what, src, rows, cols, dst)? else {
            return Ok(());
        };
        let blocks = tile_blocks(what, transpose_tiles(rows, cols) as u64)?;
        launch(self, MODULE, kernel, blocks, params)
    }

    /// The parameters of a `[rows, cols]` copy kernel from `src` to `dst` (both of `rows *
    /// cols` elements, else an error naming `kernel`); `None` when there is nothing to copy.
    fn matrix_copy_params<S: DeviceRepr, D: DeviceRepr>(
        &self,
        kernel: &'static str,
        src: &DeviceBuffer<S>,
        rows: usize,
        cols: usize,
        dst: &mut DeviceBuffer<D>,
    ) -> Result<Option<Fp8EltwiseParams>> {
        let n = elements(kernel, rows, cols)?;
        check_len(kernel, "source", src.len(), n)?;
        check_len(kernel, "destination", dst.len(), n)?;
        Ok((n > 0).then(|| Fp8EltwiseParams {
            a: src.address(self),
            out: dst.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            ..Default::default()
        }))
    }

    /// `out = x + f`, rounded to `dtype`. Twin of `ops::elementwise::residual_add`: same bits.
    pub fn residual_add(
        &self,
        x: &DeviceBuffer<f32>,
        f: &DeviceBuffer<f32>,
        dtype: Dtype,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "residual_add";
        check_len(K, "residual branch f", f.len(), x.len())?;
        check_len(K, "output", out.len(), x.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let params = Fp8EltwiseParams {
            a: x.address(self),
            b: f.address(self),
            out: out.address_mut(self),
            rows: 1,
            cols: x.len() as u64,
            dtype: dtype_code(dtype),
            ..Default::default()
        };
        let blocks = stride_blocks(self.info().multiprocessors, x.len());
        launch(self, MODULE, "fp8_residual_add", blocks, params)
    }

    /// `x = f32(dtype(x))` in place: the values rounded to the compute dtype, kept as f32 (the
    /// layers' storage). Twin of `Dtype::round_slice`: same bits. No launch for f32.
    pub fn round_to(&self, x: &mut DeviceBuffer<f32>, dtype: Dtype) -> Result<()> {
        if x.is_empty() || dtype == Dtype::F32 {
            return Ok(());
        }
        let params = Fp8EltwiseParams {
            out: x.address_mut(self),
            rows: 1,
            cols: x.len() as u64,
            dtype: dtype_code(dtype),
            ..Default::default()
        };
        let blocks = stride_blocks(self.info().multiprocessors, x.len());
        launch(self, MODULE, "fp8_round", blocks, params)
    }

    /// Columns `copy.a_first..+copy.width` of `a` into columns `copy.out_first..` of `out`, row
    /// by row; the other columns of `out` keep their values. Twin of
    /// `ops::elementwise::copy_columns`: the values moved as they are.
    pub fn copy_columns(&self, a: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>, copy: ColumnCopy) -> Result<()> {
        copy.check(a.len(), out.len())?;
        let n = copy.rows * copy.width;
        if n == 0 {
            return Ok(());
        }
        let params = Fp8CopyColumnsParams {
            a: a.address(self),
            out: out.address_mut(self),
            rows: copy.rows as u64,
            width: copy.width as u64,
            a_cols: copy.a_cols as u64,
            a_first: copy.a_first as u64,
            out_cols: copy.out_cols as u64,
            out_first: copy.out_first as u64,
        };
        let blocks = stride_blocks(self.info().multiprocessors, n);
        launch(self, MODULE, "fp8_copy_columns", blocks, params)
    }

    /// `sums[c] += x[r, c]` over the rows of `x [rows, cols]` in order (bias gradients).
    /// Twin of `ops::elementwise::column_sum_accumulate`: the same additions in the same
    /// order, so the same bits; deterministic (no atomics).
    pub fn column_sum(&self, x: &DeviceBuffer<f32>, cols: usize, sums: &mut DeviceBuffer<f32>) -> Result<()> {
        const K: &str = "column_sum";
        check_len(K, "column sums", sums.len(), cols)?;
        let rows = x.len() / cols.max(1);
        check_len(K, "column-summed input", x.len(), elements(K, rows, cols)?)?;
        if x.is_empty() || cols == 0 {
            return Ok(());
        }
        let params = Fp8EltwiseParams {
            a: x.address(self),
            out: sums.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            ..Default::default()
        };
        let blocks = tile_blocks(K, column_sum_blocks(cols) as u64)?;
        launch(self, MODULE, "fp8_column_sum", blocks, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_tiles_cover_partial_edges() {
        assert_eq!(transpose_tiles(1, 1), 1);
        assert_eq!(transpose_tiles(32, 32), 1);
        assert_eq!(transpose_tiles(33, 32), 2);
        assert_eq!(transpose_tiles(65, 100), 3 * 4);
    }

    #[test]
    fn column_sum_has_a_thread_per_column() {
        assert_eq!(column_sum_blocks(1), 1);
        assert_eq!(column_sum_blocks(256), 1);
        assert_eq!(column_sum_blocks(257), 2);
        assert_eq!(column_sum_blocks(4096), 16);
    }
}
