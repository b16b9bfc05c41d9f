//! AdamW (Loshchilov & Hutter): Adam moments with decoupled weight decay and
//! bias correction, on f32 master weights with f32 moments (`docs/numerics.md`, mixed precision).
//!
//! One step `t` (1-based) for a parameter `p` with gradient `g`; the per-step
//! scalars are computed in f64 and rounded to f32 once, every per-element
//! operation is one correctly rounded f32 operation in exactly this order (no
//! fused multiply-add), so a GPU kernel using `__fmul_rn`/`__fadd_rn`/`__fdiv_rn`/
//! `__fsqrt_rn` gives the same bits:
//!
//! ```text
//! decay     = f32(1 - lr * weight_decay)          step_size = f32(lr / (1 - beta1^t))
//! c1 = f32(1 - beta1)   c2 = f32(1 - beta2)       bc2_sqrt  = f32(sqrt(1 - beta2^t))
//! p = p * decay
//! m = m * beta1 + g * c1
//! v = v * beta2 + (g * g) * c2
//! p = p - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
//! ```
//!
//! Weight decay applies to matrices (parameters of two or more dimensions:
//! weights and embeddings); vectors (biases, norm gains) keep `decay = 1` unless
//! `decay_vectors` is set, as in GPT-2 and most LLM recipes: shrinking a norm's
//! gain or a bias toward 0 regularises nothing useful. The optimizer never skips a step
//! itself: the loss scaler decides that before calling [`AdamW::step`].

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::adamw_arena::ArenaAdamW;
pub use super::adamw_state::{AdamWState, Moments};
use super::clip::{check_max_norm, clip_coefficient};
use crate::backend::cuda::arena::ArenaLayout;
use crate::dispatch::arena_store::ArenaStore;
use crate::dispatch::{AdamWStep, Backend};
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;

use crate::nn::Module;
use crate::tensor::DeviceKind;

/// AdamW hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Default learning rate (a schedule usually passes its own to [`AdamW::step`]).
    pub lr: f32,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to `sqrt(v_hat)` so a zero second moment does not divide by zero.
    pub eps: f32,
    /// Decoupled weight decay: each step multiplies the weights by `1 - lr * weight_decay`.
    pub weight_decay: f32,
    /// Decay 1-D parameters (biases, norm gains) too, not only matrices.
    #[serde(default)]
    pub decay_vectors: bool,
}

impl Default for AdamWConfig {
    /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 (on matrices).
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decay_vectors: false,
        }
    }
}

impl AdamWConfig {
    /// Checks every value's range: betas in [0, 1), eps > 0, lr and weight decay >= 0, all finite.
    pub fn validate(&self) -> Result<()> {
        let check = |setting: &'static str, value: f32, ok: bool, reason: &str| {
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(Error::InvalidSetting {
                    setting,
                    value: value.to_string(),
                    reason: reason.to_string(),
                })
            }
        };
        check("lr", self.lr, self.lr >= 0.0, "must be finite and >= 0")?;
        check(
            "beta1",
            self.beta1,
            (0.0..1.0).contains(&self.beta1),
            "must be in [0, 1)",
        )?;
        check(
            "beta2",
            self.beta2,
            (0.0..1.0).contains(&self.beta2),
            "must be in [0, 1)",
        )?;
        check("eps", self.eps, self.eps > 0.0, "must be finite and > 0")?;
        check(
            "weight_decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
            "must be finite and >= 0",
        )
    }
}

/// The optimizer: hyperparameters and state.
#[derive(Debug)]
pub struct AdamW {
    config: AdamWConfig,
    /// While `arenas` is set, the moments' `m` and `v` live there and these keep only their
    /// names and shapes.
    state: AdamWState,
    /// Where the update runs (the device of the parameters).
    backend: Backend,
    /// The arenas on the device (`adamw_arena`), on a backend that holds them, from the first
    /// step on it; brought home by a step on another backend.
    arenas: Option<ArenaAdamW>,
    /// The device the arenas were made on (a move to another GPU brings the moments home).
    arenas_on: DeviceKind,
    /// The arenas did not fit in the device's free memory: the steps run parameter by
    /// parameter (staged), as they did before the arenas.
    arenas_refused: bool,
    /// Tests: keep the arenas in host memory (the CUDA store's twin) on any backend.
    #[cfg(test)]
    host_arenas: TestArenas,
}

/// [`AdamW::check_and_clip_on_arenas`] on `arenas`: the gradients uploaded, unscaled by
/// `inv_scale` and checked (the verdict made the group's by `agree`), their norm summed, and
/// finite ones clipped to `max_grad_norm`. Returns `(finite, norm)`.
fn check_and_clip_in(
    arenas: &mut ArenaAdamW,
    module: &mut dyn Module,
    inv_scale: Option<f32>,
    max_grad_norm: Option<f32>,
    agree: &mut dyn FnMut(bool) -> Result<bool>,
) -> Result<(bool, f64)> {
    arenas.upload_grads(module)?;
    let mut finite = true;
    if let Some(inv_scale) = inv_scale {
        finite = agree(arenas.scale_grads(module, inv_scale)?)?;
    }
    let norm = arenas.grad_sum_squares()?.sqrt();
    if let (true, Some(max)) = (finite, max_grad_norm)
        && let Some(coef) = clip_coefficient(norm, max)
    {
        arenas.scale_grads(module, coef)?;
    }
    Ok((finite, norm))
}

/// Tests: where [`AdamW`] keeps its arenas.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TestArenas {
    /// Where the backend keeps them (nowhere on the CPU).
    Backend,
    /// In host memory, the CUDA store's twin.
    Host,
    /// In host memory, lending their ranges to parameters on stand-in GPU `ordinal` (as the CUDA
    /// store does with `FP8_CUDA_ARENA_VIEWS=1`).
    Lending(usize),
    /// Nowhere: making them fails as on a GPU without the free memory.
    TooBig,
    /// Nowhere: the driver refuses an allocation though the free-memory check passed
    /// (fragmentation, or memory taken in between).
    DriverOom,
}

impl AdamW {
    /// An optimizer with no state yet (moments are made at the first step, as zeros).
    pub fn new(config: AdamWConfig) -> Result<Self> {
        config.validate()?;
        Ok(AdamW {
            config,
            state: AdamWState::default(),
            backend: Backend::default(),
            arenas: None,
            arenas_on: DeviceKind::Cpu,
            arenas_refused: false,
            #[cfg(test)]
            host_arenas: TestArenas::Backend,
        })
    }

    /// Tests: run the steps through arenas in host memory (the twin of the device's), or not.
    #[cfg(test)]
    pub(crate) fn use_host_arenas(&mut self, on: bool) {
        self.use_test_arenas(if on { TestArenas::Host } else { TestArenas::Backend });
    }

    /// Tests: where the arenas are kept.
    #[cfg(test)]
    pub(crate) fn use_test_arenas(&mut self, arenas: TestArenas) {
        self.host_arenas = arenas;
    }

    /// Whether the steps run over arenas (on a backend that holds them, where they fit).
    fn on_arenas(&self) -> bool {
        #[cfg(test)]
        if self.host_arenas != TestArenas::Backend {
            return !self.arenas_refused;
        }
        self.backend.holds_arenas() && !self.arenas_refused
    }

    fn arena_store(&self, layout: ArenaLayout) -> Result<Box<dyn ArenaStore>> {
        #[cfg(test)]
        match self.host_arenas {
            TestArenas::Backend => {}
            TestArenas::Host => return Ok(Box::new(crate::dispatch::arena_store::HostArenas::new(layout))),
            TestArenas::Lending(ordinal) => {
                return Ok(Box::new(crate::dispatch::arena_store::HostArenas::lending(
                    layout, ordinal,
                )));
            }
            TestArenas::TooBig => return Err(layout.check_fits(0).expect_err("a layout of 0 bytes is never made")),
            TestArenas::DriverOom => {
                return Err(Error::Cuda {
                    call: "cuMemAllocAsync".into(),
                    name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                    message: "out of memory".into(),
                });
            }
        }
        self.backend.arena_store(layout)
    }

    /// Copies the moments back from the arenas, if they are there, and lets the arenas go.
    fn bring_moments_home(&mut self) -> Result<()> {
        if let Some(arenas) = self.arenas.take() {
            match arenas.moments(&self.state.moments) {
                Ok(moments) => self.state.moments = moments,
                Err(e) => {
                    self.arenas = Some(arenas);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The backend the updates run on.
    pub(crate) fn backend(&self) -> Backend {
        self.backend.clone()
    }

    /// Runs the updates on `device` from now on.
    pub fn to_device(&mut self, device: DeviceKind) {
        self.backend = Backend::on(device);
    }

    /// Checks every update (and the gradient-norm reductions run on this backend) against its
    /// CPU twin from now on (`Module::check_against_cpu`); a mismatch names the layer `optimizer`.
    pub fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, "optimizer");
    }

    /// The hyperparameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Steps taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.state.step
    }

    /// The state, for checkpoints: borrowed, or copied from the device where the moments live
    /// there (an error only if that copy fails).
    pub fn state(&self) -> Result<Cow<'_, AdamWState>> {
        // Before the first step there are no moments to save, though arenas made ahead of it
        // ([`AdamW::prepare`]) hold zeros: a checkpoint then says so (step 0, no moments), as
        // one from the CPU does and as its loader requires.
        if self.state.step == 0 {
            return Ok(Cow::Owned(AdamWState::default()));
        }
        let Some(arenas) = &self.arenas else {
            return Ok(Cow::Borrowed(&self.state));
        };
        Ok(Cow::Owned(AdamWState {
            step: self.state.step,
            moments: arenas.moments(&self.state.moments)?,
        }))
    }

    /// Replaces the state (from a checkpoint), dropping any arenas (the next step makes them
    /// again from this state). The moments are checked against the module at the next
    /// [`AdamW::step`].
    pub fn set_state(&mut self, state: AdamWState) {
        self.arenas = None;
        self.state = state;
    }

    /// Bytes of optimizer state (two f32 moments per value once the first step has run),
    /// wherever they live.
    pub fn state_bytes(&self) -> usize {
        match self.arenas {
            Some(_) => self
                .state
                .moments
                .iter()
                .map(|m| 8 * m.shape.iter().product::<usize>())
                .sum(),
            None => self.state.moments.iter().map(|m| 4 * (m.m.len() + m.v.len())).sum(),
        }
    }

    /// One update of every parameter of `module` with learning rate `lr`, from its gradient;
    /// bumps each parameter's version so compute copies are refreshed. Fails, changing
    /// nothing, if the module's parameters are not the ones the state was made for.
    pub fn step(&mut self, module: &mut dyn Module, lr: f32) -> Result<()> {
        self.step_from(module, lr, false)
    }

    /// [`AdamW::step`] right after [`AdamW::check_and_clip_on_arenas`] found the gradients
    /// finite: on the arenas, the update takes the gradients checked and clipped there.
    pub(crate) fn step_checked(&mut self, module: &mut dyn Module, lr: f32) -> Result<()> {
        self.step_from(module, lr, true)
    }

    fn step_from(&mut self, module: &mut dyn Module, lr: f32, checked: bool) -> Result<()> {
        Self::check_lr(lr)?;
        let t = self.state.step + 1;
        let step = step_scalars(&self.config, lr, t);
        if self.ensure_arenas(module)? {
            let arenas = self.arenas.as_mut().expect("ensured");
            arenas.update(module, &step, checked)?;
            // The moments (and values held in their ranges) are at step t now, whatever the
            // copies back do: a failed copy must not leave the count behind them.
            self.state.step = t;
            return arenas.copy_values_back(module);
        }
        self.bring_moments_home()?;
        self.check_or_init_moments(module)?;
        let mut moments = self.state.moments.iter_mut();
        let decay_vectors = self.config.decay_vectors;
        let kernels = self.backend.kernels();
        let mut result = Ok(());
        module.visit_parameters(&mut |p| {
            let Some(state) = moments.next() else { return };
            let step = for_parameter(step, decay_vectors, p.shape());
            let (value, grad) = p.value_and_grad_mut();
            if result.is_ok() {
                result = kernels.adamw(value, grad, &mut state.m, &mut state.v, &step);
            }
            p.mark_updated();
        });
        result?;
        self.state.step = t;
        Ok(())
    }

    /// On a backend that holds arenas, makes them now for `module` (from the moments: zeros, or a
    /// checkpoint's) rather than at the first step, so a run books their device memory before it
    /// starts; elsewhere nothing.
    pub(crate) fn prepare(&mut self, module: &mut dyn Module) -> Result<()> {
        self.ensure_arenas(module).map(|_| ())
    }

    /// On a backend that holds arenas, the first half of a step there: this step's gradients
    /// copied into the gradient arena once, unscaled by `inv_scale` and checked (fp16 loss
    /// scaling), the verdict turned into the group's by `agree`, their global norm summed there,
    /// and finite gradients clipped there to `max_grad_norm`; the next `step_checked` updates
    /// from them (a plain [`AdamW::step`] copies the host's gradients again). Returns
    /// `(finite, norm)`, or None on a backend without arenas (the caller checks and clips on the
    /// host, parameter by parameter, as `train::step::check_and_clip`). The parameters' own
    /// gradients are left as they were, but those holding their arena ranges
    /// (`FP8_CUDA_ARENA_VIEWS=1`) are the arena's: unscaled and clipped in place, as the host
    /// path does to every gradient.
    pub(crate) fn check_and_clip_on_arenas(
        &mut self,
        module: &mut dyn Module,
        inv_scale: Option<f32>,
        max_grad_norm: Option<f32>,
        agree: &mut dyn FnMut(bool) -> Result<bool>,
    ) -> Result<Option<(bool, f64)>> {
        if let Some(max) = max_grad_norm {
            check_max_norm(max)?;
        }
        if !self.ensure_arenas(module)? {
            return Ok(None);
        }
        let arenas = self.arenas.as_mut().expect("ensured");
        let checked = check_and_clip_in(arenas, module, inv_scale, max_grad_norm, agree);
        // Only finite gradients, checked and clipped to the end, are for `step_checked`: after
        // a skipped step or a failure part-way, the next step uploads them again.
        if !matches!(checked, Ok((true, _))) {
            arenas.discard_grads();
        }
        checked.map(Some)
    }

    /// Bytes the arenas book in their device's memory ledger under `category` (0 without them).
    pub(crate) fn device_bytes(&self, category: MemoryCategory) -> u64 {
        self.arenas.as_ref().map_or(0, |a| a.device_bytes(category))
    }

    /// On a backend that holds arenas, checks the module against the moments (making them at
    /// first) and makes the arenas if there are none there yet, from the moments (zeros, or a
    /// checkpoint's), which then stay there; the host keeps their names and shapes. Arenas on
    /// another device come home first. Whether the steps run on arenas: not on other backends,
    /// nor where the arenas do not fit in the device's free memory (said once, then the staged
    /// per-parameter path, which needs one parameter's worth of device memory at a time).
    fn ensure_arenas(&mut self, module: &mut dyn Module) -> Result<bool> {
        if !self.on_arenas() {
            return Ok(false);
        }
        if self.arenas.is_some() && self.arenas_on != self.backend.device() {
            self.bring_moments_home()?;
        }
        self.check_or_init_moments(module)?;
        if self.arenas.is_some() {
            return Ok(true);
        }
        // Ranges of arenas that are gone (a resume, a move) go home first, so their allocations
        // are freed before new ones are made.
        let mut released = Ok(());
        module.visit_parameters(&mut |p| {
            if released.is_ok() {
                released = p.release_arena_ranges();
            }
        });
        released?;
        let moments = &self.state.moments;
        let arenas = match ArenaAdamW::open(|layout| self.arena_store(layout), moments, self.config.decay_vectors) {
            Ok(arenas) => arenas,
            // Refused by the free-memory check, or by the driver when that check passed but
            // the memory was fragmented or taken in between.
            Err(e) if crate::nn::out_of_memory(&e) => {
                eprintln!("fp8: warning: AdamW keeps its state on the host, parameter by parameter: {e}");
                self.arenas_refused = true;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        for m in &mut self.state.moments {
            (m.m, m.v) = (Vec::new(), Vec::new());
        }
        arenas.lend_to(module);
        self.arenas = Some(arenas);
        self.arenas_on = self.backend.device();
        Ok(true)
    }

    /// Checks `lr` as [`AdamW::step`] does.
    pub(crate) fn check_lr(lr: f32) -> Result<()> {
        if lr.is_finite() && lr >= 0.0 {
            return Ok(());
        }
        Err(Error::InvalidSetting {
            setting: "lr",
            value: lr.to_string(),
            reason: "must be finite and >= 0".to_string(),
        })
    }

    /// Makes zero moments at the first step; afterwards checks that the module still has the
    /// same parameters (names, shapes, order).
    fn check_or_init_moments(&mut self, module: &mut dyn Module) -> Result<()> {
        let mut live = Vec::new();
        module.visit_parameters(&mut |p| live.push((p.name().to_string(), p.shape().to_vec(), p.grad_len())));
        if let Some((name, _, len)) = live
            .iter()
            .find(|(_, shape, len)| shape.iter().product::<usize>() != *len)
        {
            return Err(Error::InvalidTensor {
                name: name.clone(),
                reason: format!("gradient has {len} values, which does not fit the parameter's shape"),
            });
        }
        if self.state.moments.is_empty() {
            self.state.moments = live
                .into_iter()
                .map(|(name, shape, len)| Moments {
                    name,
                    shape,
                    m: vec![0.0; len],
                    v: vec![0.0; len],
                })
                .collect();
            return Ok(());
        }
        if live.len() != self.state.moments.len() {
            return Err(Error::InvalidTensor {
                name: "adamw".to_string(),
                reason: format!(
                    "optimizer state has {} parameters, the module has {}",
                    self.state.moments.len(),
                    live.len()
                ),
            });
        }
        for ((name, shape, _), state) in live.iter().zip(&self.state.moments) {
            // In the arenas, the lengths are the layout's (checked by each step).
            let lengths_ok = self.arenas.is_some()
                || (state.m.len() == state.v.len() && state.m.len() == shape.iter().product::<usize>());
            if *name != state.name || *shape != state.shape || !lengths_ok {
                return Err(Error::InvalidTensor {
                    name: name.clone(),
                    reason: format!(
                        "optimizer state is for '{}' of shape {:?} ({} values), the module has '{name}' of shape {shape:?}",
                        state.name,
                        state.shape,
                        state.m.len()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The per-step scalars of step `t` (1-based) at learning rate `lr`, each computed in f64 and
/// rounded to f32 once (the formulas of the module documentation).
pub(crate) fn step_scalars(config: &AdamWConfig, lr: f32, t: u64) -> AdamWStep {
    let (lr64, b1, b2) = (lr as f64, config.beta1 as f64, config.beta2 as f64);
    AdamWStep {
        decay: (1.0 - lr64 * config.weight_decay as f64) as f32,
        step_size: (lr64 / (1.0 - b1.powf(t as f64))) as f32,
        bc2_sqrt: (1.0 - b2.powf(t as f64)).sqrt() as f32,
        beta1: config.beta1,
        beta2: config.beta2,
        c1: (1.0 - b1) as f32,
        c2: (1.0 - b2) as f32,
        eps: config.eps,
    }
}

/// `step` for a parameter of `shape`: matrices decay, vectors only with `decay_vectors`.
/// Multiplying by 1 is exact, so an undecayed parameter takes the same path.
pub(crate) fn for_parameter(step: AdamWStep, decay_vectors: bool, shape: &[usize]) -> AdamWStep {
    AdamWStep {
        decay: if decay_vectors || shape.len() >= 2 {
            step.decay
        } else {
            1.0
        },
        ..step
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::test_util::ParamList;

    /// Textbook AdamW in f64, one value at a time.
    #[allow(clippy::too_many_arguments)]
    fn reference_step(p: &mut f64, m: &mut f64, v: &mut f64, g: f64, t: i32, lr: f64, c: &AdamWConfig, decayed: bool) {
        let (b1, b2) = (c.beta1 as f64, c.beta2 as f64);
        if decayed {
            *p -= lr * c.weight_decay as f64 * *p;
        }
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        let m_hat = *m / (1.0 - b1.powi(t));
        let v_hat = *v / (1.0 - b2.powi(t));
        *p -= lr * m_hat / (v_hat.sqrt() + c.eps as f64);
    }

    #[test]
    fn several_steps_follow_an_f64_hand_computation() {
        for decay_vectors in [false, true] {
            several_steps_follow_f64(AdamWConfig {
                lr: 0.0,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-6,
                weight_decay: 0.1,
                decay_vectors,
            });
        }
    }

    fn several_steps_follow_f64(config: AdamWConfig) {
        let init = [0.5f32, -1.25, 3.0, 0.0, 1e-3, -7.5];
        let mut module = ParamList::new(&[("w", &[2, 2], init[..4].to_vec()), ("b", &[2], init[4..].to_vec())]);
        let mut opt = AdamW::new(config).unwrap();
        let mut p64: Vec<f64> = init.iter().map(|&x| x as f64).collect();
        let (mut m64, mut v64) = (vec![0.0f64; 6], vec![0.0f64; 6]);
        let lrs = [0.01f32, 0.02, 0.005, 0.01, 0.03];
        for (step, &lr) in lrs.iter().enumerate() {
            // Gradients that change sign and size from step to step, one of them zero.
            let grads: Vec<f32> = (0..6)
                .map(|i| ((i as f32 + 1.0) * (step as f32 - 1.5)).sin() * 0.3)
                .collect();
            module.params[0].grad_mut().copy_from_slice(&grads[..4]);
            module.params[1].grad_mut().copy_from_slice(&grads[4..]);
            module.params[1].grad_mut()[1] = 0.0;
            let g_used: Vec<f32> = module.params.iter().flat_map(|p| p.grad().to_vec()).collect();
            opt.step(&mut module, lr).unwrap();
            for i in 0..6 {
                reference_step(
                    &mut p64[i],
                    &mut m64[i],
                    &mut v64[i],
                    g_used[i] as f64,
                    step as i32 + 1,
                    lr as f64,
                    &config,
                    // Values 0-3 are the matrix "w", 4-5 the vector "b".
                    i < 4 || config.decay_vectors,
                );
            }
            let got: Vec<f32> = module.params.iter().flat_map(|p| p.value().to_vec()).collect();
            for i in 0..6 {
                let tol = 1e-5 * p64[i].abs().max(1.0);
                assert!(
                    (got[i] as f64 - p64[i]).abs() < tol,
                    "step {step} value {i}: {} vs {}",
                    got[i],
                    p64[i]
                );
            }
        }
        assert_eq!(opt.steps_taken(), 5);
        assert_eq!(module.params[0].version(), 5);
        assert_eq!(opt.state_bytes(), 6 * 8);
    }

    #[test]
    fn first_step_moves_each_value_by_about_lr_against_its_gradient_sign() {
        // With bias correction the first update is lr * g/|g| (plus decay), whatever the gradient's size.
        let mut module = ParamList::new(&[("w", &[3], vec![1.0, 1.0, 1.0])]);
        module.params[0].grad_mut().copy_from_slice(&[1e-4, -50.0, 3.0]);
        let config = AdamWConfig {
            weight_decay: 0.0,
            eps: 1e-12,
            ..AdamWConfig::default()
        };
        AdamW::new(config).unwrap().step(&mut module, 0.1).unwrap();
        let expected = [0.9f32, 1.1, 0.9];
        for (got, want) in module.params[0].value().iter().zip(expected) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn a_changed_parameter_set_is_an_error_and_changes_nothing() {
        let mut module = ParamList::new(&[("w", &[2], vec![1.0, 2.0])]);
        let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
        opt.step(&mut module, 0.1).unwrap();
        let mut other = ParamList::new(&[("w", &[3], vec![1.0, 2.0, 3.0])]);
        let before = other.params[0].clone();
        assert!(matches!(opt.step(&mut other, 0.1), Err(Error::InvalidTensor { .. })));
        assert_eq!(other.params[0], before);
        let mut renamed = ParamList::new(&[("v", &[2], vec![1.0, 2.0])]);
        assert!(opt.step(&mut renamed, 0.1).is_err());
        assert_eq!(opt.steps_taken(), 1);
    }

    #[test]
    fn bad_hyperparameters_and_learning_rates_are_errors() {
        for config in [
            AdamWConfig {
                beta1: 1.0,
                ..Default::default()
            },
            AdamWConfig {
                beta2: -0.1,
                ..Default::default()
            },
            AdamWConfig {
                eps: 0.0,
                ..Default::default()
            },
            AdamWConfig {
                lr: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(matches!(AdamW::new(config), Err(Error::InvalidSetting { .. })));
        }
        let mut module = ParamList::new(&[("w", &[1], vec![1.0])]);
        let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
        assert!(opt.step(&mut module, f32::INFINITY).is_err());
        assert!(opt.step(&mut module, -1.0).is_err());
    }

    #[test]
    fn state_round_trips_and_continues_identically() {
        let mut a = ParamList::new(&[("w", &[2], vec![0.3, -0.7])]);
        let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
        for s in 0..3 {
            a.params[0].grad_mut().copy_from_slice(&[0.1 * s as f32 + 0.05, -0.2]);
            opt.step(&mut a, 0.01).unwrap();
        }
        let mut b = a.clone();
        let mut copy = AdamW::new(AdamWConfig::default()).unwrap();
        copy.set_state(opt.state().unwrap().into_owned());
        a.params[0].grad_mut().copy_from_slice(&[0.4, 0.4]);
        b.params[0].grad_mut().copy_from_slice(&[0.4, 0.4]);
        opt.step(&mut a, 0.01).unwrap();
        copy.step(&mut b, 0.01).unwrap();
        assert_eq!(a.params[0].value(), b.params[0].value());
    }
}
