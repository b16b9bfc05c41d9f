//! Launcher of `cuda/attention_cached.cu`: causal attention of new queries
//! against a key/value cache (generation), grouped-query heads read in place.
//! Twin: `ops::attention_cached`, held to the reduction contract (the order
//! of the softmax total and CUDA's `expf` differ; `docs/numerics.md`).

use super::attention_simple::STATIC_SHARED;
use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::launch_grid;
use super::op_args::{GRID_YZ_LIMIT, SHARED_LIMIT, dtype_code, shared_row_bytes, to_u32};
use super::params::Fp8CachedAttentionParams;
use crate::error::{Error, Result};
use crate::ops::CachedAttentionShape;
use crate::ops::attention_cached::nothing_to_do;
use crate::tensor::Dtype;

const MODULE: &str = "attention_cached";
const KERNEL: &str = "attention_cached";

/// Grid `(queries, heads)` and the dynamic shared bytes (one f32 score per key).
pub(crate) fn plan(shape: &CachedAttentionShape) -> Result<((u32, u32, u32), u32)> {
    let shared = shared_row_bytes(shape.keys);
    let limit = SHARED_LIMIT - STATIC_SHARED;
    if shared > limit {
        return Err(Error::KernelArgs {
            kernel: KERNEL,
            detail: format!(
                "{} cached keys need {shared} bytes of shared memory per block, the simple kernel has {limit}",
                shape.keys
            ),
        });
    }
    if shape.heads > GRID_YZ_LIMIT {
        return Err(Error::KernelArgs {
            kernel: KERNEL,
            detail: format!("{} heads exceed the grid's {GRID_YZ_LIMIT}", shape.heads),
        });
    }
    let grid = (to_u32(KERNEL, "queries", shape.queries)?, shape.heads as u32, 1);
    Ok((grid, shared as u32))
}

impl CudaDevice {
    /// `out [queries, heads * head_dim]` (rounded to `dtype`) from `q` and the cache `k`, `v`
    /// `[keys, kv_heads * head_dim]`. Twin of `ops::attention_cached` (same checks, same errors).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_cached(
        &self,
        q: &DeviceBuffer<f32>,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        shape: CachedAttentionShape,
        softmax_scale: f32,
        dtype: Dtype,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        if nothing_to_do(&shape, [q.len(), k.len(), v.len(), out.len()])? {
            return Ok(());
        }
        let (grid, shared) = plan(&shape)?;
        let params = Fp8CachedAttentionParams {
            q: q.address(self),
            k: k.address(self),
            v: v.address(self),
            out: out.address_mut(self),
            queries: grid.0,
            keys: to_u32(KERNEL, "keys", shape.keys)?,
            heads: grid.1,
            kv_heads: to_u32(KERNEL, "kv_heads", shape.kv_heads)?,
            head_dim: to_u32(KERNEL, "head_dim", shape.head_dim)?,
            scale: softmax_scale,
            dtype: dtype_code(dtype),
            pad: 0,
        };
        launch_grid(self, MODULE, "fp8_attention_cached", grid, shared, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(queries: usize, keys: usize, heads: usize, kv_heads: usize) -> CachedAttentionShape {
        CachedAttentionShape {
            queries,
            keys,
            heads,
            kv_heads,
            head_dim: 16,
        }
    }

    #[test]
    fn the_grid_is_queries_by_heads_and_shared_memory_holds_one_row_of_scores() {
        // One score per key, 4 floats of slack, whole 16-byte vectors (`shared_row_bytes`).
        assert_eq!(plan(&shape(1, 300, 8, 2)).unwrap(), ((1, 8, 1), 1216));
        assert_eq!(plan(&shape(17, 17, 4, 4)).unwrap(), ((17, 4, 1), 96));
        assert!(plan(&shape(1, 12 * 1024 - 68, 8, 2)).is_ok());
        let err = plan(&shape(1, 12 * 1024 - 67, 8, 2)).unwrap_err();
        assert!(err.to_string().contains("12221 cached keys"), "{err}");
        assert!(plan(&shape(1, 4, 70_000, 1)).is_err());
    }

    #[test]
    fn the_twins_check_refuses_bad_groups_and_lengths_and_empty_steps_do_nothing() {
        let lens = |s: &CachedAttentionShape| {
            let (q, kv) = (s.queries * s.heads * 16, s.keys * s.kv_heads * 16);
            [q, kv, kv, q]
        };
        let good = shape(2, 5, 8, 2);
        assert!(!nothing_to_do(&good, lens(&good)).unwrap());
        let bad_group = shape(2, 5, 8, 3);
        assert!(nothing_to_do(&bad_group, lens(&bad_group)).is_err());
        let no_kv = shape(2, 5, 8, 0);
        assert!(nothing_to_do(&no_kv, [32, 0, 0, 32]).is_err());
        let too_many = shape(6, 5, 8, 2);
        assert!(nothing_to_do(&too_many, lens(&too_many)).is_err());
        let mut short = lens(&good);
        short[1] -= 1;
        assert!(nothing_to_do(&good, short).is_err());
        let empty = shape(0, 5, 8, 2);
        assert!(nothing_to_do(&empty, lens(&empty)).unwrap());
    }
}
