//! The device arenas of training state (llm.c style): the f32 master weights,
//! the gradients and the AdamW moments each live in one allocation, every
//! parameter a view at an aligned offset, laid out alike in all three, so one
//! AdamW launch covers every parameter and each arena is one entry in the
//! device's memory ledger. [`ArenaLayout`] is the host-side plan (pure, tested
//! without a GPU); [`CudaDevice::allocate_arenas`] allocates it.

use std::ops::Range;

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::optim::{AdamWSegment, adamw_items};
use super::params::Fp8AdamWItemParams;
use crate::error::{Error, Result};
use crate::memory::{MemoryCategory, human_bytes};

/// Byte alignment of every parameter's view: 256 bytes, what `cuMemAlloc` guarantees for a
/// base address, so a view is as aligned as its own allocation would be (16-byte vector
/// accesses, TMA's 16-byte rule, whole 128-byte lines).
pub const VIEW_ALIGN_BYTES: usize = 256;
const VIEW_ALIGN: usize = VIEW_ALIGN_BYTES / size_of::<f32>();

/// One parameter in the arenas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaEntry {
    /// The parameter's name (unique).
    pub name: String,
    /// First element (a multiple of 64 f32, i.e. 256 bytes).
    pub offset: usize,
    /// Elements.
    pub len: usize,
    /// Whether weight decay applies to it.
    pub decayed: bool,
}

/// Where every parameter lives in the value, gradient and moment arenas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaLayout {
    entries: Vec<ArenaEntry>,
    /// f32 elements of one arena (the value or the gradient arena; the moments take two).
    len: usize,
}

impl ArenaLayout {
    /// Lays out `(name, elements, decayed)` in order, each view starting on a 256-byte boundary.
    pub fn new<'a>(parameters: impl IntoIterator<Item = (&'a str, usize, bool)>) -> Result<Self> {
        let mut entries: Vec<ArenaEntry> = Vec::new();
        let mut len = 0usize;
        for (name, elements, decayed) in parameters {
            if entries.iter().any(|e| e.name == name) {
                return Err(Error::InvalidSetting {
                    setting: "arena parameter",
                    value: name.to_string(),
                    reason: "two parameters with the same name".into(),
                });
            }
            let end = len
                .checked_next_multiple_of(VIEW_ALIGN)
                .and_then(|offset| offset.checked_add(elements).map(|end| (offset, end)));
            let Some((offset, end)) = end else {
                return Err(Error::InvalidShape {
                    what: "parameter arena",
                    reason: format!("{name}: {elements} elements after {len} overflow usize"),
                });
            };
            len = end;
            entries.push(ArenaEntry {
                name: name.to_string(),
                offset,
                len: elements,
                decayed,
            });
        }
        Ok(ArenaLayout { entries, len })
    }

    /// Every parameter, in layout order.
    pub fn entries(&self) -> &[ArenaEntry] {
        &self.entries
    }

    /// f32 elements of the value arena (and of the gradient arena).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no parameter has an element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements of parameter `name` in every arena.
    pub fn view(&self, name: &str) -> Option<Range<usize>> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.offset..e.offset + e.len)
    }

    /// The arena allocations, in the order they are made: `(category, f32 elements)` of the
    /// values, the gradients, `m` and `v`. The device's ledger sees exactly these (each
    /// [`DeviceBuffer`] reports its bytes), plus the AdamW work items (16 bytes per 4096 values,
    /// optimizer state).
    pub fn buffers(&self) -> [(MemoryCategory, usize); 4] {
        [
            (MemoryCategory::MasterWeights, self.len),
            (MemoryCategory::Gradients, self.len),
            (MemoryCategory::OptimizerState, self.len),
            (MemoryCategory::OptimizerState, self.len),
        ]
    }

    /// Bytes of the four arenas together (saturating: a layout past u64 never fits).
    pub fn bytes(&self) -> u64 {
        self.buffers()
            .iter()
            .map(|&(_, n)| (n as u64).saturating_mul(size_of::<f32>() as u64))
            .fold(0u64, u64::saturating_add)
    }

    /// The AdamW segments of every parameter (the same offsets in every arena).
    pub fn adamw_segments(&self) -> Vec<AdamWSegment> {
        self.entries
            .iter()
            .map(|e| AdamWSegment {
                offset: e.offset,
                len: e.len,
                decayed: e.decayed,
            })
            .collect()
    }

    /// Refuses, before anything is allocated, a layout that does not fit in `free` bytes,
    /// saying how much it needs and how much is free.
    pub fn check_fits(&self, free: u64) -> Result<()> {
        let needed = self.bytes();
        if needed <= free {
            return Ok(());
        }
        Err(Error::NotEnoughMemory {
            what: format!(
                "the parameters, gradients and AdamW moments ({} parameters, {} values each)",
                self.entries.len(),
                self.len
            ),
            needed: human_bytes(needed),
            available: human_bytes(free),
        })
    }
}

/// The arenas on a device: values, gradients, and the moments (`m` then `v`, each `len`).
pub struct DeviceArenas {
    /// The layout they follow.
    pub layout: ArenaLayout,
    /// f32 master weights: an allocation of its own, or a view of all of one whose ranges
    /// parameters may hold as their device values ([`CudaDevice::lendable`]).
    pub values: DeviceBuffer<f32>,
    /// f32 gradients, as `values`.
    pub grads: DeviceBuffer<f32>,
    /// f32 AdamW first moments.
    pub m: DeviceBuffer<f32>,
    /// f32 AdamW second moments.
    pub v: DeviceBuffer<f32>,
    /// The AdamW work items of the layout (uploaded once).
    pub items: DeviceBuffer<Fp8AdamWItemParams>,
}

impl CudaDevice {
    /// One AdamW step of every parameter of `arenas` in one launch (`step.decay` for decayed
    /// parameters, 1 for the others). Twin: `ops::adamw_update` per parameter, same bits.
    pub fn adamw_step(&self, arenas: &mut DeviceArenas, step: &crate::ops::AdamWStep) -> Result<()> {
        if arenas.layout.entries().iter().all(|e| e.len == 0) {
            // No work item (the items buffer holds one placeholder, see `allocate_arenas`).
            return Ok(());
        }
        let DeviceArenas {
            values,
            grads,
            m,
            v,
            items,
            ..
        } = arenas;
        self.adamw(items, values, grads, m, v, step)
    }

    /// Allocates the arenas of `layout` (zeroed) as [`ArenaLayout::buffers`] lists them, after
    /// checking that they fit in the free memory (nothing is allocated otherwise).
    pub fn allocate_arenas(&self, layout: ArenaLayout) -> Result<DeviceArenas> {
        // Frees queued on the stream (old arenas whose last ranges just went home) reach the
        // driver's count of free memory once the stream has caught up with them (the default
        // pool keeps nothing back at a synchronization). Arenas are made once a run: one wait.
        self.synchronize()?;
        let (free, _) = self.memory_info()?;
        layout.check_fits(free)?;
        let mut items = adamw_items(&layout.adamw_segments(), layout.len())?;
        if items.is_empty() {
            // The driver refuses a zero-byte allocation: one empty item, never launched.
            items.push(Default::default());
        }
        // A zero-length allocation is refused by the driver: an empty layout gets one element.
        let [values, grads, m, v] = layout
            .buffers()
            .map(|(category, elements)| self.alloc_zeros::<f32>(elements.max(1), category));
        Ok(DeviceArenas {
            values: values?,
            grads: grads?,
            m: m?,
            v: v?,
            items: self.upload(&items, MemoryCategory::OptimizerState)?,
            layout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLedger;

    fn layout() -> ArenaLayout {
        ArenaLayout::new([("tok", 1000, true), ("ln.gamma", 1, false), ("fc.w", 4096 * 3, true)]).unwrap()
    }

    #[test]
    fn views_are_aligned_disjoint_and_in_order() {
        let l = layout();
        assert_eq!(l.view("tok"), Some(0..1000));
        assert_eq!(l.view("ln.gamma"), Some(1024..1025));
        assert_eq!(l.view("fc.w"), Some(1088..1088 + 12288));
        assert_eq!(l.len(), 1088 + 12288);
        assert_eq!(l.view("missing"), None);
        for e in l.entries() {
            assert_eq!((e.offset * 4) % VIEW_ALIGN_BYTES, 0, "{}", e.name);
        }
        for w in l.entries().windows(2) {
            assert!(w[0].offset + w[0].len <= w[1].offset);
        }
    }

    #[test]
    fn the_ledger_sees_each_arena_in_its_category() {
        let l = layout();
        let ledger = MemoryLedger::new();
        for (category, elements) in l.buffers() {
            ledger.allocate(category, (elements * 4) as u64);
        }
        let bytes = (l.len() * 4) as u64;
        assert_eq!(ledger.usage(MemoryCategory::MasterWeights).current, bytes);
        assert_eq!(ledger.usage(MemoryCategory::Gradients).current, bytes);
        assert_eq!(ledger.usage(MemoryCategory::OptimizerState).current, 2 * bytes);
        assert_eq!(l.buffers().map(|(_, n)| n), [l.len(); 4]);
        assert_eq!(ledger.total().current, l.bytes());
        assert_eq!(l.bytes(), 4 * bytes);
    }

    #[test]
    fn adamw_segments_cover_exactly_the_views() {
        let l = layout();
        let segments = l.adamw_segments();
        assert_eq!(segments.len(), 3);
        assert_eq!(
            (segments[1].offset, segments[1].len, segments[1].decayed),
            (1024, 1, false)
        );
        let items = adamw_items(&segments, l.len()).unwrap();
        let covered: usize = items.iter().map(|i| i.len as usize).sum();
        assert_eq!(covered, 1000 + 1 + 12288);
    }

    #[test]
    fn too_big_is_refused_with_needed_and_free() {
        let l = layout();
        assert!(l.check_fits(l.bytes()).is_ok());
        let err = l.check_fits(l.bytes() - 1).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&human_bytes(l.bytes())), "{text}");
        assert!(text.contains(&human_bytes(l.bytes() - 1)), "{text}");
    }

    #[test]
    fn duplicate_names_and_empty_layouts() {
        assert!(ArenaLayout::new([("a", 1, true), ("a", 2, true)]).is_err());
        let empty = ArenaLayout::new([]).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.bytes(), 0);
        assert!(ArenaLayout::new([("a", usize::MAX, true), ("b", 1, true)]).is_err());
    }
}
