//! Loads every embedded kernel module on a device and every kernel in it, once:
//! the first check of a GPU run (`fp8 info --load-all`), which fails fast and
//! with the module's name when the driver cannot load a fatbin (a driver older
//! than the CUDA 13.0 that built them, or no code for this GPU).

use std::ffi::{CStr, c_char, c_uint, c_void};

use cudarc::driver::{result, sys};

use super::context::CudaDevice;
use super::error::CudaResultExt;
use super::hopper::{self, kernel_checks};
use crate::backend::kernels;
use crate::error::Result;

/// One module's kernels, as the driver lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleKernels {
    /// The kernel file (`cuda/<module>.cu`).
    pub module: &'static str,
    /// Every kernel function in it.
    pub kernels: Vec<String>,
}

/// The kernel names in a fatbin, listed by the driver (`cuModuleEnumerateFunctions`).
fn enumerate(device: &CudaDevice, module: &'static str, fatbin: &[u8]) -> Result<Vec<String>> {
    device.context().bind_to_thread().call("cuCtxSetCurrent")?;
    // cuModuleLoadData wants the image 8-byte aligned: copy it into u64 words.
    let mut image = vec![0u64; fatbin.len().div_ceil(8)];
    // SAFETY: `image` has at least fatbin.len() bytes; the regions do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(fatbin.as_ptr(), image.as_mut_ptr().cast::<u8>(), fatbin.len()) };
    // SAFETY: the context is current on this thread and `image` is a complete fatbin
    // that outlives the call; the module is unloaded below on every path.
    let handle = unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) }
        .call(&format!("cuModuleLoadData({module})"))?;
    let names = (|| {
        let mut count: c_uint = 0;
        // SAFETY: `handle` is a loaded module; `count` is a valid out-pointer.
        unsafe { sys::cuModuleGetFunctionCount(&mut count, handle) }
            .result()
            .call("cuModuleGetFunctionCount")?;
        let mut functions: Vec<sys::CUfunction> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: `functions` has room for exactly `count` handles.
        unsafe { sys::cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, handle) }
            .result()
            .call("cuModuleEnumerateFunctions")?;
        let mut names = Vec::with_capacity(functions.len());
        for f in functions {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: `f` is a function of the loaded module; the driver returns a
            // NUL-terminated string it owns, copied before the module is unloaded.
            unsafe { sys::cuFuncGetName(&mut name, f) }
                .result()
                .call("cuFuncGetName")?;
            // SAFETY: non-null, NUL-terminated, alive until cuModuleUnload below.
            names.push(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned());
        }
        Ok(names)
    })();
    // SAFETY: `handle` was loaded above and no function handle of it is used afterwards.
    unsafe { result::module::unload(handle) }.call("cuModuleUnload")?;
    let mut names: Vec<String> = names?;
    names.sort();
    Ok(names)
}

/// Loads every module and gets every kernel of it through the device's own cache
/// (as launches do). On an sm_90 GPU every wgmma kernel must also have the 168
/// registers its `setmaxnreg` split needs ([`kernel_checks`]).
pub fn load_all(device: &CudaDevice) -> Result<Vec<ModuleKernels>> {
    let mut out = Vec::new();
    for &(module, fatbin) in kernels::FATBINS {
        let names = enumerate(device, module, fatbin)?;
        for name in &names {
            let func = device.function(module, name)?;
            if module == hopper::launch::MODULE && hopper::device_capable(device) {
                let known = hopper::launch::all_kernel_names()
                    .into_iter()
                    .find(|k| *k == name.as_str())
                    .unwrap_or("gemm_wgmma (unknown variant)");
                kernel_checks::check_function(device.info().ordinal, known, &func)?;
            }
        }
        out.push(ModuleKernels { module, kernels: names });
    }
    Ok(out)
}
