//! CUDA backend on `cudarc` (driver API, loaded at run time): discovery that
//! never panics without a driver, a device with its stream, kernel modules
//! loaded from the embedded fatbins, tracked allocations, and the launchers
//! of the memory-bound FP8 kernels.

mod buffer;
mod context;
mod error;
pub mod hopper;
mod launch;
pub mod params;
pub mod quantize;

pub use buffer::{DeviceBuffer, DeviceElement};
pub use context::{CudaDevice, GpuInfo, discover, driver_present, driver_version};
pub use quantize::DequantScales;
