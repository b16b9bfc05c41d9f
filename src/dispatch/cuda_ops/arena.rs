//! The optimizer's arenas in device memory (`backend::cuda::arena::DeviceArenas`):
//! the moments stay on the GPU for the whole run, and each step moves the
//! master weights and gradients in and the weights out in a few bulk copies
//! instead of each parameter's staged AdamW op (four uploads, three downloads).

use std::sync::{Arc, Weak};

use super::resident::CudaValues;
use super::{Staged, staged};
use crate::backend::cuda::DeviceBuffer;
use crate::backend::cuda::arena::{ArenaLayout, DeviceArenas};
use crate::backend::cuda::params::Fp8AdamWItemParams;
use crate::dispatch::CudaKernels;
use crate::dispatch::arena_store::{Arena, ArenaStore};
use crate::error::Result;
use crate::memory::MemoryCategory;
use crate::ops::AdamWStep;
use crate::tensor::device_values::{ArenaLender, CudaStorage};

/// The arenas of one optimizer on one GPU (the device the staged ops use).
pub(crate) struct CudaArenas {
    staged: Arc<Staged>,
    ordinal: usize,
    /// With `FP8_CUDA_ARENA_VIEWS=1`, the value and gradient arenas are views of their
    /// allocations, whose ranges parameters may hold.
    arenas: DeviceArenas,
    /// Lenders lend while it lives: the arenas' allocations outlive them while parameters hold
    /// ranges, but no new range of arenas that are gone is lent.
    alive: Arc<()>,
}

/// Allocates the arenas of `layout` on the GPU of `kernels` (zeroed; refused before anything is
/// allocated when they do not fit in its free memory, saying how much they need).
pub(crate) fn arena_store(kernels: &CudaKernels, layout: ArenaLayout) -> Result<Box<dyn ArenaStore>> {
    let staged = staged(kernels)?;
    let mut arenas = staged.device().allocate_arenas(layout)?;
    if crate::backend::cuda::env_switch::arena_views() {
        // The value and gradient arenas become views of their allocations, whose ranges the
        // parameters may then hold.
        let device = staged.device();
        arenas.values = device.lendable(arenas.values)?;
        arenas.grads = device.lendable(arenas.grads)?;
    }
    Ok(Box::new(CudaArenas {
        staged,
        ordinal: kernels.ordinal,
        arenas,
        alive: Arc::new(()),
    }))
}

/// A parameter's range of a value or gradient arena, lent as its device values
/// ([`ArenaLender`]): a view of the arena's allocation, held weakly until lent, and only while
/// the arenas live.
struct CudaLender {
    staged: Arc<Staged>,
    ordinal: usize,
    alive: Weak<()>,
    allocation: Weak<DeviceBuffer<f32>>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for CudaLender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaLender(cuda:{}, {} values from {})",
            self.ordinal, self.len, self.offset
        )
    }
}

impl ArenaLender for CudaLender {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn len(&self) -> usize {
        self.len
    }

    fn lend(&self) -> Result<Option<CudaStorage>> {
        let (Some(_alive), Some(allocation)) = (self.alive.upgrade(), self.allocation.upgrade()) else {
            return Ok(None);
        };
        let view = self.staged.device().view(&allocation, self.offset, self.len)?;
        Ok(Some(CudaValues::lent(self.staged.clone(), self.ordinal, view)))
    }
}

impl CudaArenas {
    fn buffer(&self, arena: Arena) -> &DeviceBuffer<f32> {
        match arena {
            Arena::Values => &self.arenas.values,
            Arena::Grads => &self.arenas.grads,
            Arena::M => &self.arenas.m,
            Arena::V => &self.arenas.v,
        }
    }

    fn buffer_mut(&mut self, arena: Arena) -> &mut DeviceBuffer<f32> {
        match arena {
            Arena::Values => &mut self.arenas.values,
            Arena::Grads => &mut self.arenas.grads,
            Arena::M => &mut self.arenas.m,
            Arena::V => &mut self.arenas.v,
        }
    }
}

impl ArenaStore for CudaArenas {
    fn layout(&self) -> &ArenaLayout {
        &self.arenas.layout
    }

    fn write(&mut self, arena: Arena, offset: usize, host: &[f32]) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let staged = self.staged.clone();
        staged.device().write_at(host, self.buffer_mut(arena), offset)
    }

    fn write_device(&mut self, arena: Arena, offset: usize, values: &CudaStorage) -> Result<()> {
        if values.len() == 0 {
            return Ok(());
        }
        let staged = self.staged.clone();
        let src = staged.own("optimizer arenas", values.array())?;
        staged.device().copy_at(src, self.buffer_mut(arena), offset)
    }

    fn read(&self, arena: Arena, offset: usize, host: &mut [f32]) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        self.staged.device().read_at(self.buffer(arena), offset, host)
    }

    fn read_device(&self, arena: Arena, offset: usize, values: &mut CudaStorage) -> Result<()> {
        if values.len() == 0 {
            return Ok(());
        }
        let staged = self.staged.clone();
        let dst = staged.own_mut("optimizer arenas", values, false)?;
        staged.device().copy_from_at(self.buffer(arena), offset, dst)
    }

    fn adamw(&mut self, step: &AdamWStep) -> Result<()> {
        let staged = self.staged.clone();
        staged.device().adamw_step(&mut self.arenas, step)
    }

    fn scale_grads(&mut self, factor: f32) -> Result<bool> {
        let staged = self.staged.clone();
        staged.device().unscale_and_check(&mut self.arenas.grads, factor)
    }

    fn grad_sum_squares(&self) -> Result<f64> {
        self.staged.device().sum_squares(&self.arenas.grads)
    }

    fn lender(&self, arena: Arena, offset: usize, len: usize) -> Option<Arc<dyn ArenaLender>> {
        // Only arenas made lendable (the switch on) are views of their allocations.
        let allocation = self.buffer(arena).view_base()?;
        Some(Arc::new(CudaLender {
            staged: self.staged.clone(),
            ordinal: self.ordinal,
            alive: Arc::downgrade(&self.alive),
            allocation: Arc::downgrade(allocation),
            offset,
            len,
        }))
    }

    fn holds(&self, arena: Arena, offset: usize, values: &CudaStorage) -> bool {
        let allocation = self.buffer(arena).view_base();
        allocation.is_some_and(|a| values.arena_view() == Some((Arc::as_ptr(a) as usize, offset)))
    }

    fn device_bytes(&self, category: MemoryCategory) -> u64 {
        let a = &self.arenas;
        let f32s = |b: &DeviceBuffer<f32>| (b.len() * size_of::<f32>()) as u64;
        match category {
            MemoryCategory::MasterWeights => f32s(&a.values),
            MemoryCategory::Gradients => f32s(&a.grads),
            MemoryCategory::OptimizerState => {
                f32s(&a.m) + f32s(&a.v) + (a.items.len() * size_of::<Fp8AdamWItemParams>()) as u64
            }
            _ => 0,
        }
    }
}
