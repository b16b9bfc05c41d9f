//! A step's FP8 statistics read back in one go. On a GPU a cast's counts and amax, and a GEMM
//! output's, stay on the device until the statistics are collected (`dispatch::Fp8Stats`);
//! read one by one, each is a download and a stream sync (a few per linear layer per step).
//! Here every layer's pending results are gathered first and read with one download per GPU
//! and element type.

use crate::dispatch::Deferred;
use crate::error::Result;
use crate::nn::VisitLinears;

/// Reads the results `model`'s statistics still leave on its GPU (nothing on the CPU, whose
/// statistics are finished when made).
pub fn read_pending_stats<M: VisitLinears + ?Sized>(model: &mut M) -> Result<()> {
    let (scalars, counts) = pending(model);
    if scalars.is_empty() && counts.is_empty() {
        return Ok(());
    }
    crate::dispatch::read_deferred(&scalars, &counts)
}

/// The amaxes and counts `model`'s statistics leave on a device, in layer order.
fn pending<M: VisitLinears + ?Sized>(model: &mut M) -> (Vec<Deferred<f32>>, Vec<Deferred<[u64; 4]>>) {
    let (mut scalars, mut counts) = (Vec::new(), Vec::new());
    model.visit_linears(&mut |linear| linear.visit_gemms(&mut |g| g.pending_stats(&mut scalars, &mut counts)));
    (scalars, counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amp::Precision;
    use crate::nn::{Linear, Module, Tensor};

    #[test]
    fn statistics_made_on_the_cpu_leave_nothing_to_read() {
        for name in ["fp8-delayed", "fp8-current", "fp8-block", "mxfp8"] {
            let precision: Precision = name.parse().unwrap();
            let mut layer = Linear::new("fc", 32, 16, true, &precision, 3).unwrap();
            let x = Tensor::new((0..16 * 32).map(|i| (i as f32 * 0.3).sin()).collect(), 16, 32).unwrap();
            layer.forward(&x).unwrap();
            layer
                .backward(&Tensor::new(vec![0.5; 16 * 16], 16, 16).unwrap())
                .unwrap();
            let (scalars, counts) = pending(&mut layer);
            assert!(scalars.is_empty() && counts.is_empty(), "{name}");
            read_pending_stats(&mut layer).unwrap();
            let mut stats = Vec::new();
            layer.collect_fp8_stats(&mut stats);
            assert_eq!(stats.len(), 5, "{name}: every slot's statistics");
        }
    }

    #[test]
    fn results_of_a_stand_in_are_left_to_their_own_reads() {
        use crate::tensor::device_values::HostResult;
        use std::sync::Arc;
        let amax = Arc::new(HostResult {
            ordinal: 0,
            value: 2.0f32,
            reads: 0.into(),
        });
        crate::dispatch::read_deferred(&[Deferred::Device(amax.clone())], &[]).unwrap();
        assert_eq!(amax.reads.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
