//! AdamW over arenas (llm.c style): every parameter's master weight, gradient
//! and moments at the same aligned offset of four arenas, one update launch for
//! all of them (`dispatch::arena_store`). On a GPU the moments live in device
//! memory for the whole run; each step copies the weights and gradients in and
//! the weights out in bulk pieces of at most [`PIECE`] values, instead of the
//! staged per-parameter op's four uploads and three downloads. Weights and
//! gradients a layer keeps on the GPU (`Parameter::keep_value_on`,
//! `keep_grad_on`) are copied on the device instead, both ways; the others are
//! read from and written to host memory, so a weight changed on the host
//! between steps is never overwritten by a stale device copy (its host writer
//! brought it home). Same bits as `ops::adamw_update` per parameter.
//!
//! A store may lend the parameters their ranges of the value and gradient arenas
//! ([`ArenaAdamW::lend_to`]; CUDA, with `FP8_CUDA_ARENA_VIEWS=1`): a parameter kept on the GPU then
//! holds its range as its device values or gradient, one copy that the step updates in place,
//! and the step copies nothing for it. One kept on the GPU in a copy of its own (made before the
//! arenas, or after a micro-batch sum) is copied in once and then holds its range.

use crate::backend::cuda::arena::{ArenaEntry, ArenaLayout};
use crate::dispatch::arena_store::{Arena, ArenaStore};
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;
use crate::nn::Module;
use crate::ops::AdamWStep;
use crate::tensor::DeviceKind;
use crate::tensor::device_values::{CudaStorage, Values, ValuesMut};

use super::adamw_state::Moments;

/// Values per bulk copy at most: 16 Mi f32 = 64 MiB of host staging, so a tiny model moves in one
/// copy per arena and a 7B model's 27 GB of weights in about 400, without a second host copy of
/// the model.
pub(crate) const PIECE: usize = 16 << 20;

/// The arenas of one optimizer and the host staging of its copies.
pub(crate) struct ArenaAdamW {
    store: Box<dyn ArenaStore>,
    /// The gradient arena holds this step's gradients, checked and clipped there
    /// ([`Self::upload_grads`]): the next [`Self::step`] uses them as they are.
    grads_ready: bool,
    /// Values per bulk copy.
    piece: usize,
    staging: Vec<f32>,
}

impl std::fmt::Debug for ArenaAdamW {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaAdamW")
            .field("parameters", &self.store.layout().entries().len())
            .field("values", &self.store.layout().len())
            .finish()
    }
}

/// The layout of `moments`' parameters in order: matrices decay, vectors only with
/// `decay_vectors` (as `adamw::for_parameter`).
pub(crate) fn layout_of(moments: &[Moments], decay_vectors: bool) -> Result<ArenaLayout> {
    ArenaLayout::new(
        moments
            .iter()
            .map(|m| (m.name.as_str(), m.m.len(), decay_vectors || m.shape.len() >= 2)),
    )
}

impl ArenaAdamW {
    /// Arenas made by `store` for `moments`' layout, holding their `m` and `v`.
    pub(crate) fn open(
        store: impl FnOnce(ArenaLayout) -> Result<Box<dyn ArenaStore>>,
        moments: &[Moments],
        decay_vectors: bool,
    ) -> Result<Self> {
        Self::open_in_pieces(store, moments, decay_vectors, PIECE)
    }

    /// [`Self::open`] with bulk copies of at most `piece` values (tests use small pieces).
    pub(crate) fn open_in_pieces(
        store: impl FnOnce(ArenaLayout) -> Result<Box<dyn ArenaStore>>,
        moments: &[Moments],
        decay_vectors: bool,
        piece: usize,
    ) -> Result<Self> {
        let store = store(layout_of(moments, decay_vectors)?)?;
        let mut arenas = ArenaAdamW {
            store,
            grads_ready: false,
            piece: piece.max(1),
            staging: Vec::new(),
        };
        for arena in [Arena::M, Arena::V] {
            let mut gather = Gather::new(&mut arenas, arena);
            for (m, e) in moments.iter().zip(gather.entries()) {
                gather.put(e, if arena == Arena::M { &m.m } else { &m.v })?;
            }
            gather.flush()?;
        }
        Ok(arenas)
    }

    /// Lends every parameter of `module` (in the arenas' order) its ranges of the value and
    /// gradient arenas, where the store lends them (else takes back any earlier store's). Empty
    /// parameters stay host tensors (a GPU array of no values is never made).
    pub(crate) fn lend_to(&self, module: &mut dyn Module) {
        let mut entries = self.store.layout().entries().iter();
        let lender = |arena, e: &ArenaEntry| (e.len > 0).then(|| self.store.lender(arena, e.offset, e.len)).flatten();
        module.visit_parameters(&mut |p| match entries.next() {
            Some(e) => p.lend_from(lender(Arena::Values, e), lender(Arena::Grads, e)),
            None => p.lend_from(None, None),
        });
    }

    /// One AdamW step of every parameter of `module` (in the arenas' order): its weight and
    /// gradient copied in, one update, the weight copied back and its version bumped. With
    /// `checked`, the gradients [`Self::upload_grads`] left in the arena (checked and clipped
    /// there) are used instead of the host's, if they are there. (`AdamW` runs the two halves
    /// itself, to count the step once the update ran.)
    #[cfg(test)]
    pub(crate) fn step(&mut self, module: &mut dyn Module, step: &AdamWStep, checked: bool) -> Result<()> {
        self.update(module, step, checked)?;
        self.copy_values_back(module)
    }

    /// The first half of [`Self::step`]: the weights and gradients copied in and the update run
    /// in the arenas. After an error here, every parameter keeps its values where it keeps
    /// them; a range the update may have reached counts as changed (its version bumped).
    pub(crate) fn update(&mut self, module: &mut dyn Module, step: &AdamWStep, checked: bool) -> Result<()> {
        self.check_lengths(module)?;
        let ready = std::mem::take(&mut self.grads_ready);
        let arenas: &[Arena] = match checked && ready {
            true => &[Arena::Values],
            false => &[Arena::Values, Arena::Grads],
        };
        for &arena in arenas {
            self.gather_from(module, arena)?;
        }
        if let Err(e) = self.store.adamw(step) {
            // The update may have reached some ranges before it failed: their host copies and
            // the layers' compute copies of them are stale.
            module.visit_parameters(&mut |p| {
                if p.forget_held_value_read() {
                    p.mark_updated();
                }
            });
            return Err(e);
        }
        Ok(())
    }

    /// The second half of [`Self::step`]: the updated weights copied back to where each
    /// parameter keeps them (nothing for one holding its range), every version bumped.
    pub(crate) fn copy_values_back(&mut self, module: &mut dyn Module) -> Result<()> {
        // Weights kept on the GPU get theirs back there; the host windows stop at them.
        let mut on_device = Vec::new();
        module.visit_parameters(&mut |p| on_device.push(p.value_device() != DeviceKind::Cpu));
        let staging = std::mem::take(&mut self.staging);
        let mut scatter = Scatter::new(self, Arena::Values, staging);
        let mut entries = scatter.entries().into_iter();
        scatter.stops = entries
            .clone()
            .zip(&on_device)
            .filter(|(_, device)| **device)
            .map(|(e, _)| e.offset)
            .collect();
        let mut result = Ok(());
        module.visit_parameters(&mut |p| {
            let Some(e) = entries.next() else { return };
            match result.is_ok() {
                true => {
                    result = match p.value_values_mut() {
                        ValuesMut::Host(host) => scatter.get(e, host),
                        ValuesMut::Device(device) => scatter.get_device(e, device),
                    }
                }
                // After a failed copy: a range holder's values were still updated in place.
                false => {
                    p.forget_held_value_read();
                }
            }
            p.mark_updated();
        });
        self.staging = scatter.staging;
        result
    }

    /// Forgets that the gradient arena holds checked gradients (a skipped step, or a check that
    /// failed part-way): the next checked step uploads them again.
    pub(crate) fn discard_grads(&mut self) {
        self.grads_ready = false;
    }

    /// Copies the gradients of `module` into the gradient arena, where [`Self::scale_grads`] and
    /// [`Self::grad_sum_squares`] work on them and the next [`Self::step`] takes them.
    pub(crate) fn upload_grads(&mut self, module: &mut dyn Module) -> Result<()> {
        self.grads_ready = false;
        self.check_lengths(module)?;
        self.gather_from(module, Arena::Grads)?;
        self.grads_ready = true;
        Ok(())
    }

    /// Multiplies the uploaded gradients by `factor`; whether all are finite. The gradients of
    /// `module` holding their ranges change with them: their host copies are dropped.
    pub(crate) fn scale_grads(&mut self, module: &mut dyn Module, factor: f32) -> Result<bool> {
        // Forgotten even when the scaling fails: its kernel may have run before the error.
        let finite = self.store.scale_grads(factor);
        module.visit_parameters(&mut |p| p.forget_held_grad_read());
        finite
    }

    /// The sum of the uploaded gradients' squares, in f64.
    pub(crate) fn grad_sum_squares(&self) -> Result<f64> {
        self.store.grad_sum_squares()
    }

    /// Copies each parameter's weight or gradient (`arena`) from `module` into the arena: nothing
    /// for one holding its range; one kept on the GPU in a copy of its own holds its range after
    /// the copy, where the store lends it.
    fn gather_from(&mut self, module: &mut dyn Module, arena: Arena) -> Result<()> {
        let grads = arena == Arena::Grads;
        let mut gather = Gather::new(self, arena);
        let mut result = Ok(());
        let mut entries = gather.entries().into_iter();
        module.visit_parameters(&mut |p| {
            let Some(e) = entries.next() else { return };
            if result.is_err() {
                return;
            }
            let values = match grads {
                false => p.value_values(),
                true => p.grad_values(),
            };
            result = match values {
                Values::Host(host) => gather.put(e, host),
                Values::Device(device) if gather.holds(e, device) => gather.step_over(e),
                // A weight or gradient kept on the GPU is copied there, not through the host.
                Values::Device(device) => gather.put_device(e, device).and_then(|()| p.hold_lent(grads)),
            };
        });
        result?;
        gather.flush()
    }

    /// The moments, downloaded into `like`'s names and shapes.
    pub(crate) fn moments(&self, like: &[Moments]) -> Result<Vec<Moments>> {
        let mut out: Vec<Moments> = like
            .iter()
            .map(|m| Moments {
                name: m.name.clone(),
                shape: m.shape.clone(),
                m: Vec::new(),
                v: Vec::new(),
            })
            .collect();
        for arena in [Arena::M, Arena::V] {
            let mut scatter = Scatter::new(self, arena, Vec::new());
            for (m, e) in out.iter_mut().zip(scatter.entries()) {
                let mut values = vec![0.0; e.len];
                scatter.get(e, &mut values)?;
                if arena == Arena::M {
                    m.m = values;
                } else {
                    m.v = values;
                }
            }
        }
        Ok(out)
    }

    /// Bytes the arenas book in their device's ledger under `category`.
    pub(crate) fn device_bytes(&self, category: MemoryCategory) -> u64 {
        self.store.device_bytes(category)
    }

    /// Every visited parameter has its entry's length, and there are as many.
    fn check_lengths(&self, module: &mut dyn Module) -> Result<()> {
        let entries = self.store.layout().entries();
        let mut live = Vec::new();
        module.visit_parameters(&mut |p| live.push((p.name().to_string(), p.value_len(), p.grad_len())));
        if live.len() != entries.len() {
            return Err(Error::InvalidTensor {
                name: "adamw".to_string(),
                reason: format!(
                    "the optimizer's arenas hold {} parameters, the module has {}",
                    entries.len(),
                    live.len()
                ),
            });
        }
        for ((name, values, grads), e) in live.iter().zip(entries) {
            if *values != e.len || *grads != e.len {
                return Err(Error::InvalidTensor {
                    name: name.clone(),
                    reason: format!(
                        "{values} values and {grads} gradients, the optimizer's arenas hold {} for '{}'",
                        e.len, e.name
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Where one parameter sits: its first element and its length.
#[derive(Clone, Copy, Debug)]
struct Span {
    offset: usize,
    len: usize,
}

fn spans(store: &dyn ArenaStore) -> Vec<Span> {
    store
        .layout()
        .entries()
        .iter()
        .map(|e| Span {
            offset: e.offset,
            len: e.len,
        })
        .collect()
}

/// Host values gathered into windows of at most `piece` arena elements, each written with one
/// copy (the padding between views as zeros). Spans must come in arena order.
struct Gather<'a> {
    arenas: &'a mut ArenaAdamW,
    arena: Arena,
    start: usize,
}

impl<'a> Gather<'a> {
    fn new(arenas: &'a mut ArenaAdamW, arena: Arena) -> Self {
        arenas.staging.clear();
        Gather {
            arenas,
            arena,
            start: 0,
        }
    }

    fn entries(&self) -> Vec<Span> {
        spans(self.arenas.store.as_ref())
    }

    fn put(&mut self, span: Span, mut data: &[f32]) -> Result<()> {
        let piece = self.arenas.piece;
        let mut at = span.offset;
        data = &data[..data.len().min(span.len)];
        while !data.is_empty() {
            if at < self.start || at >= self.start + piece {
                self.flush()?;
                self.start = at;
            }
            let take = (self.start + piece - at).min(data.len());
            let rel = at - self.start;
            let staging = &mut self.arenas.staging;
            if staging.len() < rel + take {
                staging.resize(rel + take, 0.0);
            }
            staging[rel..rel + take].copy_from_slice(&data[..take]);
            at += take;
            data = &data[take..];
        }
        Ok(())
    }

    /// Whether `values` is the arena's own range for `span` (nothing to copy).
    fn holds(&self, span: Span, values: &CudaStorage) -> bool {
        self.arenas.store.holds(self.arena, span.offset, values)
    }

    /// Ends the host window at a span kept on the device: the host values gathered so far go
    /// first, and the next window starts after the span, so its zero padding never covers it
    /// (a span whose parameter holds its range needs nothing more).
    fn step_over(&mut self, span: Span) -> Result<()> {
        self.flush()?;
        self.start = span.offset + span.len;
        Ok(())
    }

    /// [`Self::put`] of values on the store's GPU: the host window ends there
    /// ([`Self::step_over`]), then one copy on the device.
    fn put_device(&mut self, span: Span, values: &CudaStorage) -> Result<()> {
        self.step_over(span)?;
        if values.len() != span.len {
            return Err(Error::LengthMismatch {
                what: "device values into their arena span",
                src: values.len(),
                dst: span.len,
            });
        }
        self.arenas.store.write_device(self.arena, span.offset, values)
    }

    fn flush(&mut self) -> Result<()> {
        let ArenaAdamW { store, staging, .. } = &mut *self.arenas;
        if !staging.is_empty() {
            store.write(self.arena, self.start, staging)?;
            staging.clear();
        }
        Ok(())
    }
}

/// Arena values read in windows of at most `piece` elements, one copy each, and handed out per span
/// (in arena order); spans going to device values are copied there, and no window reaches into
/// them (`stops`: their offsets, ascending).
struct Scatter<'a> {
    store: &'a dyn ArenaStore,
    arena: Arena,
    piece: usize,
    staging: Vec<f32>,
    start: usize,
    stops: Vec<usize>,
}

impl<'a> Scatter<'a> {
    fn new(arenas: &'a ArenaAdamW, arena: Arena, mut staging: Vec<f32>) -> Self {
        staging.clear();
        Scatter {
            store: arenas.store.as_ref(),
            arena,
            piece: arenas.piece,
            staging,
            start: 0,
            stops: Vec::new(),
        }
    }

    fn entries(&self) -> Vec<Span> {
        spans(self.store)
    }

    fn get(&mut self, span: Span, out: &mut [f32]) -> Result<()> {
        let total = self.store.layout().len();
        let len = out.len().min(span.len);
        let mut done = 0;
        while done < len {
            let at = span.offset + done;
            let loaded = self.start..self.start + self.staging.len();
            if !loaded.contains(&at) {
                // Up to the next span that goes to the device, if one comes before the piece ends.
                let next = self.stops.iter().find(|&&stop| stop > at).map_or(total, |&stop| stop);
                self.staging.resize(self.piece.min(next - at), 0.0);
                self.store.read(self.arena, at, &mut self.staging)?;
                self.start = at;
            }
            let rel = at - self.start;
            let take = (self.staging.len() - rel).min(len - done);
            out[done..done + take].copy_from_slice(&self.staging[rel..rel + take]);
            done += take;
        }
        Ok(())
    }

    /// [`Self::get`] into values on the store's GPU: one copy on the device, or none for values
    /// holding their range (the step updated them in place).
    fn get_device(&mut self, span: Span, values: &mut CudaStorage) -> Result<()> {
        if self.store.holds(self.arena, span.offset, values) {
            return Ok(());
        }
        if values.len() != span.len {
            return Err(Error::LengthMismatch {
                what: "device values from their arena span",
                src: span.len,
                dst: values.len(),
            });
        }
        self.store.read_device(self.arena, span.offset, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::arena_store::HostArenas;
    use crate::error::Error;
    use crate::train::adamw::{AdamW, AdamWConfig, AdamWState};
    use crate::train::test_util::ParamList;

    /// A matrix, a vector and a longer matrix: views of 12, 5 and 300 values, padded apart.
    fn module(seed: f32) -> ParamList {
        let values = |n: usize, k: f32| {
            (0..n)
                .map(|i| ((i as f32 + k) * 0.37 + seed).sin())
                .collect::<Vec<f32>>()
        };
        ParamList::new(&[
            ("w", &[3, 4], values(12, 1.0)),
            ("b", &[5], values(5, 2.0)),
            ("fc", &[20, 15], values(300, 3.0)),
        ])
    }

    fn set_grads(module: &mut ParamList, step: usize) {
        for (j, p) in module.params.iter_mut().enumerate() {
            for (i, g) in p.grad_mut().iter_mut().enumerate() {
                // Signs and sizes change from step to step; some gradients are exactly zero.
                *g = if (i + step).is_multiple_of(7) {
                    0.0
                } else {
                    ((i * (j + 2)) as f32 * 0.11 - step as f32).cos() * 10f32.powi(j as i32 - 1)
                };
            }
        }
    }

    fn bits(module: &ParamList) -> Vec<Vec<u32>> {
        module
            .params
            .iter()
            .map(|p| p.value().iter().map(|v| v.to_bits()).collect())
            .collect()
    }

    fn state_bits(state: &AdamWState) -> Vec<(String, Vec<u32>, Vec<u32>)> {
        let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        state
            .moments
            .iter()
            .map(|m| (m.name.clone(), b(&m.m), b(&m.v)))
            .collect()
    }

    fn config(decay_vectors: bool) -> AdamWConfig {
        AdamWConfig {
            weight_decay: 0.1,
            decay_vectors,
            ..AdamWConfig::default()
        }
    }

    const LRS: [f32; 5] = [1e-2, 3e-2, 5e-3, 0.0, 2e-2];

    /// Runs `variant` and a plain optimizer of the same config over [`LRS`] on two copies of one
    /// module, calling `before(step, variant)` and `edit(step, module)` (on both copies) before
    /// each step: the same weights after every step, the same moments at the end.
    fn in_lockstep(
        seed: f32,
        decay_vectors: bool,
        variant: &mut AdamW,
        mut before: impl FnMut(usize, &mut AdamW),
        edit: fn(usize, &mut ParamList),
    ) {
        let (mut plain, mut other) = (module(seed), module(seed));
        let mut plain_opt = AdamW::new(config(decay_vectors)).unwrap();
        for (step, &lr) in LRS.iter().enumerate() {
            before(step, variant);
            for m in [&mut plain, &mut other] {
                set_grads(m, step);
                edit(step, m);
            }
            plain_opt.step(&mut plain, lr).unwrap();
            variant.step(&mut other, lr).unwrap();
            assert_eq!(bits(&other), bits(&plain), "step {step}");
        }
        assert_eq!(
            state_bits(&variant.state().unwrap()),
            state_bits(&plain_opt.state().unwrap())
        );
    }

    #[test]
    fn moments_come_home_when_the_steps_leave_the_arenas_and_go_back() {
        let mut mixed = AdamW::new(config(true)).unwrap();
        // Arenas, arenas, host, arenas, host: each change of place moves the moments.
        let place = |step: usize, opt: &mut AdamW| opt.use_host_arenas(step != 2 && step != 4);
        in_lockstep(2.5, true, &mut mixed, place, |_, _| {});
    }

    #[test]
    fn arenas_follow_the_optimizer_to_another_device() {
        use crate::tensor::DeviceKind;
        let mut moved = AdamW::new(config(false)).unwrap();
        moved.use_host_arenas(true);
        // Host arenas on every backend: a change of device makes them again from the moments
        // brought home (no GPU is opened: the host store does not need one).
        let place = |step: usize, opt: &mut AdamW| {
            opt.to_device(if step.is_multiple_of(2) {
                DeviceKind::Cpu
            } else {
                DeviceKind::Cuda(7)
            })
        };
        in_lockstep(9.5, false, &mut moved, place, |_, _| {});
    }

    #[test]
    fn arenas_that_do_not_fit_leave_the_steps_on_the_per_parameter_path() {
        use crate::train::adamw::TestArenas;
        // Refused by the free-memory check, or by the driver after it passed.
        for refusal in [TestArenas::TooBig, TestArenas::DriverOom] {
            let mut refused = AdamW::new(config(true)).unwrap();
            refused.use_test_arenas(refusal);
            refused.prepare(&mut module(8.5)).unwrap();
            in_lockstep(8.5, true, &mut refused, |_, _| {}, |_, _| {});
            assert!(matches!(refused.state().unwrap(), std::borrow::Cow::Borrowed(_)));
            assert_eq!(refused.device_bytes(crate::memory::MemoryCategory::OptimizerState), 0);
        }
    }

    #[test]
    fn arena_steps_give_the_per_parameter_bits() {
        for decay_vectors in [false, true] {
            let (mut plain, mut arena) = (module(0.5), module(0.5));
            let mut plain_opt = AdamW::new(config(decay_vectors)).unwrap();
            let mut arena_opt = AdamW::new(config(decay_vectors)).unwrap();
            arena_opt.use_host_arenas(true);
            for (step, &lr) in LRS.iter().enumerate() {
                set_grads(&mut plain, step);
                set_grads(&mut arena, step);
                plain_opt.step(&mut plain, lr).unwrap();
                arena_opt.step(&mut arena, lr).unwrap();
                assert_eq!(bits(&arena), bits(&plain), "step {step}, decay_vectors {decay_vectors}");
            }
            let versions = |m: &ParamList| m.params.iter().map(|p| p.version()).collect::<Vec<_>>();
            assert_eq!(versions(&arena), versions(&plain));
            assert_eq!(arena_opt.steps_taken(), plain_opt.steps_taken());
            assert_eq!(arena_opt.state_bytes(), plain_opt.state_bytes());
            let (a, p) = (arena_opt.state().unwrap(), plain_opt.state().unwrap());
            assert!(
                matches!(a, std::borrow::Cow::Owned(_)),
                "the moments come from the arenas"
            );
            assert_eq!(state_bits(&a), state_bits(&p));
            assert_eq!(a.step, p.step);
        }
    }

    #[test]
    fn weights_changed_on_the_host_between_steps_are_the_ones_updated() {
        let mut arena = AdamW::new(config(false)).unwrap();
        arena.use_host_arenas(true);
        // The host owns the weights: an edit there must not be undone by the arena's copy.
        let edit = |step: usize, m: &mut ParamList| m.params[2].value_mut()[step] = step as f32;
        in_lockstep(1.5, false, &mut arena, |_, _| {}, edit);
    }

    #[test]
    fn a_checkpointed_state_restarts_the_arenas() {
        let (mut plain, mut resumed) = (module(3.5), module(3.5));
        let mut plain_opt = AdamW::new(config(false)).unwrap();
        let mut first = AdamW::new(config(false)).unwrap();
        first.use_host_arenas(true);
        for (step, &lr) in LRS.iter().enumerate().take(2) {
            set_grads(&mut plain, step);
            set_grads(&mut resumed, step);
            plain_opt.step(&mut plain, lr).unwrap();
            first.step(&mut resumed, lr).unwrap();
        }
        let saved = first.state().unwrap().into_owned();
        // A new optimizer on arenas resumes from the saved state; so does the old one after
        // set_state (its arenas are dropped and made again from the state).
        let mut second = AdamW::new(config(false)).unwrap();
        second.use_host_arenas(true);
        second.set_state(saved.clone());
        first.set_state(saved);
        let mut again = resumed.clone();
        for (step, &lr) in LRS.iter().enumerate().skip(2) {
            for m in [&mut plain, &mut resumed, &mut again] {
                set_grads(m, step);
            }
            plain_opt.step(&mut plain, lr).unwrap();
            second.step(&mut resumed, lr).unwrap();
            first.step(&mut again, lr).unwrap();
            assert_eq!(bits(&resumed), bits(&plain), "step {step}");
            assert_eq!(bits(&again), bits(&plain), "step {step}");
        }
    }

    #[test]
    fn a_changed_parameter_set_is_an_error_and_changes_nothing_on_arenas() {
        let mut m = module(4.5);
        let mut opt = AdamW::new(config(false)).unwrap();
        opt.use_host_arenas(true);
        set_grads(&mut m, 0);
        opt.step(&mut m, 1e-2).unwrap();
        let before = opt.state().unwrap().into_owned();
        let mut other = module(4.5);
        other.params.pop();
        let kept = other.clone();
        assert!(matches!(opt.step(&mut other, 1e-2), Err(Error::InvalidTensor { .. })));
        assert_eq!(other.params, kept.params);
        let mut reshaped = ParamList::new(&[
            ("w", &[4, 3], vec![0.0; 12]),
            ("b", &[5], vec![0.0; 5]),
            ("fc", &[20, 15], vec![0.0; 300]),
        ]);
        assert!(opt.step(&mut reshaped, 1e-2).is_err());
        assert_eq!(opt.steps_taken(), 1);
        assert_eq!(state_bits(&opt.state().unwrap()), state_bits(&before));
    }

    #[test]
    fn unscaling_clipping_and_skipped_steps_on_arenas_give_the_host_bits() {
        use crate::amp::loss_scaler::{DynamicLossScaler, LossScalerConfig};
        use crate::train::step::apply_gradients;
        for (scaled, max_norm) in [(false, Some(0.5)), (true, Some(0.5)), (true, None), (false, None)] {
            let scaler = || match scaled {
                true => DynamicLossScaler::new(LossScalerConfig {
                    init_scale: 1024.0,
                    ..LossScalerConfig::default()
                })
                .unwrap(),
                false => DynamicLossScaler::disabled(),
            };
            let (mut plain, mut arena) = (module(6.5), module(6.5));
            let (mut plain_scaler, mut arena_scaler) = (scaler(), scaler());
            let mut plain_opt = AdamW::new(config(false)).unwrap();
            let mut arena_opt = AdamW::new(config(false)).unwrap();
            arena_opt.use_host_arenas(true);
            for (step, &lr) in LRS.iter().enumerate() {
                for (m, s) in [(&mut plain, &plain_scaler), (&mut arena, &arena_scaler)] {
                    set_grads(m, step);
                    let scale = s.scale();
                    m.params
                        .iter_mut()
                        .for_each(|p| p.grad_mut().iter_mut().for_each(|g| *g *= scale));
                    if scaled && step == 2 {
                        // An overflow: the step is skipped and the scale backs off.
                        m.params[1].grad_mut()[3] = f32::INFINITY;
                    }
                }
                let a = apply_gradients(&mut plain, &mut plain_scaler, &mut plain_opt, lr, max_norm).unwrap();
                let b = apply_gradients(&mut arena, &mut arena_scaler, &mut arena_opt, lr, max_norm).unwrap();
                let case = format!("step {step}, scaled {scaled}, clip {max_norm:?}");
                assert_eq!(b.grad_norm.to_bits(), a.grad_norm.to_bits(), "{case}");
                assert_eq!((b.skipped, b.loss_scale), (a.skipped, a.loss_scale), "{case}");
                assert_eq!(a.skipped, scaled && step == 2, "{case}");
                assert_eq!(bits(&arena), bits(&plain), "{case}");
            }
            assert_eq!(arena_opt.steps_taken(), plain_opt.steps_taken());
            assert_eq!(
                state_bits(&arena_opt.state().unwrap()),
                state_bits(&plain_opt.state().unwrap())
            );
        }
    }

    #[test]
    fn a_step_after_a_skipped_check_takes_the_new_host_gradients() {
        use crate::amp::loss_scaler::{DynamicLossScaler, LossScalerConfig};
        use crate::train::step::apply_gradients;
        let (mut plain, mut arena) = (module(7.5), module(7.5));
        let mut plain_opt = AdamW::new(config(false)).unwrap();
        let mut arena_opt = AdamW::new(config(false)).unwrap();
        arena_opt.use_host_arenas(true);
        let mut scaler = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        // Each time, the check uploads overflowed gradients and skips the update (they stay in
        // the arena); the next step, plain then checked (a skipped check leaves no gradients
        // marked checked), updates from the host's new gradients, not from those.
        for (round, checked) in [(1, false), (2, true)] {
            set_grads(&mut arena, 0);
            arena.params[0].grad_mut()[0] = f32::NAN;
            assert!(
                apply_gradients(&mut arena, &mut scaler, &mut arena_opt, 1e-2, Some(1.0))
                    .unwrap()
                    .skipped
            );
            for m in [&mut plain, &mut arena] {
                set_grads(m, round);
            }
            plain_opt.step(&mut plain, 1e-2).unwrap();
            match checked {
                false => arena_opt.step(&mut arena, 1e-2).unwrap(),
                true => arena_opt.step_checked(&mut arena, 1e-2).unwrap(),
            }
            assert_eq!(bits(&arena), bits(&plain), "round {round}");
        }
    }

    /// The moments of one plain step (decaying vectors too) of a copy of `module`.
    fn moments_after_one_step(module: &ParamList) -> Vec<Moments> {
        let (mut opt, mut m) = (AdamW::new(config(true)).unwrap(), module.clone());
        set_grads(&mut m, 0);
        opt.step(&mut m, 1e-2).unwrap();
        opt.state().unwrap().into_owned().moments
    }

    #[test]
    fn gradients_kept_on_the_device_are_gathered_as_the_host_ones() {
        // Device and host gradients side by side, in pieces that straddle both and the padding.
        for piece in [1, 5, 64, PIECE] {
            let (mut host, mut device) = (module(6.5), module(6.5));
            let start = moments_after_one_step(&host);
            let open = || {
                let store = |layout| Ok(Box::new(HostArenas::new(layout)) as Box<dyn ArenaStore>);
                ArenaAdamW::open_in_pieces(store, &start, true, piece).unwrap()
            };
            let (mut a, mut b) = (open(), open());
            set_grads(&mut host, 1);
            set_grads(&mut device, 1);
            for i in [0, 2] {
                device.params[i].grad_on_stand_in_gpu(0);
            }
            a.upload_grads(&mut host).unwrap();
            b.upload_grads(&mut device).unwrap();
            let whole = |arenas: &ArenaAdamW| {
                let mut all = vec![f32::NAN; arenas.store.layout().len()];
                arenas.store.read(Arena::Grads, 0, &mut all).unwrap();
                all.iter().map(|g| g.to_bits()).collect::<Vec<u32>>()
            };
            assert_eq!(whole(&b), whole(&a), "piece {piece}: the padding stays zero");
            let step = crate::train::adamw::step_scalars(&config(true), 1e-2, 2);
            a.step(&mut host, &step, true).unwrap();
            b.step(&mut device, &step, true).unwrap();
            assert_eq!(bits(&device), bits(&host), "piece {piece}");
            assert_eq!(device.params[0].grad_device(), crate::tensor::DeviceKind::Cuda(0));
        }
    }

    /// Host reads' ranges (offset, length), shared with the test.
    type Reads = std::sync::Arc<std::sync::Mutex<Vec<(usize, usize)>>>;

    /// Host arenas that record every host read's range and count the copies on the device.
    struct ReadLog {
        inner: HostArenas,
        reads: Reads,
        device_copies: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl ReadLog {
        fn copied(&self) {
            self.device_copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl ArenaStore for ReadLog {
        fn layout(&self) -> &ArenaLayout {
            self.inner.layout()
        }
        fn write(&mut self, arena: Arena, offset: usize, host: &[f32]) -> Result<()> {
            self.inner.write(arena, offset, host)
        }
        fn write_device(&mut self, arena: Arena, offset: usize, values: &CudaStorage) -> Result<()> {
            self.copied();
            self.inner.write_device(arena, offset, values)
        }
        fn read(&self, arena: Arena, offset: usize, host: &mut [f32]) -> Result<()> {
            self.reads.lock().unwrap().push((offset, host.len()));
            self.inner.read(arena, offset, host)
        }
        fn read_device(&self, arena: Arena, offset: usize, values: &mut CudaStorage) -> Result<()> {
            self.copied();
            self.inner.read_device(arena, offset, values)
        }
        fn adamw(&mut self, step: &AdamWStep) -> Result<()> {
            self.inner.adamw(step)
        }
        fn device_bytes(&self, category: MemoryCategory) -> u64 {
            self.inner.device_bytes(category)
        }
        fn scale_grads(&mut self, factor: f32) -> Result<bool> {
            self.inner.scale_grads(factor)
        }
        fn grad_sum_squares(&self) -> Result<f64> {
            self.inner.grad_sum_squares()
        }
        fn lender(
            &self,
            arena: Arena,
            offset: usize,
            len: usize,
        ) -> Option<std::sync::Arc<dyn crate::tensor::device_values::ArenaLender>> {
            self.inner.lender(arena, offset, len)
        }
        fn holds(&self, arena: Arena, offset: usize, values: &CudaStorage) -> bool {
            self.inner.holds(arena, offset, values)
        }
    }

    #[test]
    fn weights_kept_on_the_device_are_updated_there_and_never_read_through_the_host() {
        // Weights 0 and 2 (and one gradient) on a stand-in GPU beside host ones, in pieces that
        // straddle both and the padding: the host module's bits after every step, the device
        // weights still on the device, and no host read of the values arena covering them.
        for piece in [1, 5, 64, PIECE] {
            let (mut host, mut device) = (module(2.5), module(2.5));
            let start = moments_after_one_step(&host);
            let reads: Reads = Default::default();
            let open = |log: Option<&Reads>| {
                let store = |layout| {
                    let inner = HostArenas::new(layout);
                    Ok(match log {
                        Some(reads) => Box::new(ReadLog {
                            inner,
                            reads: reads.clone(),
                            device_copies: Default::default(),
                        }) as Box<dyn ArenaStore>,
                        None => Box::new(inner) as Box<dyn ArenaStore>,
                    })
                };
                ArenaAdamW::open_in_pieces(store, &start, true, piece).unwrap()
            };
            let (mut a, mut b) = (open(None), open(Some(&reads)));
            for i in [0, 2] {
                device.params[i].value_on_stand_in_gpu(0);
            }
            device.params[2].grad_on_stand_in_gpu(0);
            let device_spans: Vec<(usize, usize)> = b
                .store
                .layout()
                .entries()
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != 1)
                .map(|(_, e)| (e.offset, e.len))
                .collect();
            for (step, &lr) in LRS.iter().enumerate() {
                set_grads(&mut host, step + 1);
                set_grads(&mut device, step + 1);
                let scalars = crate::train::adamw::step_scalars(&config(true), lr, step as u64 + 2);
                reads.lock().unwrap().clear();
                a.step(&mut host, &scalars, false).unwrap();
                b.step(&mut device, &scalars, false).unwrap();
                assert_eq!(bits(&device), bits(&host), "piece {piece}, step {step}");
                for i in [0, 2] {
                    assert_eq!(device.params[i].value_device(), crate::tensor::DeviceKind::Cuda(0));
                }
                assert_eq!(device.params[1].value_device(), crate::tensor::DeviceKind::Cpu);
                for &(offset, len) in reads.lock().unwrap().iter() {
                    for &(start, n) in &device_spans {
                        assert!(
                            offset + len <= start || start + n <= offset,
                            "piece {piece}: a host read of {offset}+{len} covers the device span {start}+{n}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bulk_copies_of_any_piece_size_give_the_same_bits() {
        // Pieces smaller than a view, straddling padding, and larger than the arena.
        let moments = |m: &mut ParamList| {
            let mut opt = AdamW::new(config(false)).unwrap();
            set_grads(m, 0);
            opt.step(m, 1e-2).unwrap();
            opt.state().unwrap().into_owned().moments
        };
        let mut reference = module(5.5);
        let start = moments(&mut reference);
        let mut results = Vec::new();
        for piece in [1, 5, 64, 100, 1000, PIECE] {
            let mut m = reference.clone();
            let host = |layout| Ok(Box::new(HostArenas::new(layout)) as Box<dyn ArenaStore>);
            let mut arenas = ArenaAdamW::open_in_pieces(host, &start, false, piece).unwrap();
            assert_eq!(
                state_bits(&AdamWState {
                    step: 1,
                    moments: arenas.moments(&start).unwrap()
                }),
                state_bits(&AdamWState {
                    step: 1,
                    moments: start.clone()
                }),
                "piece {piece}"
            );
            set_grads(&mut m, 1);
            let step = crate::train::adamw::step_scalars(&config(false), 1e-2, 2);
            arenas.step(&mut m, &step, false).unwrap();
            arenas.piece = 1;
            results.push((
                piece,
                bits(&m),
                state_bits(&AdamWState {
                    step: 2,
                    moments: arenas.moments(&start).unwrap(),
                }),
            ));
        }
        for (piece, values, state) in &results[1..] {
            assert_eq!(values, &results[0].1, "piece {piece}");
            assert_eq!(state, &results[0].2, "piece {piece}");
        }
    }

    /// Sets the gradients `set_grads` gives for `step` where they live (a device gradient in
    /// place, so one holding its arena range keeps holding it).
    fn set_grads_where_they_live(m: &mut ParamList, step: usize) {
        let mut host = module(0.0);
        set_grads(&mut host, step);
        for (p, h) in m.params.iter_mut().zip(&host.params) {
            match p.trainable_grad_values().unwrap() {
                ValuesMut::Host(g) => g.copy_from_slice(h.grad()),
                ValuesMut::Device(g) => g.overwrite(h.grad()).unwrap(),
            }
        }
    }

    /// Whether `p`'s master values and gradient hold ranges of an arena.
    fn holds_ranges(p: &crate::nn::Parameter) -> (bool, bool) {
        let held = |v: Values<'_>| matches!(v, Values::Device(d) if d.arena_view().is_some());
        (held(p.value_values()), held(p.grad_values()))
    }

    /// Two copies of the test module with their optimizers: `plain` on host values, `lent` with
    /// parameters 0 and 2 on a stand-in GPU and an optimizer whose arenas lend them their ranges
    /// (prepared, so the ranges are lent before the first step).
    fn lending_pair(seed: f32, decay_vectors: bool) -> (ParamList, ParamList, AdamW, AdamW) {
        let (plain, mut lent) = (module(seed), module(seed));
        for i in [0, 2] {
            lent.params[i].value_on_stand_in_gpu(0);
            lent.params[i].grad_on_stand_in_gpu(0);
        }
        let plain_opt = AdamW::new(config(decay_vectors)).unwrap();
        let mut opt = AdamW::new(config(decay_vectors)).unwrap();
        opt.use_test_arenas(crate::train::adamw::TestArenas::Lending(0));
        opt.prepare(&mut lent).unwrap();
        (plain, lent, plain_opt, opt)
    }

    #[test]
    fn parameters_holding_their_arena_ranges_are_updated_in_place_with_the_per_parameter_bits() {
        for decay_vectors in [false, true] {
            let (mut plain, mut lent, mut plain_opt, mut opt) = lending_pair(7.5, decay_vectors);
            let mut snapshot = None;
            for (step, &lr) in LRS.iter().enumerate() {
                set_grads(&mut plain, step);
                set_grads_where_they_live(&mut lent, step);
                if step == 2 {
                    // A resume drops the arenas: the next step brings the old ranges home before
                    // it makes new arenas (so the old allocations are freed first).
                    opt.set_state(opt.state().unwrap().into_owned());
                }
                if step == 3 {
                    // A layer takes them up again (copies of their own here, which the next step
                    // copies in before they hold their new ranges).
                    for i in [0, 2] {
                        assert_eq!(holds_ranges(&lent.params[i]), (false, false));
                        lent.params[i].value_on_stand_in_gpu(0);
                        lent.params[i].grad_on_stand_in_gpu(0);
                    }
                    // A clone of a parameter holding its range is a copy: the step leaves it.
                    let p = lent.params[0].clone();
                    assert_eq!(holds_ranges(&p), (false, false));
                    snapshot = Some((p.value().to_vec(), p));
                }
                plain_opt.step(&mut plain, lr).unwrap();
                opt.step(&mut lent, lr).unwrap();
                assert_eq!(bits(&lent), bits(&plain), "step {step}, decay_vectors {decay_vectors}");
                for i in [0, 2] {
                    let held = step != 2;
                    assert_eq!(
                        holds_ranges(&lent.params[i]),
                        (held, held),
                        "step {step}, parameter {i}"
                    );
                }
                assert_eq!(lent.params[1].value_device(), crate::tensor::DeviceKind::Cpu);
                assert_eq!(lent.params[1].grad_device(), crate::tensor::DeviceKind::Cpu);
            }
            let (before, p) = snapshot.unwrap();
            assert_eq!(p.value(), &before[..], "the clone kept its values");
            assert_eq!(
                state_bits(&opt.state().unwrap()),
                state_bits(&plain_opt.state().unwrap())
            );
            let versions = |m: &ParamList| m.params.iter().map(|p| p.version()).collect::<Vec<_>>();
            assert_eq!(versions(&lent), versions(&plain));
        }
    }

    #[test]
    fn ranges_held_by_their_parameters_are_copied_neither_in_nor_out() {
        let start = moments_after_one_step(&module(4.0));
        let copies: std::sync::Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let count = || copies.swap(0, std::sync::atomic::Ordering::Relaxed);
        let store = |layout| {
            Ok(Box::new(ReadLog {
                inner: HostArenas::lending(layout, 0),
                reads: Default::default(),
                device_copies: copies.clone(),
            }) as Box<dyn ArenaStore>)
        };
        let mut arenas = ArenaAdamW::open_in_pieces(store, &start, true, 64).unwrap();
        let (mut lent, mut plain) = (module(4.0), module(4.0));
        for i in [0, 2] {
            lent.params[i].value_on_stand_in_gpu(0);
            lent.params[i].grad_on_stand_in_gpu(0);
        }
        arenas.lend_to(&mut lent);
        let host = |layout| Ok(Box::new(HostArenas::new(layout)) as Box<dyn ArenaStore>);
        let mut reference = ArenaAdamW::open_in_pieces(host, &start, true, 64).unwrap();
        for step in 0..3 {
            set_grads(&mut plain, step + 1);
            set_grads_where_they_live(&mut lent, step + 1);
            let scalars = crate::train::adamw::step_scalars(&config(true), 1e-2, step as u64 + 2);
            reference.step(&mut plain, &scalars, false).unwrap();
            // The checked path: gradients checked and clipped in the arena, then the update.
            arenas.upload_grads(&mut lent).unwrap();
            assert!(arenas.scale_grads(&mut lent, 1.0).unwrap());
            arenas.step(&mut lent, &scalars, true).unwrap();
            assert_eq!(bits(&lent), bits(&plain), "step {step}");
            // The first step copies the two device values and gradients in once (their own
            // copies, made before the arenas); after that they hold their ranges.
            assert_eq!(count(), if step == 0 { 4 } else { 0 }, "step {step}");
        }
        // A clipped gradient held in its range is the arena's: the host read sees the change.
        let before = lent.params[2].grad().to_vec();
        arenas.upload_grads(&mut lent).unwrap();
        arenas.scale_grads(&mut lent, 0.5).unwrap();
        let halved: Vec<f32> = before.iter().map(|g| g * 0.5).collect();
        assert_eq!(lent.params[2].grad(), &halved[..]);
        // A gradient cleared in place keeps its range; one brought home gives it back.
        lent.params[2].zero_grad();
        assert_eq!(holds_ranges(&lent.params[2]), (true, true));
        assert!(lent.params[2].grad().iter().all(|&g| g == 0.0));
        lent.params[2].grad_to_host().unwrap();
        assert_eq!(holds_ranges(&lent.params[2]), (true, false));
    }

    #[test]
    fn the_trainers_clip_scales_held_gradients_in_place_with_the_host_bits() {
        use crate::amp::loss_scaler::DynamicLossScaler;
        use crate::train::step::apply_gradients;
        let (mut plain, mut lent, mut plain_opt, mut opt) = lending_pair(3.0, true);
        let grad_bits = |p: &crate::nn::Parameter| p.grad().iter().map(|g| g.to_bits()).collect::<Vec<u32>>();
        for (step, &lr) in LRS.iter().enumerate() {
            set_grads(&mut plain, step);
            set_grads_where_they_live(&mut lent, step);
            // A host copy read before the clip must not outlive it.
            let _ = lent.params[2].grad();
            let mut scaler = DynamicLossScaler::disabled();
            let a = apply_gradients(&mut plain, &mut scaler, &mut plain_opt, lr, Some(0.5)).unwrap();
            let b = apply_gradients(&mut lent, &mut scaler, &mut opt, lr, Some(0.5)).unwrap();
            assert!(a.grad_norm > 0.5, "step {step}: the clip bites");
            assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits(), "step {step}");
            assert_eq!(bits(&lent), bits(&plain), "step {step}");
            // The host path clips every gradient in place; a held one is clipped in place too.
            for i in [0, 2] {
                assert_eq!(holds_ranges(&lent.params[i]), (true, true), "step {step}");
                assert_eq!(
                    grad_bits(&lent.params[i]),
                    grad_bits(&plain.params[i]),
                    "step {step}, parameter {i}"
                );
            }
        }
    }
}
