//! Launchers of `cuda/embedding.cu`: the embedding gather and its deterministic
//! scatter-add. Twins: `ops::embedding_forward` and `ops::embedding_backward`,
//! same bits.
//!
//! Why the scatter-add is deterministic without sorting on the device or float
//! atomics: the token ids come from the host (the data loader), so the host
//! builds a [`ScatterPlan`], the positions grouped by id with each group in
//! position order (one stable counting pass, O(tokens + distinct ids)). The
//! kernel runs one block per distinct id and adds that id's rows in the
//! group's order, so each table element receives the twin's additions in the
//! twin's order.

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::{launch, tile_blocks};
use super::op_args::{check_len, elements, stride_blocks};
use super::params::Fp8EmbeddingParams;
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;

const MODULE: &str = "embedding";

/// Token positions grouped by id, each group in ascending position order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScatterPlan {
    /// Positions, group after group.
    pub order: Vec<u32>,
    /// `groups + 1` offsets into `order`: group g is `order[starts[g]..starts[g + 1]]`.
    pub starts: Vec<u32>,
    /// The id of each group, ascending.
    pub group_ids: Vec<u32>,
}

impl ScatterPlan {
    /// The plan of `ids` for a table of `vocab` rows; an id `>= vocab` is the twin's error.
    pub fn new(ids: &[u32], vocab: usize) -> Result<Self> {
        check_ids(ids, vocab)?;
        let positions = u32::try_from(ids.len()).map_err(|_| Error::KernelArgs {
            kernel: "embedding_backward",
            detail: format!("{} tokens exceed 2^32-1", ids.len()),
        })?;
        // Counting pass over the ids that occur (a sparse map keeps it O(tokens) for any vocab).
        let mut counts = std::collections::BTreeMap::<u32, u32>::new();
        for &id in ids {
            *counts.entry(id).or_default() += 1;
        }
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut group_ids = Vec::with_capacity(counts.len());
        let mut next = std::collections::HashMap::with_capacity(counts.len());
        let mut at = 0u32;
        for (&id, &count) in &counts {
            starts.push(at);
            group_ids.push(id);
            next.insert(id, at);
            at += count;
        }
        starts.push(at);
        let mut order = vec![0u32; ids.len()];
        for (position, id) in (0..positions).zip(ids) {
            let slot = next.get_mut(id).expect("every id was counted");
            order[*slot as usize] = position;
            *slot += 1;
        }
        Ok(ScatterPlan {
            order,
            starts,
            group_ids,
        })
    }

    /// Distinct ids (blocks of the kernel).
    pub fn groups(&self) -> usize {
        self.group_ids.len()
    }
}

/// The twin's id check: the first id `>= vocab` is `IndexOutOfRange` with its position.
pub(crate) fn check_ids(ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().enumerate().find(|&(_, &id)| id as usize >= vocab) {
        Some((position, &id)) => Err(Error::IndexOutOfRange {
            what: "token id",
            index: id.into(),
            position,
            len: vocab,
        }),
        None => Ok(()),
    }
}

/// Rows of a `[vocab, dim]` table of `len` values (the twin's checks and errors).
pub(crate) fn vocab_of(what: &'static str, len: usize, dim: usize) -> Result<usize> {
    if dim == 0 {
        return Err(Error::InvalidShape {
            what,
            reason: "dim is 0".into(),
        });
    }
    if !len.is_multiple_of(dim) {
        return Err(Error::InvalidShape {
            what,
            reason: format!("a table of {len} values is not a whole number of rows of {dim}"),
        });
    }
    Ok(len / dim)
}

impl CudaDevice {
    /// `out [ids.len(), dim]` = rows `ids` of `table [vocab, dim]`. Twin of `ops::embedding_forward`.
    /// `ids` are checked on the host (the twin's errors) and uploaded.
    pub fn embedding_forward(
        &self,
        ids: &[u32],
        table: &DeviceBuffer<f32>,
        dim: usize,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "embedding_forward";
        let vocab = vocab_of("embedding forward", table.len(), dim)?;
        check_ids(ids, vocab)?;
        let n = elements(K, ids.len(), dim)?;
        check_len(K, "output [ids, dim]", out.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let ids_dev = self.upload(ids, MemoryCategory::Workspace)?;
        let params = Fp8EmbeddingParams {
            ids: ids_dev.address(self),
            src: table.address(self),
            dst: out.address_mut(self),
            tokens: ids.len() as u64,
            dim: dim as u64,
            ..Default::default()
        };
        launch(
            self,
            MODULE,
            "fp8_embedding_gather",
            stride_blocks(self.info().multiprocessors, n),
            params,
        )
    }

    /// `dtable[ids[i]] += dout[i]` for each `i` in order. Twin of `ops::embedding_backward`: same bits.
    pub fn embedding_backward(
        &self,
        ids: &[u32],
        dout: &DeviceBuffer<f32>,
        dim: usize,
        dtable: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "embedding_backward";
        let vocab = vocab_of("embedding backward", dtable.len(), dim)?;
        let plan = ScatterPlan::new(ids, vocab)?;
        check_len(
            K,
            "output gradient [ids, dim]",
            dout.len(),
            elements(K, ids.len(), dim)?,
        )?;
        if plan.groups() == 0 {
            return Ok(());
        }
        let order = self.upload(&plan.order, MemoryCategory::Workspace)?;
        let starts = self.upload(&plan.starts, MemoryCategory::Workspace)?;
        let group_ids = self.upload(&plan.group_ids, MemoryCategory::Workspace)?;
        let params = Fp8EmbeddingParams {
            order: order.address(self),
            starts: starts.address(self),
            group_ids: group_ids.address(self),
            src: dout.address(self),
            dst: dtable.address_mut(self),
            tokens: ids.len() as u64,
            dim: dim as u64,
            groups: plan.groups() as u64,
            ..Default::default()
        };
        launch(
            self,
            MODULE,
            "fp8_embedding_scatter_add",
            tile_blocks(K, plan.groups() as u64)?,
            params,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_groups_positions_by_id_in_position_order() {
        let ids = [5, 2, 5, 0, 2, 5];
        let plan = ScatterPlan::new(&ids, 6).unwrap();
        assert_eq!(plan.group_ids, vec![0, 2, 5]);
        assert_eq!(plan.starts, vec![0, 1, 3, 6]);
        assert_eq!(plan.order, vec![3, 1, 4, 0, 2, 5]);
        // Replaying the plan adds each row's contributions in the twin's order.
        for g in 0..plan.groups() {
            let group = &plan.order[plan.starts[g] as usize..plan.starts[g + 1] as usize];
            assert!(group.windows(2).all(|w| w[0] < w[1]));
            assert!(group.iter().all(|&t| ids[t as usize] == plan.group_ids[g]));
        }
    }

    #[test]
    fn replaying_the_plan_gives_the_cpu_scatter_add_bits() {
        let (vocab, dim) = (7, 3);
        let ids: Vec<u32> = (0..50u32).map(|i| (i * 5 + i / 3) % vocab as u32).collect();
        let dout: Vec<f32> = (0..ids.len() * dim)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut cpu = vec![0.25f32; vocab * dim];
        crate::ops::embedding_backward(&ids, &dout, dim, &mut cpu).unwrap();
        let plan = ScatterPlan::new(&ids, vocab).unwrap();
        let mut replay = vec![0.25f32; vocab * dim];
        for g in 0..plan.groups() {
            let id = plan.group_ids[g] as usize;
            for c in 0..dim {
                let mut s = replay[id * dim + c];
                for &t in &plan.order[plan.starts[g] as usize..plan.starts[g + 1] as usize] {
                    s += dout[t as usize * dim + c];
                }
                replay[id * dim + c] = s;
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&replay), bits(&cpu));
    }

    #[test]
    fn ids_and_tables_are_checked_like_the_twin() {
        assert_eq!(
            ScatterPlan::new(&[1, 9, 2], 4).unwrap_err(),
            Error::IndexOutOfRange {
                what: "token id",
                index: 9,
                position: 1,
                len: 4
            }
        );
        assert!(vocab_of("t", 10, 0).is_err());
        assert!(vocab_of("t", 10, 3).is_err());
        assert_eq!(vocab_of("t", 12, 3).unwrap(), 4);
        let empty = ScatterPlan::new(&[], 4).unwrap();
        assert_eq!((empty.groups(), empty.starts.clone()), (0, vec![0]));
    }
}
