//! Results an op leaves on its GPU until the host reads them ([`Deferred`]): a cast's or a
//! GEMM's amax, a cast's statistics' counts. Each read is a download that waits for the
//! stream; kept on the device, an amax is folded into a slot bank there and the counts wait
//! for the step's statistics (`docs/cuda-backend.md`, Slot banks on the device).

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::{Pooled, Staged, staged};
use crate::backend::cuda::DeviceBuffer;
use crate::dispatch::CudaKernels;
use crate::error::{Error, Result};
use crate::tensor::device_values::{Deferred, DeviceResult};

/// A small device buffer (work already queued writes it) read once, then kept; given back to
/// the staging pool when dropped, as a leased buffer would be.
struct Small<T: Pooled> {
    staged: Arc<Staged>,
    buffer: Option<DeviceBuffer<T>>,
}

impl<T: Pooled> std::fmt::Debug for Small<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Small({} values)", self.buffer.as_ref().map_or(0, |b| b.len()))
    }
}

impl<T: Pooled> Small<T> {
    fn buffer(&self) -> &DeviceBuffer<T> {
        self.buffer.as_ref().expect("held until dropped")
    }

    fn download(&self) -> Result<Vec<T>> {
        self.staged.down_vec(self.buffer())
    }
}

impl<T: Pooled> Drop for Small<T> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.staged.recycle(buffer);
        }
    }
}

/// One f32 on a GPU (an amax), read once.
#[derive(Debug)]
pub(crate) struct DeviceScalar {
    ordinal: usize,
    small: Small<f32>,
    read: OnceLock<f32>,
}

impl DeviceScalar {
    /// `buffer` (one value, written by work already queued) left on GPU `ordinal`.
    pub(crate) fn deferred(staged: &Arc<Staged>, ordinal: usize, buffer: DeviceBuffer<f32>) -> Deferred<f32> {
        Deferred::Device(Arc::new(DeviceScalar {
            ordinal,
            small: Small {
                staged: staged.clone(),
                buffer: Some(buffer),
            },
            read: OnceLock::new(),
        }))
    }

    /// Its buffer, for a kernel that reads it (the fold into a bank).
    pub(crate) fn buffer(&self) -> &DeviceBuffer<f32> {
        self.small.buffer()
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
        let v = self.small.download()?.first().copied().unwrap_or(0.0);
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
    small: Small<u32>,
    read: OnceLock<[u64; 4]>,
}

impl DeviceCounts {
    /// `buffer` (four counters, written by work already queued) left on GPU `ordinal`.
    pub(crate) fn deferred(staged: &Arc<Staged>, ordinal: usize, buffer: DeviceBuffer<u32>) -> Deferred<[u64; 4]> {
        Deferred::Device(Arc::new(DeviceCounts {
            ordinal,
            small: Small {
                staged: staged.clone(),
                buffer: Some(buffer),
            },
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
        let c = self.small.download()?;
        let counts = match c[..] {
            [a, b, n, f] => [a, b, n, f].map(u64::from),
            _ => {
                return Err(Error::LengthMismatch {
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

/// Reads every CUDA result of `scalars` and `counts` not read yet with one download per GPU and
/// element type (device-to-device copies gather them into one buffer first), instead of one
/// stream sync each: a step's statistics at once. Results of other kinds are left to their own
/// reads.
pub(crate) fn read_all(scalars: &[Deferred<f32>], counts: &[Deferred<[u64; 4]>]) -> Result<()> {
    let mut by_gpu: BTreeMap<usize, (Vec<&DeviceScalar>, Vec<&DeviceCounts>)> = BTreeMap::new();
    for d in scalars {
        if let Deferred::Device(r) = d
            && let Some(scalar) = r.as_any().downcast_ref::<DeviceScalar>()
            && scalar.read.get().is_none()
        {
            by_gpu.entry(scalar.ordinal).or_default().0.push(scalar);
        }
    }
    for d in counts {
        if let Deferred::Device(r) = d
            && let Some(count) = r.as_any().downcast_ref::<DeviceCounts>()
            && count.read.get().is_none()
        {
            by_gpu.entry(count.ordinal).or_default().1.push(count);
        }
    }
    for (ordinal, (scalars, counts)) in by_gpu {
        let s = staged(&CudaKernels { ordinal })?;
        let values = gathered(&s, scalars.iter().map(|r| r.small.buffer()), 1)?;
        for (r, &v) in scalars.iter().zip(&values) {
            let _ = r.read.set(v);
        }
        let values = gathered(&s, counts.iter().map(|r| r.small.buffer()), 4)?;
        for (r, c) in counts.iter().zip(values.chunks_exact(4)) {
            let _ = r.read.set([c[0], c[1], c[2], c[3]].map(u64::from));
        }
    }
    Ok(())
}

/// `buffers` (of `each` values) copied one after the other into one device buffer and
/// downloaded (one sync).
fn gathered<'a, T: Pooled + 'a>(
    s: &Staged,
    buffers: impl Iterator<Item = &'a DeviceBuffer<T>>,
    each: usize,
) -> Result<Vec<T>> {
    let buffers: Vec<_> = buffers.collect();
    if let Some(b) = buffers.iter().find(|b| b.len() != each) {
        return Err(Error::LengthMismatch {
            what: "a device result read with others",
            src: b.len(),
            dst: each,
        });
    }
    let total = buffers.iter().map(|b| b.len()).sum();
    if total == 0 {
        return Ok(Vec::new());
    }
    let mut all = s.scratch::<T>(total)?;
    let mut at = 0;
    for b in buffers {
        s.device().copy_at(b, &mut all, at)?;
        at += b.len();
    }
    s.down_vec(&all)
}
