//! Small device values copied into pinned host memory behind the work that writes them, read
//! later by waiting for that copy only (its event), never for the whole stream: a slot bank's
//! scales after its update on the device, which the host needs for the next casts
//! (`docs/cuda-backend.md`, Slot banks on the device).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::error::CudaResultExt;
use super::{CudaDevice, DeviceBuffer};
use crate::error::{Error, Result};

/// A pinned copy of the first `len` values of a device buffer, as of the last [`Self::queue`].
#[derive(Debug)]
pub struct PinnedSnapshot {
    pinned: PinnedHostSlice<f32>,
    /// Recorded after each copy (its own, not the pinned memory's event, which cudarc records
    /// only while it tracks stream synchronization).
    done: CudaEvent,
    queued: bool,
}

impl PinnedSnapshot {
    /// Pins room for `len` values on `device` (cached host memory: the host reads it).
    pub fn new(device: &CudaDevice, len: usize) -> Result<Self> {
        let ctx: &Arc<_> = device.context();
        // SAFETY: the values are only read after a copy wrote them (`queued`).
        let pinned = unsafe { ctx.alloc_pinned_with_flags::<f32>(len.max(1), 0) }.call("cuMemHostAlloc")?;
        let done = ctx.new_event(None).call("cuEventCreate")?;
        Ok(PinnedSnapshot {
            pinned,
            done,
            queued: false,
        })
    }

    /// Forgets the last copy (an update is about to change what it copied): [`Self::read`]
    /// says `None` until the next [`Self::queue`].
    pub fn invalidate(&mut self) {
        self.queued = false;
    }

    /// Queues the copy of `src[..len]` in stream order (after the work queued before it) and
    /// records `done` behind it. Returns at once.
    pub fn queue(&mut self, device: &CudaDevice, src: &DeviceBuffer<f32>) -> Result<()> {
        let len = self.pinned.len();
        if src.len() < len {
            return Err(Error::LengthMismatch {
                what: "pinned snapshot source",
                src: src.len(),
                dst: len,
            });
        }
        let Some(slice) = src.owned_slice() else {
            return Err(Error::KernelArgs {
                kernel: "pinned snapshot",
                detail: "the source is a view of another buffer; snapshots copy a bank's own allocation".into(),
            });
        };
        let view = slice.slice(0..len);
        device
            .stream()
            .memcpy_dtoh(&view, &mut self.pinned)
            .call("cuMemcpyDtoHAsync")?;
        self.done.record(device.stream()).call("cuEventRecord")?;
        self.queued = true;
        Ok(())
    }

    /// The values of the last queued copy, once it completed (`None` before any copy, or after
    /// [`Self::invalidate`]).
    pub fn read(&self) -> Result<Option<&[f32]>> {
        if !self.queued {
            return Ok(None);
        }
        self.done.synchronize().call("cuEventSynchronize")?;
        Ok(Some(self.pinned.as_slice().call("cuEventSynchronize")?))
    }
}

impl Drop for PinnedSnapshot {
    fn drop(&mut self) {
        // A copy may still write the pinned memory: wait before cudarc frees it.
        let _ = self.done.synchronize();
    }
}
