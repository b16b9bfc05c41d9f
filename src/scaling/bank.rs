//! A bank of delayed-scaling slots laid out the way the cast and update
//! kernels read them: `scale[slots]`, `scale_inv[slots]` and
//! `history[slots, len]` in three flat vectors. A linear layer keeps one bank
//! for its five slots; one `delayed_update` per bank per pass updates the
//! forward or the backward ones. [`DelayedSlot`] stays the view checkpoints
//! save and load, so their format does not change.
//!
//! A layer running on a GPU may keep its bank there ([`DeviceBank`]): casts and
//! GEMMs fold their amax into it and the update runs in place, so no op waits
//! to read an amax back (`docs/cuda-backend.md`, Slot banks on the device).
//! Every host accessor still sees the whole bank: readers download it, writers
//! bring it home first, and the layer takes it up again at its next pass.

use std::any::Any;
use std::fmt::Debug;

use super::delayed::{DelayedSlot, update_in_place};
use super::recipe::DelayedScaling;
use crate::error::Result;
use crate::format::Fp8Format;

/// A bank's `scale[slots] | history[slots, len]` on a GPU, kept by that GPU's backend
/// (`dispatch::cuda_ops::slot_bank`), authoritative while it is there. Its `scale_inv` stays
/// the host's (set from the scale each cast used, which the host knows).
pub(crate) trait DeviceBank: Debug + Send + Sync {
    /// The GPU holding it.
    fn ordinal(&self) -> usize;
    /// `scale[slots] | history[slots, len]`, downloaded after every write queued to them.
    fn read(&self) -> Result<Vec<f32>>;
    /// Overwrites the copy with `host` (`scale[slots] | history[slots, len]`): a bank that came
    /// home goes up again into the buffers it had.
    fn reload(&mut self, host: &[f32]) -> Result<()>;
    /// Slot `slot`'s scale as the last update queued on the device left it, waiting for that
    /// update only if it changed the slot (its scales are copied out behind it); `None`: the
    /// host's scale holds.
    fn updated_scale(&self, slot: usize) -> Result<Option<f32>>;
    /// The backend's own type, to reach its buffer.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// `slots` delayed-scaling slots with histories of `len` amaxes each.
#[derive(Debug)]
pub struct SlotBank {
    len: usize,
    scale: Vec<f32>,
    scale_inv: Vec<f32>,
    history: Vec<f32>,
    /// The bank's copy on a GPU. While `on_device`, its scales and histories there are the
    /// bank's (the host's history is stale, its scales those before the device's first
    /// update); after the bank came home it is kept to go up into again.
    device: Option<Box<dyn DeviceBank>>,
    on_device: bool,
}

/// A copy in host memory (a bank on a GPU is downloaded).
///
/// # Panics
/// If that download fails (the GPU is gone); `SlotBank::bring_home` returns the error.
impl Clone for SlotBank {
    fn clone(&self) -> Self {
        let (scale, history) = self.host_state();
        SlotBank {
            len: self.len,
            scale,
            scale_inv: self.scale_inv.clone(),
            history,
            device: None,
            on_device: false,
        }
    }
}

/// Equal values, wherever they live.
impl PartialEq for SlotBank {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.values() == other.values()
    }
}

impl SlotBank {
    /// Every value of the bank in a fixed order (scales, scale_invs, histories), for comparing
    /// two banks (a bank on a GPU is read there: panics as [`Clone`] if it cannot be).
    pub(crate) fn values(&self) -> Vec<f32> {
        let (scale, history) = self.host_state();
        [&scale[..], &self.scale_inv[..], &history[..]].concat()
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
            device: None,
            on_device: false,
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.scale.len()
    }

    /// Amaxes each slot's history holds.
    pub(crate) fn history_len(&self) -> usize {
        self.len
    }

    /// The scale slot `i` casts with.
    ///
    /// # Panics
    /// For a bank on a GPU whose last update cannot be read back (the GPU is gone);
    /// `SlotBank::scale_now` returns the error.
    pub fn scale(&self, i: usize) -> f32 {
        self.scale_now(i)
            .unwrap_or_else(|e| panic!("a delayed-scaling scale could not come back from its GPU: {e}"))
    }

    /// [`Self::scale`], or the error of reading a device update's scale back.
    pub(crate) fn scale_now(&self, i: usize) -> Result<f32> {
        match self.live_device() {
            Some(device) => Ok(device.updated_scale(i)?.unwrap_or(self.scale[i])),
            None => Ok(self.scale[i]),
        }
    }

    /// This step's amax of slot `i` so far (its `history[0]`; read from a bank on a GPU, with
    /// the panic of [`Clone`]).
    pub fn current_amax(&self, i: usize) -> f32 {
        self.host_state().1[i * self.len]
    }

    /// This step's amax of every slot, in slot order (one read of a bank on a GPU).
    pub(crate) fn current_amaxes(&self) -> Vec<f32> {
        let (_, history) = self.host_state();
        history.iter().step_by(self.len).copied().collect()
    }

    /// Overwrites the current amax of slot `i` (a cross-rank reduction's result). A bank on a
    /// GPU comes home first (with the panic of [`Clone`]).
    pub fn set_current_amax(&mut self, i: usize, amax: f32) {
        self.home();
        self.history[i * self.len] = amax;
    }

    /// What a cast of slot `i` leaves behind, as [`DelayedSlot::record_cast`]: the amax
    /// max-accumulated into the slot's `history[0]`, `scale_inv = 1/scale`. A bank on a GPU
    /// comes home first (with the panic of [`Clone`]); the layers fold a device amax into it
    /// there instead (`Kernels::record_amax`).
    pub fn record_cast(&mut self, i: usize, amax: f32) {
        self.home();
        let first = &mut self.history[i * self.len];
        *first = first.max(amax);
        self.scale_inv[i] = 1.0 / self.scale[i];
    }

    /// The host's half of a cast recorded on the device (its amax folded into `history[0]`
    /// there): `scale_inv = 1/scale` of the scale the cast used.
    pub(crate) fn recorded_on_device(&mut self, i: usize) -> Result<()> {
        self.scale_inv[i] = 1.0 / self.scale_now(i)?;
        Ok(())
    }

    /// The delayed-scaling update of the slots `slots[k]`, slot `slots[k]` in `formats[k]`
    /// (`docs/numerics.md`, delayed scaling): the same code as [`DelayedSlot::update`]. A bank
    /// on a GPU comes home first (with the panic of [`Clone`]); the layers update it there
    /// instead (`Kernels::delayed_update`).
    pub fn update(&mut self, slots: &[usize], formats: &[Fp8Format], recipe: &DelayedScaling) {
        self.home();
        for (&i, &format) in slots.iter().zip(formats) {
            let history = &mut self.history[i * self.len..(i + 1) * self.len];
            update_in_place(&mut self.scale[i], history, recipe, format);
        }
    }

    /// A copy of slot `i` as a [`DelayedSlot`] (read from a bank on a GPU, with the panic of
    /// [`Clone`]).
    pub fn view(&self, i: usize) -> DelayedSlot {
        let (scale, history) = self.host_state();
        DelayedSlot {
            scale: scale[i],
            scale_inv: self.scale_inv[i],
            history: history[i * self.len..(i + 1) * self.len].to_vec(),
        }
    }

    /// Calls `f` on slot `i` as a [`DelayedSlot`] and stores what it leaves. A history of
    /// another length is not stored (checkpoints refuse such a file before they get here). A
    /// bank on a GPU comes home first (with the panic of [`Clone`]).
    pub fn with_slot<R>(&mut self, i: usize, f: impl FnOnce(&mut DelayedSlot) -> R) -> R {
        self.home();
        let mut slot = self.view(i);
        let result = f(&mut slot);
        if slot.history.len() == self.len {
            self.scale[i] = slot.scale;
            self.scale_inv[i] = slot.scale_inv;
            self.history[i * self.len..(i + 1) * self.len].copy_from_slice(&slot.history);
        }
        result
    }

    /// The GPU holding the bank, if it is on one.
    pub(crate) fn device_ordinal(&self) -> Option<usize> {
        self.live_device().map(|d| d.ordinal())
    }

    /// The bank's copy on its GPU, while the bank is there.
    pub(crate) fn device_mut(&mut self) -> Option<&mut (dyn DeviceBank + 'static)> {
        match self.on_device {
            true => self.device.as_deref_mut(),
            false => None,
        }
    }

    fn live_device(&self) -> Option<&dyn DeviceBank> {
        self.device.as_deref().filter(|_| self.on_device)
    }

    /// Moves the bank to GPU `ordinal`: into the copy it had there, or into the one `make` returns
    /// from `scale[slots] | history[slots, len]` (a bank on another GPU comes home first).
    /// Nothing to do if it is there already.
    pub(crate) fn keep_on(
        &mut self,
        ordinal: usize,
        make: impl FnOnce(&[f32]) -> Result<Box<dyn DeviceBank>>,
    ) -> Result<()> {
        if self.on_device && self.device.as_ref().is_some_and(|d| d.ordinal() == ordinal) {
            return Ok(());
        }
        // On another GPU: home first, then up.
        self.bring_home()?;
        let layout = [&self.scale[..], &self.history[..]].concat();
        match &mut self.device {
            Some(device) if device.ordinal() == ordinal => device.reload(&layout)?,
            _ => self.device = Some(make(&layout)?),
        }
        self.on_device = true;
        Ok(())
    }

    /// Brings a bank kept on a GPU back into host memory (one download); the next pass on the
    /// device takes it up again.
    pub(crate) fn bring_home(&mut self) -> Result<()> {
        if let Some(device) = self.live_device() {
            (self.scale, self.history) = self.read_device(device)?;
            self.on_device = false;
        }
        Ok(())
    }

    /// `device`'s scales and histories, downloaded (a read of another length is an error).
    fn read_device(&self, device: &dyn DeviceBank) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut values = device.read()?;
        let want = self.slots() * (1 + self.len);
        if values.len() != want {
            return Err(crate::error::Error::LengthMismatch {
                what: "slot bank read back from its GPU",
                src: values.len(),
                dst: want,
            });
        }
        let history = values.split_off(self.slots());
        Ok((values, history))
    }

    /// [`Self::bring_home`] for the infallible host accessors.
    fn home(&mut self) {
        if let Err(e) = self.bring_home() {
            panic!("delayed-scaling slots could not come back from their GPU: {e}");
        }
    }

    /// The scales and histories wherever they live (a bank on a GPU read there).
    fn host_state(&self) -> (Vec<f32>, Vec<f32>) {
        let Some(device) = self.live_device() else {
            return (self.scale.clone(), self.history.clone());
        };
        self.read_device(device)
            .unwrap_or_else(|e| panic!("delayed-scaling slots could not be read from their GPU: {e}"))
    }
}

/// A bank's device copy in host memory, for tests without a GPU: it plays the device's part
/// (its own values, the scales of its last update).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct HostBank {
    pub(crate) ordinal: usize,
    pub(crate) values: Vec<f32>,
    pub(crate) updated: Option<Vec<f32>>,
}

#[cfg(test)]
impl DeviceBank for HostBank {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn read(&self) -> Result<Vec<f32>> {
        Ok(self.values.clone())
    }
    fn reload(&mut self, host: &[f32]) -> Result<()> {
        self.values = host.to_vec();
        self.updated = None;
        Ok(())
    }
    fn updated_scale(&self, slot: usize) -> Result<Option<f32>> {
        Ok(self.updated.as_ref().map(|s| s[slot]))
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
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

    /// `layout` as a bank's copy on stand-in GPU `ordinal`.
    fn stand_in(ordinal: usize, layout: &[f32]) -> Result<Box<dyn DeviceBank>> {
        Ok(Box::new(HostBank {
            ordinal,
            values: layout.to_vec(),
            updated: None,
        }))
    }

    /// A bank of 3 slots with histories of 2 whose slots differ, moved to stand-in GPU 1.
    fn bank_on_device() -> (SlotBank, Vec<f32>) {
        let mut bank = SlotBank::new(3, 2);
        for i in 0..3 {
            bank.record_cast(i, 1.0 + i as f32);
        }
        let host = bank.clone();
        bank.keep_on(1, |layout| stand_in(1, layout)).unwrap();
        assert_eq!(bank, host, "the device copy holds the host's values");
        (bank, host.values())
    }

    /// The stand-in device copy, to play what kernels do there.
    fn device(bank: &mut SlotBank) -> &mut HostBank {
        bank.device_mut()
            .unwrap()
            .as_any_mut()
            .downcast_mut::<HostBank>()
            .unwrap()
    }

    #[test]
    fn a_bank_on_a_device_is_read_there_and_its_scales_follow_its_last_update() {
        let (mut bank, _) = bank_on_device();
        assert_eq!(bank.device_ordinal(), Some(1));
        // Kernels fold an amax into slot 2's history[0] and update slot 0's scale there.
        device(&mut bank).values[3 + 2 * 2] = 9.0;
        device(&mut bank).values[0] = 5.0;
        assert_eq!(bank.current_amax(2), 9.0, "read from the device");
        assert_eq!(bank.current_amaxes(), vec![1.0, 2.0, 9.0]);
        assert_eq!(bank.view(2).history, vec![9.0, 0.0]);
        // Until an update's scales come back, casts use the host's scales.
        assert_eq!(bank.scale(0), 1.0);
        device(&mut bank).updated = Some(vec![5.0, 1.0, 1.0]);
        assert_eq!(bank.scale(0), 5.0, "the update's scale, without bringing the bank home");
        assert_eq!(bank.device_ordinal(), Some(1));
        // A cast recorded there sets the host's scale_inv from the scale it used.
        bank.recorded_on_device(0).unwrap();
        assert_eq!(bank.view(0).scale_inv, 0.2);
        // A clone is a host copy of the device's values.
        let copy = bank.clone();
        assert_eq!(copy.device_ordinal(), None);
        assert_eq!(copy.view(2).history, vec![9.0, 0.0]);
        assert_eq!(copy.scale(0), 5.0);
        // Taking it up again while it is there keeps the device's copy.
        bank.keep_on(1, |_| panic!("already on the device")).unwrap();
        assert_eq!(bank.current_amax(2), 9.0);
        // Home, then up again: into the copy it had, with the host's values.
        bank.bring_home().unwrap();
        assert_eq!(bank.device_ordinal(), None);
        bank.set_current_amax(0, 4.0);
        let home = bank.values();
        bank.keep_on(1, |_| panic!("the old copy is reused")).unwrap();
        assert_eq!((bank.device_ordinal(), bank.values()), (Some(1), home));
        assert_eq!(device(&mut bank).updated, None, "the reload forgot the old update");
        // Another GPU gets a copy of its own, of the values the first one held.
        device(&mut bank).values[3] = 6.0; // slot 0's history[0] on GPU 1
        bank.keep_on(2, |layout| stand_in(2, layout)).unwrap();
        assert_eq!(bank.device_ordinal(), Some(2));
        assert_eq!(bank.current_amax(0), 6.0);
    }

    #[test]
    fn host_writers_bring_a_bank_home_with_the_devices_values() {
        type Write = fn(&mut SlotBank);
        let writers: [(&str, Write); 4] = [
            ("record_cast", |b| b.record_cast(1, 0.5)),
            ("set_current_amax", |b| b.set_current_amax(1, 2.0)),
            ("update", |b| {
                b.update(&[1], &[Fp8Format::E4M3], &DelayedScaling::default())
            }),
            ("with_slot", |b| b.with_slot(1, |_| ())),
        ];
        for (what, write) in writers {
            let (mut bank, _) = bank_on_device();
            device(&mut bank).values[3 + 2] = 7.0; // slot 1's history[0] on the device
            let mut expected = bank.clone();
            write(&mut expected);
            write(&mut bank);
            assert_eq!(bank.device_ordinal(), None, "{what}: home");
            assert_eq!(bank, expected, "{what}: the device's values, then the write");
        }
    }

    #[test]
    fn a_bank_whose_device_copy_has_another_length_stays_there_with_an_error() {
        let (mut bank, _) = bank_on_device();
        device(&mut bank).values.pop();
        assert!(bank.bring_home().is_err());
        assert_eq!(bank.device_ordinal(), Some(1), "nothing half-copied");
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
