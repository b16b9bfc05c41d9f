//! Launchers of `cuda/optim.cu`: AdamW over every parameter in one launch, the
//! sum of squares for gradient clipping, and the unscale + finite check of
//! dynamic loss scaling. Twins: `ops::adamw_update` (same bits),
//! `ops::sum_of_squares` (f64; bound below), `ops::unscale_and_check` (same
//! bits, same verdict).

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::{launch, tile_blocks};
use super::op_args::{check_len, stride_blocks};
use super::params::{FP8_ADAMW_ITEM, FP8_SUMSQ_PER_BLOCK, Fp8AdamWItemParams, Fp8AdamWParams, Fp8EltwiseParams};
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;
use crate::ops::AdamWStep;

const MODULE: &str = "optim";

/// One parameter's place in the arenas that AdamW updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdamWSegment {
    /// First element in the value/grad/moment arenas.
    pub offset: usize,
    /// Elements.
    pub len: usize,
    /// Whether weight decay applies (the step's `decay`), or not (decay 1).
    pub decayed: bool,
}

/// The work items of one AdamW launch: every segment cut into pieces of at
/// most `FP8_ADAMW_ITEM` elements, one block each.
pub fn adamw_items(segments: &[AdamWSegment], arena_len: usize) -> Result<Vec<Fp8AdamWItemParams>> {
    let item = FP8_ADAMW_ITEM as usize;
    let mut items = Vec::new();
    for s in segments {
        let end = s.offset.checked_add(s.len).filter(|&e| e <= arena_len);
        if end.is_none() {
            return Err(Error::KernelArgs {
                kernel: "adamw",
                detail: format!(
                    "a parameter at {} of {} elements overruns arenas of {arena_len}",
                    s.offset, s.len
                ),
            });
        }
        for start in (0..s.len).step_by(item) {
            items.push(Fp8AdamWItemParams {
                offset: (s.offset + start) as u64,
                len: (s.len - start).min(item) as u32,
                decayed: s.decayed as u32,
            });
        }
    }
    Ok(items)
}

/// Blocks of the first stage of the sum of squares.
pub(crate) fn sum_squares_blocks(n: usize) -> usize {
    n.div_ceil(FP8_SUMSQ_PER_BLOCK as usize)
}

/// The bound `|gpu - cpu|` of the sum of squares of `n` values whose squares sum to `sum`:
/// both are f64 sums of the same exact squares in two orders, each within `(n - 1) 2^-53 sum`.
pub fn sum_squares_bound(n: usize, sum: f64) -> f64 {
    2.0 * n.saturating_sub(1) as f64 * f64::EPSILON / 2.0 * sum
}

impl CudaDevice {
    /// One AdamW step over every item of `items` (see [`adamw_items`]) in one launch: `value`,
    /// `grad`, `m`, `v` are arenas of the same length. Twin of `ops::adamw_update` per
    /// parameter (with `step.decay` for decayed items and 1 for the others): same bits.
    pub fn adamw(
        &self,
        items: &DeviceBuffer<Fp8AdamWItemParams>,
        value: &mut DeviceBuffer<f32>,
        grad: &DeviceBuffer<f32>,
        m: &mut DeviceBuffer<f32>,
        v: &mut DeviceBuffer<f32>,
        step: &AdamWStep,
    ) -> Result<()> {
        const K: &str = "adamw";
        let n = value.len();
        check_len(K, "gradient", grad.len(), n)?;
        check_len(K, "first moment", m.len(), n)?;
        check_len(K, "second moment", v.len(), n)?;
        if items.is_empty() {
            return Ok(());
        }
        let params = Fp8AdamWParams {
            value: value.address_mut(self),
            grad: grad.address(self),
            m: m.address_mut(self),
            v: v.address_mut(self),
            items: items.address(self),
            n_items: items.len() as u64,
            decay: step.decay,
            step_size: step.step_size,
            bc2_sqrt: step.bc2_sqrt,
            beta1: step.beta1,
            beta2: step.beta2,
            c1: step.c1,
            c2: step.c2,
            eps: step.eps,
        };
        launch(self, MODULE, "fp8_adamw", tile_blocks(K, items.len() as u64)?, params)
    }

    /// `ops::adamw_update` of one parameter (all of `value`), through [`Self::adamw`].
    pub fn adamw_update(
        &self,
        value: &mut DeviceBuffer<f32>,
        grad: &DeviceBuffer<f32>,
        m: &mut DeviceBuffer<f32>,
        v: &mut DeviceBuffer<f32>,
        step: &AdamWStep,
    ) -> Result<()> {
        let segment = AdamWSegment {
            offset: 0,
            len: value.len(),
            decayed: true,
        };
        let items = adamw_items(&[segment], value.len())?;
        let items = self.upload(&items, MemoryCategory::Workspace)?;
        self.adamw(&items, value, grad, m, v, step)
    }

    /// `sum x^2` in f64 (two deterministic stages; within [`sum_squares_bound`] of the twin).
    pub fn sum_squares(&self, values: &DeviceBuffer<f32>) -> Result<f64> {
        const K: &str = "sum_squares";
        if values.is_empty() {
            return Ok(0.0);
        }
        let blocks = sum_squares_blocks(values.len());
        let mut partials = self.alloc_zeros::<f64>(blocks, MemoryCategory::Workspace)?;
        let mut total = self.alloc_zeros::<f64>(1, MemoryCategory::Workspace)?;
        let first = Fp8EltwiseParams {
            a: values.address(self),
            out: partials.address_mut(self),
            rows: 1,
            cols: values.len() as u64,
            ..Default::default()
        };
        launch(self, MODULE, "fp8_sum_squares", tile_blocks(K, blocks as u64)?, first)?;
        let second = Fp8EltwiseParams {
            a: partials.address(self),
            out: total.address_mut(self),
            rows: blocks as u64,
            cols: 1,
            ..Default::default()
        };
        launch(self, MODULE, "fp8_sum_squares_total", 1, second)?;
        Ok(self.download(&total)?[0])
    }

    /// `x *= factor` for every value, each product rounded once (`__fmul_rn`): the loss
    /// scaler's unscale kernel with its finite flag left unread, so nothing waits for it. Twin
    /// of `ops::elementwise::multiply`: same bits.
    pub fn multiply(&self, values: &mut DeviceBuffer<f32>, factor: f32) -> Result<()> {
        self.unscale(values, factor).map(drop)
    }

    /// `x *= inv_scale` for every value; whether every result is finite. Twin of
    /// `ops::unscale_and_check`: same bits, same verdict (one flag, read once).
    pub fn unscale_and_check(&self, values: &mut DeviceBuffer<f32>, inv_scale: f32) -> Result<bool> {
        match self.unscale(values, inv_scale)? {
            Some(flag) => Ok(self.download(&flag)?[0] == 0),
            None => Ok(true),
        }
    }

    /// Launches `x *= factor` over `values`; the device flag a non-finite product sets (`None`
    /// for no values: nothing launched).
    fn unscale(&self, values: &mut DeviceBuffer<f32>, factor: f32) -> Result<Option<DeviceBuffer<u32>>> {
        if values.is_empty() {
            return Ok(None);
        }
        let mut flag = self.alloc_zeros::<u32>(1, MemoryCategory::Workspace)?;
        let params = Fp8EltwiseParams {
            a: values.address_mut(self),
            flag: flag.address_mut(self),
            rows: 1,
            cols: values.len() as u64,
            scalar: factor,
            ..Default::default()
        };
        let blocks = stride_blocks(self.info().multiprocessors, values.len());
        launch(self, MODULE, "fp8_unscale_check", blocks, params)?;
        Ok(Some(flag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_cut_every_parameter_into_blocks_and_keep_its_decay() {
        let item = FP8_ADAMW_ITEM as usize;
        let segments = [
            AdamWSegment {
                offset: 0,
                len: item + 5,
                decayed: true,
            },
            AdamWSegment {
                offset: item + 8,
                len: 3,
                decayed: false,
            },
        ];
        let items = adamw_items(&segments, item + 11).unwrap();
        let view: Vec<(u64, u32, u32)> = items.iter().map(|i| (i.offset, i.len, i.decayed)).collect();
        assert_eq!(
            view,
            vec![(0, item as u32, 1), (item as u64, 5, 1), (item as u64 + 8, 3, 0)]
        );
        // Every element of every segment is covered exactly once.
        let covered: usize = items.iter().map(|i| i.len as usize).sum();
        assert_eq!(covered, item + 8);
    }

    #[test]
    fn a_segment_past_the_arena_is_an_error_and_empty_ones_make_no_item() {
        let s = AdamWSegment {
            offset: 10,
            len: 5,
            decayed: true,
        };
        assert!(adamw_items(&[s], 14).is_err());
        assert!(
            adamw_items(
                &[AdamWSegment {
                    offset: usize::MAX,
                    len: 2,
                    decayed: true
                }],
                14
            )
            .is_err()
        );
        assert!(
            adamw_items(
                &[AdamWSegment {
                    offset: 3,
                    len: 0,
                    decayed: true
                }],
                14
            )
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn sum_of_squares_grid_and_bound() {
        assert_eq!(sum_squares_blocks(1), 1);
        assert_eq!(sum_squares_blocks(FP8_SUMSQ_PER_BLOCK as usize + 1), 2);
        assert_eq!(sum_squares_bound(1, 4.0), 0.0);
        // Reordering a real f64 sum stays within the bound.
        let x: Vec<f32> = (0..10_000).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
        let forward = crate::ops::sum_of_squares(&x);
        let backward: f64 = x.iter().rev().map(|&v| (v as f64) * (v as f64)).sum();
        assert!((forward - backward).abs() <= sum_squares_bound(x.len(), forward));
    }
}
