//! The gradient all-reduce of a data-parallel step: every rank's gradients become the sum over
//! ranks, in buckets of about `bucket_bytes` (one collective call each), from the last
//! parameter backwards.
//!
//! This is the reduce after backward (`--no-overlap`); [`super::grad_overlap`] makes the same
//! calls on the same values while backward runs. Bucketing never changes a value: every element
//! is reduced once, by the same rank-order formula, whatever bucket holds it.

use crate::dist::collective::{Collective, Wire};
use crate::dist::shard::bucket_ranges;
use crate::error::Result;
use crate::nn::Module;

/// What [`all_reduce_gradients`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GradSync {
    /// Collective calls made (buckets).
    pub buckets: usize,
    /// Bytes each rank sent into the reductions (values times the wire's bytes).
    pub bytes: usize,
    /// Buckets handed to the communication thread before backward returned (overlapped
    /// reduce, [`super::grad_overlap`]); 0 for the reduce after backward.
    pub launched_in_backward: usize,
}

/// Sums the gradients of `model` over the ranks of `collective` (rank order, `wire` format),
/// bucketed by `bucket_bytes` of f32 gradient. World size 1 with an f32 wire is a no-op.
pub fn all_reduce_gradients<M: Module + ?Sized>(
    model: &mut M,
    collective: &dyn Collective,
    bucket_bytes: usize,
    wire: Wire,
) -> Result<GradSync> {
    if collective.world_size() == 1 && wire == Wire::F32 {
        return Ok(GradSync::default());
    }
    let mut lens = Vec::new();
    let mut flat = Vec::new();
    model.visit_parameters(&mut |p| {
        lens.push(p.grad_len());
        flat.extend_from_slice(p.grad());
    });
    let buckets = bucket_ranges(&lens, (bucket_bytes / 4).max(1));
    for range in &buckets {
        collective.all_reduce_sum(&mut flat[range.clone()], wire)?;
    }
    let mut offset = 0;
    model.visit_parameters(&mut |p| {
        let grad = p.grad_mut();
        let n = grad.len();
        grad.copy_from_slice(&flat[offset..offset + n]);
        offset += n;
    });
    Ok(GradSync {
        buckets: buckets.len(),
        bytes: flat.len() * wire.bytes(),
        launched_in_backward: 0,
    })
}
