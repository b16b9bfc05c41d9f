//! Shadow mode: every op runs on the primary backend and its twin on the CPU
//! backend with the same inputs; the results are compared by the op's contract
//! (`docs/numerics.md`, Op contracts between backends). In-place state (`+=`
//! gradients, AdamW moments, slot banks, GEMM accumulators) is copied before
//! the primary op, so the twin starts from the same state.
//!
//! The `Kernels` implementation is generated with the op list in `mod.rs`;
//! this file holds the handle and the error it raises.

#[cfg(test)]
use std::cell::Cell;
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
            bound: breach.bound,
            ratio: breach.ratio(),
        }
    }
}

/// The CPU backend with the result of `op` moved at element `index` by `ulps` (for
/// `quantize`: one code's lowest mantissa bit flipped).
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Perturbed {
    pub(crate) op: &'static str,
    pub(crate) index: usize,
    pub(crate) ulps: i32,
}

#[cfg(test)]
thread_local! {
    /// The perturbation the CPU primaries of this thread's next `checked_against_cpu` take.
    static PERTURBATION: Cell<Option<Perturbed>> = const { Cell::new(None) };
}

/// Test hook: layers switched to shadow mode on this thread from now on get a perturbed CPU
/// primary (`None`: the plain CPU backend again).
#[cfg(test)]
pub(crate) fn perturb_cpu_primaries(perturbed: Option<Perturbed>) {
    PERTURBATION.with(|p| p.set(perturbed));
}

/// `primary`, perturbed if this thread asked for it and it is the CPU backend.
pub(crate) fn primary_for_tests(primary: Primary) -> Primary {
    #[cfg(test)]
    if let (Primary::Cpu(_), Some(perturbed)) = (&primary, PERTURBATION.with(Cell::get)) {
        return Primary::Perturbed(perturbed);
    }
    primary
}
