//! Wall-clock time per backend op, for `fp8 bench layer --breakdown`: off unless switched on,
//! and then one clock read on each side of every CPU op call. Off, an op pays one
//! thread-local flag read.
//!
//! Recording is per calling thread (an op's own worker threads run inside its call, so they
//! count), which keeps concurrent callers (tests) apart. Times are grouped by the phase the
//! caller names ([`set_phase`]), so forward and backward ops of the same name (a GEMM, a cast)
//! are told apart.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::backend::cuda::transfer_times;
pub use crate::backend::cuda::transfer_times::{Transfer, TransferTime, TransferTimes};

/// The part of a step an op ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Forward,
    Backward,
    /// Anything else (optimizer, loss, ...).
    Other,
}

/// The time one op spent in one phase.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// The op's name (a method of the backend's op list, e.g. `gemm`, `layernorm_forward`).
    pub op: &'static str,
    pub phase: Phase,
    pub total: Duration,
    pub calls: u64,
}

type Times = BTreeMap<(&'static str, Phase), (Duration, u64)>;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    static SYNCED: Cell<bool> = const { Cell::new(false) };
    static PHASE: Cell<Phase> = const { Cell::new(Phase::Other) };
    static TIMES: RefCell<Times> = const { RefCell::new(BTreeMap::new()) };
}

/// Starts (`true`) or stops recording the ops this thread calls, and the staged CUDA ops'
/// copies, waits and allocations inside them ([`take_transfers`]).
pub fn enable(on: bool) {
    ENABLED.set(on);
    transfer_times::enable(on);
}

/// The staged CUDA ops' copies, waits for the GPU and allocations this thread recorded since
/// the last call (part of the ops' own times; all zero on the CPU backend); clears them.
pub fn take_transfers() -> TransferTimes {
    transfer_times::take()
}

/// While recording, makes every GPU op wait for its stream before its clock stops (`true`),
/// so each op is charged with its own kernels rather than the first op that waits, and the
/// time between ops is host work only. It adds a stream sync per op, so the step itself is
/// slower: for `fp8 bench layer --breakdown --sync-ops`, a diagnosis, not a speed.
pub fn sync_ops(on: bool) {
    SYNCED.set(on);
}

/// Whether GPU ops wait for their stream while recorded ([`sync_ops`]).
#[inline]
pub(crate) fn syncing_ops() -> bool {
    ENABLED.get() && SYNCED.get()
}

/// The phase this thread's following ops are counted in.
pub fn set_phase(phase: Phase) {
    PHASE.set(phase);
}

/// The times this thread recorded since the last call, sorted by op name and phase; clears them.
pub fn take() -> Vec<OpTime> {
    TIMES
        .take()
        .into_iter()
        .map(|((op, phase), (total, calls))| OpTime {
            op,
            phase,
            total,
            calls,
        })
        .collect()
}

/// Runs `f`, adding its wall time to `op` when recording is on.
#[inline]
pub(crate) fn timed<R>(op: &'static str, f: impl FnOnce() -> R) -> R {
    if !ENABLED.get() {
        return f();
    }
    let start = Instant::now();
    let result = f();
    let elapsed = start.elapsed();
    TIMES.with_borrow_mut(|times| {
        let entry = times.entry((op, PHASE.get())).or_default();
        entry.0 += elapsed;
        entry.1 += 1;
    });
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::Backend;
    use crate::dispatch::{Values, ValuesMut};

    #[test]
    fn ops_wait_for_their_stream_only_while_recording_with_sync_on() {
        enable(false);
        sync_ops(true);
        assert!(!syncing_ops(), "not recording: no op waits");
        enable(true);
        assert!(syncing_ops());
        sync_ops(false);
        assert!(!syncing_ops(), "recording without --sync-ops: no op waits");
        enable(false);
        // CPU ops take no sync even while it is on: the times are the same with and without.
        sync_ops(true);
        enable(true);
        let x = vec![0.5f32; 64];
        let mut y = vec![0.0f32; 64];
        Backend::default()
            .kernels()
            .gelu_forward(Values::Host(&x), ValuesMut::Host(&mut y))
            .unwrap();
        enable(false);
        sync_ops(false);
        assert_eq!(take().iter().map(|t| t.calls).sum::<u64>(), 1);
        assert_eq!(take_transfers(), TransferTimes::default(), "a CPU op records no wait");
    }

    #[test]
    fn records_ops_per_phase_only_while_enabled() {
        let kernels = Backend::default();
        let x = vec![0.5f32; 1024];
        let mut y = vec![0.0f32; 1024];
        kernels
            .kernels()
            .gelu_forward(Values::Host(&x), ValuesMut::Host(&mut y))
            .unwrap();
        take();
        enable(true);
        set_phase(Phase::Forward);
        kernels
            .kernels()
            .gelu_forward(Values::Host(&x), ValuesMut::Host(&mut y))
            .unwrap();
        kernels
            .kernels()
            .gelu_forward(Values::Host(&x), ValuesMut::Host(&mut y))
            .unwrap();
        set_phase(Phase::Backward);
        kernels
            .kernels()
            .gelu_backward(Values::Host(&x), Values::Host(&x), ValuesMut::Host(&mut y))
            .unwrap();
        enable(false);
        kernels
            .kernels()
            .gelu_backward(Values::Host(&x), Values::Host(&x), ValuesMut::Host(&mut y))
            .unwrap();
        let times = take();
        let calls: Vec<_> = times.iter().map(|t| (t.op, t.phase, t.calls)).collect();
        assert_eq!(
            calls,
            vec![
                ("gelu_backward", Phase::Backward, 1),
                ("gelu_forward", Phase::Forward, 2)
            ]
        );
        assert!(times.iter().all(|t| t.total > Duration::ZERO));
        assert!(take().is_empty());
        set_phase(Phase::Other);
    }
}
