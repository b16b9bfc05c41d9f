//! Results an op leaves on its GPU until the host reads them ([`Deferred`]): a cast's or a
//! GEMM's amax, a cast's statistics' counts. Each read is a download that waits for the
//! stream; kept on the device, an amax is folded into a slot bank there and the counts wait
//! for the step's statistics (`docs/cuda-backend.md`, Slot banks on the device).

use std::any::Any;
use std::sync::{Arc, OnceLock};

use super::staged;
use crate::backend::cuda::DeviceBuffer;
use crate::dispatch::CudaKernels;
use crate::error::Result;
use crate::tensor::device_values::{Deferred, DeviceResult};

/// One f32 on a GPU (an amax), read once.
#[derive(Debug)]
pub(crate) struct DeviceScalar {
    ordinal: usize,
    buffer: DeviceBuffer<f32>,
    read: OnceLock<f32>,
}

impl DeviceScalar {
    /// `buffer` (one value, written by work already queued) left on GPU `ordinal`.
    pub(crate) fn deferred(ordinal: usize, buffer: DeviceBuffer<f32>) -> Deferred<f32> {
        Deferred::Device(Arc::new(DeviceScalar {
            ordinal,
            buffer,
            read: OnceLock::new(),
        }))
    }

    /// Its buffer, for a kernel that reads it (the fold into a bank).
    pub(crate) fn buffer(&self) -> &DeviceBuffer<f32> {
        &self.buffer
    }
}

impl DeviceResult<f32> for DeviceScalar {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn read(&self) -> Result<f32> {
        if let Some(&v) = self.read.get() {
            return Ok(v);
        }
        let s = staged(&CudaKernels { ordinal: self.ordinal })?;
        let v = s.down_vec(&self.buffer)?.first().copied().unwrap_or(0.0);
        Ok(*self.read.get_or_init(|| v))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `[saturated, underflow, nonzero, nonfinite]` counted on a GPU in 32-bit counters, read once.
#[derive(Debug)]
pub(crate) struct DeviceCounts {
    ordinal: usize,
    buffer: DeviceBuffer<u32>,
    read: OnceLock<[u64; 4]>,
}

impl DeviceCounts {
    /// `buffer` (four counters, written by work already queued) left on GPU `ordinal`.
    pub(crate) fn deferred(ordinal: usize, buffer: DeviceBuffer<u32>) -> Deferred<[u64; 4]> {
        Deferred::Device(Arc::new(DeviceCounts {
            ordinal,
            buffer,
            read: OnceLock::new(),
        }))
    }
}

impl DeviceResult<[u64; 4]> for DeviceCounts {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn read(&self) -> Result<[u64; 4]> {
        if let Some(&v) = self.read.get() {
            return Ok(v);
        }
        let s = staged(&CudaKernels { ordinal: self.ordinal })?;
        let c = s.down_vec(&self.buffer)?;
        let counts = match c[..] {
            [a, b, n, f] => [a, b, n, f].map(u64::from),
            _ => {
                return Err(crate::error::Error::LengthMismatch {
                    what: "statistics counters read back",
                    src: c.len(),
                    dst: 4,
                });
            }
        };
        Ok(*self.read.get_or_init(|| counts))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
