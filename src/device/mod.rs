//! Where work runs: the CPU (the reference kernels) or a CUDA GPU, chosen by
//! the user or automatically, with the same memory accounting on both.

pub mod policy;

use std::str::FromStr;
use std::sync::{Arc, Once};

pub use crate::memory::{MemoryCategory, MemoryLedger, MemoryReport, MemoryUsage};
pub use crate::tensor::DeviceKind;
pub use policy::PrecisionPolicy;

use crate::backend::cuda::CudaDevice;
use crate::error::{Error, Result};

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// CUDA GPU 0 if usable, else the CPU (said once on stderr).
    #[default]
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// CUDA GPU with this ordinal; an error if it cannot be used.
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = Error;

    /// `auto`, `cpu`, `cuda` (GPU 0) or `cuda:N`.
    fn from_str(text: &str) -> Result<Self> {
        let unknown = || Error::UnknownDevice { name: text.to_string() };
        match text {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => text
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(unknown),
        }
    }
}

/// The CPU backend: the reference kernels plus a memory ledger.
#[derive(Debug, Default)]
pub struct CpuDevice {
    ledger: Arc<MemoryLedger>,
}

/// A device that kernels run on.
#[derive(Debug)]
pub enum Device {
    /// The CPU reference backend.
    Cpu(CpuDevice),
    /// A CUDA GPU.
    Cuda(CudaDevice),
}

static AUTO_NOTE: Once = Once::new();

impl Device {
    /// Opens the device the user chose; `Auto` falls back to the CPU and says why once on stderr.
    pub fn select(choice: DeviceChoice) -> Result<Device> {
        match choice {
            DeviceChoice::Cpu => Ok(Device::Cpu(CpuDevice::default())),
            DeviceChoice::Cuda(ordinal) => CudaDevice::open(ordinal).map(Device::Cuda),
            DeviceChoice::Auto => match CudaDevice::open(0) {
                Ok(gpu) => {
                    let info = gpu.info();
                    let (major, minor) = info.compute_capability;
                    AUTO_NOTE.call_once(|| eprintln!("fp8: using GPU 0: {} (sm_{major}{minor})", info.name));
                    Ok(Device::Cuda(gpu))
                }
                Err(err) => {
                    AUTO_NOTE.call_once(|| eprintln!("fp8: using the CPU ({err})"));
                    Ok(Device::Cpu(CpuDevice::default()))
                }
            },
        }
    }

    /// Bytes in use and peak bytes of this device by category.
    pub fn ledger(&self) -> &Arc<MemoryLedger> {
        match self {
            Device::Cpu(cpu) => &cpu.ledger,
            Device::Cuda(gpu) => gpu.ledger(),
        }
    }

    /// The kind and ordinal of this device, as tensors name it.
    pub fn kind(&self) -> DeviceKind {
        match self {
            Device::Cpu(_) => DeviceKind::Cpu,
            Device::Cuda(gpu) => DeviceKind::Cuda(gpu.info().ordinal),
        }
    }

    /// Free memory of a GPU as its driver reports it now; `None` for the CPU (whose limit is the
    /// host's available memory) or when the driver cannot say.
    pub fn free_memory(&self) -> Option<u64> {
        match self {
            Device::Cpu(_) => None,
            Device::Cuda(gpu) => gpu.memory_info().ok().map(|(free, _)| free),
        }
    }

    /// Whether layers on this device keep their activations on it between ops: a GPU unless
    /// `FP8_CUDA_RESIDENT=0` (then every CUDA op stages host tensors). Always false on the CPU.
    pub fn resident_layers(&self) -> bool {
        matches!(self, Device::Cuda(_)) && crate::backend::cuda::env_switch::resident_layers()
    }

    /// Whether resident layers on this device keep their delayed-scaling slot banks on it
    /// (`FP8_CUDA_DEVICE_BANKS=1`, opt-in until a GPU run validates it). Always false on the CPU.
    pub fn device_slot_banks(&self) -> bool {
        self.resident_layers() && crate::backend::cuda::env_switch::device_slot_banks()
    }

    /// A short description: "cpu" or "cuda:0 (NVIDIA H100 ..., sm_90)".
    pub fn describe(&self) -> String {
        match self {
            Device::Cpu(_) => "cpu".to_string(),
            Device::Cuda(gpu) => {
                let info = gpu.info();
                let (major, minor) = info.compute_capability;
                format!("cuda:{} ({}, sm_{major}{minor})", info.ordinal, info.name)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse() {
        assert_eq!("auto".parse::<DeviceChoice>(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse::<DeviceChoice>(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("cuda:3".parse::<DeviceChoice>(), Ok(DeviceChoice::Cuda(3)));
        assert!("gpu".parse::<DeviceChoice>().is_err());
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn a_gpu_request_without_a_usable_gpu_is_an_error_not_a_panic() {
        // On a GPU machine this opens the GPU; elsewhere it must be a typed error.
        match Device::select(DeviceChoice::Cuda(0)) {
            Ok(Device::Cuda(_)) => {}
            Ok(Device::Cpu(_)) => panic!("asked for CUDA, got the CPU"),
            Err(err) => assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}"),
        }
    }
}
