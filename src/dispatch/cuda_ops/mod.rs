//! The CUDA arms of the op trait. An op's value arguments are [`Values`](crate::dispatch::Values)
//! or [`ValuesMut`](crate::dispatch::ValuesMut): values already on the op's GPU are read and
//! written in place (`resident`); host values are STAGED: uploaded into device buffers leased
//! from a per-device pool, and host outputs downloaded after the launcher(s) of
//! `backend::cuda` ran on the device's one stream (`docs/cuda-backend.md`). Ops whose
//! arguments are still host slices stage them all. The layers on a GPU upload their input
//! and pass device tensors; with `FP8_CUDA_RESIDENT=0` they pass host tensors
//! (`docs/cuda-backend.md`, Device-resident tensors).
//!
//! Every op has a kernel: GEMMs of MXFP8 operands run on the E8M0 variant of the
//! portable GEMM (`cuda/gemm_mma_mxfp8.cu`), f32 operands take the cuBLASLt
//! reference path (`backend::cuda::gemm_f32`).

mod arena;
mod cast;
mod deferred;
mod layer;
mod resident;
mod slot_bank;
pub(super) mod switches;
mod train;
mod transpose;

pub(super) use arena::arena_store;
pub(super) use cast::{cast_stats, current_scale, delayed_update, gemm, gemm_into, quantize, resident, uncast_stats};
pub(super) use deferred::read_all;
pub(super) use layer::{
    attention_backward, attention_cached, attention_forward, column_sum, convert, convert_transposed, copy_columns,
    dropout, dropout_add, gelu_backward, gelu_forward, layernorm_backward, layernorm_forward, multiply, residual_add,
    rmsnorm_backward, rmsnorm_forward, rope_backward, rope_forward, round, swiglu_backward, swiglu_forward,
};
pub(super) use resident::{new_values, upload};
pub(super) use slot_bank::{bank_on, record_amax};
pub(super) use train::{
    adamw, cross_entropy_backward, cross_entropy_forward, embedding_backward, embedding_forward, sum_squares,
    unscale_and_check,
};
pub(super) use transpose::transpose_fp8;

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

use super::CudaKernels;
use crate::backend::cuda::cublaslt::CublasLt;
use crate::backend::cuda::pool::SizePool;
use crate::backend::cuda::{CudaDevice, DeviceBuffer};
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;

/// Bytes of spare staging buffers kept per element type: enough for every tensor of one
/// layer step at the layer shape (a 2 x 2048 x 16384 f32 activation is 256 MiB).
const POOL_LIMIT_BYTES: u64 = 2 << 30;
/// Spares kept per length: a layer stages at most a handful of tensors of one shape at once.
const POOL_PER_LEN: usize = 8;
/// The largest spare kept: that 256 MiB activation. A larger buffer is one of a kind (a 7B
/// model's frozen head widened to f32 for its one conversion, 524 MB) and would sit idle in the
/// pool for the rest of the process.
const POOL_MAX_BUFFER_BYTES: u64 = 256 << 20;

/// One GPU opened for the staged arms: the device (context, stream, modules, ledger) and a
/// pool of staging buffers per element type.
pub(crate) struct Staged {
    device: CudaDevice,
    /// cuBLASLt for the f32 reference GEMM, made at the first f32 GEMM (its 32 MiB workspace
    /// is in the ledger then).
    cublaslt: Mutex<Option<CublasLt>>,
    f32s: Mutex<SizePool<DeviceBuffer<f32>>>,
    u8s: Mutex<SizePool<DeviceBuffer<u8>>>,
    u32s: Mutex<SizePool<DeviceBuffer<u32>>>,
    bf16s: Mutex<SizePool<DeviceBuffer<bf16>>>,
    f16s: Mutex<SizePool<DeviceBuffer<f16>>>,
}

fn pool<T>() -> Mutex<SizePool<DeviceBuffer<T>>> {
    Mutex::new(SizePool::new(
        size_of::<T>(),
        POOL_LIMIT_BYTES,
        POOL_PER_LEN,
        POOL_MAX_BUFFER_BYTES,
    ))
}

/// The device of `kernels`, opened on first use and kept for the process (its stream, loaded
/// modules and pool are reused by every later op). A device that cannot be opened is an
/// error each time (`NoGpu`, `KernelsMissing`), never a panic.
pub(crate) fn staged(kernels: &CudaKernels) -> Result<Arc<Staged>> {
    static OPENED: OnceLock<Mutex<HashMap<usize, Arc<Staged>>>> = OnceLock::new();
    let mut opened = OPENED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(staged) = opened.get(&kernels.ordinal) {
        return Ok(staged.clone());
    }
    let device = CudaDevice::open(kernels.ordinal)?;
    // SAFETY: every op runs on this device's one stream, and its buffers never leave it: the
    // layers' device values, arenas, banks and pools are all allocated and used here (NCCL
    // copies host slices into buffers of its own stream).
    unsafe { device.disable_event_tracking() };
    let staged = Arc::new(Staged {
        device,
        cublaslt: Mutex::new(None),
        f32s: pool(),
        u8s: pool(),
        u32s: pool(),
        bf16s: pool(),
        f16s: pool(),
    });
    opened.insert(kernels.ordinal, staged.clone());
    Ok(staged)
}

/// Waits for the stream of `kernels`' device, timed as a wait for the GPU
/// (`op_times::sync_ops`). A device never opened has nothing queued.
pub(crate) fn wait_for_stream(kernels: &CudaKernels) -> Result<()> {
    staged(kernels)?.device().wait_timed()
}

/// Element types the staging pools hold.
pub(crate) trait Pooled: DeviceRepr + ValidAsZeroBits + Unpin + Copy {
    fn pool(staged: &Staged) -> &Mutex<SizePool<DeviceBuffer<Self>>>;
}

macro_rules! pooled {
    ($($t:ty => $field:ident),*) => {$(
        impl Pooled for $t {
            fn pool(staged: &Staged) -> &Mutex<SizePool<DeviceBuffer<Self>>> {
                &staged.$field
            }
        }
    )*};
}
pooled!(f32 => f32s, u8 => u8s, u32 => u32s, bf16 => bf16s, f16 => f16s);

/// A device buffer borrowed from the pool, returned to it on drop.
pub(crate) struct Lease<'a, T: Pooled> {
    buffer: Option<DeviceBuffer<T>>,
    staged: &'a Staged,
}

impl<T: Pooled> Deref for Lease<'_, T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        self.buffer.as_ref().expect("a lease holds its buffer until dropped")
    }
}

impl<T: Pooled> DerefMut for Lease<'_, T> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<T> {
        self.buffer.as_mut().expect("a lease holds its buffer until dropped")
    }
}

impl<T: Pooled> Lease<'_, T> {
    /// The buffer, kept out of the pool (a device mirror holds it for as long as its tensor lives).
    pub(crate) fn into_buffer(mut self) -> DeviceBuffer<T> {
        self.buffer.take().expect("a lease holds its buffer until dropped")
    }
}

impl<T: Pooled> Drop for Lease<'_, T> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.staged.recycle(buffer);
        }
    }
}

impl Staged {
    /// The opened device.
    pub(crate) fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Runs `f` with the device's cuBLASLt handle, made on first use (`NoGpu` naming the
    /// library when libcublasLt cannot be loaded).
    pub(crate) fn with_cublaslt<R>(&self, f: impl FnOnce(&mut CublasLt) -> Result<R>) -> Result<R> {
        let mut lt = self.cublaslt.lock().unwrap_or_else(|p| p.into_inner());
        if lt.is_none() {
            *lt = Some(CublasLt::new(&self.device)?);
        }
        f(lt.as_mut().expect("made above"))
    }

    /// A buffer of `len` elements whose contents are unspecified (a kernel overwrites it).
    pub(crate) fn scratch<T: Pooled>(&self, len: usize) -> Result<Lease<'_, T>> {
        let spare = T::pool(self).lock().unwrap_or_else(|p| p.into_inner()).take(len);
        let buffer = match spare {
            Some(buffer) => buffer,
            None => self.device.alloc_zeros::<T>(len, MemoryCategory::Workspace)?,
        };
        Ok(Lease {
            buffer: Some(buffer),
            staged: self,
        })
    }

    /// Gives `buffer` back to the pool (dropped if the pool is full). Work is ordered on the one
    /// stream, so a later op's use of it runs after every kernel queued before that reads or
    /// writes it.
    pub(crate) fn recycle<T: Pooled>(&self, buffer: DeviceBuffer<T>) {
        let rejected = T::pool(self)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .give(buffer.len(), buffer);
        drop(rejected);
    }

    /// A buffer holding a copy of `host`.
    pub(crate) fn up<T: Pooled>(&self, host: &[T]) -> Result<Lease<'_, T>> {
        let mut lease = self.scratch(host.len())?;
        if !host.is_empty() {
            self.device.write(host, &mut lease)?;
        }
        Ok(lease)
    }

    /// A buffer of `len` zeros.
    pub(crate) fn zeros<T: Pooled>(&self, len: usize) -> Result<Lease<'_, T>> {
        let mut lease = self.scratch(len)?;
        if len > 0 {
            self.device.zero(&mut lease)?;
        }
        Ok(lease)
    }

    /// Copies `buffer` into `host` (same length; waits for the stream and reports a kernel
    /// error flag, as [`CudaDevice::download`]).
    pub(crate) fn down<T: Pooled>(&self, buffer: &DeviceBuffer<T>, host: &mut [T]) -> Result<()> {
        if host.len() != buffer.len() {
            return Err(Error::LengthMismatch {
                what: "staged download",
                src: buffer.len(),
                dst: host.len(),
            });
        }
        if host.is_empty() {
            return Ok(());
        }
        // Straight into `host`: no second host buffer (a fresh 256 MiB vector costs its page
        // faults and a copy on every staged output of the layer).
        self.device.read_at(buffer, 0, host)
    }

    /// `buffer` as a new vector.
    pub(crate) fn down_vec<T: Pooled>(&self, buffer: &DeviceBuffer<T>) -> Result<Vec<T>> {
        if buffer.is_empty() {
            return Ok(Vec::new());
        }
        self.device.download(buffer)
    }
}
