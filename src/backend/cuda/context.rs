//! GPU discovery and the `CudaDevice` handle: context, stream, kernel modules, memory ledger.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtrMut, result};
use cudarc::nvrtc::Ptx;

use super::error::{CudaResultExt, describe_error_flag};
use super::staging::Staging;
use crate::backend::kernels;
use crate::error::{Error, Result};
use crate::memory::MemoryLedger;

/// The memory ledger of GPU `ordinal`, one per GPU for the process: every `CudaDevice` opened on
/// it (the CLI's, the staged op arms', a test's) counts into the same ledger, so `fp8 train
/// --device cuda`'s memory summary includes the staging buffers the ops allocate (Workspace).
pub(crate) fn ledger_of(ordinal: usize) -> Arc<MemoryLedger> {
    static LEDGERS: OnceLock<Mutex<HashMap<usize, Arc<MemoryLedger>>>> = OnceLock::new();
    LEDGERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(ordinal)
        .or_insert_with(|| Arc::new(MemoryLedger::new()))
        .clone()
}

/// What discovery reports about one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// Driver ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (u32, u32),
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

impl GpuInfo {
    /// Whether the kernels of this build can run on it (sm_75 or newer; CUDA 13 dropped Volta).
    pub fn supported(&self) -> bool {
        self.compute_capability >= (7, 5)
    }
}

/// Whether the CUDA driver library can be loaded. Every other driver call
/// would panic inside cudarc without it, so everything here asks this first.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; no driver function is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The driver version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> Result<(u32, u32)> {
    if !driver_present() {
        return Err(no_driver());
    }
    result::init().call("cuInit")?;
    let mut version = 0i32;
    // SAFETY: the driver is loaded and initialized; `version` is a valid out-pointer.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .call("cuDriverGetVersion")?;
    Ok(((version / 1000) as u32, ((version % 1000) / 10) as u32))
}

fn no_driver() -> Error {
    Error::NoGpu {
        reason: "the CUDA driver library (libcuda) is not installed".to_string(),
    }
}

/// Every GPU the driver sees, or `NoGpu` without a driver. Never panics.
pub fn discover() -> Result<Vec<GpuInfo>> {
    if !driver_present() {
        return Err(no_driver());
    }
    result::init().call("cuInit")?;
    let count = result::device::get_count().call("cuDeviceGetCount")?;
    (0..count).map(|i| info(i as usize)).collect()
}

fn info(ordinal: usize) -> Result<GpuInfo> {
    let dev = result::device::get(ordinal as i32).call("cuDeviceGet")?;
    // SAFETY: `dev` is a valid device handle from cuDeviceGet on an initialized driver.
    let attribute = |a: CUdevice_attribute| unsafe { result::device::get_attribute(dev, a) };
    let major =
        attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).call("cuDeviceGetAttribute")?;
    let minor =
        attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).call("cuDeviceGetAttribute")?;
    let sms = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).call("cuDeviceGetAttribute")?;
    // SAFETY: as above.
    let total = unsafe { result::device::total_mem(dev) }.call("cuDeviceTotalMem")?;
    Ok(GpuInfo {
        ordinal,
        name: result::device::get_name(dev).call("cuDeviceGetName")?,
        compute_capability: (major as u32, minor as u32),
        total_memory: total as u64,
        multiprocessors: sms as u32,
    })
}

/// One GPU ready for kernels: its context, a stream, the loaded modules and a memory ledger.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: GpuInfo,
    ledger: Arc<MemoryLedger>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// The u32 the production GEMM launches write their error codes to
    /// (allocated on first use), checked by [`CudaDevice::check_kernel_errors`].
    kernel_flag: Box<KernelFlag>,
    /// The pinned host buffers copies go through (pinned on the first copy; `Err` once pinning
    /// failed: copies then stay pageable).
    staging: Mutex<Option<std::result::Result<Box<Staging>, ()>>>,
}

/// The kernel error flag and the launches it was handed to.
#[derive(Debug, Default)]
struct KernelFlag {
    slice: Mutex<Option<CudaSlice<u32>>>,
    /// Whether a launch was handed the flag since it was last read: a download reads the flag
    /// only then (a staged op downloads several outputs; most ops never touch the flag).
    watch: FlagWatch,
}

/// Launches handed the kernel error flag, and how many of them a read of the flag has covered.
#[derive(Debug, Default)]
struct FlagWatch {
    armed: AtomicU64,
    covered: AtomicU64,
}

impl FlagWatch {
    /// A launch got the flag's address (before it is enqueued).
    fn arm(&self) {
        self.armed.fetch_add(1, Ordering::SeqCst);
    }

    /// The launches a read now would cover, if any is not covered yet. Taken before the read, so
    /// a launch armed during the read is still pending for the next one.
    fn pending(&self) -> Option<u64> {
        let armed = self.armed.load(Ordering::SeqCst);
        (armed != self.covered.load(Ordering::SeqCst)).then_some(armed)
    }

    /// A read (stream-ordered after them) covered the launches counted in `armed`.
    fn covered(&self, armed: u64) {
        self.covered.fetch_max(armed, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// The driver's high-water marks of a GPU's allocations ([`CudaDevice::allocation_peak`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationPeak {
    /// Bytes the allocations held at once, at most.
    pub used: u64,
    /// Bytes the memory pool reserved for them, at most (at least `used`).
    pub reserved: u64,
}

impl CudaDevice {
    /// Opens GPU `ordinal`: checks the driver, the device, its compute capability and that kernels were compiled in.
    pub fn open(ordinal: usize) -> Result<Self> {
        let gpus = discover()?;
        let info = gpus.get(ordinal).cloned().ok_or_else(|| Error::NoGpu {
            reason: format!("GPU {ordinal} asked for, the driver sees {} GPU(s)", gpus.len()),
        })?;
        if !info.supported() {
            let (major, minor) = info.compute_capability;
            return Err(Error::NoGpu {
                reason: format!(
                    "{} has compute capability {major}.{minor}; the kernels need 7.5 (Turing) or newer",
                    info.name
                ),
            });
        }
        if !kernels::compiled() {
            return Err(Error::KernelsMissing);
        }
        let ctx = CudaContext::new(ordinal).call("cuDevicePrimaryCtxRetain")?;
        let stream = ctx.new_stream().call("cuStreamCreate")?;
        Ok(CudaDevice {
            ctx,
            stream,
            info,
            ledger: ledger_of(ordinal),
            modules: Mutex::new(HashMap::new()),
            kernel_flag: Box::default(),
            staging: Mutex::new(None),
        })
    }

    /// Turns off cudarc's event tracking for the buffers this handle allocates from now on
    /// (call it right after [`Self::open`]). cudarc records an event at every use of a buffer
    /// once a context has a second stream, and creates two per allocation: two to four driver
    /// calls per kernel argument, in steps that are launch-bound. They order nothing here, where
    /// every access to a buffer runs on its handle's one stream (the layers' staged device,
    /// `dispatch::cuda_ops::staged`).
    ///
    /// # Safety
    /// Every buffer allocated through this handle afterwards must be used (read, written and
    /// dropped) only on [`Self::stream`]; a second stream would need its own waits.
    pub(crate) unsafe fn disable_event_tracking(&self) {
        // SAFETY: the caller keeps every buffer of this handle on its one stream.
        unsafe { self.ctx.disable_event_tracking() }
    }

    /// What discovery reported about this GPU.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launcher of this device uses (kernels run in order on it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Bytes in use and peak bytes of this device, by category.
    pub fn ledger(&self) -> &Arc<MemoryLedger> {
        &self.ledger
    }

    /// Free and total device memory in bytes, as the driver reports them.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.ctx.mem_get_info().call("cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    /// The device's default memory pool, from which every stream-ordered allocation of this
    /// crate comes (cudarc allocates with `cuMemAllocAsync`).
    fn default_memory_pool(&self) -> Result<cudarc::driver::sys::CUmemoryPool> {
        use cudarc::driver::sys;
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the context is current; `pool` is a valid out-pointer.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .call("cuDeviceGetDefaultMemPool")?;
        Ok(pool)
    }

    /// The most bytes the device's allocations held at once since the last
    /// [`Self::reset_allocation_peak`], and the most its pool reserved for them (fragmentation
    /// included: what runs out first), as the driver counts them (the default pool's
    /// `USED_MEM_HIGH` and `RESERVED_MEM_HIGH`: every buffer of every handle on this GPU; the
    /// CUDA context and the loaded modules are not in them). Waits for all work on the GPU
    /// first, so every queued allocation and free is counted.
    pub fn allocation_peak(&self) -> Result<AllocationPeak> {
        use cudarc::driver::sys::CUmemPool_attribute as Attr;
        self.ctx.synchronize().call("cuCtxSynchronize")?;
        let pool = self.default_memory_pool()?;
        let read = |attr: Attr| -> Result<u64> {
            let mut value: u64 = 0;
            // SAFETY: `pool` is the device's pool; both attributes are a cuuint64_t written to
            // `value`.
            unsafe { cudarc::driver::sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) }
                .result()
                .call("cuMemPoolGetAttribute")?;
            Ok(value)
        };
        Ok(AllocationPeak {
            used: read(Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved: read(Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Restarts both of [`Self::allocation_peak`]'s counts from what is allocated and reserved
    /// now (the driver takes the value 0 to mean that).
    pub fn reset_allocation_peak(&self) -> Result<()> {
        use cudarc::driver::sys::CUmemPool_attribute as Attr;
        self.ctx.synchronize().call("cuCtxSynchronize")?;
        let pool = self.default_memory_pool()?;
        for attr in [
            Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: as above; the driver reads a cuuint64_t 0 from `zero`.
            unsafe { cudarc::driver::sys::cuMemPoolSetAttribute(pool, attr, (&mut zero as *mut u64).cast()) }
                .result()
                .call("cuMemPoolSetAttribute")?;
        }
        Ok(())
    }

    /// Waits for all work on the device's stream, then reports a code a GEMM
    /// kernel left in the device's error flag ([`Self::check_kernel_errors`]).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().call("cuStreamSynchronize")?;
        self.check_kernel_errors()
    }

    /// Device address of this device's kernel error flag (a zeroed u32,
    /// allocated on first use) for kernels that report through one.
    pub fn kernel_error_flag(&self) -> Result<u64> {
        let mut flag = self.kernel_flag.slice.lock().unwrap_or_else(|p| p.into_inner());
        if flag.is_none() {
            *flag = Some(self.stream.alloc_zeros::<u32>(1).call("cuMemAlloc")?);
        }
        let slice = flag.as_mut().expect("allocated above");
        let (ptr, _sync) = slice.device_ptr_mut(&self.stream);
        self.kernel_flag.watch.arm();
        Ok(ptr)
    }

    /// Reads the kernel error flag (waiting for the stream; nothing to read
    /// unless a launch was handed the flag since the last read): a non-zero
    /// code is returned as an error once and the flag is cleared, so a kernel
    /// that refused to run is not silent.
    pub fn check_kernel_errors(&self) -> Result<()> {
        // No launch was handed the flag since the last read: it is still zero.
        let Some(armed) = self.kernel_flag.watch.pending() else {
            return Ok(());
        };
        let mut guard = self.kernel_flag.slice.lock().unwrap_or_else(|p| p.into_inner());
        let Some(flag) = guard.as_mut() else {
            return Ok(());
        };
        let code = self.stream.clone_dtoh(flag).call("cuMemcpyDtoH")?[0];
        self.kernel_flag.watch.covered(armed);
        let Some(what) = describe_error_flag(code) else {
            return Ok(());
        };
        self.stream.memset_zeros(flag).call("cuMemsetD8")?;
        Err(Error::KernelArgs {
            kernel: "gemm (kernel error flag)",
            detail: what,
        })
    }

    /// Runs `copy` with this handle's pinned staging buffers, pinning them on first use (one copy
    /// at a time per handle); `None` when they cannot be pinned (warned once per handle): the
    /// caller then copies the pageable way. `copy` must not itself stage a copy on this handle
    /// (the lock is held; a rayon worker waiting in it may run other jobs).
    pub(crate) fn with_staging<R>(&self, copy: impl FnOnce(&mut Staging) -> Result<R>) -> Result<Option<R>> {
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let state = staging.get_or_insert_with(|| {
            Staging::new(&self.ctx).map(Box::new).map_err(|err| {
                eprintln!("fp8-engine: warning: pinned staging buffers unavailable ({err}); copies stay pageable");
            })
        });
        match state {
            Ok(pinned) => copy(pinned).map(Some),
            Err(()) => Ok(None),
        }
    }

    /// Kernel `function` of `cuda/<module>.cu`, loading the module from its fatbin on first use.
    pub fn function(&self, module: &'static str, function: &str) -> Result<CudaFunction> {
        let loaded = {
            let mut modules = self.modules.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match modules.get(module) {
                Some(m) => m.clone(),
                None => {
                    let fatbin = kernels::fatbin(module).ok_or(Error::KernelsMissing)?;
                    let m = self
                        .ctx
                        .load_module(Ptx::from_binary(fatbin.to_vec()))
                        .call(&format!("cuModuleLoadData({module})"))?;
                    modules.insert(module, m.clone());
                    m
                }
            }
        };
        loaded
            .load_function(function)
            .call(&format!("cuModuleGetFunction({module}.{function})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryCategory;

    #[test]
    fn every_handle_on_one_gpu_counts_into_one_ledger() {
        // Ordinals no machine has, so no other test's GPU ledger is touched.
        let (a, b, other) = (ledger_of(1001), ledger_of(1001), ledger_of(1002));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other));
        a.allocate(MemoryCategory::Workspace, 4096);
        assert_eq!(b.usage(MemoryCategory::Workspace).current, 4096);
        assert_eq!(other.usage(MemoryCategory::Workspace).current, 0);
        b.free(MemoryCategory::Workspace, 4096);
        assert_eq!(a.total().current, 0);
    }
}

#[cfg(test)]
mod flag_watch_tests {
    use super::FlagWatch;

    #[test]
    fn the_flag_is_read_after_each_new_launch_and_not_again() {
        let watch = FlagWatch::default();
        assert_eq!(watch.pending(), None, "no launch: nothing to read");
        watch.arm();
        watch.arm();
        let armed = watch.pending().expect("two launches to cover");
        // A launch armed during the read stays pending for the next read.
        watch.arm();
        watch.covered(armed);
        let again = watch.pending().expect("the third launch");
        watch.covered(again);
        assert_eq!(watch.pending(), None);
        // A stale read never uncovers newer launches.
        watch.covered(armed);
        assert_eq!(watch.pending(), None);
    }
}
