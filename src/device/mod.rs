//! Where work runs: the CPU (the reference kernels) or a CUDA GPU, chosen by
//! the user or automatically, with the same memory accounting on both.

pub mod memory;
pub mod policy;

use std::str::FromStr;
use std::sync::{Arc, Once};

pub use crate::tensor::DeviceKind;
pub use memory::{MemoryCategory, MemoryLedger, MemoryReport, MemoryUsage};
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

    /// A host vector of `len` copies of `value`, counted in this device's ledger under `category`
    /// (the CPU backend's allocator).
    pub fn host_buffer<T: Clone>(&self, len: usize, value: T, category: MemoryCategory) -> HostBuffer<T> {
        HostBuffer::new(vec![value; len], category, self.ledger().clone())
    }
}

/// A host allocation counted in a ledger until dropped.
#[derive(Debug)]
pub struct HostBuffer<T> {
    data: Vec<T>,
    category: MemoryCategory,
    ledger: Arc<MemoryLedger>,
}

impl<T> HostBuffer<T> {
    /// Tracks `data` in `ledger` under `category`.
    pub fn new(data: Vec<T>, category: MemoryCategory, ledger: Arc<MemoryLedger>) -> Self {
        ledger.allocate(category, std::mem::size_of_val(data.as_slice()) as u64);
        HostBuffer { data, category, ledger }
    }
}

impl<T> std::ops::Deref for HostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T> std::ops::DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
}

impl<T> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        self.ledger
            .free(self.category, std::mem::size_of_val(self.data.as_slice()) as u64);
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
    fn cpu_buffers_are_counted_until_dropped() {
        let device = Device::select(DeviceChoice::Cpu).unwrap();
        let buffer = device.host_buffer(1000, 0f32, MemoryCategory::Activations);
        assert_eq!(device.ledger().usage(MemoryCategory::Activations).current, 4000);
        drop(buffer);
        let usage = device.ledger().usage(MemoryCategory::Activations);
        assert_eq!((usage.current, usage.peak), (0, 4000));
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
