//! The gradient all-reduce overlapped with backward (`docs/distributed.md`, Overlap): a
//! communication thread reduces each bucket as soon as backward has finished all its
//! parameters, while the main thread runs backward through the earlier layers.
//!
//! The buckets are [`bucket_ranges`]' (last parameter first), and they are handed to the
//! communication thread strictly in that order, so every rank makes the same collective calls
//! on the same values as the reduce after backward ([`super::grad_sync`]): each element is
//! still the rank-order sum, and the results are the same bits whatever the timing.

use std::ops::Range;
use std::sync::mpsc;

use super::accumulate::EarlierSums;
use super::grad_sync::GradSync;
use crate::dist::collective::{Collective, Wire};
use crate::dist::shard::bucket_ranges;
use crate::error::{Error, Result};
use crate::nn::{Module, Parameter};

/// Where every parameter's gradient lies in the flat vector and in which bucket.
struct BucketPlan {
    names: Vec<String>,
    /// Flat range of each parameter, in visiting order.
    spans: Vec<Range<usize>>,
    buckets: Vec<Range<usize>>,
    /// The bucket holding each parameter (`None` for an empty one).
    bucket_of: Vec<Option<usize>>,
}

impl BucketPlan {
    fn new<M: Module + ?Sized>(model: &mut M, bucket_bytes: usize) -> Self {
        let (mut names, mut spans) = (Vec::new(), Vec::new());
        let mut offset = 0;
        model.visit_parameters(&mut |p| {
            names.push(p.name().to_string());
            spans.push(offset..offset + p.grad_len());
            offset += p.grad_len();
        });
        let lens: Vec<usize> = spans.iter().map(|s| s.len()).collect();
        let buckets = bucket_ranges(&lens, (bucket_bytes / 4).max(1));
        let bucket_of = spans
            .iter()
            .map(|s| {
                buckets
                    .iter()
                    .position(|b| b.start <= s.start && s.end <= b.end && !s.is_empty())
            })
            .collect();
        BucketPlan {
            names,
            spans,
            buckets,
            bucket_of,
        }
    }
}

/// A bucket on its way: `(bucket index, its gradients)`.
type Bucket = (usize, Vec<f32>);

/// The main thread's side of an overlapped reduce: collects finished gradients into buckets
/// and hands each full bucket to the communication thread.
pub struct GradLauncher<'p> {
    plan: &'p BucketPlan,
    /// Parameters `0..unready` have not been handed over yet (groups come last first).
    unready: usize,
    buffers: Vec<Vec<f32>>,
    filled: Vec<usize>,
    /// The next bucket to send: buckets leave in plan order only.
    next: usize,
    to_comm: mpsc::Sender<Bucket>,
    rank: usize,
}

impl GradLauncher<'_> {
    fn mismatch(&self, reason: String) -> Error {
        Error::Collective {
            op: "overlapped all_reduce_sum",
            rank: self.rank,
            reason,
        }
    }

    /// Takes a group of finished parameters ([`crate::model::GradReady`]'s contract: the run
    /// just before the previous group), folds in the earlier micro-batches' sums, copies the
    /// gradients into their buckets and sends every bucket that is complete.
    pub fn ready(&mut self, group: &mut dyn Module, earlier: &mut EarlierSums) -> Result<()> {
        let mut count = 0;
        group.visit_parameters(&mut |_| count += 1);
        let Some(start) = self.unready.checked_sub(count) else {
            return Err(self.mismatch(format!(
                "backward reported {count} parameters with only {} left",
                self.unready
            )));
        };
        self.take(start, group, Some(earlier))?;
        self.unready = start;
        self.send_complete()
    }

    /// Copies the parameters of `group`, which must be the plan's from `start` on.
    fn take(&mut self, start: usize, group: &mut dyn Module, mut earlier: Option<&mut EarlierSums>) -> Result<()> {
        let (plan, mut index, mut error) = (self.plan, start, None);
        group.visit_parameters(&mut |p| {
            if error.is_some() {
                return;
            }
            if index >= plan.names.len() {
                error = Some(format!("backward reported '{}' past the last parameter", p.name()));
                return;
            }
            if p.name() != plan.names[index] || p.grad_len() != plan.spans[index].len() {
                error = Some(format!(
                    "backward reported '{}' ({} values) where '{}' ({} values) was next",
                    p.name(),
                    p.grad_len(),
                    plan.names[index],
                    plan.spans[index].len()
                ));
                return;
            }
            if let Some(earlier) = earlier.as_deref_mut() {
                earlier.fold(index, p.grad_mut());
            }
            if let Some(b) = plan.bucket_of[index] {
                let bucket = &plan.buckets[b];
                if self.buffers[b].is_empty() {
                    self.buffers[b] = vec![0.0; bucket.len()];
                }
                let at = plan.spans[index].start - bucket.start;
                self.buffers[b][at..at + p.grad_len()].copy_from_slice(p.grad());
                self.filled[b] += p.grad_len();
            }
            index += 1;
        });
        match error {
            Some(reason) => Err(self.mismatch(reason)),
            None => Ok(()),
        }
    }

    fn send_complete(&mut self) -> Result<()> {
        while self.next < self.plan.buckets.len() && self.filled[self.next] == self.plan.buckets[self.next].len() {
            let buffer = std::mem::take(&mut self.buffers[self.next]);
            if self.to_comm.send((self.next, buffer)).is_err() {
                return Err(self.mismatch("the communication thread stopped".into()));
            }
            self.next += 1;
        }
        Ok(())
    }

    /// After backward: hands over the parameters no group named (all of them when backward
    /// reported none), so every bucket has been sent.
    fn finish<M: Module + ?Sized>(&mut self, model: &mut M) -> Result<()> {
        let mut first = Prefix {
            model,
            count: self.unready,
        };
        self.take(0, &mut first, None)?;
        self.unready = 0;
        self.send_complete()?;
        if self.next != self.plan.buckets.len() {
            return Err(self.mismatch(format!(
                "{} of {} buckets were filled",
                self.next,
                self.plan.buckets.len()
            )));
        }
        Ok(())
    }
}

/// The first `count` parameters of a module.
struct Prefix<'a, M: ?Sized> {
    model: &'a mut M,
    count: usize,
}

impl<M: Module + ?Sized> Module for Prefix<'_, M> {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        let mut seen = 0;
        self.model.visit_parameters(&mut |p| {
            if seen < self.count {
                f(p);
            }
            seen += 1;
        });
    }
}

/// Runs `backward` (which must hand each group of finished gradients to the [`GradLauncher`])
/// while a communication thread all-reduces every full bucket over `collective` (rank order,
/// `wire` format); afterwards the gradients of `model` are the sums over ranks, bit-identical
/// to [`super::grad_sync::all_reduce_gradients`] after `backward`. Every rank of the group
/// must call it with the same model layout and settings.
pub fn reduce_during_backward<M, T>(
    model: &mut M,
    collective: &dyn Collective,
    bucket_bytes: usize,
    wire: Wire,
    backward: impl FnOnce(&mut M, &mut GradLauncher) -> Result<T>,
) -> Result<(T, GradSync)>
where
    M: Module + ?Sized,
{
    let plan = BucketPlan::new(model, bucket_bytes);
    let n = plan.buckets.len();
    let rank = collective.rank();
    std::thread::scope(|s| {
        let (to_comm, from_main) = mpsc::channel::<Bucket>();
        let comm = s.spawn(move || -> Result<Vec<Bucket>> {
            let mut done = Vec::with_capacity(n);
            for (index, mut buffer) in from_main {
                collective.all_reduce_sum(&mut buffer, wire)?;
                done.push((index, buffer));
            }
            Ok(done)
        });
        let mut launcher = GradLauncher {
            plan: &plan,
            unready: plan.names.len(),
            buffers: vec![Vec::new(); n],
            filled: vec![0; n],
            next: 0,
            to_comm,
            rank,
        };
        let out = backward(model, &mut launcher);
        let launched_in_backward = launcher.next;
        let finished = out.and_then(|out| launcher.finish(model).map(|()| out));
        drop(launcher); // closes the channel: the thread ends after the last bucket
        let reduced = comm.join().unwrap_or_else(|_| {
            Err(Error::Collective {
                op: "overlapped all_reduce_sum",
                rank,
                reason: "the communication thread panicked".into(),
            })
        });
        // The thread's error is the cause when both failed (the main thread saw it stop).
        let (out, mut reduced) = match (finished, reduced) {
            (_, Err(e)) => return Err(e),
            (Err(e), _) => return Err(e),
            (Ok(out), Ok(reduced)) => (out, reduced),
        };
        reduced.sort_by_key(|(index, _)| *index);
        let mut index = 0;
        model.visit_parameters(&mut |p| {
            if let Some(b) = plan.bucket_of[index] {
                let at = plan.spans[index].start - plan.buckets[b].start;
                let n = p.grad_len();
                p.grad_mut().copy_from_slice(&reduced[b].1[at..at + n]);
            }
            index += 1;
        });
        Ok((
            out,
            GradSync {
                buckets: n,
                bytes: plan.spans.last().map_or(0, |s| s.end) * wire.bytes(),
                launched_in_backward,
            },
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::cpu_group;
    use crate::train::grad_sync::all_reduce_gradients;
    use crate::train::test_util::ParamList;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// A CPU rank that counts the sums it has started.
    struct Counting<'a> {
        inner: &'a dyn Collective,
        sums_started: &'a AtomicUsize,
    }

    impl Collective for Counting<'_> {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn world_size(&self) -> usize {
            self.inner.world_size()
        }
        fn all_reduce_sum(&self, data: &mut [f32], wire: Wire) -> Result<()> {
            self.sums_started.fetch_add(1, Ordering::SeqCst);
            self.inner.all_reduce_sum(data, wire)
        }
        fn all_reduce_max(&self, data: &mut [f32]) -> Result<()> {
            self.inner.all_reduce_max(data)
        }
        fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
            self.inner.broadcast(data, root)
        }
        fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
            self.inner.all_gather(local, out)
        }
        fn barrier(&self) -> Result<()> {
            self.inner.barrier()
        }
    }

    /// A run of a [`ParamList`]'s parameters, as a backward group.
    struct Group<'a>(&'a mut [Parameter]);

    impl Module for Group<'_> {
        fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
            self.0.iter_mut().for_each(f);
        }
    }

    /// Rank `rank`'s gradients: parameters of 3, 2 and 4 values.
    fn params(rank: usize) -> ParamList {
        let mut list = ParamList::new(&[
            ("a", &[3], vec![0.0; 3]),
            ("b", &[2], vec![0.0; 2]),
            ("c", &[4], vec![0.0; 4]),
        ]);
        let mut k = 0.0;
        list.visit_parameters(&mut |p| {
            for g in p.grad_mut() {
                *g = (k + 1.0) * 0.1 + rank as f32 * 16_777_216.0 * (k % 2.0);
                k += 1.0;
            }
        });
        list
    }

    /// The communication thread reduces the last parameter's bucket while "backward" still
    /// runs: the backward below does not return before it has seen that sum start (it would
    /// wait forever, then fail, if buckets were reduced after backward), and the results are
    /// the bits of the reduce after backward.
    #[test]
    fn a_bucket_is_reduced_while_backward_still_runs() {
        let group = cpu_group(2).unwrap();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut want = params(c.rank());
                        // Buckets of one parameter each (4 bytes): [c], [b], [a].
                        all_reduce_gradients(&mut want, c, 4, Wire::F32).unwrap();
                        let started = AtomicUsize::new(0);
                        let counting = Counting {
                            inner: c,
                            sums_started: &started,
                        };
                        let mut got = params(c.rank());
                        let (seen_during, sync) =
                            reduce_during_backward(&mut got, &counting, 4, Wire::F32, |m, launcher| {
                                let mut earlier = EarlierSums::default();
                                launcher.ready(&mut Group(&mut m.params[2..]), &mut earlier)?;
                                let deadline = Instant::now() + Duration::from_secs(60);
                                while started.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
                                    std::thread::sleep(Duration::from_millis(1));
                                }
                                // "a" and "b" are left for after backward.
                                Ok(started.load(Ordering::SeqCst))
                            })
                            .unwrap();
                        let bits = |l: &mut ParamList| {
                            let mut v = Vec::new();
                            l.visit_parameters(&mut |p| v.extend(p.grad().iter().map(|g| g.to_bits())));
                            v
                        };
                        (seen_during, sync, bits(&mut got) == bits(&mut want))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (seen_during, sync, same) in results {
            assert_eq!(seen_during, 1, "bucket [c] was being reduced before backward returned");
            assert_eq!((sync.buckets, sync.launched_in_backward), (3, 1));
            assert!(same, "the overlapped reduce gives the reduce-after-backward bits");
        }
    }

    /// A group that is not the run just before the previous one is an error, not a wrong sum.
    #[test]
    fn groups_out_of_order_are_errors() {
        let group = cpu_group(1).unwrap();
        let mut list = params(0);
        let result = reduce_during_backward(&mut list, &group[0], 4, Wire::Bf16, |m, launcher| {
            launcher.ready(&mut Group(&mut m.params[..1]), &mut EarlierSums::default())
        });
        assert!(matches!(result, Err(Error::Collective { reason, .. }) if reason.contains("'a'")));
        let result = reduce_during_backward(&mut list, &group[0], 4, Wire::Bf16, |m, launcher| {
            let mut earlier = EarlierSums::default();
            launcher.ready(&mut Group(&mut m.params[..]), &mut earlier)?;
            launcher.ready(&mut Group(&mut m.params[2..]), &mut earlier)
        });
        assert!(matches!(result, Err(Error::Collective { reason, .. }) if reason.contains("only 0 left")));
    }

    /// A two-layer decoder on two ranks: every bucket but the embeddings' is reduced during
    /// backward, and the gradients are those of the reduce after backward, bit for bit.
    #[test]
    fn a_decoder_launches_its_layers_buckets_during_backward() {
        use crate::model::{DecoderModel, LanguageModel, ModelConfig};
        let config = ModelConfig {
            vocab: 16,
            max_seq: 8,
            hidden: 16,
            heads: 2,
            layers: 2,
            ffn_hidden: 32,
            ..ModelConfig::default()
        };
        let precision = "fp32".parse().unwrap();
        let group = cpu_group(2).unwrap();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .map(|c| {
                    let (config, precision) = (&config, &precision);
                    s.spawn(move || {
                        let ids: Vec<u32> = (0..16).map(|i| ((i * 7 + c.rank() * 3) % 16) as u32).collect();
                        let pass = |m: &mut DecoderModel| m.forward_loss(&ids[..], &ids[..], 2, 8).map(drop);
                        let mut want = DecoderModel::new(config, precision, 5).unwrap();
                        pass(&mut want).unwrap();
                        want.backward(0.5).unwrap();
                        let sync_after = all_reduce_gradients(&mut want, c, 4, Wire::F32).unwrap();
                        let mut got = DecoderModel::new(config, precision, 5).unwrap();
                        pass(&mut got).unwrap();
                        let ((), sync) = reduce_during_backward(&mut got, c, 4, Wire::F32, |m, launcher| {
                            let mut earlier = EarlierSums::default();
                            LanguageModel::backward_with(m, 0.5, &mut |g| launcher.ready(g, &mut earlier))
                        })
                        .unwrap();
                        let mut bits = Vec::new();
                        want.visit_parameters(&mut |p| {
                            bits.push(p.grad().iter().map(|g| g.to_bits()).collect::<Vec<_>>())
                        });
                        let mut same = true;
                        let mut i = 0;
                        got.visit_parameters(&mut |p| {
                            same &= p.grad().iter().map(|g| g.to_bits()).collect::<Vec<_>>() == bits[i];
                            i += 1;
                        });
                        (sync_after.buckets, sync, same)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (buckets_after, sync, same) in results {
            assert_eq!(sync.buckets, buckets_after);
            // One parameter a bucket: all but embed.tokens and embed.positions leave during backward.
            assert_eq!(sync.launched_in_backward, sync.buckets - 2, "{sync:?}");
            assert!(same, "overlapped gradients differ from the reduce after backward");
        }
    }
}
