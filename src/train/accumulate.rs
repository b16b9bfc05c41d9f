//! Gradient accumulation over micro-batches: the contract between the step and
//! the model's forward/backward.
//!
//! A step of `count` micro-batches of equal size must give the gradient of the
//! mean loss over the whole batch, times the loss scale:
//!
//! ```text
//! grad = sum_i  d(loss_i * backward_seed) / dw,   backward_seed = loss_scale / count
//! ```
//!
//! so the caller's closure seeds its backward pass with
//! [`MicroBatch::backward_seed`] instead of 1, and its layers *add* into
//! `Parameter::grad`, which is zeroed here before each micro-batch; the micro-batch
//! gradients are then summed in micro-batch order (see [`accumulate_gradients`]).
//! Weights do not change between micro-batches (no `mark_updated` until the
//! optimizer step), so every layer's compute copy of its weights (bf16/fp16,
//! FP8 codes and transposes, keyed by `Parameter::version`) is made in the
//! first micro-batch and reused by the others.

use crate::error::{Error, Result};
use crate::nn::{Module, Parameter};
use crate::tensor::Tensor;

/// What the closure needs to know about the micro-batch it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MicroBatch {
    /// 0-based index within the step.
    pub index: usize,
    /// Micro-batches in the step (over all ranks).
    pub count: usize,
    /// What backward starts from: `loss_scale / count` (the loss divided by the count, then scaled).
    pub backward_seed: f32,
}

/// The losses of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct AccumulatedLoss {
    /// Mean of the micro-batch losses (unscaled), summed in f64.
    pub mean: f32,
    /// Each micro-batch's unscaled mean loss, in order.
    pub micro: Vec<f32>,
}

/// Zeroes the gradients of `model`, then runs `forward_backward(model, micro)` for each of
/// `count` micro-batches; the closure returns its micro-batch's unscaled mean loss. The first
/// error stops the step and is returned (gradients are then partial: do not step on them).
///
/// The step's gradient is `((g_0 + g_1) + g_2) + ...`: each micro-batch's gradient `g_i` is
/// computed on its own (into zeroed gradients) and added to the sum of the earlier ones, one
/// f32 addition per value, in micro-batch order. This is the rank-order sum of a data-parallel
/// all-reduce, so N ranks of one micro-batch each get the same bits (`docs/distributed.md`);
/// it costs one gradient-sized buffer while a step has more than one micro-batch.
pub fn accumulate_gradients<M, F>(
    model: &mut M,
    count: usize,
    loss_scale: f32,
    forward_backward: F,
) -> Result<AccumulatedLoss>
where
    M: Module + ?Sized,
    F: FnMut(&mut M, MicroBatch) -> Result<f32>,
{
    let share = Share {
        first: 0,
        count,
        total: count,
    };
    accumulate_share(model, share, loss_scale, forward_backward)
}

/// Which micro-batches of a step one rank runs: `first..first + count` of `total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// Index of the rank's first micro-batch in the step.
    pub first: usize,
    /// Micro-batches the rank runs.
    pub count: usize,
    /// Micro-batches of the step over all ranks (the loss is divided by it).
    pub total: usize,
}

/// [`accumulate_gradients`] over one rank's `share` of the step's micro-batches: the seed is
/// `loss_scale / share.total`, [`MicroBatch::index`] counts from `share.first`, and
/// [`AccumulatedLoss::mean`] is the mean of this rank's losses only.
pub fn accumulate_share<M, F>(
    model: &mut M,
    share: Share,
    loss_scale: f32,
    mut forward_backward: F,
) -> Result<AccumulatedLoss>
where
    M: Module + ?Sized,
    F: FnMut(&mut M, MicroBatch) -> Result<f32>,
{
    accumulate_share_with(model, share, loss_scale, |m, micro, _| forward_backward(m, micro))
}

/// The sum of a rank's earlier micro-batch gradients while a later one runs, by parameter
/// (visiting order). A step that hands gradients on before its backward returns (the overlapped
/// all-reduce) folds each parameter's sum in as soon as the parameter is final; the rest are
/// folded when the micro-batch's closure returns.
/// A sum is kept where its gradient lived (a gradient on a GPU stays there).
#[derive(Debug, Default)]
pub struct EarlierSums {
    sums: Vec<Tensor>,
    folded: Vec<bool>,
}

impl EarlierSums {
    /// Adds the earlier micro-batches' sum into parameter `index`'s gradient, once (`g + sum`:
    /// f32 addition commutes, so this is the contract's `sum + g` bit for bit). Does nothing
    /// in a step's first micro-batch, or for a parameter already folded.
    ///
    /// # Panics
    /// If the sum lives on a GPU and cannot come back ([`Self::fold_into`] returns the error).
    pub fn fold(&mut self, index: usize, grad: &mut [f32]) {
        if let Some(sum) = self.take(index) {
            // Borrowed in host memory, downloaded from a GPU.
            let sum = sum
                .values()
                .to_host()
                .unwrap_or_else(|e| panic!("an earlier gradient sum: {e}"));
            grad.iter_mut().zip(sum.iter()).for_each(|(g, s)| *g += *s);
        }
    }

    /// [`Self::fold`] into `p`'s gradient where it lives: on its GPU when the sum is there too
    /// (an f32 add on the device, the same bits), else in host memory.
    pub(crate) fn fold_into(&mut self, index: usize, p: &mut Parameter) -> Result<()> {
        match self.take(index) {
            Some(sum) => p.add_to_grad(sum),
            None => Ok(()),
        }
    }

    /// Parameter `index`'s sum if it is not folded yet (marked folded).
    fn take(&mut self, index: usize) -> Option<&Tensor> {
        match (self.sums.get(index), self.folded.get_mut(index)) {
            (Some(sum), Some(folded @ false)) => {
                *folded = true;
                Some(sum)
            }
            _ => None,
        }
    }
}

/// [`accumulate_share`] whose closure also gets the [`EarlierSums`] (empty in the rank's first
/// micro-batch), to fold parameters in early.
pub fn accumulate_share_with<M, F>(
    model: &mut M,
    share: Share,
    loss_scale: f32,
    mut forward_backward: F,
) -> Result<AccumulatedLoss>
where
    M: Module + ?Sized,
    F: FnMut(&mut M, MicroBatch, &mut EarlierSums) -> Result<f32>,
{
    let Share { first, count, total } = share;
    if count == 0 || total < first + count {
        return Err(Error::InvalidSetting {
            setting: "micro_batches",
            value: format!("{count} of {total} from {first}"),
            reason: "a step needs at least one micro-batch, inside the step's count".to_string(),
        });
    }
    if !(loss_scale.is_finite() && loss_scale > 0.0) {
        return Err(Error::InvalidScale { value: loss_scale });
    }
    model.zero_grad();
    // Rounded once in f64: exact for power-of-two counts and scales.
    let backward_seed = (loss_scale as f64 / total as f64) as f32;
    let mut micro = Vec::with_capacity(count);
    let mut earlier = EarlierSums::default();
    for index in first..first + count {
        if index > first {
            // The sum so far leaves the gradients, which start this micro-batch at zero.
            earlier.sums.clear();
            model.visit_parameters(&mut |p| {
                // A clone shares a device gradient's array; clearing it then makes a new one. A
                // gradient holding its optimizer arena range is copied, and cleared in place.
                earlier.sums.push(earlier_sum(p));
                p.zero_grad();
            });
            earlier.folded = vec![false; earlier.sums.len()];
        }
        let batch = MicroBatch {
            index,
            count: total,
            backward_seed,
        };
        micro.push(forward_backward(model, batch, &mut earlier)?);
        let (mut param, mut folded) = (0, Ok(()));
        model.visit_parameters(&mut |p| {
            if folded.is_ok() {
                folded = earlier.fold_into(param, p);
            }
            param += 1;
        });
        folded?;
    }
    let mean = mean_loss(&micro);
    Ok(AccumulatedLoss { mean, micro })
}

/// `p`'s gradient as an earlier micro-batches' sum: a clone where it lives, or (a GPU without room
/// for a copy of an arena range) brought home first and cloned there.
///
/// # Panics
/// If the gradient cannot come back from its GPU (as [`EarlierSums::fold`]).
fn earlier_sum(p: &mut Parameter) -> Tensor {
    match p.grad_tensor().try_clone() {
        Ok(sum) => return sum,
        Err(e) if !crate::nn::out_of_memory(&e) => {
            panic!("the gradient of '{}' could not be copied on its GPU: {e}", p.name())
        }
        Err(_) => {}
    }
    if let Err(e) = p.grad_to_host() {
        panic!("the gradient of '{}' could not come back from its GPU: {e}", p.name());
    }
    p.grad_tensor().clone()
}

/// The step's mean loss from every micro-batch's loss in step order (all ranks' together):
/// summed in f64, divided by the count, rounded to f32 once.
pub fn mean_loss(micro: &[f32]) -> f32 {
    (micro.iter().map(|&l| l as f64).sum::<f64>() / micro.len().max(1) as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Parameter;

    /// y = w . x with a mean squared error, and a "compute copy" of w rebuilt when its version changes.
    struct Linear {
        w: Parameter,
        cache_version: Option<u64>,
        cache_refreshes: usize,
        cache: Vec<f32>,
    }

    impl Module for Linear {
        fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
            f(&mut self.w)
        }
    }

    impl Linear {
        fn new(w: Vec<f32>) -> Self {
            Linear {
                w: Parameter::new("w", &[w.len()], w).unwrap(),
                cache_version: None,
                cache_refreshes: 0,
                cache: Vec::new(),
            }
        }

        /// Mean loss over `rows` and adds `seed * dloss/dw` into the gradient.
        fn forward_backward(&mut self, rows: &[(Vec<f32>, f32)], seed: f32) -> f32 {
            if self.cache_version != Some(self.w.version()) {
                self.cache = self.w.value().to_vec();
                self.cache_version = Some(self.w.version());
                self.cache_refreshes += 1;
            }
            let n = rows.len() as f32;
            let mut loss = 0.0;
            for (x, y) in rows {
                let pred: f32 = self.cache.iter().zip(x).map(|(w, x)| w * x).sum();
                let err = pred - y;
                loss += err * err / n;
                for (g, xi) in self.w.grad_mut().iter_mut().zip(x) {
                    *g += seed * 2.0 * err * xi / n;
                }
            }
            loss
        }
    }

    fn data() -> Vec<(Vec<f32>, f32)> {
        (0..8)
            .map(|i| {
                let x = vec![(i as f32 * 0.7).sin(), (i as f32 * 1.3).cos(), 1.0];
                (x, i as f32 * 0.25 - 1.0)
            })
            .collect()
    }

    #[test]
    fn four_micro_batches_give_the_full_batch_gradient_and_mean_loss() {
        let rows = data();
        let w = vec![0.3f32, -0.2, 0.1];
        // f64 reference gradient and loss of the whole batch, times the loss scale.
        let scale = 1024.0f64;
        let mut grad = [0.0f64; 3];
        let mut loss = 0.0f64;
        for (x, y) in &rows {
            let err: f64 = w.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum::<f64>() - *y as f64;
            loss += err * err / 8.0;
            for j in 0..3 {
                grad[j] += scale * 2.0 * err * x[j] as f64 / 8.0;
            }
        }
        let mut model = Linear::new(w);
        model.w.grad_mut().copy_from_slice(&[99.0; 3]); // stale gradient from a previous step: must be cleared
        let out = accumulate_gradients(&mut model, 4, scale as f32, |m, micro| {
            assert_eq!(micro.count, 4);
            assert_eq!(micro.backward_seed, 256.0);
            let rows = &rows[micro.index * 2..micro.index * 2 + 2];
            Ok(m.forward_backward(rows, micro.backward_seed))
        })
        .unwrap();
        assert_eq!(out.micro.len(), 4);
        assert!(
            (out.mean as f64 - loss).abs() < 1e-6 * loss.max(1.0),
            "{} vs {loss}",
            out.mean
        );
        for (got, want) in model.w.grad().iter().zip(grad) {
            assert!(
                (*got as f64 - want).abs() < 1e-5 * want.abs().max(scale),
                "{got} vs {want}"
            );
        }
        assert_eq!(model.cache_refreshes, 1, "the weight copy is made once per step");
        model.w.mark_updated();
        accumulate_gradients(&mut model, 2, 1.0, |m, micro| {
            Ok(m.forward_backward(&rows[micro.index..], 1.0))
        })
        .unwrap();
        assert_eq!(model.cache_refreshes, 2, "a new version makes one new copy");
    }

    #[test]
    fn errors_stop_the_step() {
        let mut model = Linear::new(vec![1.0]);
        let mut calls = 0;
        let result = accumulate_gradients(&mut model, 3, 1.0, |_, micro| {
            calls += 1;
            if micro.index == 1 {
                Err(Error::InvalidSetting {
                    setting: "test",
                    value: "1".into(),
                    reason: "fails".into(),
                })
            } else {
                Ok(1.0)
            }
        });
        assert!(result.is_err());
        assert_eq!(calls, 2);
        assert!(accumulate_gradients(&mut model, 0, 1.0, |_, _| Ok(0.0)).is_err());
        assert!(accumulate_gradients(&mut model, 1, 0.0, |_, _| Ok(0.0)).is_err());
    }
}
