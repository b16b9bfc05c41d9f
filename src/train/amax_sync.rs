//! The delayed-scaling update once per optimizer step, with the amaxes max-reduced across the
//! ranks first (`docs/distributed.md`, What is reduced when).
//!
//! During a training run every linear layer only records amaxes in its forward and backward
//! (its slots' `history[0]` is then the max over the step's micro-batches); at the end of the
//! step every bank's five current amaxes are gathered into one flat buffer, in layer order,
//! reduced with ONE `all_reduce_max` for the whole model, written back, and every slot is
//! updated. Max is exact and order-free, so N ranks of one micro-batch each end the step with
//! the bits one rank gets from the same N micro-batches.

use crate::dist::collective::Collective;
use crate::error::Result;
use crate::nn::VisitLinears;

/// Puts every linear layer of `model` in per-step mode (`on`) or back to one update per pass.
pub fn set_update_per_step<M: VisitLinears + ?Sized>(model: &mut M, on: bool) {
    model.visit_linears(&mut |linear| linear.visit_gemms(&mut |g| g.set_update_per_step(on)));
}

/// This step's amax of every delayed-scaling slot of `model`, in layer order, five per bank.
pub fn current_amaxes<M: VisitLinears + ?Sized>(model: &mut M) -> Vec<f32> {
    let mut amaxes = Vec::new();
    model.visit_linears(&mut |linear| linear.visit_gemms(&mut |g| g.push_current_amaxes(&mut amaxes)));
    amaxes
}

/// Ends a step's delayed scaling: with `reduce` (and more than one rank) the current amaxes
/// of the whole model are max-reduced across `collective` in one call, then every slot is
/// updated. Returns the number of amaxes reduced (0 when nothing was).
pub fn reduce_and_update<M: VisitLinears + ?Sized>(
    model: &mut M,
    collective: &dyn Collective,
    reduce: bool,
) -> Result<usize> {
    let mut reduced = 0;
    if reduce && collective.world_size() > 1 {
        let mut amaxes = current_amaxes(model);
        // Every rank has the same layers, so every rank skips together.
        if !amaxes.is_empty() {
            collective.all_reduce_max(&mut amaxes)?;
        }
        reduced = amaxes.len();
        let mut it = amaxes.into_iter();
        model.visit_linears(&mut |linear| linear.visit_gemms(&mut |g| g.set_current_amaxes(&mut it)));
    }
    let mut result = Ok(());
    model.visit_linears(&mut |linear| {
        linear.visit_gemms(&mut |g| {
            if result.is_ok() {
                result = g.update_step();
            }
        })
    });
    result.map(|()| reduced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amp::Precision;
    use crate::dist::cpu_group;
    use crate::nn::{Linear, Module, Tensor};
    use crate::scaling::DelayedSlot;

    const ROWS: usize = 16;

    /// Rank (or micro-batch) `i`'s input: values of magnitude up to `8^i`, so every rank sees
    /// another data range and the amaxes differ by rank.
    fn input(i: usize) -> Tensor {
        let scale = 8f32.powi(i as i32);
        let data = (0..ROWS * 32).map(|k| scale * ((k as f32 * 0.37).sin())).collect();
        Tensor::new(data, ROWS, 32).unwrap()
    }

    fn layer(precision: &Precision) -> Linear {
        let mut l = Linear::new("l", 32, 16, true, precision, 5).unwrap();
        set_update_per_step(&mut l, true);
        l
    }

    fn run_micro(l: &mut Linear, i: usize) {
        let y = l.forward(&input(i)).unwrap();
        let dy = Tensor::new(y.data().iter().map(|v| v * 0.5).collect(), ROWS, 16).unwrap();
        l.backward(&dy).unwrap();
    }

    fn slots(l: &mut Linear) -> Vec<DelayedSlot> {
        let mut out = Vec::new();
        l.visit_fp8_slots(&mut |_, s| out.push(s.clone()));
        out
    }

    /// Ranks see data ranges 1, 8, 64, 512: after one step every rank holds the scales one rank
    /// computes from all four micro-batches, and without the reduce they differ.
    #[test]
    fn every_rank_ends_the_step_with_the_all_data_scales() {
        let world = 4;
        let precision: Precision = "fp8-delayed".parse().unwrap();
        let mut single = layer(&precision);
        for i in 0..world {
            run_micro(&mut single, i);
        }
        reduce_and_update(&mut single, &crate::dist::SingleRank, true).unwrap();
        let want = slots(&mut single);
        assert!(
            want[0].scale < 448.0 / 500.0,
            "the widest range sets the input scale: {}",
            want[0].scale
        );

        for reduce in [true, false] {
            let group = cpu_group(world).unwrap();
            let got: Vec<Vec<DelayedSlot>> = std::thread::scope(|s| {
                let handles: Vec<_> = group
                    .iter()
                    .map(|c| {
                        let precision = precision.clone();
                        s.spawn(move || {
                            let mut l = layer(&precision);
                            run_micro(&mut l, c.rank());
                            assert_eq!(
                                reduce_and_update(&mut l, c, reduce).unwrap(),
                                if reduce { 5 } else { 0 }
                            );
                            slots(&mut l)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (rank, slots) in got.iter().enumerate() {
                if reduce {
                    assert_eq!(slots, &want, "rank {rank}");
                } else if rank < world - 1 {
                    assert_ne!(slots[0].scale, want[0].scale, "rank {rank} kept its own input scale");
                }
            }
        }
    }

    /// Per-step mode records and does not update; back in per-pass mode the forward updates.
    #[test]
    fn per_step_mode_defers_the_update_to_the_step() {
        let precision: Precision = "fp8-delayed".parse().unwrap();
        let mut l = layer(&precision);
        run_micro(&mut l, 1);
        assert!(
            slots(&mut l).iter().all(|s| s.scale == 1.0),
            "no update inside the step"
        );
        assert!(current_amaxes(&mut l).iter().all(|&a| a > 0.0));
        reduce_and_update(&mut l, &crate::dist::SingleRank, true).unwrap();
        let after = slots(&mut l);
        assert!(after.iter().all(|s| s.scale != 1.0 && s.history[0] == 0.0));
        set_update_per_step(&mut l, false);
        run_micro(&mut l, 2);
        assert_ne!(
            slots(&mut l)[0].scale,
            after[0].scale,
            "per pass again: the forward updated"
        );
    }
}
