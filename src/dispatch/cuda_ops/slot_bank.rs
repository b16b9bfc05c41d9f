//! Delayed-scaling slot banks kept on the GPU (issue 15's scaling state on the device). A
//! layer running resident moves its bank up once (`SlotBank::keep_on`); from then on:
//!
//! * a cast's or a GEMM's amax, left on the device ([`super::deferred::DeviceScalar`]), is folded into the
//!   slot's `history[0]` there by the amax kernel (`fmaxf`: a NaN dropped as by `f32::max`,
//!   so the same bits as `SlotBank::record_cast`);
//! * the update runs in place on the bank (`fp8_delayed_update` over the slots' run), and
//!   the new scales are copied into pinned memory behind it, so the next pass's casts wait
//!   for that copy only, never for the stream.
//!
//! Nothing is read back per op (`docs/cuda-backend.md`, Slot banks on the device).

use std::any::Any;
use std::ops::Range;
use std::sync::Mutex;

use super::deferred::device_scalar;
use super::resident::staged_for;
use super::staged;
use crate::backend::cuda::DeviceBuffer;
use crate::backend::cuda::snapshot::PinnedSnapshot;
use crate::dispatch::{CudaKernels, Deferred};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::memory::MemoryCategory;
use crate::scaling::{DelayedScaling, DeviceBank, SlotBank};

/// A bank's `scale[slots] | history[slots, len]` in one device buffer, and the pinned copy of
/// the scales its last update left.
#[derive(Debug)]
pub(crate) struct CudaBank {
    ordinal: usize,
    slots: usize,
    len: usize,
    values: DeviceBuffer<f32>,
    /// Made at the first update.
    snapshot: Option<PinnedSnapshot>,
    scales: Mutex<KnownScales>,
}

/// The scales the host has read, and the slots updates changed since (whose reads wait for
/// the last snapshot): the backward's casts do not wait for the forward's update, which left
/// their slots alone.
#[derive(Debug)]
struct KnownScales {
    known: Vec<f32>,
    stale: Range<usize>,
}

impl DeviceBank for CudaBank {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn read(&self) -> Result<Vec<f32>> {
        staged(&CudaKernels { ordinal: self.ordinal })?.down_vec(&self.values)
    }
    fn reload(&mut self, host: &[f32]) -> Result<()> {
        check_layout(host, self.slots, self.len)?;
        let s = staged(&CudaKernels { ordinal: self.ordinal })?;
        s.device().write_at(host, &mut self.values, 0)?;
        let scales = self.scales.get_mut().unwrap_or_else(|p| p.into_inner());
        scales.known.copy_from_slice(&host[..self.slots]);
        scales.stale = 0..0;
        Ok(())
    }
    fn updated_scale(&self, slot: usize) -> Result<Option<f32>> {
        let mut scales = self.scales.lock().unwrap_or_else(|p| p.into_inner());
        if scales.stale.contains(&slot) {
            let snapshot = self.snapshot.as_ref().and_then(|s| s.read().transpose());
            let Some(latest) = snapshot.transpose()? else {
                return Err(Error::KernelArgs {
                    kernel: "delayed_update",
                    detail: "a slot bank's update left no copy of its scales".into(),
                });
            };
            scales.known.copy_from_slice(&latest[..self.slots]);
            scales.stale = 0..0;
        }
        Ok(scales.known.get(slot).copied())
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// `host` (`scale[slots] | history[slots, len]`) as a bank on `k`'s GPU.
pub(crate) fn bank_on(k: &CudaKernels, host: &[f32], slots: usize, len: usize) -> Result<Box<dyn DeviceBank>> {
    check_layout(host, slots, len)?;
    let s = staged(k)?;
    // The scaling state: a few floats per layer, booked with the other small device state.
    let values = s.device().upload(host, MemoryCategory::Workspace)?;
    Ok(Box::new(CudaBank {
        ordinal: k.ordinal,
        slots,
        len,
        values,
        snapshot: None,
        scales: Mutex::new(KnownScales {
            known: host[..slots].to_vec(),
            stale: 0..0,
        }),
    }))
}

/// `host` holds `scale[slots] | history[slots, len]`.
fn check_layout(host: &[f32], slots: usize, len: usize) -> Result<()> {
    match host.len() == slots * (1 + len) {
        true => Ok(()),
        false => Err(Error::LengthMismatch {
            what: "slot bank to the device",
            src: host.len(),
            dst: slots * (1 + len),
        }),
    }
}

/// The bank's device copy as this backend's own.
fn cuda_bank<'a>(device: &'a mut dyn DeviceBank, op: &'static str) -> Result<&'a mut CudaBank> {
    device
        .as_any_mut()
        .downcast_mut::<CudaBank>()
        .ok_or_else(|| Error::KernelArgs {
            kernel: op,
            detail: "the slot bank is not kept by the CUDA backend".into(),
        })
}

/// [`crate::dispatch::Kernels::record_amax`] on a GPU: folded into a bank kept there; a bank
/// in host memory takes the amax home (a read that waits for the stream).
pub(crate) fn record_amax(k: &CudaKernels, bank: &mut SlotBank, slot: usize, amax: &Deferred<f32>) -> Result<()> {
    const OP: &str = "record_amax";
    crate::dispatch::check_slot(bank, slot)?;
    let Some(device) = bank.device_mut() else {
        staged_for(k, OP, [amax.ordinal()])?;
        bank.record_cast(slot, amax.get()?);
        return Ok(());
    };
    let s = staged_for(k, OP, [Some(device.ordinal()), amax.ordinal()])?;
    let cuda = cuda_bank(device, OP)?;
    let at = cuda.slots + slot * cuda.len;
    match (device_scalar(amax, OP)?, amax) {
        (Some(scalar), _) => s.device().amax_at(scalar.buffer(), &mut cuda.values, at)?,
        // The fold takes |v|; `f32::max` drops a NaN and keeps a `history[0]` (never below
        // zero on a device) against a negative value: those are not folded.
        (None, Deferred::Host(v)) if *v >= 0.0 => {
            let up = s.up(&[*v])?;
            s.device().amax_at(&up, &mut cuda.values, at)?;
        }
        (None, _) => {}
    }
    bank.recorded_on_device(slot)
}

/// The first slot and the count of `slots` if they are one ascending run (`first..first+n`),
/// the layout the in-place update launches over; `None` otherwise.
pub(crate) fn slot_run(slots: &[usize]) -> Option<(usize, usize)> {
    let first = *slots.first()?;
    let ascending = slots.iter().enumerate().all(|(j, &i)| i == first + j);
    ascending.then_some((first, slots.len()))
}

/// [`crate::dispatch::Kernels::delayed_update`] of a bank kept on the GPU: in place, the new
/// scales queued into pinned memory behind it. Slots that are not one run (no layer asks for
/// that) bring the bank home for the staged update.
pub(crate) fn update_in_bank(
    k: &CudaKernels,
    bank: &mut SlotBank,
    slots: &[usize],
    formats: &[Fp8Format],
    recipe: &DelayedScaling,
) -> Result<bool> {
    const OP: &str = "delayed_update";
    let Some(ordinal) = bank.device_ordinal() else {
        return Ok(false);
    };
    let Some((first, count)) = slot_run(slots) else {
        bank.bring_home()?;
        return Ok(false);
    };
    let s = staged_for(k, OP, [Some(ordinal)])?;
    let scaled_max: Vec<f32> = formats.iter().map(|&f| recipe.scaled_max(f)).collect();
    let max_d = s.up(&scaled_max)?;
    let device = bank.device_mut().expect("checked above");
    let cuda = cuda_bank(device, OP)?;
    // The pinned copy first: once the update is queued, its scales must reach the host.
    if cuda.snapshot.is_none() {
        cuda.snapshot = Some(PinnedSnapshot::new(s.device(), cuda.slots)?);
    }
    // Stale before the launch: whatever fails below, these slots' scales are read from the
    // device (a failed copy is an error at that read, never an old scale).
    let scales = cuda.scales.get_mut().unwrap_or_else(|p| p.into_inner());
    scales.stale = covering(&scales.stale, first..first + count);
    let snapshot = cuda.snapshot.as_mut().expect("made above");
    snapshot.invalidate();
    s.device().delayed_update_in_bank(
        &mut cuda.values,
        (cuda.slots, cuda.len),
        first,
        &max_d,
        recipe.amax_compute_algo,
    )?;
    snapshot.queue(s.device(), &cuda.values)?;
    Ok(true)
}

/// The smallest range holding both (an empty one holds nothing).
fn covering(a: &Range<usize>, b: Range<usize>) -> Range<usize> {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b,
        (_, true) => a.clone(),
        _ => a.start.min(b.start)..a.end.max(b.end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_slots_cover_every_update_not_yet_read() {
        assert_eq!(covering(&(0..0), 0..3), 0..3);
        assert_eq!(covering(&(0..3), 3..5), 0..5);
        assert_eq!(covering(&(3..5), 0..0), 3..5);
        assert_eq!(covering(&(1..2), 3..4), 1..4);
    }

    #[test]
    fn only_an_ascending_run_of_slots_updates_in_place() {
        assert_eq!(slot_run(&[0, 1, 2]), Some((0, 3)));
        assert_eq!(slot_run(&[3, 4]), Some((3, 2)));
        assert_eq!(slot_run(&[2]), Some((2, 1)));
        assert_eq!(slot_run(&[]), None);
        assert_eq!(slot_run(&[0, 2]), None);
        assert_eq!(slot_run(&[1, 0]), None);
        assert_eq!(slot_run(&[3, 3]), None);
    }
}
