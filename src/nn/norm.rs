//! `LayerNorm` and `RMSNorm` over the features of each token, in f32 under every
//! precision (`docs/numerics.md`, mixed precision); the output is rounded to the compute dtype unless a fused
//! FP8 cast consumes it directly.

use super::no_forward;
use super::param::{Module, Parameter};
use crate::amp::Precision;
use crate::dispatch::{Backend, NormShape, Values, ValuesMut};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::tensor::{DeviceKind, Dtype};

/// Which normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * gamma + beta`.
    #[default]
    LayerNorm,
    /// `x / sqrt(mean(x^2) + eps) * gamma`.
    RmsNorm,
}

/// Settings of a norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormConfig {
    /// LayerNorm or RMSNorm.
    pub kind: NormKind,
    /// Added to the variance.
    pub eps: f32,
    /// Store `gamma - 1` (initialized to zero) so weight decay pulls gamma towards 1.
    pub zero_centered_gamma: bool,
}

impl Default for NormConfig {
    fn default() -> Self {
        NormConfig {
            kind: NormKind::LayerNorm,
            eps: 1e-5,
            zero_centered_gamma: false,
        }
    }
}

/// What a norm's forward keeps for backward, where the input lived (host or GPU).
struct NormSaved {
    x: Tensor,
    /// LayerNorm's row means (`[rows, 1]`); none for RMSNorm.
    mean: Option<Tensor>,
    rstd: Tensor,
}

/// The shared core of LayerNorm and RMSNorm.
struct NormCore {
    name: String,
    hidden: usize,
    config: NormConfig,
    dtype: Dtype,
    gamma: Parameter,
    beta: Option<Parameter>,
    saved: Option<NormSaved>,
    /// Where its ops run.
    backend: Backend,
}

impl NormCore {
    fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, &self.name);
    }

    fn new(name: &str, hidden: usize, config: NormConfig, precision: &Precision) -> Result<Self> {
        let gamma0 = if config.zero_centered_gamma { 0.0 } else { 1.0 };
        let gamma = Parameter::new(format!("{name}.weight"), &[hidden], vec![gamma0; hidden])?;
        let beta = (config.kind == NormKind::LayerNorm)
            .then(|| Parameter::new(format!("{name}.bias"), &[hidden], vec![0.0; hidden]))
            .transpose()?;
        Ok(NormCore {
            name: name.to_string(),
            hidden,
            config,
            dtype: precision.compute_dtype(),
            gamma,
            beta,
            saved: None,
            backend: Backend::default(),
        })
    }

    /// The f32 output (not rounded), where `x` lives (host or GPU).
    fn forward_f32(&mut self, x: &Tensor) -> Result<Tensor> {
        x.expect(&self.name, "input", None, self.hidden)?;
        let rows = x.rows();
        let shape = NormShape {
            rows,
            cols: self.hidden,
        };
        // gamma and beta live where the layer's tensors do, as a linear's weight (small, but a
        // host one is uploaded by every call on a GPU).
        let device = x.device();
        self.gamma.value_where(&self.backend, device, self.dtype)?;
        if let Some(beta) = &mut self.beta {
            beta.value_where(&self.backend, device, self.dtype)?;
        }
        let gamma_host = self.gamma.host_op_values();
        let beta_host = self.beta.as_ref().and_then(Parameter::host_op_values);
        // Both norm kernels write every output value.
        let mut y = self.backend.output_like(x, rows, self.hidden)?;
        let mut rstd = self.backend.output_like(x, rows, 1)?;
        let mean = match &self.beta {
            Some(beta) => {
                let mut mean = self.backend.output_like(x, rows, 1)?;
                self.backend.kernels().layernorm_forward(
                    x.values(),
                    self.gamma.op_values(&gamma_host),
                    beta.op_values(&beta_host),
                    shape,
                    self.config.eps,
                    self.config.zero_centered_gamma,
                    y.values_mut(),
                    mean.values_mut(),
                    rstd.values_mut(),
                )?;
                Some(mean)
            }
            None => {
                self.backend.kernels().rmsnorm_forward(
                    x.values(),
                    self.gamma.op_values(&gamma_host),
                    shape,
                    self.config.eps,
                    self.config.zero_centered_gamma,
                    y.values_mut(),
                    rstd.values_mut(),
                )?;
                None
            }
        };
        self.saved = Some(NormSaved {
            x: x.kept_copy(),
            mean,
            rstd,
        });
        Ok(y)
    }

    fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        let mut y = self.forward_f32(x)?;
        self.backend.kernels().round(y.values_mut(), self.dtype)?;
        Ok(y)
    }

    fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        let Some(saved) = self.saved.take() else {
            return Err(no_forward(&self.name));
        };
        let rows = saved.x.rows();
        if let Err(err) = dy.expect(&self.name, "output gradient", Some(rows), self.hidden) {
            self.saved = Some(saved);
            return Err(err);
        }
        let shape = NormShape {
            rows,
            cols: self.hidden,
        };
        // dX is overwritten by both backward kernels (their gamma and beta gradients accumulate).
        let mut dx = self.backend.output_like(dy, rows, self.hidden)?;
        let zc = self.config.zero_centered_gamma;
        // Trainable gradients accumulate where dY lives (`Parameter::grad_where`), as a linear's.
        let device = dy.device();
        self.gamma.grad_where(&self.backend, device, self.dtype)?;
        if let Some(beta) = &mut self.beta {
            beta.grad_where(&self.backend, device, self.dtype)?;
        }
        // A frozen norm (LoRA) still needs dX; its weight gradients go to a scratch buffer, and
        // its weight may be held in 16 bits: widened for the call (`hidden` values).
        let (mut gamma_scratch, mut beta_scratch) = (Vec::new(), Vec::new());
        let frozen_gamma = self.gamma.is_frozen().then(|| self.gamma.widened().into_owned());
        let (gamma, dgamma) = match self.gamma.value_and_trainable_grad_values() {
            (gamma, Some(dgamma)) => (gamma, dgamma),
            (_, None) => {
                gamma_scratch.resize(self.hidden, 0.0);
                let gamma = frozen_gamma.as_deref().unwrap_or_default();
                (Values::Host(gamma), ValuesMut::Host(&mut gamma_scratch[..]))
            }
        };
        match (&mut self.beta, &saved.mean) {
            (Some(beta), Some(mean)) => self.backend.kernels().layernorm_backward(
                dy.values(),
                saved.x.values(),
                gamma,
                mean.values(),
                saved.rstd.values(),
                shape,
                zc,
                dx.values_mut(),
                dgamma,
                match beta.trainable_grad_values() {
                    Some(dbeta) => dbeta,
                    None => {
                        beta_scratch.resize(self.hidden, 0.0);
                        ValuesMut::Host(&mut beta_scratch[..])
                    }
                },
            )?,
            (None, None) => self.backend.kernels().rmsnorm_backward(
                dy.values(),
                saved.x.values(),
                gamma,
                saved.rstd.values(),
                shape,
                zc,
                dx.values_mut(),
                dgamma,
            )?,
            // The forward saves a mean exactly when the norm has a beta (LayerNorm).
            _ => {
                return Err(crate::error::Error::LayerShape {
                    layer: self.name.clone(),
                    detail: "the saved forward state does not match the norm's kind".into(),
                });
            }
        }
        self.backend.kernels().round(dx.values_mut(), self.dtype)?;
        saved.x.recycle();
        Ok(dx)
    }

    fn visit(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        f(&mut self.gamma);
        if let Some(beta) = &mut self.beta {
            f(beta);
        }
    }

    fn saved_bytes(&self) -> usize {
        self.saved.as_ref().map_or(0, |s| {
            s.x.len() * self.dtype.bytes() + 4 * (s.mean.as_ref().map_or(0, Tensor::len) + s.rstd.len())
        })
    }
}

macro_rules! norm_layer {
    ($(#[$doc:meta])* $ty:ident, $kind:expr) => {
        $(#[$doc])*
        pub struct $ty(NormCore);

        impl $ty {
            /// A norm over `hidden` features; gamma starts at 1 (0 when zero-centred), beta at 0.
            /// `config.kind` is ignored: the type decides it.
            pub fn new(name: &str, hidden: usize, config: NormConfig, precision: &Precision) -> Result<Self> {
                let config = NormConfig { kind: $kind, ..config };
                NormCore::new(name, hidden, config, precision).map($ty)
            }

            /// Normalizes each row of `x` `[tokens, hidden]`; the result is rounded to the compute dtype.
            pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
                self.0.forward(x)
            }

            /// dX; accumulates the gamma (and beta) gradients.
            pub fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
                self.0.backward(dy)
            }

            /// The scale `gamma` (`gamma - 1` when zero-centred).
            pub fn gamma(&self) -> &Parameter {
                &self.0.gamma
            }

            /// Drops what the last forward kept for backward (after an evaluation-only forward).
            pub fn clear_saved(&mut self) {
                self.0.saved = None;
            }
        }

        impl Module for $ty {
            fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
                self.0.visit(f);
            }

            fn saved_activation_bytes(&self) -> usize {
                self.0.saved_bytes()
            }

            fn to_device(&mut self, device: DeviceKind) -> Result<()> {
                self.0.backend = Backend::on(device);
                Ok(())
            }

            fn check_against_cpu(&mut self, on: bool) {
                self.0.check_against_cpu(on);
            }
        }
    };
}

norm_layer!(
    /// Layer normalization with learnable `gamma` and `beta` (`name.weight`, `name.bias`).
    LayerNorm,
    NormKind::LayerNorm
);
norm_layer!(
    /// Root-mean-square normalization with a learnable `gamma` (`name.weight`).
    RMSNorm,
    NormKind::RmsNorm
);

/// A norm of either kind, as composite layers hold it.
pub(crate) struct Norm(NormCore);

impl Norm {
    pub(crate) fn new(name: &str, hidden: usize, config: NormConfig, precision: &Precision) -> Result<Self> {
        NormCore::new(name, hidden, config, precision).map(Norm)
    }

    /// The f32 output, for a fused FP8 cast.
    pub(crate) fn forward_f32(&mut self, x: &Tensor) -> Result<Tensor> {
        self.0.forward_f32(x)
    }

    pub(crate) fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }

    pub(crate) fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        self.0.backward(dy)
    }

    pub(crate) fn clear_saved(&mut self) {
        self.0.saved = None;
    }

    pub(crate) fn set_backend(&mut self, backend: Backend) {
        self.0.backend = backend;
    }

    pub(crate) fn check_against_cpu(&mut self, on: bool) {
        self.0.check_against_cpu(on);
    }

    pub(crate) fn visit(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.0.visit(f);
    }

    pub(crate) fn saved_bytes(&self) -> usize {
        self.0.saved_bytes()
    }
}
