//! Shadow mode: every op runs on the primary backend and its twin on the CPU
//! backend with the same inputs; the results are compared by the op's contract
//! (`docs/numerics.md`, Op contracts between backends). In-place state (`+=`
//! gradients, AdamW moments, slot banks, GEMM accumulators) is copied before
//! the primary op, so the twin starts from the same state.
//!
//! The `Kernels` implementation is generated with the op list in `mod.rs`;
//! this file holds the handle and the error it raises.

use std::sync::Arc;

use super::contract::Breach;
use super::{CpuKernels, CudaKernels, Kernels};
use crate::error::Error;
use crate::tensor::DeviceKind;

/// The primary backend of a shadow run.
#[derive(Clone, Debug)]
pub(crate) enum Primary {
    Cpu(CpuKernels),
    Cuda(CudaKernels),
    /// The CPU backend with one op's result moved (tests of the shadow runner itself).
    #[cfg(test)]
    Perturbed(Perturbed),
}

impl Primary {
    pub(crate) fn kernels(&self) -> &dyn Kernels {
        match self {
            Primary::Cpu(k) => k,
            Primary::Cuda(k) => k,
            #[cfg(test)]
            Primary::Perturbed(k) => k,
        }
    }

    pub(crate) fn device(&self) -> DeviceKind {
        match self {
            Primary::Cpu(_) => DeviceKind::Cpu,
            Primary::Cuda(k) => DeviceKind::Cuda(k.ordinal),
            #[cfg(test)]
            Primary::Perturbed(_) => DeviceKind::Cpu,
        }
    }
}

/// A backend shadowed by the CPU, for the ops of one layer.
#[derive(Clone, Debug)]
pub(crate) struct ShadowKernels {
    pub(crate) primary: Primary,
    /// The layer whose ops run here, named in a mismatch.
    pub(crate) layer: Arc<str>,
}

impl ShadowKernels {
    pub(crate) fn mismatch(&self, op: &'static str, breach: Breach) -> Error {
        Error::TwinMismatch {
            op,
            layer: self.layer.to_string(),
            index: breach.index,
            primary: breach.primary,
            cpu: breach.cpu,
        }
    }
}

/// The CPU backend with the result of `op` moved at element `index` by `ulps` (for
/// `quantize`: one code's lowest mantissa bit flipped).
#[cfg(test)]
#[derive(Clone, Debug)]
pub(crate) struct Perturbed {
    pub(crate) op: &'static str,
    pub(crate) index: usize,
    pub(crate) ulps: i32,
}
