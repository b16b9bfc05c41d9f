//! Device buffers that keep the device's memory ledger up to date.

use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits, result};

use super::context::CudaDevice;
use super::error::CudaResultExt;
use super::staging::staged;
use super::transfer_times::{self, Transfer, timed};
use crate::error::{Error, Result};
use crate::memory::{MemoryCategory, MemoryLedger};

/// High-precision element types the kernels take: f32, bf16, fp16.
pub trait DeviceElement: crate::convert::HighPrecision + DeviceRepr + ValidAsZeroBits + Unpin {
    /// Kernel name suffix (`fp8_cast_amax_f32`, ...).
    const SUFFIX: &'static str;
}

impl DeviceElement for f32 {
    const SUFFIX: &'static str = "f32";
}
impl DeviceElement for half::bf16 {
    const SUFFIX: &'static str = "bf16";
}
impl DeviceElement for half::f16 {
    const SUFFIX: &'static str = "f16";
}

/// A device allocation counted in its device's ledger under one category until dropped, or a
/// view of part of another buffer's allocation ([`CudaDevice::view`]: a parameter's range of an
/// optimizer arena), which books nothing and keeps that allocation alive.
pub struct DeviceBuffer<T> {
    memory: Memory<T>,
    category: MemoryCategory,
    ledger: Arc<MemoryLedger>,
}

enum Memory<T> {
    /// An allocation of its own, freed (and its ledger booking returned) when dropped.
    Owned(CudaSlice<T>),
    /// `len` elements from `offset` of `base`'s allocation. Writes through it change `base`'s
    /// values: it is how a parameter and its optimizer's arena share one copy.
    View {
        base: Arc<DeviceBuffer<T>>,
        offset: usize,
        len: usize,
    },
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("len", &self.len())
            .field("category", &self.category)
            .field("view", &self.view_of().map(|(_, offset)| offset))
            .finish()
    }
}

impl<T> DeviceBuffer<T> {
    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        match &self.memory {
            Memory::Owned(slice) => slice.len(),
            Memory::View { len, .. } => *len,
        }
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// For a view: the allocation it views, which views of its ranges share
    /// ([`CudaDevice::view`]).
    pub(crate) fn view_base(&self) -> Option<&Arc<DeviceBuffer<T>>> {
        match &self.memory {
            Memory::Owned(_) => None,
            Memory::View { base, .. } => Some(base),
        }
    }

    /// For a view: the allocation it views (by address, to compare) and its first element there.
    pub(crate) fn view_of(&self) -> Option<(*const DeviceBuffer<T>, usize)> {
        match &self.memory {
            Memory::Owned(_) => None,
            Memory::View { base, offset, .. } => Some((Arc::as_ptr(base), *offset)),
        }
    }
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    fn track(slice: CudaSlice<T>, category: MemoryCategory, ledger: &Arc<MemoryLedger>) -> Self {
        ledger.allocate(category, slice.num_bytes() as u64);
        DeviceBuffer {
            memory: Memory::Owned(slice),
            category,
            ledger: ledger.clone(),
        }
    }

    /// The ledger category it is booked under (a view: its allocation's).
    pub(crate) fn category(&self) -> MemoryCategory {
        self.category
    }

    /// The underlying cudarc slice of an allocation of its own (`None` for a view).
    pub fn owned_slice(&self) -> Option<&CudaSlice<T>> {
        match &self.memory {
            Memory::Owned(slice) => Some(slice),
            Memory::View { .. } => None,
        }
    }

    /// The device address as kernels see it (valid while `self` lives; work is ordered on the device's stream).
    pub(crate) fn address(&self, device: &CudaDevice) -> u64 {
        match &self.memory {
            Memory::Owned(slice) => {
                let (ptr, _sync) = slice.device_ptr(device.stream());
                ptr
            }
            Memory::View { base, offset, .. } => base.address(device) + (offset * size_of::<T>()) as u64,
        }
    }

    /// The device address for a kernel that writes the buffer (a view writes its allocation's
    /// range: device memory, ordered on the one stream like every other access).
    ///
    /// A view takes its allocation's address through a shared reference, so cudarc records no
    /// write event on the allocation: correct while every access runs on the device's one
    /// stream (as all of this crate's do); a second stream would have to wait for the first.
    pub(crate) fn address_mut(&mut self, device: &CudaDevice) -> u64 {
        match &mut self.memory {
            Memory::Owned(slice) => {
                let (ptr, _sync) = slice.device_ptr_mut(device.stream());
                ptr
            }
            Memory::View { base, offset, .. } => base.address(device) + (*offset * size_of::<T>()) as u64,
        }
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // A view frees nothing: its allocation goes with the last reference to it.
        let Memory::Owned(slice) = &self.memory else {
            return;
        };
        // The free that follows (cudarc's) runs on this thread: a buffer kept by a host tensor
        // (a cast's device mirror) may be dropped on a thread that never ran an op.
        let _ = slice.stream().context().bind_to_thread();
        self.ledger.free(self.category, (slice.len() * size_of::<T>()) as u64);
    }
}

/// `offset..offset + count` lies within a buffer of `len` elements, else `what` as an error.
fn check_range(what: &'static str, offset: usize, count: usize, len: usize) -> Result<()> {
    if offset.checked_add(count).is_none_or(|end| end > len) {
        return Err(Error::LengthMismatch {
            what,
            src: offset.saturating_add(count),
            dst: len,
        });
    }
    Ok(())
}

impl CudaDevice {
    /// `len` zeroed elements in `category`.
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        category: MemoryCategory,
    ) -> Result<DeviceBuffer<T>> {
        if len == 0 {
            return self.empty(category);
        }
        let bytes = len.saturating_mul(size_of::<T>());
        let slice = timed(Transfer::Allocation, bytes, || self.stream().alloc_zeros::<T>(len)).call("cuMemAlloc")?;
        Ok(DeviceBuffer::track(slice, category, self.ledger()))
    }

    /// A buffer of no elements: the driver refuses an allocation of zero bytes, so it is a view
    /// of none of a one-element allocation (booked as such).
    fn empty<T: DeviceRepr>(&self, category: MemoryCategory) -> Result<DeviceBuffer<T>> {
        // SAFETY: the element is never read: the view holds none.
        let one = unsafe { self.stream().alloc::<T>(1) }.call("cuMemAlloc")?;
        self.view(&Arc::new(DeviceBuffer::track(one, category, self.ledger())), 0, 0)
    }

    /// A copy of `host` on the device, in `category`.
    pub fn upload<T: DeviceRepr>(&self, host: &[T], category: MemoryCategory) -> Result<DeviceBuffer<T>> {
        if host.is_empty() {
            return self.empty(category);
        }
        let slice = timed(Transfer::HostToDevice, size_of_val(host), || -> Result<CudaSlice<T>> {
            // SAFETY: every element is written below, in stream order before any use.
            let mut slice = unsafe { self.stream().alloc::<T>(host.len()) }.call("cuMemAlloc")?;
            let (dst, sync) = slice.device_ptr_mut(self.stream());
            self.copy_to_device(host, dst)?;
            drop(sync);
            Ok(slice)
        })?;
        Ok(DeviceBuffer::track(slice, category, self.ledger()))
    }

    /// Sets every element of `buffer` to zero (on the stream).
    pub fn zero<T: DeviceRepr + ValidAsZeroBits>(&self, buffer: &mut DeviceBuffer<T>) -> Result<()> {
        if let Memory::Owned(slice) = &mut buffer.memory {
            return self.stream().memset_zeros(slice).call("cuMemsetD8");
        }
        let (dst, bytes) = (buffer.address_mut(self), buffer.len() * size_of::<T>());
        if bytes == 0 {
            return Ok(());
        }
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: a view's range lies within its allocation (checked when it was made), which it
        // keeps alive; the memset is ordered on the stream with every other access.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream().cu_stream()) }.call("cuMemsetD8Async")
    }

    /// `buffer` as a view of all of it, so that views of its ranges can be made
    /// ([`DeviceBuffer::view_base`]); a view is returned as it is.
    pub fn lendable<T>(&self, buffer: DeviceBuffer<T>) -> Result<DeviceBuffer<T>> {
        if buffer.view_of().is_some() {
            return Ok(buffer);
        }
        let len = buffer.len();
        self.view(&Arc::new(buffer), 0, len)
    }

    /// A view of `len` elements of `base` from `offset` (a range past `base` is an error): writes
    /// through it change `base`'s values. It books nothing and keeps `base`'s allocation alive.
    /// A view of a view views the same allocation.
    pub fn view<T>(&self, base: &Arc<DeviceBuffer<T>>, offset: usize, len: usize) -> Result<DeviceBuffer<T>> {
        check_range("device view past the buffer", offset, len, base.len())?;
        let (base, offset) = match &base.memory {
            Memory::Owned(_) => (base.clone(), offset),
            Memory::View {
                base: inner,
                offset: start,
                ..
            } => (inner.clone(), start + offset),
        };
        Ok(DeviceBuffer {
            category: base.category,
            ledger: base.ledger.clone(),
            memory: Memory::View { base, offset, len },
        })
    }

    /// Overwrites `buffer` with `host` (same length).
    pub fn write<T: DeviceRepr>(&self, host: &[T], buffer: &mut DeviceBuffer<T>) -> Result<()> {
        self.write_at(host, buffer, 0)
    }

    /// Overwrites `buffer[offset..offset + host.len()]` with `host` (a range past the buffer is
    /// an error, nothing copied).
    pub fn write_at<T: DeviceRepr>(&self, host: &[T], buffer: &mut DeviceBuffer<T>, offset: usize) -> Result<()> {
        check_range("device write past the buffer", offset, host.len(), buffer.len())?;
        if host.is_empty() {
            return Ok(());
        }
        let start = buffer.address_mut(self) + (offset * size_of::<T>()) as u64;
        timed(Transfer::HostToDevice, size_of_val(host), || {
            self.copy_to_device(host, start)
        })
    }

    /// Copies `buffer[offset..offset + host.len()]` into `host` (waits for the stream and reports
    /// a kernel error flag, as [`CudaDevice::download`]; a range past the buffer is an error).
    pub fn read_at<T: DeviceRepr>(&self, buffer: &DeviceBuffer<T>, offset: usize, host: &mut [T]) -> Result<()> {
        check_range("device read past the buffer", offset, host.len(), buffer.len())?;
        if host.is_empty() {
            return self.synchronize();
        }
        let start = buffer.address(self) + (offset * size_of::<T>()) as u64;
        self.wait_when_timed()?;
        // SAFETY: `T` and `MaybeUninit<T>` have one layout; only whole values are written.
        let dst = unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr().cast::<MaybeUninit<T>>(), host.len()) };
        timed(Transfer::DeviceToHost, size_of_val(dst), || {
            self.copy_to_host(start, dst)
        })?;
        self.synchronize()
    }

    /// The buffer's contents (waits for the stream; reports a kernel error flag as [`CudaDevice::synchronize`]).
    pub fn download<T: DeviceRepr>(&self, buffer: &DeviceBuffer<T>) -> Result<Vec<T>> {
        self.wait_when_timed()?;
        let len = buffer.len();
        if len == 0 {
            // Nothing to copy (no zero-byte copy reaches the driver); still a wait for the stream.
            self.synchronize()?;
            return Ok(Vec::new());
        }
        let mut data = Vec::<T>::with_capacity(len);
        let start = buffer.address(self);
        timed(Transfer::DeviceToHost, len * size_of::<T>(), || {
            self.copy_to_host(start, &mut data.spare_capacity_mut()[..len])
        })?;
        // SAFETY: `copy_to_host` wrote all `len` values (a `DeviceRepr` is plain data).
        unsafe { data.set_len(len) };
        self.check_kernel_errors()?;
        Ok(data)
    }

    /// Copies `host` to device address `dst` in stream order: through the pinned staging
    /// ([`super::staging`]), or from pageable memory when small or with `FP8_CUDA_PINNED=0`.
    fn copy_to_device<T: DeviceRepr>(&self, host: &[T], dst: CUdeviceptr) -> Result<()> {
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        if staged(size_of_val(host)) {
            // SAFETY: a `DeviceRepr` is plain data; its bytes are read as bytes.
            let bytes = unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u8>(), size_of_val(host)) };
            if self
                .with_staging(|staging| staging.upload(self.stream(), bytes, dst))?
                .is_some()
            {
                return Ok(());
            }
        }
        // SAFETY: `dst` holds `host.len()` values (checked by the callers); a pageable source
        // is staged by the driver before the call returns.
        unsafe { result::memcpy_htod_async(dst, host, self.stream().cu_stream()) }.call("cuMemcpyHtoDAsync")
    }

    /// Copies `host.len()` values from device address `src` into `host` in stream order,
    /// returning once they are there (pinned staging, or pageable when small or with
    /// `FP8_CUDA_PINNED=0`).
    fn copy_to_host<T: DeviceRepr>(&self, src: CUdeviceptr, host: &mut [MaybeUninit<T>]) -> Result<()> {
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        if staged(size_of_val(host)) {
            let len = size_of_val(host);
            // SAFETY: as bytes, the same memory; only whole values' bytes are written.
            let bytes = unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr().cast::<MaybeUninit<u8>>(), len) };
            if self
                .with_staging(|staging| staging.download(self.stream(), src, bytes))?
                .is_some()
            {
                return Ok(());
            }
        }
        // SAFETY: `src` holds `host.len()` values; a copy to pageable memory has completed when
        // the call returns.
        unsafe { result::memcpy_dtoh_async(host, src, self.stream().cu_stream()) }.call("cuMemcpyDtoHAsync")
    }

    /// Waits for the stream, counted as a wait for the GPU when transfers are timed.
    pub(crate) fn wait_timed(&self) -> Result<()> {
        timed(Transfer::WaitForGpu, 0, || self.stream().synchronize()).call("cuStreamSynchronize")
    }

    /// While transfers are timed, waits for the stream before a download, so that the wait
    /// (the queued kernels) is counted apart from the copy ([`transfer_times`](super::transfer_times)).
    fn wait_when_timed(&self) -> Result<()> {
        if !transfer_times::enabled() {
            return Ok(());
        }
        self.wait_timed()
    }

    /// Device-to-device copy of all of `src` into `dst[offset..offset + src.len()]` (a range
    /// past `dst` is an error, nothing copied): a gradient into the optimizer's arena.
    pub fn copy_at<T: DeviceRepr>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
        offset: usize,
    ) -> Result<()> {
        check_range("device copy past the buffer", offset, src.len(), dst.len())?;
        self.copy_ranges(src, 0, dst, offset, src.len())
    }

    /// Device-to-device copy of `src[offset..offset + dst.len()]` into `dst` (the optimizer's
    /// arena back into a parameter's device values).
    pub fn copy_from_at<T: DeviceRepr>(
        &self,
        src: &DeviceBuffer<T>,
        offset: usize,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        check_range("device copy past the buffer", offset, dst.len(), src.len())?;
        let len = dst.len();
        self.copy_ranges(src, offset, dst, 0, len)
    }

    /// Device-to-device copy of `src` into `dst` (same length); the baseline of the bandwidth bench.
    pub fn copy<T: DeviceRepr>(&self, src: &DeviceBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                what: "device copy",
                src: src.len(),
                dst: dst.len(),
            });
        }
        self.copy_ranges(src, 0, dst, 0, src.len())
    }

    /// `len` elements from `src[from..]` to `dst[to..]` (ranges checked by the callers): through
    /// cudarc between allocations of their own, through the driver by address where a view
    /// takes part.
    fn copy_ranges<T: DeviceRepr>(
        &self,
        src: &DeviceBuffer<T>,
        from: usize,
        dst: &mut DeviceBuffer<T>,
        to: usize,
        len: usize,
    ) -> Result<()> {
        if let (Memory::Owned(s), Memory::Owned(d)) = (&src.memory, &mut dst.memory) {
            let view = s.slice(from..from + len);
            let mut target = d.slice_mut(to..to + len);
            return self.stream().memcpy_dtod(&view, &mut target).call("cuMemcpyDtoD");
        }
        let size = size_of::<T>();
        let (src_at, dst_at) = (src.address(self), dst.address_mut(self));
        self.copy_raw(src_at + (from * size) as u64, dst_at + (to * size) as u64, len * size)
    }

    /// `bytes` from device address `from` to `to`, in stream order (nothing for none: the
    /// addresses of buffers, owned or views, whose ranges the callers checked).
    fn copy_raw(&self, from: CUdeviceptr, to: CUdeviceptr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: both ranges lie within live allocations (checked by the callers, kept alive by
        // their buffers for the call); the copy is ordered on the stream with every other access.
        unsafe { result::memcpy_dtod_async(to, from, bytes, self.stream().cu_stream()) }.call("cuMemcpyDtoDAsync")
    }
}
