//! Results an op leaves on its GPU until the host reads them ([`Deferred`]): a cast's or a
//! GEMM's amax, a cast's statistics' counts. Each read is a download that waits for the
//! stream; kept on the device, an amax is folded into a slot bank there and the counts wait
//! for the step's statistics (`docs/cuda-backend.md`, Slot banks on the device).

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::{Pooled, Staged};
use crate::backend::cuda::DeviceBuffer;
use crate::error::{Error, Result};
use crate::tensor::device_values::{Deferred, DeviceResult};

/// A small device buffer (work already queued writes it) read once as a `V`, then kept; given
/// back to the staging pool when dropped, as a leased buffer would be.
pub(crate) struct OnDevice<T: Pooled, V> {
    staged: Arc<Staged>,
    buffer: Option<DeviceBuffer<T>>,
    read: OnceLock<V>,
}

/// One f32 on a GPU: an amax.
pub(crate) type DeviceScalar = OnDevice<f32, f32>;
/// `[saturated, underflow, nonzero, nonfinite]` counted on a GPU in 32-bit counters.
pub(crate) type DeviceCounts = OnDevice<u32, [u64; 4]>;

/// How a result's device values become its host value.
pub(crate) trait FromDevice<T>: Sized {
    /// Values in the device buffer of one result.
    const LEN: usize;
    /// The result from its `LEN` downloaded values.
    fn from_device(values: &[T]) -> Self;
}

impl FromDevice<f32> for f32 {
    const LEN: usize = 1;
    fn from_device(values: &[f32]) -> f32 {
        values[0]
    }
}

impl FromDevice<u32> for [u64; 4] {
    const LEN: usize = 4;
    fn from_device(c: &[u32]) -> [u64; 4] {
        [c[0], c[1], c[2], c[3]].map(u64::from)
    }
}

impl<T: Pooled, V> std::fmt::Debug for OnDevice<T, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OnDevice(cuda:{})", self.ordinal())
    }
}

impl<T: Pooled + 'static, V: FromDevice<T> + Copy + Send + Sync + 'static> OnDevice<T, V> {
    /// `buffer` (written by work already queued on `staged`'s GPU) left there until read.
    pub(crate) fn deferred(staged: &Arc<Staged>, buffer: DeviceBuffer<T>) -> Deferred<V> {
        Deferred::Device(Arc::new(OnDevice {
            staged: staged.clone(),
            buffer: Some(buffer),
            read: OnceLock::new(),
        }))
    }
}

impl<T: Pooled, V> OnDevice<T, V> {
    /// Its buffer, for a kernel that reads it (the fold into a bank).
    pub(crate) fn buffer(&self) -> &DeviceBuffer<T> {
        self.buffer.as_ref().expect("held until dropped")
    }

    fn ordinal(&self) -> usize {
        self.staged.device().info().ordinal
    }
}

impl<T: Pooled, V> Drop for OnDevice<T, V> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.staged.recycle(buffer);
        }
    }
}

impl<T: Pooled + 'static, V: FromDevice<T> + Copy + Send + Sync + 'static> DeviceResult<V> for OnDevice<T, V> {
    fn ordinal(&self) -> usize {
        OnDevice::ordinal(self)
    }
    fn read(&self) -> Result<V> {
        if let Some(&v) = self.read.get() {
            return Ok(v);
        }
        let values = self.staged.down_vec(self.buffer())?;
        check_len(values.len(), V::LEN)?;
        Ok(*self.read.get_or_init(|| V::from_device(&values)))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The CUDA scalar behind `d`: `None` for a host value, an error for another kind of device
/// result (a stand-in), which no kernel can read.
pub(crate) fn device_scalar<'a>(d: &'a Deferred<f32>, op: &'static str) -> Result<Option<&'a DeviceScalar>> {
    match d {
        Deferred::Host(_) => Ok(None),
        Deferred::Device(r) => r
            .as_any()
            .downcast_ref::<DeviceScalar>()
            .map(Some)
            .ok_or_else(|| Error::KernelArgs {
                kernel: op,
                detail: "the value is not a CUDA result".into(),
            }),
    }
}

fn check_len(got: usize, want: usize) -> Result<()> {
    match got == want {
        true => Ok(()),
        false => Err(Error::LengthMismatch {
            what: "a device result read back",
            src: got,
            dst: want,
        }),
    }
}

/// Reads every CUDA result of `scalars` and `counts` not read yet with one download per GPU and
/// element type (device-to-device copies gather them into one buffer first), instead of one
/// stream sync each: a step's statistics at once. Results of other kinds are left to their own
/// reads.
pub(crate) fn read_all(scalars: &[Deferred<f32>], counts: &[Deferred<[u64; 4]>]) -> Result<()> {
    read_gathered::<f32, f32>(scalars)?;
    read_gathered::<u32, [u64; 4]>(counts)
}

/// [`read_all`] of one kind of result.
fn read_gathered<T: Pooled + 'static, V: FromDevice<T> + Copy + Send + Sync + 'static>(
    results: &[Deferred<V>],
) -> Result<()> {
    let mut by_gpu: BTreeMap<usize, Vec<&OnDevice<T, V>>> = BTreeMap::new();
    for d in results {
        if let Deferred::Device(r) = d
            && let Some(r) = r.as_any().downcast_ref::<OnDevice<T, V>>()
            && r.read.get().is_none()
        {
            by_gpu.entry(r.ordinal()).or_default().push(r);
        }
    }
    for unread in by_gpu.values() {
        for r in unread {
            check_len(r.buffer().len(), V::LEN)?;
        }
        let s = &unread[0].staged;
        let mut all = s.scratch::<T>(unread.len() * V::LEN)?;
        for (i, r) in unread.iter().enumerate() {
            s.device().copy_at(r.buffer(), &mut all, i * V::LEN)?;
        }
        let values = s.down_vec(&all)?;
        for (r, v) in unread.iter().zip(values.chunks_exact(V::LEN)) {
            let _ = r.read.set(V::from_device(v));
        }
    }
    Ok(())
}
