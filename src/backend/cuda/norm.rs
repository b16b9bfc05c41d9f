//! Launchers of `cuda/norm.cu`: LayerNorm and RMSNorm forward (optionally
//! writing the FP8 copy of the output and its amax, the fused norm + cast) and
//! backward (dx, and dgamma/dbeta through per-row-block partials added in block
//! order: deterministic). Twins: `ops::layernorm_forward/backward`,
//! `ops::rmsnorm_forward/backward`, within the reduction bound of
//! `docs/numerics.md`; the FP8 copy is exactly `cast_sat(y * scale)` of the y
//! the kernel wrote.

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::{launch, tile_blocks};
use super::op_args::{check_len, elements, format_code, row_blocks, rows_per_partial, to_u32};
use super::params::Fp8NormParams;
use crate::error::Result;
use crate::format::Fp8Format;
use crate::memory::MemoryCategory;
use crate::ops::NormShape;

const MODULE: &str = "norm";

/// The FP8 copy a norm forward writes next to (or instead of) its f32 output.
pub struct NormFp8Out<'a> {
    /// `[rows, cols]` codes `cast_sat(y * scale)`.
    pub codes: &'a mut DeviceBuffer<u8>,
    /// Format of the codes.
    pub format: Fp8Format,
    /// `scale[0]` multiplies y before the cast.
    pub scale: &'a DeviceBuffer<f32>,
    /// `amax[0] = fmaxf(amax[0], max|y|)`.
    pub amax: &'a mut DeviceBuffer<f32>,
}

/// The saved statistics and parameters of a norm (LayerNorm has `beta` and `mean`).
pub struct NormParamsRef<'a> {
    /// `[cols]` weight (`1 + gamma` when zero-centered).
    pub gamma: &'a DeviceBuffer<f32>,
    /// `[cols]` LayerNorm shift; `None` for RMSNorm.
    pub beta: Option<&'a DeviceBuffer<f32>>,
    /// Whether the weight is `1 + gamma`.
    pub zero_centered: bool,
}

/// Row blocks of the backward and the f32 length of its dgamma/dbeta partials workspace.
pub(crate) fn backward_partials(shape: NormShape) -> (usize, usize) {
    let per = rows_per_partial(shape.cols);
    let blocks = shape.rows.div_ceil(per);
    (blocks, blocks * 2 * shape.cols)
}

impl CudaDevice {
    /// LayerNorm (with `beta`) or RMSNorm (without) forward over `x [rows, cols]`: writes `y` (if
    /// given), the FP8 copy (if given), `rstd [rows]` and, for LayerNorm, `mean [rows]`.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_forward(
        &self,
        x: &DeviceBuffer<f32>,
        params: NormParamsRef<'_>,
        shape: NormShape,
        eps: f32,
        y: Option<&mut DeviceBuffer<f32>>,
        fp8: Option<NormFp8Out<'_>>,
        mean: Option<&mut DeviceBuffer<f32>>,
        rstd: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "norm_forward";
        let NormShape { rows, cols } = shape;
        let n = elements(K, rows, cols)?;
        check_len(K, "input x", x.len(), n)?;
        check_len(K, "gamma", params.gamma.len(), cols)?;
        check_len(K, "saved rstd", rstd.len(), rows)?;
        let layer = params.beta.is_some();
        let mut p = Fp8NormParams {
            x: x.address(self),
            gamma: params.gamma.address(self),
            rstd: rstd.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            eps,
            zero_centered: params.zero_centered as u32,
            ..Default::default()
        };
        if let Some(beta) = params.beta {
            check_len(K, "beta", beta.len(), cols)?;
            p.beta = beta.address(self);
        }
        match (layer, mean) {
            (true, Some(mean)) => {
                check_len(K, "saved mean", mean.len(), rows)?;
                p.mean = mean.address_mut(self);
            }
            (false, None) => {}
            (true, None) | (false, Some(_)) => {
                return Err(crate::error::Error::KernelArgs {
                    kernel: K,
                    detail: "LayerNorm (beta given) saves a mean, RMSNorm (no beta) does not".into(),
                });
            }
        }
        if let Some(y) = y {
            check_len(K, "output y", y.len(), n)?;
            p.y = y.address_mut(self);
        }
        if let Some(out) = fp8 {
            check_len(K, "FP8 output codes", out.codes.len(), n)?;
            check_len(K, "FP8 output scale", out.scale.len(), 1)?;
            check_len(K, "FP8 output amax", out.amax.len(), 1)?;
            p.y_fp8 = out.codes.address_mut(self);
            p.scale = out.scale.address(self);
            p.amax = out.amax.address_mut(self);
            p.format = format_code(out.format);
        }
        if rows == 0 {
            return Ok(());
        }
        let function = if layer {
            "fp8_layernorm_forward"
        } else {
            "fp8_rmsnorm_forward"
        };
        launch(self, MODULE, function, row_blocks(K, rows)?, p)
    }

    /// LayerNorm (with `beta`/`dbeta`) or RMSNorm backward: overwrites `dx`, adds to `dgamma`
    /// (and `dbeta`). `mean` is LayerNorm's saved mean. Allocates its partials workspace.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_backward(
        &self,
        dy: &DeviceBuffer<f32>,
        x: &DeviceBuffer<f32>,
        params: NormParamsRef<'_>,
        mean: Option<&DeviceBuffer<f32>>,
        rstd: &DeviceBuffer<f32>,
        shape: NormShape,
        dx: &mut DeviceBuffer<f32>,
        dgamma: &mut DeviceBuffer<f32>,
        dbeta: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<()> {
        const K: &str = "norm_backward";
        let NormShape { rows, cols } = shape;
        let n = elements(K, rows, cols)?;
        check_len(K, "output gradient dy", dy.len(), n)?;
        check_len(K, "input x", x.len(), n)?;
        check_len(K, "input gradient dx", dx.len(), n)?;
        check_len(K, "gamma", params.gamma.len(), cols)?;
        check_len(K, "dgamma", dgamma.len(), cols)?;
        check_len(K, "saved rstd", rstd.len(), rows)?;
        let layer = params.beta.is_some();
        if layer != mean.is_some() || layer != dbeta.is_some() {
            return Err(crate::error::Error::KernelArgs {
                kernel: K,
                detail: "LayerNorm takes beta, mean and dbeta; RMSNorm none of them".into(),
            });
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (blocks, partials_len) = backward_partials(shape);
        let mut partials = self.alloc_zeros::<f32>(partials_len, MemoryCategory::Workspace)?;
        let mut p = Fp8NormParams {
            x: x.address(self),
            gamma: params.gamma.address(self),
            rstd: rstd.address(self),
            dy: dy.address(self),
            dx: dx.address_mut(self),
            partials: partials.address_mut(self),
            dgamma: dgamma.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            zero_centered: params.zero_centered as u32,
            rows_per_block: to_u32(K, "rows per partial", rows_per_partial(cols))?,
            ..Default::default()
        };
        if let (Some(mean), Some(dbeta)) = (mean, dbeta) {
            check_len(K, "saved mean", mean.len(), rows)?;
            check_len(K, "dbeta", dbeta.len(), cols)?;
            p.mean = mean.address(self);
            p.dbeta = dbeta.address_mut(self);
        }
        let function = if layer {
            "fp8_layernorm_backward"
        } else {
            "fp8_rmsnorm_backward"
        };
        launch(self, MODULE, function, tile_blocks(K, blocks as u64)?, p)?;
        let column_blocks = super::convert::column_sum_blocks(cols);
        launch(
            self,
            MODULE,
            "fp8_norm_param_grads",
            tile_blocks(K, column_blocks as u64)?,
            p,
        )
        // `partials` drops here: cudarc frees it on the stream (or after a synchronize), after the kernels.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_partials_follow_the_cpu_row_blocks() {
        assert_eq!(backward_partials(NormShape { rows: 100, cols: 768 }), (3, 3 * 2 * 768));
        assert_eq!(
            backward_partials(NormShape { rows: 4096, cols: 4096 }),
            (512, 512 * 2 * 4096)
        );
        assert_eq!(backward_partials(NormShape { rows: 1, cols: 8 }), (1, 16));
        assert_eq!(backward_partials(NormShape { rows: 0, cols: 8 }), (0, 0));
    }
}
