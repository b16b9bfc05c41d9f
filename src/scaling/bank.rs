//! A bank of delayed-scaling slots laid out the way the cast and update
//! kernels read them: `scale[slots]`, `scale_inv[slots]` and
//! `history[slots, len]` in three flat vectors. A linear layer keeps one bank
//! for its five slots; one `delayed_update` per bank per pass updates the
//! forward or the backward ones. [`DelayedSlot`] stays the view checkpoints
//! save and load, so their format does not change.

use super::delayed::{DelayedSlot, update_in_place};
use super::recipe::DelayedScaling;
use crate::format::Fp8Format;

/// `slots` delayed-scaling slots with histories of `len` amaxes each.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotBank {
    len: usize,
    scale: Vec<f32>,
    scale_inv: Vec<f32>,
    history: Vec<f32>,
}

impl SlotBank {
    /// Every value of the bank in a fixed order (scales, scale_invs, histories), for comparing two banks.
    pub(crate) fn values(&self) -> Vec<f32> {
        [&self.scale[..], &self.scale_inv[..], &self.history[..]].concat()
    }

    /// Every slot as [`DelayedSlot::new`] makes it: scale 1, scale_inv 1, a history of zeros
    /// (`len` is raised to 1 like there).
    pub fn new(slots: usize, len: usize) -> Self {
        let len = len.max(1);
        SlotBank {
            len,
            scale: vec![1.0; slots],
            scale_inv: vec![1.0; slots],
            history: vec![0.0; slots * len],
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.scale.len()
    }

    /// The scale slot `i` casts with.
    pub fn scale(&self, i: usize) -> f32 {
        self.scale[i]
    }

    /// This step's amax of slot `i` so far (its `history[0]`).
    pub fn current_amax(&self, i: usize) -> f32 {
        self.history[i * self.len]
    }

    /// Overwrites the current amax of slot `i` (a cross-rank reduction's result).
    pub fn set_current_amax(&mut self, i: usize, amax: f32) {
        self.history[i * self.len] = amax;
    }

    /// What a cast of slot `i` leaves behind, as [`DelayedSlot::record_cast`]: the amax
    /// max-accumulated into the slot's `history[0]`, `scale_inv = 1/scale`.
    pub fn record_cast(&mut self, i: usize, amax: f32) {
        let first = &mut self.history[i * self.len];
        *first = first.max(amax);
        self.scale_inv[i] = 1.0 / self.scale[i];
    }

    /// The delayed-scaling update of the slots `slots[k]`, slot `slots[k]` in `formats[k]`
    /// (`docs/numerics.md`, delayed scaling): the same code as [`DelayedSlot::update`].
    pub fn update(&mut self, slots: &[usize], formats: &[Fp8Format], recipe: &DelayedScaling) {
        for (&i, &format) in slots.iter().zip(formats) {
            let history = &mut self.history[i * self.len..(i + 1) * self.len];
            update_in_place(&mut self.scale[i], history, recipe, format);
        }
    }

    /// A copy of slot `i` as a [`DelayedSlot`].
    pub fn view(&self, i: usize) -> DelayedSlot {
        DelayedSlot {
            scale: self.scale[i],
            scale_inv: self.scale_inv[i],
            history: self.history[i * self.len..(i + 1) * self.len].to_vec(),
        }
    }

    /// Calls `f` on slot `i` as a [`DelayedSlot`] and stores what it leaves. A history of
    /// another length is not stored (checkpoints refuse such a file before they get here).
    pub fn with_slot<R>(&mut self, i: usize, f: impl FnOnce(&mut DelayedSlot) -> R) -> R {
        let mut slot = self.view(i);
        let result = f(&mut slot);
        if slot.history.len() == self.len {
            self.scale[i] = slot.scale;
            self.scale_inv[i] = slot.scale_inv;
            self.history[i * self.len..(i + 1) * self.len].copy_from_slice(&slot.history);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::AmaxComputeAlgo;

    #[test]
    fn a_bank_slot_follows_a_delayed_slot_bit_for_bit() {
        for algo in [AmaxComputeAlgo::Max, AmaxComputeAlgo::MostRecent] {
            let recipe = DelayedScaling {
                amax_history_len: 3,
                amax_compute_algo: algo,
                ..DelayedScaling::default()
            };
            let mut bank = SlotBank::new(2, 3);
            let mut lone = DelayedSlot::new(3);
            let amaxes = [3.5f32, 0.0, 1e-30, f32::NAN, 7.0, 0.25, 1e30, 2.0];
            for (step, &amax) in amaxes.iter().enumerate() {
                bank.record_cast(1, amax);
                lone.record_cast(amax);
                bank.update(&[1], &[Fp8Format::E5M2], &recipe);
                lone.update(&recipe, Fp8Format::E5M2);
                assert_eq!(bank.view(1), lone, "{algo:?} step {step}");
                assert_eq!(bank.view(0), DelayedSlot::new(3), "slot 0 was never cast");
            }
        }
    }

    #[test]
    fn with_slot_writes_back_what_the_view_left() {
        let mut bank = SlotBank::new(3, 2);
        let saved = DelayedSlot {
            scale: 4.0,
            scale_inv: 0.25,
            history: vec![0.0, 9.0],
        };
        bank.with_slot(2, |s| *s = saved.clone());
        assert_eq!(bank.view(2), saved);
        assert_eq!(bank.scale(2), 4.0);
        bank.with_slot(1, |s| s.history = vec![1.0; 5]);
        assert_eq!(
            bank.view(1),
            DelayedSlot::new(2),
            "a history of another length is not stored"
        );
    }
}
