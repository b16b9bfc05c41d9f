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

/// A device allocation counted in its device's ledger under one category until dropped.
pub struct DeviceBuffer<T> {
    slice: CudaSlice<T>,
    category: MemoryCategory,
    ledger: Arc<MemoryLedger>,
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("len", &self.slice.len())
            .field("category", &self.category)
            .finish()
    }
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    fn track(slice: CudaSlice<T>, category: MemoryCategory, ledger: &Arc<MemoryLedger>) -> Self {
        ledger.allocate(category, slice.num_bytes() as u64);
        DeviceBuffer {
            slice,
            category,
            ledger: ledger.clone(),
        }
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// The ledger category it is booked under.
    pub(crate) fn category(&self) -> MemoryCategory {
        self.category
    }

    /// The underlying cudarc slice.
    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The device address as kernels see it (valid while `self` lives; work is ordered on the device's stream).
    pub(crate) fn address(&self, device: &CudaDevice) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(device.stream());
        ptr
    }

    /// The device address for a kernel that writes the buffer.
    pub(crate) fn address_mut(&mut self, device: &CudaDevice) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr_mut(device.stream());
        ptr
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // The free that follows (cudarc's) runs on this thread: a buffer kept by a host tensor
        // (a cast's device mirror) may be dropped on a thread that never ran an op.
        let _ = self.slice.stream().context().bind_to_thread();
        self.ledger
            .free(self.category, (self.slice.len() * size_of::<T>()) as u64);
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
        let bytes = len.saturating_mul(size_of::<T>());
        let slice = timed(Transfer::Allocation, bytes, || self.stream().alloc_zeros::<T>(len)).call("cuMemAlloc")?;
        Ok(DeviceBuffer::track(slice, category, self.ledger()))
    }

    /// A copy of `host` on the device, in `category`.
    pub fn upload<T: DeviceRepr>(&self, host: &[T], category: MemoryCategory) -> Result<DeviceBuffer<T>> {
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
        self.stream().memset_zeros(&mut buffer.slice).call("cuMemsetD8")
    }

    /// Overwrites `buffer` with `host` (same length).
    pub fn write<T: DeviceRepr>(&self, host: &[T], buffer: &mut DeviceBuffer<T>) -> Result<()> {
        self.write_at(host, buffer, 0)
    }

    /// Overwrites `buffer[offset..offset + host.len()]` with `host` (a range past the buffer is
    /// an error, nothing copied).
    pub fn write_at<T: DeviceRepr>(&self, host: &[T], buffer: &mut DeviceBuffer<T>, offset: usize) -> Result<()> {
        check_range("device write past the buffer", offset, host.len(), buffer.len())?;
        let start = buffer.address_mut(self) + (offset * size_of::<T>()) as u64;
        timed(Transfer::HostToDevice, size_of_val(host), || {
            self.copy_to_device(host, start)
        })
    }

    /// Copies `buffer[offset..offset + host.len()]` into `host` (waits for the stream and reports
    /// a kernel error flag, as [`CudaDevice::download`]; a range past the buffer is an error).
    pub fn read_at<T: DeviceRepr>(&self, buffer: &DeviceBuffer<T>, offset: usize, host: &mut [T]) -> Result<()> {
        check_range("device read past the buffer", offset, host.len(), buffer.len())?;
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
        let mut view = dst.slice.slice_mut(offset..offset + src.len());
        self.stream().memcpy_dtod(&src.slice, &mut view).call("cuMemcpyDtoD")
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
        let view = src.slice.slice(offset..offset + dst.len());
        self.stream().memcpy_dtod(&view, &mut dst.slice).call("cuMemcpyDtoD")
    }

    /// Device-to-device copy of `src` into `dst` (same length); the baseline of the bandwidth bench.
    pub fn copy<T: DeviceRepr>(&self, src: &DeviceBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<()> {
        self.stream()
            .memcpy_dtod(&src.slice, &mut dst.slice)
            .call("cuMemcpyDtoD")
    }
}
