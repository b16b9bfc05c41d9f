//! Copies between host memory and the device through two pinned (page-locked) host buffers.
//!
//! Why: a copy from or to pageable memory goes through the driver's own small staging, on one
//! thread, and a download into a fresh `Vec` also pays a page fault per 4 KiB page on that
//! thread. The first H200 breakdown (`fp8 bench layer --breakdown`, 2026-11-27) measured
//! device -> host copies at 2.0-2.1 GB/s and host -> device at 7.3-7.7 GB/s: 65-75% of a
//! staged step of the layer. Here the DMA runs between the device and pinned memory
//! (tens of GB/s on PCIe 5 / NVLink-C2C), and the host side of each chunk is copied by all
//! cores (`rayon`), while the DMA of the next chunk runs: chunk `i` uses half `i % 2`.
//!
//! Copies under [`PINNED_MIN_BYTES`] stay pageable; `FP8_CUDA_PINNED=0` sends every copy the
//! pageable way, to compare.

use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, PinnedHostSlice, result};
use rayon::prelude::*;

use super::error::CudaResultExt;
use crate::error::Result;

/// Bytes of each of the two pinned halves: large enough that a DMA dwarfs its ~10 us of
/// launch and event overhead, small enough (16 MiB pinned per device handle) to pin freely.
pub const STAGING_CHUNK_BYTES: usize = 8 << 20;

/// Copies under this many bytes go the pageable way: for them the two event waits of a staged
/// copy (and waking the host copy's threads) cost more than the bandwidth saves. On the H200
/// (2026-11-27), staging everything took the hidden-64 layer step from 2.0 to 2.8 ms (its tensors
/// are 16-64 KiB), and with the limit at 256 KiB `fp8 train`'s default run (activations of
/// 256 KiB, AdamW arena copies of ~400 KiB) was still 4-9% slower than all pageable. 1 MiB keeps
/// both of those pageable; the layer bench's 16-256 MiB tensors are staged.
pub const PINNED_MIN_BYTES: usize = 1 << 20;

/// Host copies under this many bytes run on the calling thread (a rayon fork and wake-up cost
/// ~10-50 us; a core copies 1 MiB in ~100 us).
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// Pieces of a parallel host copy: 32 per staged chunk, two for each of the GPU host's 16 cores.
/// With 1 MiB pieces (8 per chunk) device -> host copies of the layer ran at 10.3-12.6
/// GB/s on the H200 (a85c74d), with 256 KiB pieces at 13.5-14.6 GB/s (84d2cd2); one run each.
const PIECE_BYTES: usize = 256 << 10;

/// Whether a copy of `bytes` goes through pinned staging: large enough, and not turned off.
pub(crate) fn staged(bytes: usize) -> bool {
    bytes >= PINNED_MIN_BYTES && pinned_enabled()
}

/// Whether copies go through pinned staging (`FP8_CUDA_PINNED=0` turns it off).
fn pinned_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::env_switch::on("FP8_CUDA_PINNED"))
}

/// One pinned half and the event recorded after the last DMA that used it.
struct Half {
    pinned: PinnedHostSlice<u8>,
    /// Its first byte (page-aligned; valid while `pinned` lives).
    ptr: *mut u8,
    /// Recorded after each DMA on this half: the half is free once it completed.
    done: CudaEvent,
}

/// The two pinned halves of one device handle.
pub(crate) struct Staging {
    halves: [Half; 2],
}

// SAFETY: the raw pointers point into the pinned allocations the halves own; a `Staging` is used
// under its device's mutex, one copy at a time.
unsafe impl Send for Staging {}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("bytes", &(self.halves.len() * self.halves[0].pinned.len()))
            .finish()
    }
}

/// The chunks of a copy of `bytes` bytes: `(offset, len, half)`, in order.
pub(crate) fn chunks(bytes: usize, chunk: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..bytes.div_ceil(chunk)).map(move |i| {
        let offset = i * chunk;
        (offset, chunk.min(bytes - offset), i % 2)
    })
}

impl Staging {
    /// Pins the two halves on `ctx`.
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let half = || -> Result<Half> {
            // Flags 0: cached host memory. The default write-combined memory is slow for the
            // host to read, and a download reads it.
            // SAFETY: the bytes are only read after a DMA or a host copy wrote them.
            let mut pinned =
                unsafe { ctx.alloc_pinned_with_flags::<u8>(STAGING_CHUNK_BYTES, 0) }.call("cuMemHostAlloc")?;
            let ptr = pinned.as_mut_ptr().call("cuEventSynchronize")?;
            let done = ctx.new_event(None).call("cuEventCreate")?;
            Ok(Half { pinned, ptr, done })
        };
        Ok(Staging {
            halves: [half()?, half()?],
        })
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`, in stream order (after the
    /// work queued before it); returns when `dst` holds them.
    pub(crate) fn download(
        &mut self,
        stream: &CudaStream,
        src: CUdeviceptr,
        dst: &mut [MaybeUninit<u8>],
    ) -> Result<()> {
        let plan: Vec<_> = chunks(dst.len(), STAGING_CHUNK_BYTES).collect();
        for (i, &(offset, len, half)) in plan.iter().enumerate() {
            self.dma_to_host(stream, src + offset as u64, len, half)?;
            // While this chunk's DMA runs, the host copies out the previous one.
            if i > 0 {
                self.copy_out(plan[i - 1], dst)?;
            }
        }
        if let Some(&last) = plan.last() {
            self.copy_out(last, dst)?;
        }
        Ok(())
    }

    /// Copies `src` to device address `dst`, in stream order; returns once `src` is no longer
    /// read (the last DMA may still run: later work on the stream comes after it).
    pub(crate) fn upload(&mut self, stream: &CudaStream, src: &[u8], dst: CUdeviceptr) -> Result<()> {
        for (offset, len, half) in chunks(src.len(), STAGING_CHUNK_BYTES) {
            let h = &self.halves[half];
            // The half's previous DMA (two chunks ago, or a previous copy) must have read it.
            h.done.synchronize().call("cuEventSynchronize")?;
            // SAFETY: the half holds STAGING_CHUNK_BYTES >= len bytes, and no DMA reads it now.
            let staged = unsafe { std::slice::from_raw_parts_mut(h.ptr.cast::<MaybeUninit<u8>>(), len) };
            copy_bytes(&src[offset..offset + len], staged);
            // SAFETY: `staged` was written above; the pinned half outlives the DMA (it is only
            // reused or freed after `done` completes).
            let bytes = unsafe { std::slice::from_raw_parts(h.ptr, len) };
            unsafe { result::memcpy_htod_async(dst + offset as u64, bytes, stream.cu_stream()) }
                .call("cuMemcpyHtoDAsync")?;
            h.done.record(stream).call("cuEventRecord")?;
        }
        Ok(())
    }

    /// Queues the DMA of `len` bytes from `src` into half `half` (after its earlier use ended).
    fn dma_to_host(&mut self, stream: &CudaStream, src: CUdeviceptr, len: usize, half: usize) -> Result<()> {
        let h = &mut self.halves[half];
        h.done.synchronize().call("cuEventSynchronize")?;
        // SAFETY: the half holds STAGING_CHUNK_BYTES >= len bytes; nothing else uses it until
        // `done` completes (`copy_out` waits for it).
        let staged = unsafe { std::slice::from_raw_parts_mut(h.ptr, len) };
        unsafe { result::memcpy_dtoh_async(staged, src, stream.cu_stream()) }.call("cuMemcpyDtoHAsync")?;
        h.done.record(stream).call("cuEventRecord")
    }

    /// Waits for chunk `(offset, len, half)`'s DMA and copies it into `dst[offset..]`.
    fn copy_out(&self, (offset, len, half): (usize, usize, usize), dst: &mut [MaybeUninit<u8>]) -> Result<()> {
        let h = &self.halves[half];
        h.done.synchronize().call("cuEventSynchronize")?;
        // SAFETY: the DMA that wrote these `len` bytes completed (`done`).
        let staged = unsafe { std::slice::from_raw_parts(h.ptr, len) };
        copy_bytes(staged, &mut dst[offset..offset + len]);
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A DMA may still read or write a half: wait before cudarc frees the pinned memory.
        for h in &self.halves {
            let _ = h.done.synchronize();
        }
    }
}

/// `dst = src` (same length), on all cores when large.
pub(crate) fn copy_bytes(src: &[u8], dst: &mut [MaybeUninit<u8>]) {
    assert_eq!(src.len(), dst.len(), "copy_bytes lengths");
    let copy = |(s, d): (&[u8], &mut [MaybeUninit<u8>])| {
        // SAFETY: same lengths; `src` and `dst` cannot overlap (`dst` is a unique borrow).
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), d.as_mut_ptr().cast::<u8>(), s.len()) }
    };
    if src.len() < PARALLEL_MIN_BYTES {
        copy((src, dst));
    } else {
        src.par_chunks(PIECE_BYTES)
            .zip(dst.par_chunks_mut(PIECE_BYTES))
            .for_each(copy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_copy_once_in_order_alternating_halves() {
        for bytes in [0, 1, 7, 8, 9, 16, 17, 40] {
            let plan: Vec<_> = chunks(bytes, 8).collect();
            let mut next = 0;
            for (i, &(offset, len, half)) in plan.iter().enumerate() {
                assert_eq!(offset, next, "{bytes} bytes: chunk {i} starts where the last ended");
                assert!(len > 0 && len <= 8);
                assert_eq!(half, i % 2);
                next += len;
            }
            assert_eq!(next, bytes, "{bytes} bytes covered");
        }
    }

    #[test]
    fn copy_bytes_copies_every_byte_serial_and_parallel() {
        for len in [
            0,
            1,
            1000,
            PARALLEL_MIN_BYTES - 1,
            PARALLEL_MIN_BYTES,
            3 * PARALLEL_MIN_BYTES + 17,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 + i / 251) as u8).collect();
            let mut dst = vec![MaybeUninit::new(0xA5u8); len];
            copy_bytes(&src, &mut dst);
            // SAFETY: every element was initialized above.
            let got: Vec<u8> = dst.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert_eq!(got, src, "{len} bytes");
        }
    }
}
