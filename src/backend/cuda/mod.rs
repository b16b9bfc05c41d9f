//! CUDA backend on `cudarc` (driver API, loaded at run time): discovery that
//! never panics without a driver, a device with its stream, kernel modules
//! loaded from the embedded fatbins, tracked allocations, and the launchers
//! of the memory-bound FP8 kernels.

mod buffer;
mod context;
pub mod cublaslt;
mod error;
pub mod error_bound;
pub mod gemm;
pub mod gemm_dispatch;
pub mod gemm_operands;
pub mod gemm_path;
pub mod gemm_portable;
pub mod hopper;
pub mod kernel_inventory;
mod launch;
pub mod params;
pub mod quantize;

pub use buffer::{DeviceBuffer, DeviceElement};
pub use context::{CudaDevice, GpuInfo, discover, driver_present, driver_version};
pub use error::describe_error_flag;
pub use quantize::DequantScales;
