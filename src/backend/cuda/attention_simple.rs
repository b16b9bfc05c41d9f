//! The simple attention kernels' launches (`cuda/attention.cu`): one block per query row
//! forward and for dq, one per key row for dk/dv, the scores of a row in shared memory.
//! `CudaDevice::attention_forward` / `attention_backward` (`super::attention`) run them
//! unless the tensor-core kernels apply, and the tensor-core self-check
//! (`super::attention_mma`) takes them as its reference.

use super::context::CudaDevice;
use super::launch::launch_grid;
use super::op_args::{GRID_YZ_LIMIT, SHARED_LIMIT, dtype_code, shared_row_bytes, to_u32};
use super::params::Fp8AttentionParams;
use crate::error::{Error, Result};
use crate::ops::AttentionShape;
use crate::tensor::Dtype;

const MODULE: &str = "attention";

/// The launch of one attention kernel: grid `(seq, heads, batch)` and its dynamic shared bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttentionLaunch {
    pub grid: (u32, u32, u32),
    pub shared_bytes: u32,
}

/// Static shared memory the kernels keep next to the dynamic rows (a block
/// reduction's 8 floats), rounded up; the 48 KiB limit counts both.
pub(crate) const STATIC_SHARED: usize = 256;

/// Checks that `shape`'s heads and sequences fit the grid's y and z dimensions (every attention
/// kernel's grid is `(tiles or rows, heads, batch)`).
pub(crate) fn check_grid(kernel: &'static str, shape: &AttentionShape) -> Result<()> {
    if shape.heads > GRID_YZ_LIMIT || shape.batch > GRID_YZ_LIMIT {
        return Err(Error::KernelArgs {
            kernel,
            detail: format!(
                "{} heads x {} sequences exceed the grid's {GRID_YZ_LIMIT} per dimension",
                shape.heads, shape.batch
            ),
        });
    }
    Ok(())
}

/// Checks the shape's limits and sizes the launch of a kernel that keeps
/// `rows_in_shared` f32 rows of `seq` values in shared memory (1 forward and
/// dq, 2 for dk/dv).
pub(crate) fn plan(kernel: &'static str, shape: &AttentionShape, rows_in_shared: usize) -> Result<AttentionLaunch> {
    let shared = shared_row_bytes(shape.seq.saturating_mul(rows_in_shared));
    let limit = SHARED_LIMIT - STATIC_SHARED;
    if shared > limit {
        return Err(Error::KernelArgs {
            kernel,
            detail: format!(
                "seq {} needs {shared} bytes of shared memory per block, the simple kernel has {limit}",
                shape.seq
            ),
        });
    }
    check_grid(kernel, shape)?;
    Ok(AttentionLaunch {
        grid: (
            to_u32(kernel, "seq", shape.seq)?,
            shape.heads as u32,
            shape.batch as u32,
        ),
        shared_bytes: shared as u32,
    })
}

pub(crate) fn base_params(
    kernel: &'static str,
    shape: &AttentionShape,
    scale: f32,
    dtype: Dtype,
) -> Result<Fp8AttentionParams> {
    Ok(Fp8AttentionParams {
        batch: to_u32(kernel, "batch", shape.batch)?,
        seq: to_u32(kernel, "seq", shape.seq)?,
        heads: to_u32(kernel, "heads", shape.heads)?,
        head_dim: to_u32(kernel, "head_dim", shape.head_dim)?,
        scale,
        dtype: dtype_code(dtype),
        ..Default::default()
    })
}

/// The simple forward kernel on parameters the caller checked and filled
/// (q, k, v, out, lse); also the reference of the tensor-core path's self-check.
pub(crate) fn simple_forward(
    device: &CudaDevice,
    kernel: &'static str,
    shape: &AttentionShape,
    p: Fp8AttentionParams,
) -> Result<()> {
    let launch = plan(kernel, shape, 1)?;
    launch_grid(
        device,
        MODULE,
        "fp8_attention_forward",
        launch.grid,
        launch.shared_bytes,
        p,
    )
}

/// The simple backward kernels on parameters the caller checked and filled
/// (every tensor, delta a workspace of lse's length); also the self-check's reference.
pub(crate) fn simple_backward(
    device: &CudaDevice,
    kernel: &'static str,
    shape: &AttentionShape,
    p: Fp8AttentionParams,
) -> Result<()> {
    let dq_launch = plan(kernel, shape, 1)?;
    let dkdv_launch = plan(kernel, shape, 2)?;
    // Stream order: dq writes delta before dk/dv reads it.
    launch_grid(
        device,
        MODULE,
        "fp8_attention_backward_dq",
        dq_launch.grid,
        dq_launch.shared_bytes,
        p,
    )?;
    launch_grid(
        device,
        MODULE,
        "fp8_attention_backward_dkdv",
        dkdv_launch.grid,
        dkdv_launch.shared_bytes,
        p,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn shape(batch: usize, seq: usize, heads: usize, head_dim: usize) -> AttentionShape {
        AttentionShape::new(batch, seq, heads, head_dim)
    }

    #[test]
    fn the_grid_is_rows_by_heads_by_sequences_and_shared_memory_holds_the_rows() {
        let l = plan("a", &shape(2, 1024, 12, 64), 1).unwrap();
        assert_eq!(
            l,
            AttentionLaunch {
                grid: (1024, 12, 2),
                shared_bytes: (1024 + 4) * 4
            }
        );
        assert_eq!(
            plan("a", &shape(2, 1024, 12, 64), 2).unwrap().shared_bytes,
            (2048 + 4) * 4
        );
        // The slack rounds up to whole 16-byte vectors.
        assert_eq!(plan("a", &shape(1, 1, 1, 8), 1).unwrap().shared_bytes, 16 + 16);
        assert_eq!(plan("a", &shape(1, 3, 1, 8), 2).unwrap().shared_bytes, 16 * 3);
    }

    #[test]
    fn sequences_past_the_shared_memory_of_the_simple_kernel_are_refused() {
        // 48 KiB less 256 static bytes is 12224 floats, 4 of them the tail's slack.
        assert!(plan("a", &shape(1, 12 * 1024 - 68, 1, 64), 1).is_ok());
        assert!(plan("a", &shape(1, 12 * 1024 - 67, 1, 64), 1).is_err());
        assert!(plan("a", &shape(1, 6 * 1024 - 34, 1, 64), 2).is_ok());
        assert!(plan("a", &shape(1, 6 * 1024 - 33, 1, 64), 2).is_err());
        assert!(plan("a", &shape(70_000, 16, 1, 64), 1).is_err());
    }
}
