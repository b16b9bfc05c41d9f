//! The collective operations data parallelism needs, as one trait with a CPU implementation
//! (threads, [`super::cpu_group`]) and an NCCL one (GPUs), and the reduction-order contract
//! every implementation states (`docs/distributed.md`, What is deterministic).
//!
//! Every rank of a group calls the same operations in the same order with buffers of the same
//! length. A call returns once every rank has made it (or with an error on every rank).

use half::bf16;

use crate::error::{Error, Result};

/// The number format gradients travel in for [`Collective::all_reduce_sum`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wire {
    /// f32 all the way: the sum is the f32 sum of the inputs in rank order.
    #[default]
    F32,
    /// Each rank's values rounded to bf16 (nearest-even) before they are sent, summed in f32
    /// in rank order, the sum rounded to bf16 again: half the bytes, about 3 significant digits.
    Bf16,
}

impl Wire {
    /// `v` as it is sent: unchanged for f32, rounded to the nearest bf16 for bf16.
    pub fn round(self, v: f32) -> f32 {
        match self {
            Wire::F32 => v,
            Wire::Bf16 => bf16::from_f32(v).to_f32(),
        }
    }

    /// Bytes per value on the wire.
    pub fn bytes(self) -> usize {
        match self {
            Wire::F32 => 4,
            Wire::Bf16 => 2,
        }
    }
}

impl std::str::FromStr for Wire {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "fp32" => Ok(Wire::F32),
            "bf16" => Ok(Wire::Bf16),
            _ => Err(Error::InvalidSetting {
                setting: "grad_wire",
                value: s.to_string(),
                reason: "expected f32 or bf16".to_string(),
            }),
        }
    }
}

/// A group of `world_size` ranks that reduce, gather and broadcast f32 buffers together.
///
/// Reduction order (the contract the CPU group implements exactly): element `i` of a sum is
/// `((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{n-1}[i]`, one f32 addition at a time, left to right
/// in rank order, each `x_r[i]` first passed through [`Wire::round`]; a max is the same fold
/// with `fmaxf` (a NaN operand is ignored, as CUDA's `fmaxf`). Every rank gets the same bits.
pub trait Collective: Send + Sync {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn world_size(&self) -> usize;

    /// `data` becomes the element-wise sum over ranks (order above), on every rank.
    fn all_reduce_sum(&self, data: &mut [f32], wire: Wire) -> Result<()>;

    /// `data` becomes the element-wise max over ranks (`fmaxf`), on every rank.
    fn all_reduce_max(&self, data: &mut [f32]) -> Result<()>;

    /// `data` becomes `root`'s `data` on every rank.
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()>;

    /// `out` (`world_size * local.len()` values) becomes every rank's `local`, in rank order.
    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
}

/// The group of one: every operation is the identity, except that a bf16 wire rounds as it
/// would on a larger group (so world size 1 follows the same formula).
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleRank;

impl Collective for SingleRank {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, data: &mut [f32], wire: Wire) -> Result<()> {
        if wire != Wire::F32 {
            data.iter_mut().for_each(|v| *v = wire.round(wire.round(*v)));
        }
        Ok(())
    }

    fn all_reduce_max(&self, _data: &mut [f32]) -> Result<()> {
        Ok(())
    }

    fn broadcast(&self, _data: &mut [f32], root: usize) -> Result<()> {
        check_root("broadcast", 0, root, 1)
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        check_gather(0, local.len(), out.len(), 1)?;
        out.copy_from_slice(local);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// The rank-order reduction of the contract: `out[i] = fold(round(inputs[0][i]), ...)`.
pub(crate) fn reduce_in_rank_order(inputs: &[&[f32]], out: &mut [f32], op: ReduceOp) {
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = op.wire().round(inputs[0][i]);
        for input in &inputs[1..] {
            let v = op.wire().round(input[i]);
            acc = match op {
                ReduceOp::Sum(_) => acc + v,
                ReduceOp::Max => acc.max(v),
            };
        }
        *o = op.wire().round(acc);
    }
}

/// What a reduction computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    /// Sum, with the values on `Wire`.
    Sum(Wire),
    /// `fmaxf`, in f32.
    Max,
}

impl ReduceOp {
    fn wire(self) -> Wire {
        match self {
            ReduceOp::Sum(wire) => wire,
            ReduceOp::Max => Wire::F32,
        }
    }
}

pub(crate) fn check_root(op: &'static str, rank: usize, root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(Error::Collective {
            op,
            rank,
            reason: format!("root rank {root} is outside the group of {world}"),
        });
    }
    Ok(())
}

pub(crate) fn check_gather(rank: usize, local: usize, out: usize, world: usize) -> Result<()> {
    if local.checked_mul(world) != Some(out) {
        return Err(Error::Collective {
            op: "all_gather",
            rank,
            reason: format!("output holds {out} values, {world} ranks x {local} were gathered"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_order_sum_is_a_left_fold() {
        // 1 + 2^24 rounds to 2^24 in f32 only when it is added to 2^24 last, not first.
        let (a, b, c) = ([1.0f32], [16_777_216.0f32], [-16_777_216.0f32]);
        let mut out = [0.0f32];
        reduce_in_rank_order(&[&a, &b, &c], &mut out, ReduceOp::Sum(Wire::F32));
        assert_eq!(out[0], (1.0f32 + 16_777_216.0) - 16_777_216.0);
        assert_eq!(out[0], 0.0, "(1 + 2^24) rounds to 2^24, then 0");
        reduce_in_rank_order(&[&b, &c, &a], &mut out, ReduceOp::Sum(Wire::F32));
        assert_eq!(
            out[0], 1.0,
            "another rank order gives another result: the order is the contract"
        );
    }

    #[test]
    fn max_ignores_nan_and_bf16_wire_rounds_inputs_and_result() {
        let mut out = [0.0f32; 2];
        reduce_in_rank_order(&[&[f32::NAN, 1.0], &[2.0, f32::NAN]], &mut out, ReduceOp::Max);
        assert_eq!(out, [2.0, 1.0]);
        // 1 + 2^-9 is not a bf16 (8 significand bits): it rounds to 1 before the sum.
        let x = 1.0 + 2f32.powi(-9);
        reduce_in_rank_order(&[&[x], &[x]], &mut out[..1], ReduceOp::Sum(Wire::Bf16));
        assert_eq!(out[0], 2.0);
        let mut single = [x];
        SingleRank.all_reduce_sum(&mut single, Wire::Bf16).unwrap();
        assert_eq!(single[0], 1.0);
        assert_eq!("bf16".parse::<Wire>().unwrap(), Wire::Bf16);
        assert!("f16".parse::<Wire>().is_err());
    }
}
