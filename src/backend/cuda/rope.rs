//! Launcher of `cuda/rope.cu`: the rotary position embedding, forward and
//! backward, in place. Twin: `ops::rope_forward/backward`, the same bits: the
//! kernel reads the twin's own cos/sin table rows (only those of the call's
//! positions go up) and repeats its f32 operations in order.

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::launch;
use super::op_args::{elements, stride_blocks, to_u32};
use super::params::Fp8RopeParams;
use crate::error::{Error, Result};
use crate::ops::RopeShape;
use crate::ops::rope::check;

const MODULE: &str = "rope";

/// Which way the rotation turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeDirection {
    /// By the position's angle (`ops::rope_forward`).
    Forward,
    /// By the negative angle: the transposed rotation (`ops::rope_backward`).
    Backward,
}

/// The table rows a call reads: `(first position, count)`, positions
/// `first_position + r % seq` of `rows` tokens; none for an empty call.
pub(crate) fn table_rows(shape: &RopeShape) -> (usize, usize) {
    (shape.first_position, shape.seq.min(shape.rows))
}

/// Pairs the kernel rotates: `rows * heads * rotary_dim / 2`.
pub(crate) fn pairs(shape: &RopeShape, half: usize) -> Result<usize> {
    elements("rope", elements("rope", shape.rows, shape.heads)?, half)
}

impl CudaDevice {
    /// Rotates `x` (`[rows, heads * head_dim]`) in place. `cos` and `sin` are the rows of the
    /// twin's table for positions `first_position ..` ([`crate::ops::RopeTable`]'s rows,
    /// [`table_rows`] of them, `rotary_dim / 2` values each); the host checks the shape against
    /// the table first (the twin's check). Twin of `ops::rope_forward`/`rope_backward`.
    pub fn rope(
        &self,
        x: &mut DeviceBuffer<f32>,
        shape: RopeShape,
        rotary_dim: usize,
        cos: &DeviceBuffer<f32>,
        sin: &DeviceBuffer<f32>,
        direction: RopeDirection,
    ) -> Result<()> {
        const K: &str = "rope";
        let half = rotary_dim / 2;
        let table = elements(K, table_rows(&shape).1, half)?;
        if !rotary_dim.is_multiple_of(2) || rotary_dim > shape.head_dim || cos.len() != table || sin.len() != table {
            return Err(Error::KernelArgs {
                kernel: K,
                detail: format!(
                    "rotary width {rotary_dim} (head_dim {}) with {} cos and {} sin values, the shape needs {table}",
                    shape.head_dim,
                    cos.len(),
                    sin.len()
                ),
            });
        }
        let width = elements(K, shape.heads, shape.head_dim)?;
        super::op_args::check_len(K, "x", x.len(), elements(K, shape.rows, width)?)?;
        let n = pairs(&shape, half)?;
        if n == 0 {
            return Ok(());
        }
        let params = Fp8RopeParams {
            x: x.address_mut(self),
            cos: cos.address(self),
            sin: sin.address(self),
            rows: shape.rows as u64,
            seq: shape.seq as u64,
            heads: to_u32(K, "heads", shape.heads)?,
            head_dim: to_u32(K, "head_dim", shape.head_dim)?,
            half: to_u32(K, "rotary_dim / 2", half)?,
            negate: u32::from(direction == RopeDirection::Backward),
        };
        launch(
            self,
            MODULE,
            "fp8_rope",
            stride_blocks(self.info().multiprocessors, n),
            params,
        )
    }
}

/// The host side of a staged call: the twin's check, then the table rows to upload.
pub(crate) fn host_rows<'t>(
    x_len: usize,
    shape: &RopeShape,
    table: &'t crate::ops::RopeTable,
) -> Result<(&'t [f32], &'t [f32])> {
    check(x_len, shape, table)?;
    let (first, count) = table_rows(shape);
    if count == 0 {
        // No token: the twin checks no position either.
        return Ok((&[], &[]));
    }
    table.rows(first, count).ok_or_else(|| Error::InvalidShape {
        what: "rope",
        reason: format!(
            "positions {first}..{} are past the table's {}",
            first + count,
            table.positions()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{RopeFrequencyScaling, RopeTable, inv_freq};

    fn shape(rows: usize, seq: usize, first_position: usize) -> RopeShape {
        RopeShape {
            rows,
            seq,
            heads: 3,
            head_dim: 8,
            first_position,
        }
    }

    #[test]
    fn a_call_reads_the_table_rows_of_its_positions_only() {
        let table = RopeTable::new(&inv_freq(10000.0, 6, RopeFrequencyScaling::None), 32);
        // Two sequences of 5 from position 7: positions 7..12, three values per row.
        let x = vec![0.0; 10 * 24];
        let (cos, sin) = host_rows(x.len(), &shape(10, 5, 7), &table).unwrap();
        assert_eq!((cos.len(), sin.len()), (15, 15));
        let (all_cos, all_sin) = table.rows(0, 32).unwrap();
        assert_eq!(cos, &all_cos[21..36]);
        assert_eq!(sin, &all_sin[21..36]);
        // A decode step: one token at the cache length.
        let (cos, _) = host_rows(24, &shape(1, 1, 31), &table).unwrap();
        assert_eq!(cos, &all_cos[93..96]);
        assert_eq!(pairs(&shape(10, 5, 7), 3).unwrap(), 90);
    }

    #[test]
    fn the_twins_check_runs_first_and_past_the_table_is_an_error() {
        let table = RopeTable::new(&inv_freq(10000.0, 6, RopeFrequencyScaling::None), 8);
        let x = vec![0.0; 4 * 24];
        assert!(host_rows(x.len(), &shape(4, 4, 5), &table).is_err());
        assert!(host_rows(23, &shape(1, 1, 0), &table).is_err());
        assert!(host_rows(x.len(), &shape(4, 4, 4), &table).is_ok());
        // No token, any first position: nothing to read, as the twin accepts it.
        assert_eq!(host_rows(0, &shape(0, 4, 99), &table).unwrap().0.len(), 0);
        let mut none: Vec<f32> = Vec::new();
        assert!(crate::ops::rope_forward(&mut none, &shape(0, 4, 99), &table).is_ok());
        assert!(table.rows(6, 3).is_none());
        assert_eq!(table.rows(8, 0).map(|(c, _)| c.len()), Some(0));
    }
}
