//! CUDA backend on `cudarc` (driver API, loaded at run time): discovery that
//! never panics without a driver, a device with its stream, kernel modules
//! loaded from the embedded fatbins, tracked allocations, the launchers
//! of the memory-bound FP8 kernels, and those of the layer ops (convert, norm,
//! activation, embedding, loss, optim, attention, rope, cached attention, f32 GEMM:
//! not yet run on a GPU) with
//! the device arenas of training state.

pub mod activation;
pub mod arena;
pub mod attention;
pub mod attention_cached;
pub mod attention_mma;
mod attention_simple;
mod buffer;
mod context;
pub mod convert;
pub mod cublaslt;
pub mod embedding;
pub(crate) mod env_switch;
mod error;
pub mod error_bound;
pub mod gemm;
pub mod gemm_dispatch;
pub mod gemm_f32;
pub mod gemm_operands;
pub mod gemm_path;
pub mod gemm_portable;
pub mod hopper;
pub mod kernel_inventory;
mod launch;
pub mod loss;
pub mod nccl;
pub mod norm;
mod op_args;
pub mod optim;
pub mod params;
pub(crate) mod pool;
pub mod quantize;
pub mod rope;
pub mod snapshot;
pub mod staging;
pub mod transfer_times;

pub use buffer::{DeviceBuffer, DeviceElement};
pub use context::{AllocationPeak, CudaDevice, GpuInfo, discover, driver_present, driver_version};
pub use error::describe_error_flag;
pub use quantize::{DequantScales, ScaleAt, StatsVerdict};
