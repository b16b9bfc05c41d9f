//! The CPU [`Collective`]: `world_size` ranks as threads of one process, meeting in shared
//! memory. Each call deposits the rank's buffer; the last rank to arrive publishes the set of
//! all buffers, and every rank computes its result from that set in rank order, so results are
//! the contract's exactly (`docs/distributed.md`) and the same bits on every rank.
//!
//! A rank that fails calls [`CpuCollective::abort`] (or drops an [`AbortOnDrop`] guard): every
//! rank waiting in a call, and every later call, returns an error instead of waiting forever.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::collective::{Collective, ReduceOp, Wire, check_gather, check_root, reduce_in_rank_order};
use crate::error::{Error, Result};

/// What one rank brought to a call: the operation's name (all ranks must agree) and its buffer.
type Deposit = (&'static str, Arc<Vec<f32>>);

#[derive(Default)]
struct GroupState {
    /// This call's deposits so far, by rank.
    pending: Vec<Option<Deposit>>,
    arrived: usize,
    /// Calls completed; a waiting rank knows its call completed when this moves.
    generation: u64,
    /// Every deposit of the last completed call, by rank. It stays valid until the next call
    /// completes, which needs every rank, so a rank still reading it cannot lose it.
    published: Arc<Vec<Deposit>>,
    aborted: Option<String>,
}

struct Group {
    world: usize,
    state: Mutex<GroupState>,
    changed: Condvar,
}

/// One rank's handle on a CPU group.
pub struct CpuCollective {
    rank: usize,
    group: Arc<Group>,
}

/// Makes a group of `world_size` ranks: handle `r` is rank `r`; give each to its own thread.
pub fn cpu_group(world_size: usize) -> Result<Vec<CpuCollective>> {
    if world_size == 0 {
        return Err(Error::InvalidSetting {
            setting: "world_size",
            value: "0".into(),
            reason: "a group needs at least one rank".into(),
        });
    }
    let group = Arc::new(Group {
        world: world_size,
        state: Mutex::new(GroupState {
            pending: vec![None; world_size],
            ..GroupState::default()
        }),
        changed: Condvar::new(),
    });
    Ok((0..world_size)
        .map(|rank| CpuCollective {
            rank,
            group: group.clone(),
        })
        .collect())
}

impl CpuCollective {
    fn error(&self, op: &'static str, reason: impl Into<String>) -> Error {
        Error::Collective {
            op,
            rank: self.rank,
            reason: reason.into(),
        }
    }

    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, GroupState>> {
        self.group
            .state
            .lock()
            .map_err(|_| self.error(op, "a rank panicked inside a collective"))
    }

    /// Stops the group: every rank's current and later calls return an error naming `reason`.
    pub fn abort(&self, reason: &str) {
        if let Ok(mut state) = self.group.state.lock() {
            state
                .aborted
                .get_or_insert_with(|| format!("rank {} stopped: {reason}", self.rank));
        }
        self.group.changed.notify_all();
    }

    /// Deposits `data` for `op` and returns every rank's deposit once all have arrived.
    fn exchange(&self, op: &'static str, data: Vec<f32>) -> Result<Arc<Vec<Deposit>>> {
        let mut state = self.lock(op)?;
        if let Some(reason) = &state.aborted {
            return Err(self.error(op, reason.clone()));
        }
        state.pending[self.rank] = Some((op, Arc::new(data)));
        state.arrived += 1;
        let generation = state.generation;
        if state.arrived == self.group.world {
            let all: Vec<Deposit> = state
                .pending
                .iter_mut()
                .map(|d| d.take().unwrap_or(("missing", Arc::default())))
                .collect();
            state.published = Arc::new(all);
            state.arrived = 0;
            state.generation += 1;
            self.group.changed.notify_all();
        } else {
            while state.generation == generation && state.aborted.is_none() {
                state = self
                    .group
                    .changed
                    .wait(state)
                    .map_err(|_| self.error(op, "a rank panicked inside a collective"))?;
            }
            if state.generation == generation {
                let reason = state.aborted.clone().unwrap_or_default();
                return Err(self.error(op, reason));
            }
        }
        let published = state.published.clone();
        drop(state);
        // Every rank checks the same deposits, so every rank returns the same error.
        if let Some((rank, (other, _))) = published.iter().enumerate().find(|(_, (o, _))| *o != op) {
            return Err(self.error(op, format!("rank {rank} called {other} at the same point")));
        }
        Ok(published)
    }

    /// Deposits for a reduction or gather: every rank's buffer must have `len` values.
    fn exchange_equal(&self, op: &'static str, data: &[f32]) -> Result<Arc<Vec<Deposit>>> {
        let all = self.exchange(op, data.to_vec())?;
        if let Some((rank, (_, d))) = all.iter().enumerate().find(|(_, (_, d))| d.len() != data.len()) {
            return Err(self.error(
                op,
                format!(
                    "rank {rank} brought {} values, rank {} brought {}",
                    d.len(),
                    self.rank,
                    data.len()
                ),
            ));
        }
        Ok(all)
    }

    fn reduce(&self, op: &'static str, data: &mut [f32], how: ReduceOp) -> Result<()> {
        let all = self.exchange_equal(op, data)?;
        let inputs: Vec<&[f32]> = all.iter().map(|(_, d)| d.as_slice()).collect();
        reduce_in_rank_order(&inputs, data, how);
        Ok(())
    }
}

impl Collective for CpuCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.world
    }

    fn all_reduce_sum(&self, data: &mut [f32], wire: Wire) -> Result<()> {
        self.reduce("all_reduce_sum", data, ReduceOp::Sum(wire))
    }

    fn all_reduce_max(&self, data: &mut [f32]) -> Result<()> {
        self.reduce("all_reduce_max", data, ReduceOp::Max)
    }

    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        check_root("broadcast", self.rank, root, self.group.world)?;
        let all = self.exchange_equal("broadcast", data)?;
        data.copy_from_slice(&all[root].1);
        Ok(())
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        check_gather(self.rank, local.len(), out.len(), self.group.world)?;
        let all = self.exchange_equal("all_gather", local)?;
        for (chunk, (_, d)) in out.chunks_exact_mut(local.len().max(1)).zip(all.iter()) {
            chunk.copy_from_slice(d);
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.exchange("barrier", Vec::new()).map(|_| ())
    }
}

/// Aborts the group when dropped unless [`AbortOnDrop::disarm`] was called: a rank's thread
/// holds one so that an error or a panic anywhere in it releases the other ranks.
pub struct AbortOnDrop<'a> {
    rank: &'a CpuCollective,
    armed: bool,
}

impl<'a> AbortOnDrop<'a> {
    /// Guards `rank`.
    pub fn new(rank: &'a CpuCollective) -> Self {
        AbortOnDrop { rank, armed: true }
    }

    /// The rank finished normally: dropping the guard no longer aborts.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.rank.abort("it failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f(rank)` on one thread per rank and returns the results by rank.
    fn on_ranks<T: Send>(world: usize, f: impl Fn(&CpuCollective) -> T + Sync) -> Vec<T> {
        let group = cpu_group(world).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = group.iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn sums_follow_rank_order_on_every_rank() {
        // Column 1 holds [2^24, 1, 1, -2^24] by rank: the left fold gives ((2^24 + 1) + 1) - 2^24
        // = 0 (each + 1 rounds back to 2^24), where another order could give 2.
        let results = on_ranks(4, |c| {
            let r = c.rank() as f32;
            let big = [16_777_216.0, 1.0, 1.0, -16_777_216.0][c.rank()];
            let mut data = vec![r, big, 1.0];
            c.all_reduce_sum(&mut data, Wire::F32).unwrap();
            data
        });
        for r in &results {
            assert_eq!(r, &vec![6.0, 0.0, 4.0]);
        }
    }

    #[test]
    fn max_gather_broadcast_and_barrier() {
        let results = on_ranks(3, |c| {
            let r = c.rank() as f32;
            let mut amax = vec![r, 10.0 - r, if c.rank() == 1 { f32::NAN } else { 0.5 }];
            c.all_reduce_max(&mut amax).unwrap();
            let mut gathered = vec![0.0; 6];
            c.all_gather(&[r, r * 10.0], &mut gathered).unwrap();
            let mut b = vec![r; 2];
            c.broadcast(&mut b, 2).unwrap();
            c.barrier().unwrap();
            (amax, gathered, b)
        });
        for (amax, gathered, b) in results {
            assert_eq!(amax, vec![2.0, 10.0, 0.5]);
            assert_eq!(gathered, vec![0.0, 0.0, 1.0, 10.0, 2.0, 20.0]);
            assert_eq!(b, vec![2.0, 2.0]);
        }
    }

    #[test]
    fn disagreements_and_failures_are_errors_on_every_rank() {
        let results = on_ranks(2, |c| {
            let mut data = vec![0.0; 1 + c.rank()];
            c.all_reduce_sum(&mut data, Wire::F32)
        });
        assert!(results.iter().all(|r| matches!(r, Err(Error::Collective { .. }))));
        let results = on_ranks(2, |c| match c.rank() {
            0 => c.all_reduce_max(&mut [1.0]),
            _ => c.all_reduce_sum(&mut [1.0], Wire::F32),
        });
        assert!(results.iter().all(|r| r.is_err()), "{results:?}");
        // Rank 1 fails before its first call: rank 0 is released instead of waiting forever.
        let results = on_ranks(2, |c| {
            let guard = AbortOnDrop::new(c);
            if c.rank() == 1 {
                return Err(Error::InvalidScale { value: 0.0 });
            }
            let r = c.barrier();
            guard.disarm();
            r
        });
        assert!(matches!(&results[0], Err(Error::Collective { reason, .. }) if reason.contains("rank 1")));
        assert!(cpu_group(0).is_err());
    }
}
