//! Which device a tensor's values live on, as a small copyable name. It sits
//! with the tensor types (not in `device`) so that `tensor` depends on no
//! backend; `device::Device::kind` names an opened device the same way.

use std::fmt;

/// A device a tensor can live on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host memory, the CPU reference backend.
    Cpu,
    /// The CUDA GPU with this ordinal.
    Cuda(usize),
}

impl fmt::Display for DeviceKind {
    /// `cpu` or `cuda:N`, the spelling `--device` takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKind::Cpu => write!(f, "cpu"),
            DeviceKind::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}
