//! Where the optimizer's arenas live: the f32 master weights, gradients and
//! AdamW moments of every parameter, laid out by `backend::cuda::arena::ArenaLayout`
//! (aligned views, the same offsets in all four). [`ArenaStore`] is what the
//! trainer's arena optimizer (`train::adamw_arena`) needs of them: copy a range
//! in, copy a range out, one AdamW step over every parameter. The CUDA store
//! (`cuda_ops::arena`) keeps them in device memory, so the moments never cross
//! PCIe during training; [`HostArenas`] is its CPU twin, the same bookkeeping
//! in host vectors, so the orchestration is tested on any machine.

use crate::backend::cuda::arena::ArenaLayout;
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;
use crate::ops::AdamWStep;
use crate::tensor::device_values::CudaStorage;

/// One of the four arenas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arena {
    /// f32 master weights.
    Values,
    /// f32 gradients.
    Grads,
    /// AdamW first moments.
    M,
    /// AdamW second moments.
    V,
}

impl Arena {
    fn index(self) -> usize {
        self as usize
    }
}

/// The arenas of one optimizer, wherever they live.
pub(crate) trait ArenaStore: Send + Sync {
    /// Their layout.
    fn layout(&self) -> &ArenaLayout;
    /// Overwrites `arena[offset..offset + host.len()]` with `host`.
    fn write(&mut self, arena: Arena, offset: usize, host: &[f32]) -> Result<()>;
    /// Overwrites `arena[offset..offset + values.len()]` with values on the store's own GPU (a
    /// copy there; values on another device are `DeviceMismatch`).
    fn write_device(&mut self, arena: Arena, offset: usize, values: &CudaStorage) -> Result<()>;
    /// Copies `arena[offset..offset + host.len()]` into `host`.
    fn read(&self, arena: Arena, offset: usize, host: &mut [f32]) -> Result<()>;
    /// Copies `arena[offset..offset + values.len()]` into values on the store's own GPU (a copy
    /// there; values on another device are `DeviceMismatch`).
    fn read_device(&self, arena: Arena, offset: usize, values: &mut CudaStorage) -> Result<()>;
    /// One AdamW step of every parameter: `step` for the decayed ones, `step` with decay 1 for
    /// the others (`ops::adamw_update` per parameter, same bits).
    fn adamw(&mut self, step: &AdamWStep) -> Result<()>;
    /// Bytes these arenas book in their device's memory ledger under `category` (0 in host memory).
    fn device_bytes(&self, category: MemoryCategory) -> u64;
    /// Multiplies every gradient by `factor` (`ops::unscale_and_check` over the gradient arena,
    /// whose zero padding stays zero); whether every result is finite.
    fn scale_grads(&mut self, factor: f32) -> Result<bool>;
    /// The sum of the gradients' squares in f64 (the twin: `ops::sum_of_squares` per parameter,
    /// added in order; a device sums in its own order, within `sum_squares_bound`).
    fn grad_sum_squares(&self) -> Result<f64>;
}

/// The four arenas in host memory: the CPU twin of the CUDA store.
pub(crate) struct HostArenas {
    layout: ArenaLayout,
    arenas: [Vec<f32>; 4],
}

impl HostArenas {
    /// Zeroed arenas of `layout`.
    #[cfg_attr(not(test), allow(dead_code))] // the trainer's stores are the device's; tests use these
    pub(crate) fn new(layout: ArenaLayout) -> Self {
        let arenas = std::array::from_fn(|_| vec![0.0; layout.len()]);
        HostArenas { layout, arenas }
    }

    fn range(&self, offset: usize, len: usize, what: &'static str) -> Result<std::ops::Range<usize>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.layout.len() => Ok(offset..end),
            _ => Err(Error::LengthMismatch {
                what,
                src: offset.saturating_add(len),
                dst: self.layout.len(),
            }),
        }
    }
}

impl ArenaStore for HostArenas {
    fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    fn write(&mut self, arena: Arena, offset: usize, host: &[f32]) -> Result<()> {
        let range = self.range(offset, host.len(), "arena write past the arena")?;
        self.arenas[arena.index()][range].copy_from_slice(host);
        Ok(())
    }

    fn write_device(&mut self, arena: Arena, offset: usize, values: &CudaStorage) -> Result<()> {
        // The twin reads a stand-in GPU's values as a download would.
        self.write(arena, offset, &values.to_vec()?)
    }

    fn read(&self, arena: Arena, offset: usize, host: &mut [f32]) -> Result<()> {
        let range = self.range(offset, host.len(), "arena read past the arena")?;
        host.copy_from_slice(&self.arenas[arena.index()][range]);
        Ok(())
    }

    fn read_device(&self, arena: Arena, offset: usize, values: &mut CudaStorage) -> Result<()> {
        // The twin writes a stand-in GPU's values as an upload would.
        let range = self.range(offset, values.len(), "arena read past the arena")?;
        values.overwrite(&self.arenas[arena.index()][range])
    }

    fn adamw(&mut self, step: &AdamWStep) -> Result<()> {
        let [values, grads, m, v] = &mut self.arenas;
        for e in self.layout.entries() {
            let r = e.offset..e.offset + e.len;
            let step = AdamWStep {
                decay: if e.decayed { step.decay } else { 1.0 },
                ..*step
            };
            crate::ops::adamw_update(
                &mut values[r.clone()],
                &grads[r.clone()],
                &mut m[r.clone()],
                &mut v[r],
                &step,
            )?;
        }
        Ok(())
    }

    fn device_bytes(&self, _category: MemoryCategory) -> u64 {
        0
    }

    fn scale_grads(&mut self, factor: f32) -> Result<bool> {
        Ok(crate::ops::unscale_and_check(
            &mut self.arenas[Arena::Grads.index()],
            factor,
        ))
    }

    fn grad_sum_squares(&self) -> Result<f64> {
        // Parameter by parameter, as `train::clip` sums them on the host.
        let grads = &self.arenas[Arena::Grads.index()];
        let sums = self
            .layout
            .entries()
            .iter()
            .map(|e| crate::ops::sum_of_squares(&grads[e.offset..e.offset + e.len]));
        Ok(sums.fold(0.0, |total, s| total + s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_past_the_arena_are_errors_and_change_nothing() {
        let layout = ArenaLayout::new([("a", 3, true), ("b", 2, false)]).unwrap();
        let mut store = HostArenas::new(layout);
        let n = store.layout().len();
        store.write(Arena::M, n - 2, &[1.0, 2.0]).unwrap();
        assert!(store.write(Arena::M, n - 1, &[1.0, 2.0]).is_err());
        assert!(store.write(Arena::M, usize::MAX, &[1.0]).is_err());
        let mut back = [0.0; 2];
        store.read(Arena::M, n - 2, &mut back).unwrap();
        assert_eq!(back, [1.0, 2.0]);
        assert!(store.read(Arena::V, n - 1, &mut back).is_err());
        // The other arenas are untouched.
        store.read(Arena::V, n - 2, &mut back).unwrap();
        assert_eq!(back, [0.0, 0.0]);
    }
}
