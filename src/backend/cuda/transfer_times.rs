//! Where the staged CUDA ops spend their time: wall time and bytes of host -> device copies,
//! device -> host copies, device allocations, and the waits for the GPU before a download
//! (the kernels' own time, as the host sees it); and the operand bytes that device copies saved
//! uploading. A copy from pageable host memory may itself wait for earlier kernels, so an upload
//! right after a launch can count some kernel time as copy time; so can a staged upload, which
//! waits for its pinned half's previous DMA (queued behind earlier kernels) and leaves its own
//! last DMA running. Off unless switched on (with
//! `op_times`, for `fp8 bench layer --breakdown`); off, a copy pays one thread-local flag read.
//!
//! While on, a download first waits for the stream on its own, so that the wait (queued
//! kernels finishing) and the copy are told apart; the download waited for the stream anyway,
//! so results and ordering do not change. Recording is per calling thread, like `op_times`.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// One kind of staged work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// Host -> device copies (an upload's allocation included).
    HostToDevice,
    /// Device -> host copies, after the stream went idle.
    DeviceToHost,
    /// Waiting for the queued kernels before a download.
    WaitForGpu,
    /// Device allocations that missed the staging pool (zeroed: their memset included; a
    /// stream-ordered allocation is timed as queued).
    Allocation,
    /// GEMM operands read from the device copy a cast left instead of uploaded (bytes saved;
    /// no time).
    SavedByCastCopies,
    /// GEMM operands read from the device copy of a weight held there (a frozen FP8 base)
    /// instead of uploaded (bytes saved; no time).
    SavedByHeldWeights,
}

impl Transfer {
    pub const ALL: [Transfer; 6] = [
        Transfer::HostToDevice,
        Transfer::DeviceToHost,
        Transfer::WaitForGpu,
        Transfer::Allocation,
        Transfer::SavedByCastCopies,
        Transfer::SavedByHeldWeights,
    ];

    /// Its place in [`TransferTimes`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether it counts uploads saved (bytes only), not time spent.
    pub fn is_saving(self) -> bool {
        matches!(self, Transfer::SavedByCastCopies | Transfer::SavedByHeldWeights)
    }

    /// Its label in the breakdown table.
    pub fn label(self) -> &'static str {
        match self {
            Transfer::HostToDevice => "host -> device copies",
            Transfer::DeviceToHost => "device -> host copies",
            Transfer::WaitForGpu => "waits for the GPU (kernels)",
            Transfer::Allocation => "device allocations",
            Transfer::SavedByCastCopies => "uploads saved (cast copies)",
            Transfer::SavedByHeldWeights => "uploads saved (held weights)",
        }
    }
}

/// Time, bytes and calls of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TransferTime {
    pub total: Duration,
    pub bytes: u64,
    pub calls: u64,
}

/// What one thread recorded, by kind ([`Transfer::ALL`] order).
pub type TransferTimes = [TransferTime; Transfer::ALL.len()];

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    static TIMES: Cell<TransferTimes> = const { Cell::new([TransferTime { total: Duration::ZERO, bytes: 0, calls: 0 }; Transfer::ALL.len()]) };
}

/// Starts (`true`) or stops recording this thread's staged copies.
pub fn enable(on: bool) {
    ENABLED.set(on);
}

/// Whether this thread records.
#[inline]
pub(crate) fn enabled() -> bool {
    ENABLED.get()
}

/// What this thread recorded since the last call; clears it.
pub fn take() -> TransferTimes {
    TIMES.take()
}

/// Counts `bytes` of a GEMM operand read from its device copy instead of uploaded, a held
/// weight's (`held`) or a cast's.
#[inline]
pub(crate) fn saved_upload(bytes: usize, held: bool) {
    let kind = match held {
        true => Transfer::SavedByHeldWeights,
        false => Transfer::SavedByCastCopies,
    };
    timed(kind, bytes, || ());
}

/// Runs `f` (moving `bytes`), adding its wall time to `kind` when recording is on.
#[inline]
pub(crate) fn timed<R>(kind: Transfer, bytes: usize, f: impl FnOnce() -> R) -> R {
    if !ENABLED.get() {
        return f();
    }
    let start = Instant::now();
    let result = f();
    let elapsed = start.elapsed();
    let mut times = TIMES.get();
    let t = &mut times[kind.index()];
    t.total += elapsed;
    t.bytes += bytes as u64;
    t.calls += 1;
    TIMES.set(times);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_by_kind_only_while_enabled() {
        take();
        timed(Transfer::HostToDevice, 100, || ());
        assert_eq!(take(), TransferTimes::default(), "off: nothing recorded");
        enable(true);
        timed(Transfer::HostToDevice, 100, || ());
        timed(Transfer::HostToDevice, 28, || ());
        timed(Transfer::WaitForGpu, 0, || std::thread::sleep(Duration::from_millis(2)));
        enable(false);
        let t = take();
        assert_eq!((t[0].bytes, t[0].calls), (128, 2));
        assert_eq!((t[1].calls, t[3].calls, t[4].calls, t[5].calls), (0, 0, 0, 0));
        assert!(t[2].total >= Duration::from_millis(2) && t[2].calls == 1);
        assert_eq!(take(), TransferTimes::default(), "taken: cleared");
        assert!(Transfer::ALL.iter().enumerate().all(|(i, k)| k.index() == i));
    }
}
