//! Where the optimizer's arenas live: the f32 master weights, gradients and
//! AdamW moments of every parameter, laid out by `backend::cuda::arena::ArenaLayout`
//! (aligned views, the same offsets in all four). [`ArenaStore`] is what the
//! trainer's arena optimizer (`train::adamw_arena`) needs of them: copy a range
//! in, copy a range out, one AdamW step over every parameter. The CUDA store
//! (`cuda_ops::arena`) keeps them in device memory, so the moments never cross
//! PCIe during training; [`HostArenas`] is its CPU twin, the same bookkeeping
//! in host vectors, so the orchestration is tested on any machine.

use std::sync::{Arc, Mutex};

use crate::backend::cuda::arena::ArenaLayout;
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;
use crate::ops::AdamWStep;
use crate::tensor::device_values::{ArenaLender, CudaStorage};

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
    /// A lender of `arena[offset..offset + len]` (asked of the value and gradient arenas, for
    /// non-empty ranges) as a parameter's device values, or `None` where this store lends none: a parameter holding the range is the
    /// arena's copy, which the step updates in place ([`Self::holds`]).
    fn lender(&self, arena: Arena, offset: usize, len: usize) -> Option<Arc<dyn ArenaLender>>;
    /// Whether `values` is this store's range of `arena` from `offset` (lent by
    /// [`Self::lender`]): nothing to copy either way.
    fn holds(&self, arena: Arena, offset: usize, values: &CudaStorage) -> bool;
}

/// The four arenas in host memory: the CPU twin of the CUDA store. In tests it may lend ranges
/// of its value and gradient arenas to parameters on a stand-in GPU ([`HostArenas::lending`]).
pub(crate) struct HostArenas {
    layout: ArenaLayout,
    arenas: [Shared; 4],
    /// The stand-in GPU whose parameters may hold ranges of the value and gradient arenas.
    lend_on: Option<usize>,
    /// Lenders lend while it lives (as the CUDA store's).
    alive: Arc<()>,
}

/// One arena's values, shared with the ranges it lends.
type Shared = Arc<Mutex<Vec<f32>>>;

fn lock(arena: &Shared) -> std::sync::MutexGuard<'_, Vec<f32>> {
    arena.lock().unwrap_or_else(|p| p.into_inner())
}

impl HostArenas {
    /// Zeroed arenas of `layout`.
    #[cfg_attr(not(test), allow(dead_code))] // the trainer's stores are the device's; tests use these
    pub(crate) fn new(layout: ArenaLayout) -> Self {
        let arenas = std::array::from_fn(|_| Arc::new(Mutex::new(vec![0.0; layout.len()])));
        HostArenas {
            layout,
            arenas,
            lend_on: None,
            alive: Arc::new(()),
        }
    }

    /// [`Self::new`], lending ranges of the value and gradient arenas to parameters on stand-in
    /// GPU `ordinal` (`tensor::device_values::HostArray`), as the CUDA store lends them on its GPU.
    #[cfg(test)]
    pub(crate) fn lending(layout: ArenaLayout, ordinal: usize) -> Self {
        HostArenas {
            lend_on: Some(ordinal),
            ..Self::new(layout)
        }
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

    fn arena(&self, arena: Arena) -> std::sync::MutexGuard<'_, Vec<f32>> {
        lock(&self.arenas[arena.index()])
    }
}

impl ArenaStore for HostArenas {
    fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    fn write(&mut self, arena: Arena, offset: usize, host: &[f32]) -> Result<()> {
        let range = self.range(offset, host.len(), "arena write past the arena")?;
        self.arena(arena)[range].copy_from_slice(host);
        Ok(())
    }

    fn write_device(&mut self, arena: Arena, offset: usize, values: &CudaStorage) -> Result<()> {
        // The twin reads a stand-in GPU's values as a download would.
        self.write(arena, offset, &values.to_vec()?)
    }

    fn read(&self, arena: Arena, offset: usize, host: &mut [f32]) -> Result<()> {
        let range = self.range(offset, host.len(), "arena read past the arena")?;
        host.copy_from_slice(&self.arena(arena)[range]);
        Ok(())
    }

    fn read_device(&self, arena: Arena, offset: usize, values: &mut CudaStorage) -> Result<()> {
        // The twin writes a stand-in GPU's values as an upload would.
        let range = self.range(offset, values.len(), "arena read past the arena")?;
        let host = self.arena(arena)[range].to_vec();
        values.overwrite(&host)
    }

    fn adamw(&mut self, step: &AdamWStep) -> Result<()> {
        let [values, grads, m, v] = self.arenas.each_ref().map(lock);
        let (mut values, grads, mut m, mut v) = (values, grads, m, v);
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
        Ok(crate::ops::unscale_and_check(&mut self.arena(Arena::Grads), factor))
    }

    fn grad_sum_squares(&self) -> Result<f64> {
        // Parameter by parameter, as `train::clip` sums them on the host.
        let grads = self.arena(Arena::Grads);
        let sums = self
            .layout
            .entries()
            .iter()
            .map(|e| crate::ops::sum_of_squares(&grads[e.offset..e.offset + e.len]));
        Ok(sums.fold(0.0, |total, s| total + s))
    }

    fn lender(&self, arena: Arena, offset: usize, len: usize) -> Option<Arc<dyn ArenaLender>> {
        lend_range(self.lend_on?, &self.alive, &self.arenas[arena.index()], offset, len)
    }

    fn holds(&self, arena: Arena, offset: usize, values: &CudaStorage) -> bool {
        // Only a range this store lent points into its allocation.
        let allocation = Arc::as_ptr(&self.arenas[arena.index()]) as usize;
        values.arena_view() == Some((allocation, offset))
    }
}

/// A lender of `arena[offset..offset + len]` to stand-in GPU `ordinal` (tests only: elsewhere
/// host arenas lend nothing).
#[cfg(test)]
fn lend_range(
    ordinal: usize,
    alive: &Arc<()>,
    arena: &Shared,
    offset: usize,
    len: usize,
) -> Option<Arc<dyn ArenaLender>> {
    Some(Arc::new(stand_in::Lender {
        ordinal,
        alive: Arc::downgrade(alive),
        arena: Arc::downgrade(arena),
        offset,
        len,
    }))
}

#[cfg(not(test))]
fn lend_range(
    _ordinal: usize,
    _alive: &Arc<()>,
    _arena: &Shared,
    _offset: usize,
    _len: usize,
) -> Option<Arc<dyn ArenaLender>> {
    None
}

/// Ranges of host arenas playing a GPU's views of its arenas, for tests of the code around them.
#[cfg(test)]
mod stand_in {
    use std::any::Any;
    use std::sync::{Arc, Weak};

    use super::{Shared, lock};
    use crate::error::Result;
    use crate::tensor::device_values::{ArenaLender, CudaStorage, DeviceArray, HostArray};

    /// Lends [`Range`]s while its arena lives.
    #[derive(Debug)]
    pub(super) struct Lender {
        pub(super) ordinal: usize,
        pub(super) alive: Weak<()>,
        pub(super) arena: Weak<std::sync::Mutex<Vec<f32>>>,
        pub(super) offset: usize,
        pub(super) len: usize,
    }

    impl ArenaLender for Lender {
        fn ordinal(&self) -> usize {
            self.ordinal
        }
        fn len(&self) -> usize {
            self.len
        }
        fn lend(&self) -> Result<Option<CudaStorage>> {
            if self.alive.upgrade().is_none() {
                return Ok(None);
            }
            Ok(self.arena.upgrade().map(|arena| {
                CudaStorage::new(Box::new(Range {
                    ordinal: self.ordinal,
                    arena,
                    offset: self.offset,
                    len: self.len,
                }))
            }))
        }
    }

    /// `len` values of an arena from `offset`: reads and writes go to the arena.
    #[derive(Debug)]
    pub(crate) struct Range {
        ordinal: usize,
        arena: Shared,
        offset: usize,
        len: usize,
    }

    impl Range {
        fn values(&self) -> std::ops::Range<usize> {
            self.offset..self.offset + self.len
        }
    }

    impl DeviceArray for Range {
        fn ordinal(&self) -> usize {
            self.ordinal
        }
        fn len(&self) -> usize {
            self.len
        }
        fn read(&self, out: &mut [f32]) -> Result<()> {
            out.copy_from_slice(&lock(&self.arena)[self.values()]);
            Ok(())
        }
        fn duplicate(&self) -> Result<Box<dyn DeviceArray>> {
            Ok(Box::new(HostArray {
                ordinal: self.ordinal,
                values: lock(&self.arena)[self.values()].to_vec(),
            }))
        }
        fn blank(&self) -> Result<Box<dyn DeviceArray>> {
            Ok(Box::new(HostArray {
                ordinal: self.ordinal,
                values: vec![f32::NAN; self.len],
            }))
        }
        fn zero(&mut self) -> Result<()> {
            let range = self.values();
            lock(&self.arena)[range].fill(0.0);
            Ok(())
        }
        fn write(&mut self, host: &[f32]) -> Result<()> {
            let range = self.values();
            lock(&self.arena)[range].copy_from_slice(host);
            Ok(())
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
        fn arena_view(&self) -> Option<(usize, usize)> {
            Some((Arc::as_ptr(&self.arena) as usize, self.offset))
        }
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
