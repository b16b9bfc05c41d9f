//! A trainable parameter: f32 master values and their f32 gradient. Layers keep
//! their compute copies (bf16, fp16, FP8 with its transpose) keyed by `version`,
//! which the optimizer bumps after every update, so a copy is made once per step
//! and reused across micro-batches.

use std::borrow::Cow;
use std::sync::OnceLock;

use crate::dispatch::Backend;
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;
use crate::scaling::DelayedSlot;
use crate::scaling::Fp8TensorStats;
use crate::tensor::device_values::{ArenaLender, CudaStorage, Values, ValuesMut};
use crate::tensor::{DeviceKind, Dtype, HalfValues, Tensor};

/// One trainable tensor.
#[derive(Clone, Debug)]
pub struct Parameter {
    name: String,
    shape: Vec<usize>,
    /// f32 master values, row-major, as a matrix (see [`matrix_dims`]): in host memory, or on
    /// the GPU of a layer that keeps its activations there ([`Parameter::keep_value_on`]), where
    /// its casts read them and the optimizer's arenas update them in place.
    value: Tensor,
    /// The host copy of device master values that [`Parameter::value`] made (dropped whenever
    /// they may change).
    value_read: HostCopy,
    /// f32 gradient, accumulated across micro-batches until `zero_grad`: in host memory, or
    /// on the GPU of a layer that keeps its activations there ([`Parameter::keep_grad_on`]),
    /// where the wgrad GEMMs accumulate into it and the optimizer's arenas copy it in place.
    grad: Tensor,
    /// The host copy of a device gradient that [`Parameter::grad`] made (dropped whenever the
    /// gradient may change).
    grad_read: HostCopy,
    version: u64,
    /// Frozen (LoRA's base weights): no gradient buffer, no optimizer state.
    frozen: bool,
    /// A frozen parameter held at the checkpoint's 16-bit width ([`Parameter::hold_frozen_in`]);
    /// `value` is then empty.
    half: Option<HalfValues>,
    /// ZeRO-1 sharded masters: `value` holds only these values of the whole tensor (the other
    /// ranks hold the rest); `None`: it holds all of them.
    held: Option<std::ops::Range<usize>>,
    /// The optimizer's arena ranges this parameter may hold as its device values and gradient
    /// ([`Parameter::lend_from`]).
    lenders: Lenders,
}

/// The ranges of an optimizer's value and gradient arenas lent to one parameter. A clone
/// starts without: two parameters never hold one range.
#[derive(Debug, Default)]
struct Lenders {
    value: Option<std::sync::Arc<dyn ArenaLender>>,
    grad: Option<std::sync::Arc<dyn ArenaLender>>,
}

impl Clone for Lenders {
    fn clone(&self) -> Self {
        Lenders::default()
    }
}

impl PartialEq for Parameter {
    /// Names, shapes, values, versions and states; values and gradients by their values wherever
    /// they live (device ones read back).
    fn eq(&self, other: &Self) -> bool {
        (
            &self.name,
            &self.shape,
            self.value.shape(),
            self.value(),
            self.version,
            self.frozen,
            &self.half,
            &self.held,
        ) == (
            &other.name,
            &other.shape,
            other.value.shape(),
            other.value(),
            other.version,
            other.frozen,
            &other.half,
            &other.held,
        ) && self.grad.shape() == other.grad.shape()
            && self.grad() == other.grad()
    }
}

/// The `[rows, cols]` a parameter of `shape` is stored as: a vector is one row, a matrix itself,
/// higher ranks fold their trailing dimensions into the columns, a scalar is `[1, 1]`.
fn matrix_dims(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (1, *n),
        [rows, rest @ ..] => (*rows, rest.iter().product()),
    }
}

impl Parameter {
    /// A parameter named `name` (unique within its model) holding `value` of `shape`.
    pub fn new(name: impl Into<String>, shape: &[usize], value: Vec<f32>) -> Result<Self> {
        let name = name.into();
        let expected: usize = shape.iter().product();
        if value.len() != expected {
            return Err(Error::InvalidTensor {
                name,
                reason: format!("shape {shape:?} needs {expected} values, got {}", value.len()),
            });
        }
        let (rows, cols) = matrix_dims(shape);
        Ok(Parameter {
            grad: Tensor::zeros(rows, cols),
            grad_read: HostCopy::default(),
            value: Tensor::new(value, rows, cols)?,
            value_read: HostCopy::default(),
            name,
            shape: shape.to_vec(),
            version: 0,
            frozen: false,
            half: None,
            held: None,
            lenders: Lenders::default(),
        })
    }

    /// A frozen parameter of `shape` holding no values yet (a weight about to be replaced by
    /// frozen FP8 codes): nothing is allocated.
    pub(crate) fn placeholder(name: impl Into<String>, shape: &[usize]) -> Self {
        let mut p = Parameter {
            name: name.into(),
            shape: shape.to_vec(),
            value: Tensor::zeros(0, 0),
            value_read: HostCopy::default(),
            grad: Tensor::zeros(0, 0),
            grad_read: HostCopy::default(),
            version: 0,
            frozen: false,
            half: None,
            held: None,
            lenders: Lenders::default(),
        };
        p.freeze();
        p
    }

    /// Freezes the parameter and drops its values (the layer holds them in another form).
    pub(crate) fn release(&mut self) {
        self.freeze();
        self.value = Tensor::zeros(0, 0);
        self.value_read.forget();
        self.half = None;
    }

    /// Holds the values of this frozen parameter in `dtype`: bf16 or f16 at 2 bytes a value (each
    /// must be exactly representable, so nothing changes: an error names the first that is not),
    /// or f32 again. Readers widen them ([`Parameter::widened`]); [`Parameter::value`] is empty
    /// while they are 16-bit. An error for a trainable parameter: its f32 master is what trains.
    pub fn hold_frozen_in(&mut self, dtype: Dtype) -> Result<()> {
        if !self.frozen {
            return Err(Error::InvalidTensor {
                name: self.name.clone(),
                reason: format!(
                    "a trainable parameter keeps its f32 master values; only frozen ones are held in {dtype}"
                ),
            });
        }
        let (rows, cols) = matrix_dims(&self.shape);
        match (dtype, &self.half) {
            (Dtype::F32, None) => {}
            (Dtype::F32, Some(half)) => {
                self.value = Tensor::new(half.to_f32(), rows, cols)?;
                self.value_read.forget();
                self.half = None;
            }
            (_, Some(half)) if half.dtype() == dtype => {}
            (_, _) => {
                let half = HalfValues::exact(&self.name, dtype, &self.widened())?;
                self.value = Tensor::zeros(0, 0);
                self.value_read.forget();
                self.half = Some(half);
            }
        }
        Ok(())
    }

    /// The 16-bit values of a frozen parameter held at that width, else `None` (f32 values).
    pub fn half_values(&self) -> Option<&HalfValues> {
        self.half.as_ref()
    }

    /// The dtype the values are held in.
    pub fn storage_dtype(&self) -> Dtype {
        self.half.as_ref().map_or(Dtype::F32, HalfValues::dtype)
    }

    /// The values as f32: the f32 values themselves, or the 16-bit ones widened (exact, a copy).
    pub fn widened(&self) -> Cow<'_, [f32]> {
        self.widened_copy()
            .unwrap_or_else(|e| panic!("the values of '{}' could not come back from their GPU: {e}", self.name))
    }

    /// [`Parameter::widened`], or the error of a download that failed (no panic).
    pub(crate) fn widened_copy(&self) -> Result<Cow<'_, [f32]>> {
        match &self.half {
            Some(half) => Ok(Cow::Owned(half.to_f32())),
            None => self.value_copy(),
        }
    }

    /// The f32 master values as [`Parameter::value`] reads them, without keeping a host copy of
    /// values kept on a GPU: a checkpoint's or an export's one read of every parameter holds
    /// no second copy of the model in host memory after it (28 GB for a 7B model's masters).
    pub(crate) fn value_copy(&self) -> Result<Cow<'_, [f32]>> {
        if self.value.device() == DeviceKind::Cpu {
            return Ok(Cow::Borrowed(self.value.data()));
        }
        // A range's copy is never trusted (as `bring_home`): its optimizer writes it in place.
        match self.value_read.0.get() {
            Some(read) if !holds_range(&self.value) => Ok(Cow::Borrowed(read)),
            _ => Ok(Cow::Owned(self.value.to_host()?.into_data())),
        }
    }

    /// Bytes the values take: 4 a value in f32, 2 in bf16 or f16.
    pub fn held_bytes(&self) -> usize {
        self.half.as_ref().map_or(4 * self.value.len(), HalfValues::bytes)
    }

    /// The 16-bit values (if held so) and the gradient to accumulate into (if trainable),
    /// wherever it lives, at once.
    pub(crate) fn half_and_trainable_grad(&mut self) -> (Option<&HalfValues>, Option<ValuesMut<'_>>) {
        self.grad_read.forget();
        let grad = (!self.frozen).then(|| self.grad.values_mut());
        (self.half.as_ref(), grad)
    }

    /// The values an op reads from host memory: the f32 masters, or a frozen parameter's 16-bit
    /// values widened (exact); `None` for masters kept on a GPU, which the op reads in place
    /// ([`Parameter::op_values`]).
    pub(crate) fn host_op_values(&self) -> Option<Cow<'_, [f32]>> {
        (self.half.is_some() || self.value.device() == DeviceKind::Cpu).then(|| self.widened())
    }

    /// The values as an op argument: `host` (from [`Parameter::host_op_values`]) or the
    /// master values where they live.
    pub(crate) fn op_values<'a>(&'a self, host: &'a Option<Cow<'a, [f32]>>) -> Values<'a> {
        match host {
            Some(values) => Values::Host(values),
            None => self.value.values(),
        }
    }

    /// The master values as an op argument and the gradient to accumulate into (`None` when
    /// frozen), each wherever it lives, at once: a norm's backward reads gamma and adds into its
    /// gradient. Not for a parameter held in 16 bits (its `value` is empty): use
    /// [`Parameter::widened`].
    pub(crate) fn value_and_trainable_grad_values(&mut self) -> (Values<'_>, Option<ValuesMut<'_>>) {
        self.grad_read.forget();
        let grad = (!self.frozen).then(|| self.grad.values_mut());
        (self.value.values(), grad)
    }

    /// The gradient to accumulate into wherever it lives, or `None` for a frozen parameter.
    pub(crate) fn trainable_grad_values(&mut self) -> Option<ValuesMut<'_>> {
        self.half_and_trainable_grad().1
    }

    /// The gradient as an op argument, wherever it lives (the optimizer's arenas copy a
    /// device gradient on the device).
    pub(crate) fn grad_values(&self) -> Values<'_> {
        self.grad.values()
    }

    /// Drops the host copy [`Parameter::grad`] made of a gradient holding its optimizer arena
    /// range (the arena unscaled or clipped it in place); a gradient of its own keeps its copy.
    pub(crate) fn forget_held_grad_read(&mut self) {
        if holds_range(&self.grad) {
            self.grad_read.forget();
        }
    }

    /// Drops the host copy [`Parameter::value`] made of master values holding their optimizer
    /// arena range (an update that may have changed the range, then failed before this
    /// parameter's turn); values of their own keep their copy. Whether they hold a range.
    pub(crate) fn forget_held_value_read(&mut self) -> bool {
        let held = holds_range(&self.value);
        if held {
            self.value_read.forget();
        }
        held
    }

    /// The device the gradient lives on.
    pub fn grad_device(&self) -> DeviceKind {
        self.grad.device()
    }

    /// Keeps the trainable gradient where a backward's `dy` lives (`device`): on its GPU
    /// ([`Self::keep_grad_on`]) for device tensors, so the wgrad GEMMs accumulate in place and
    /// the optimizer's arenas copy it on the device, else in host memory. Not under fp32
    /// (`dtype`), whose GEMM (the cuBLASLt reference) finishes on the host: a device gradient
    /// would only add its download and upload.
    pub(crate) fn grad_where(&mut self, backend: &Backend, device: DeviceKind, dtype: Dtype) -> Result<()> {
        match kept_on_device(device, dtype) {
            false => self.grad_to_host(),
            true => self.keep_grad_on(backend),
        }
    }

    /// Keeps a trainable gradient on `backend`'s GPU from now on (uploaded once;
    /// [`Parameter::zero_grad`] clears it there). Nothing on the CPU, for a frozen parameter, or
    /// for a gradient already there. A GPU without room for it leaves it in host memory (the
    /// staged GEMMs accumulate there, as before): the run goes on.
    ///
    /// The device copy is booked as workspace: the memory summary's gradients are the training
    /// session's model of them (one copy, two while micro-batches accumulate), which real
    /// allocations must not move.
    pub(crate) fn keep_grad_on(&mut self, backend: &Backend) -> Result<()> {
        if self.frozen {
            return Ok(());
        }
        keep_on(backend, &mut self.grad, &mut self.grad_read, self.lenders.grad.as_ref())
    }

    /// Brings a device gradient to host memory (a download, or the copy [`Parameter::grad`]
    /// already read; nothing for a host one).
    pub fn grad_to_host(&mut self) -> Result<()> {
        bring_home(&mut self.grad, &mut self.grad_read)
    }

    /// Moves the gradient onto a stand-in GPU `ordinal` (host memory playing a device array,
    /// `tensor::device_values::HostArray`), for tests of the code around device gradients.
    #[cfg(test)]
    pub(crate) fn grad_on_stand_in_gpu(&mut self, ordinal: usize) {
        on_stand_in_gpu(&mut self.grad, &mut self.grad_read, ordinal);
    }

    /// [`Self::grad_to_host`] for accessors that hand out host slices: a failed download
    /// means the GPU is gone, and they have no error to return.
    fn grad_home(&mut self) {
        if let Err(e) = self.grad_to_host() {
            panic!("the gradient of '{}' could not come back from its GPU: {e}", self.name);
        }
    }

    /// Name, e.g. `layers.0.attn.qkv.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Shape, e.g. `[out_features, in_features]` for a weight.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The f32 master values, row-major (empty for a frozen parameter held in 16 bits:
    /// [`Parameter::widened`] reads either; under sharded masters, only
    /// [`Parameter::held_range`]).
    ///
    /// Master values kept on a GPU are downloaded at the first read after they changed.
    ///
    /// # Panics
    /// If that download fails (the GPU is gone); [`Parameter::value_to_host`] returns the error.
    pub fn value(&self) -> &[f32] {
        if self.value.device() == DeviceKind::Cpu {
            return self.value.data();
        }
        self.value_read.0.get_or_init(|| match self.value.to_host() {
            Ok(t) => t.into_data(),
            Err(e) => panic!("the values of '{}' could not come back from their GPU: {e}", self.name),
        })
    }

    /// The master values to change in place, in host memory (device values come back first and
    /// stay until a layer takes them up again); call [`Parameter::mark_updated`] after, so
    /// layers remake their compute copies.
    ///
    /// # Panics
    /// As [`Parameter::value`].
    pub fn value_mut(&mut self) -> &mut [f32] {
        self.value_home();
        self.value.data_mut()
    }

    /// The master values as an op argument, wherever they live (a layer's weight cast reads
    /// device values in place).
    pub(crate) fn value_values(&self) -> Values<'_> {
        self.value.values()
    }

    /// The master values to overwrite wherever they live (the optimizer's arenas write device
    /// values on the device); call [`Parameter::mark_updated`] after.
    pub(crate) fn value_values_mut(&mut self) -> ValuesMut<'_> {
        self.value_read.forget();
        self.value.values_mut()
    }

    /// Number of f32 master values held here, wherever they live (0 while held in 16 bits; a
    /// shard's under sharded masters).
    pub(crate) fn value_len(&self) -> usize {
        self.value.len()
    }

    /// Overwrites every master value with `values` (of the same length) where they live: in
    /// place in host memory, or uploaded into the device values (nothing downloaded first);
    /// call [`Parameter::mark_updated`] after.
    pub(crate) fn write_value(&mut self, values: &[f32]) -> Result<()> {
        self.value_read.forget();
        match self.value.values_mut() {
            ValuesMut::Device(storage) => storage.overwrite(values),
            ValuesMut::Host(host) if host.len() == values.len() => {
                host.copy_from_slice(values);
                Ok(())
            }
            ValuesMut::Host(host) => Err(Error::LengthMismatch {
                what: "values into a parameter",
                src: values.len(),
                dst: host.len(),
            }),
        }
    }

    /// The device the master values live on.
    pub fn value_device(&self) -> DeviceKind {
        self.value.device()
    }

    /// Keeps the trainable master values where a forward's input lives (`device`): on its GPU
    /// ([`Self::keep_value_on`]) for device tensors, so the weight casts read them there and the
    /// optimizer's arenas update them in place, else in host memory. Not under fp32 (`dtype`),
    /// whose weight copy and GEMM (the cuBLASLt reference) stay on the host, as its gradients do.
    pub(crate) fn value_where(&mut self, backend: &Backend, device: DeviceKind, dtype: Dtype) -> Result<()> {
        match kept_on_device(device, dtype) {
            false => self.value_to_host(),
            true => self.keep_value_on(backend),
        }
    }

    /// Keeps trainable f32 master values on `backend`'s GPU from now on (uploaded once). Nothing
    /// on the CPU, for a frozen, 16-bit, sharded or empty parameter, or for values already
    /// there. A GPU without room for them leaves them in host memory: the run goes on.
    ///
    /// The device copy is booked as workspace, as a device gradient is: the memory summary's
    /// parameters are the training session's model of them.
    pub(crate) fn keep_value_on(&mut self, backend: &Backend) -> Result<()> {
        if !self.trainable_masters() {
            return Ok(());
        }
        keep_on(
            backend,
            &mut self.value,
            &mut self.value_read,
            self.lenders.value.as_ref(),
        )
    }

    /// Lends this parameter its optimizer's arena ranges (`None`: none): when a layer keeps its
    /// master values or gradient on that GPU ([`Self::keep_value_on`], [`Self::keep_grad_on`]),
    /// they are uploaded into the range and held there, one copy on the device that the
    /// optimizer updates in place, instead of a device copy of their own beside the arena.
    pub(crate) fn lend_from(
        &mut self,
        value: Option<std::sync::Arc<dyn ArenaLender>>,
        grad: Option<std::sync::Arc<dyn ArenaLender>>,
    ) {
        self.lenders = match self.trainable_masters() {
            true => Lenders { value, grad },
            false => Lenders::default(),
        };
    }

    /// Whether the f32 master values train here, whole: not frozen, not held in 16 bits, not a
    /// ZeRO shard.
    fn trainable_masters(&self) -> bool {
        !self.frozen && self.half.is_none() && self.held.is_none()
    }

    /// Brings master values and a gradient that hold ranges of an optimizer's arenas to host
    /// memory (a download each): the optimizer is about to make new arenas, and ranges of the
    /// old ones would keep their allocations alive beside them. A layer takes them up again,
    /// into the new arenas' ranges.
    pub(crate) fn release_arena_ranges(&mut self) -> Result<()> {
        if holds_range(&self.value) {
            self.value_to_host()?;
        }
        if holds_range(&self.grad) {
            self.grad_to_host()?;
        }
        Ok(())
    }

    /// After the optimizer copied device master values (`grad`: the device gradient) into their
    /// arena range, holds that range instead of the copy of their own, which is freed. Nothing
    /// for host values or without a range lent on their GPU.
    pub(crate) fn hold_lent(&mut self, grad: bool) -> Result<()> {
        let (t, read, lender) = match grad {
            false => (&mut self.value, &mut self.value_read, self.lenders.value.as_ref()),
            true => (&mut self.grad, &mut self.grad_read, self.lenders.grad.as_ref()),
        };
        let DeviceKind::Cuda(ordinal) = t.device() else {
            return Ok(());
        };
        if let Some(range) = lent_range(lender, ordinal, t.len())? {
            hold(t, read, range)?;
        }
        Ok(())
    }

    /// Brings device master values to host memory (a download, or the copy
    /// [`Parameter::value`] already read; nothing for host ones).
    pub fn value_to_host(&mut self) -> Result<()> {
        bring_home(&mut self.value, &mut self.value_read)
    }

    /// [`Self::value_to_host`] for accessors that hand out host slices.
    fn value_home(&mut self) {
        if let Err(e) = self.value_to_host() {
            panic!("the values of '{}' could not come back from their GPU: {e}", self.name);
        }
    }

    /// Moves the master values onto a stand-in GPU `ordinal` (as
    /// [`Parameter::grad_on_stand_in_gpu`]).
    #[cfg(test)]
    pub(crate) fn value_on_stand_in_gpu(&mut self, ordinal: usize) {
        on_stand_in_gpu(&mut self.value, &mut self.value_read, ordinal);
    }

    /// The f32 gradient, accumulated across micro-batches until [`Parameter::zero_grad`]. A
    /// gradient kept on a GPU is downloaded at the first read after it changed.
    ///
    /// # Panics
    /// If that download fails (the GPU is gone); [`Parameter::grad_to_host`] returns the error.
    pub fn grad(&self) -> &[f32] {
        if self.grad.device() == DeviceKind::Cpu {
            return self.grad.data();
        }
        self.grad_read.0.get_or_init(|| match self.grad.to_host() {
            Ok(t) => t.into_data(),
            Err(e) => panic!("the gradient of '{}' could not come back from its GPU: {e}", self.name),
        })
    }

    /// The gradient as a tensor, wherever it lives.
    pub(crate) fn grad_tensor(&self) -> &Tensor {
        &self.grad
    }

    /// Adds `sum` (earlier micro-batches' gradients, of the same length) into the gradient: on
    /// its GPU when both live there (an f32 add, the same bits as on the host), else in host
    /// memory.
    pub(crate) fn add_to_grad(&mut self, sum: &Tensor) -> Result<()> {
        if sum.len() != self.grad.len() {
            return Err(Error::LengthMismatch {
                what: "gradient sum",
                src: sum.len(),
                dst: self.grad.len(),
            });
        }
        let device = self.grad.device();
        if device != DeviceKind::Cpu && sum.device() == device {
            // The gradient's array is shared with `before` while the add writes: the output is
            // a new array booked as the gradient's was, and `before` goes after. A gradient
            // holding its arena range keeps it: `before` is a copy, the add writes the range.
            self.grad_read.forget();
            match self.grad.try_clone() {
                Ok(before) => {
                    let kernels = Backend::on(device);
                    let kernels = kernels.kernels();
                    match kernels.residual_add(before.values(), sum.values(), Dtype::F32, self.grad.values_mut()) {
                        // No room for the sum's new array: the gradient (unchanged) is added on the host.
                        Err(e) if out_of_memory(&e) => self.grad = before,
                        done => return done,
                    }
                }
                // No room for the copy: the gradient (unchanged) is added on the host.
                Err(e) if out_of_memory(&e) => {}
                Err(e) => return Err(e),
            }
        }
        // Borrowed in host memory, downloaded from a GPU.
        let sum = sum.values().to_host()?;
        self.grad_to_host()?;
        self.grad
            .data_mut()
            .iter_mut()
            .zip(sum.iter())
            .for_each(|(g, s)| *g += *s);
        Ok(())
    }

    /// Number of gradient values (0 for a frozen parameter), wherever they live.
    pub fn grad_len(&self) -> usize {
        self.grad.len()
    }

    /// The gradient, to accumulate into or rescale in place, in host memory (a device gradient
    /// comes back first and stays until a layer takes it up again).
    ///
    /// # Panics
    /// As [`Parameter::grad`].
    pub fn grad_mut(&mut self) -> &mut [f32] {
        self.grad_home();
        self.grad.data_mut()
    }

    /// The master values and the gradient at once (an optimizer reads one and writes the other),
    /// in host memory as [`Parameter::grad_mut`].
    pub fn value_and_grad_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        self.value_home();
        self.grad_home();
        (self.value.data_mut(), self.grad.data_mut())
    }

    /// Replaces the master values with `value` of the same length (checked by the caller).
    pub(crate) fn set_value(&mut self, value: Vec<f32>) {
        self.value_read.forget();
        if self.half.take().is_some() {
            // Held in 16 bits: the new values are f32 again.
            let (rows, cols) = matrix_dims(&self.shape);
            if let Ok(t) = Tensor::new(value, rows, cols) {
                self.value = t;
            }
            return;
        }
        debug_assert_eq!(value.len(), self.value.len());
        let (rows, cols) = (self.value.rows(), self.value.cols());
        // The vector becomes the storage (no second copy of a 1 GiB embedding while loading;
        // `Tensor::new` only checks the length, checked here); device values come home with it
        // (the next forward takes them up again).
        if value.len() == rows * cols {
            if let Ok(t) = Tensor::new(value, rows, cols) {
                self.value = t;
            }
            return;
        }
        self.value_mut().copy_from_slice(&value);
    }

    /// The device the master values and the gradient live on.
    pub fn device(&self) -> DeviceKind {
        self.value.device()
    }

    /// Number of values (of the whole tensor, also when this rank holds a slice of them).
    pub fn len(&self) -> usize {
        match (&self.held, &self.half) {
            (Some(_), _) => self.grad.len(),
            (None, Some(half)) => half.len(),
            (None, None) => self.value.len(),
        }
    }

    /// The values of the whole tensor that [`Parameter::value`] holds: all of them, unless the
    /// masters are sharded over ranks (`train::zero1_masters`).
    pub fn held_range(&self) -> std::ops::Range<usize> {
        self.held.clone().unwrap_or(0..self.value.len())
    }

    /// Whether this rank holds only a slice of the f32 values.
    pub fn is_sharded(&self) -> bool {
        self.held.is_some()
    }

    /// Keeps only values `range` of the whole tensor (the rest lives on other ranks); the
    /// gradient stays whole. Layers then need their compute copy installed from outside.
    pub(crate) fn keep_only(&mut self, range: std::ops::Range<usize>) {
        let kept = self.value()[range.clone()].to_vec();
        let n = kept.len();
        if let Ok(t) = Tensor::new(kept, 1, n) {
            self.value = t;
            self.value_read.forget();
            self.held = Some(range);
        }
    }

    /// Gives a sharded parameter its whole values back (`whole` of [`Parameter::len`] values,
    /// checked by the caller); the version does not change (the values are the same).
    pub(crate) fn restore_whole(&mut self, whole: Vec<f32>) {
        let (rows, cols) = (self.grad.rows(), self.grad.cols());
        if let Ok(t) = Tensor::new(whole, rows, cols) {
            self.value = t;
            self.value_read.forget();
            self.held = None;
        }
    }

    /// Whether the parameter holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bumped by [`Parameter::mark_updated`]; compute copies made at another version are stale.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Says the master values changed (after an optimizer step or a checkpoint load).
    pub fn mark_updated(&mut self) {
        self.version += 1;
    }

    /// Freezes the parameter: drops its gradient buffer; layers skip its gradient from now on.
    pub fn freeze(&mut self) {
        self.frozen = true;
        self.grad = Tensor::zeros(0, 0);
        self.grad_read.forget();
    }

    /// Whether [`Parameter::freeze`] was called.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// The gradient to accumulate into, in host memory as [`Parameter::grad_mut`], or `None`
    /// for a frozen parameter.
    pub fn trainable_grad(&mut self) -> Option<&mut [f32]> {
        if self.frozen {
            return None;
        }
        Some(self.grad_mut())
    }

    /// Clears the gradient before the first micro-batch of a step, where it lives. A device
    /// gradient that cannot be cleared there becomes host zeros (the next backward takes them
    /// up again): the same gradient either way.
    pub fn zero_grad(&mut self) {
        self.grad_read.forget();
        match self.grad.values_mut() {
            ValuesMut::Host(values) => values.fill(0.0),
            ValuesMut::Device(storage) => {
                if storage.zero().is_err() {
                    let (rows, cols) = self.grad.shape();
                    self.grad = Tensor::zeros(rows, cols);
                }
            }
        }
    }
}

/// Whether a layer whose tensors live on `device`, computing in `dtype`, keeps a parameter's
/// master values and gradient there: on a GPU, except under fp32, whose weight copy and GEMM (the
/// cuBLASLt reference) finish on the host, so device copies would only add transfers.
fn kept_on_device(device: DeviceKind, dtype: Dtype) -> bool {
    device != DeviceKind::Cpu && dtype != Dtype::F32
}

/// `t` (with `read`, its host copy) uploaded to `backend`'s GPU, booked as workspace; nothing on
/// the CPU, for an empty tensor, or for one already there. A GPU without room leaves it in host
/// memory: one on another GPU comes home rather than stay where this backend cannot reach it.
///
/// With an arena range lent on that GPU (`lender`), the values go into the range instead of an
/// allocation of their own.
fn keep_on(
    backend: &Backend,
    t: &mut Tensor,
    read: &mut HostCopy,
    lender: Option<&std::sync::Arc<dyn ArenaLender>>,
) -> Result<()> {
    let device = backend.device();
    if device == DeviceKind::Cpu || t.device() == device || t.is_empty() {
        return Ok(());
    }
    if into_lent_range(t, read, lender, device)? {
        return Ok(());
    }
    match backend.to_device_as(t, MemoryCategory::Workspace) {
        Ok(on_gpu) => {
            *t = on_gpu;
            read.forget();
            Ok(())
        }
        Err(e) if out_of_memory(&e) => bring_home(t, read),
        Err(e) => Err(e),
    }
}

/// `t`'s values written into the arena range `lender` lends on `device`, which `t` then holds;
/// whether it was lent one.
fn into_lent_range(
    t: &mut Tensor,
    read: &mut HostCopy,
    lender: Option<&std::sync::Arc<dyn ArenaLender>>,
    device: DeviceKind,
) -> Result<bool> {
    let DeviceKind::Cuda(ordinal) = device else {
        return Ok(false);
    };
    let Some(mut range) = lent_range(lender, ordinal, t.len())? else {
        return Ok(false);
    };
    range.overwrite(&t.values().to_host()?)?;
    hold(t, read, range)?;
    Ok(true)
}

/// `t` (with `read`, its host copy) replaced by `range`, an arena range holding its values.
fn hold(t: &mut Tensor, read: &mut HostCopy, range: CudaStorage) -> Result<()> {
    let (rows, cols) = t.shape();
    *t = Tensor::on_device(range, rows, cols)?;
    read.forget();
    Ok(())
}

/// Whether `t` holds a range of an optimizer's arena.
fn holds_range(t: &Tensor) -> bool {
    matches!(t.values(), Values::Device(d) if d.arena_view().is_some())
}

/// The arena range `lender` lends, if it is on GPU `ordinal`, of `len` values, and its arena is
/// still there.
fn lent_range(
    lender: Option<&std::sync::Arc<dyn ArenaLender>>,
    ordinal: usize,
    len: usize,
) -> Result<Option<CudaStorage>> {
    match lender {
        Some(l) if l.ordinal() == ordinal && l.len() == len => l.lend(),
        _ => Ok(None),
    }
}

/// `t` brought to host memory: its host copy `read` if one was made (never for an arena range),
/// else a download; nothing for a host tensor.
fn bring_home(t: &mut Tensor, read: &mut HostCopy) -> Result<()> {
    // A range is written in place by its optimizer: always download it, so that one missed
    // drop of a stale copy cannot undo an update.
    if holds_range(t) {
        read.forget();
    }
    if t.device() != DeviceKind::Cpu {
        let (rows, cols) = t.shape();
        *t = match read.0.take() {
            Some(values) => Tensor::new(values, rows, cols)?,
            None => t.to_host()?,
        };
    }
    Ok(())
}

/// `t` (with `read`, its host copy) moved onto a stand-in GPU `ordinal`, host memory playing a
/// device array, for tests.
#[cfg(test)]
fn on_stand_in_gpu(t: &mut Tensor, read: &mut HostCopy, ordinal: usize) {
    use crate::tensor::device_values::{CudaStorage, HostArray};
    let (rows, cols) = t.shape();
    let values = t.to_host().unwrap().into_data();
    let storage = CudaStorage::new(Box::new(HostArray { ordinal, values }));
    *t = Tensor::on_device(storage, rows, cols).unwrap();
    read.forget();
}

/// Whether `e` says a GPU had no room for an allocation.
pub(crate) fn out_of_memory(e: &Error) -> bool {
    matches!(e, Error::Cuda { name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY")
        || matches!(e, Error::NotEnoughMemory { .. })
}

/// The host copy of a device gradient or device values, made at the first read. It is a cache: clones start
/// without one, and it takes no part in comparisons.
#[derive(Default)]
struct HostCopy(OnceLock<Vec<f32>>);

impl std::fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCopy(read: {})", self.0.get().is_some())
    }
}

impl HostCopy {
    fn forget(&mut self) {
        self.0.take();
    }
}

impl Clone for HostCopy {
    fn clone(&self) -> Self {
        HostCopy::default()
    }
}

/// Anything that owns parameters: a layer or a whole model.
pub trait Module {
    /// Calls `f` on every parameter, in a fixed order (the order checkpoints and optimizers use).
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter));

    /// Runs the module's ops on `device` from now on. The parameters stay in host storage until
    /// device storage exists; the CUDA backend's ops are staged through host memory
    /// (`docs/cuda-backend.md`). Modules without an override can only stay on the CPU.
    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        match device {
            DeviceKind::Cpu => Ok(()),
            other => Err(Error::Unsupported {
                op: "to_device",
                device: other.to_string(),
            }),
        }
    }

    /// From now on (`on = false`: no longer) runs every op of the module on its device and again
    /// on the CPU twin, and compares the two by the op's contract (`docs/numerics.md`, Op
    /// contracts between backends); a breach is `Error::TwinMismatch` naming the layer. Call it
    /// after `to_device`, which resets it. Modules without an override run unchecked.
    fn check_against_cpu(&mut self, _on: bool) {}

    /// Number of frozen values (weights held but not trained, e.g. LoRA's base model); modules
    /// without frozen parameters have none.
    fn frozen_parameter_count(&mut self) -> usize {
        0
    }

    /// Bytes the frozen values take as held (4 a value in f32, 2 in bf16 or f16); modules
    /// without an override hold them in f32.
    fn frozen_parameter_bytes(&mut self) -> usize {
        4 * self.frozen_parameter_count()
    }

    /// Total number of trainable values.
    fn parameter_count(&mut self) -> usize {
        let mut count = 0;
        self.visit_parameters(&mut |p| count += p.len());
        count
    }

    /// Clears every gradient.
    fn zero_grad(&mut self) {
        self.visit_parameters(&mut |p| p.zero_grad());
    }

    /// Calls `f` on every delayed-scaling slot with its full name (e.g. `layers.0.attn.qkv.input`),
    /// in a fixed order; checkpoints save and restore them. Modules without FP8 state do nothing.
    fn visit_fp8_slots(&mut self, _f: &mut dyn FnMut(&str, &mut DelayedSlot)) {}

    /// Bytes of activations saved for backward right now (after forward: what backward will read; after
    /// backward: zero). With recompute only the layer inputs count. Bytes are counted at the storage dtype.
    fn saved_activation_bytes(&self) -> usize {
        0
    }

    /// Bytes of cached compute copies of the weights (FP8 codes + transposes + scales, or bf16/fp16 copies).
    fn weight_cache_bytes(&self) -> usize {
        0
    }

    /// Appends the FP8 statistics of the last forward and backward, one entry per FP8 tensor slot.
    fn collect_fp8_stats(&self, _out: &mut Vec<Fp8TensorStats>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::device_values::HostArray;

    fn param() -> Parameter {
        let mut p = Parameter::new("w", &[2, 3], vec![0.5; 6]).unwrap();
        p.grad_mut().copy_from_slice(&[1.0, -2.0, 3.0, -4.0, 5.0, -6.0]);
        p
    }

    /// Writes `v` into every value of a device gradient, as a kernel would.
    fn written_on_device(p: &mut Parameter, v: f32) {
        let Some(ValuesMut::Device(storage)) = p.trainable_grad_values() else {
            panic!("the gradient is not on the device")
        };
        let array = storage.unique_mut(true).unwrap();
        array.as_any_mut().downcast_mut::<HostArray>().unwrap().values.fill(v);
    }

    #[test]
    fn a_device_gradient_reads_as_the_host_one_and_is_cleared_where_it_lives() {
        let mut p = param();
        let host = p.grad().to_vec();
        p.grad_on_stand_in_gpu(3);
        assert_eq!(p.grad_device(), DeviceKind::Cuda(3));
        assert_eq!((p.grad(), p.grad_len()), (host.as_slice(), 6));
        // A write on the device is seen by the next read (the host copy is dropped).
        written_on_device(&mut p, 7.0);
        assert_eq!(p.grad(), &[7.0; 6]);
        // Cleared on the device: it stays there, and a clone keeps its own values.
        let kept = p.clone();
        p.zero_grad();
        assert_eq!(p.grad_device(), DeviceKind::Cuda(3));
        assert_eq!(p.grad(), &[0.0; 6]);
        assert_eq!(kept.grad(), &[7.0; 6]);
        // Host accessors bring it home, with its values.
        written_on_device(&mut p, -1.5);
        p.grad_mut()[0] = 2.0;
        assert_eq!(p.grad_device(), DeviceKind::Cpu);
        assert_eq!(p.grad(), &[2.0, -1.5, -1.5, -1.5, -1.5, -1.5]);
    }

    #[test]
    fn a_sum_on_another_device_is_added_in_host_memory() {
        let mut p = param();
        p.grad_on_stand_in_gpu(1);
        let sum = Tensor::new(vec![0.5; 6], 2, 3).unwrap();
        p.add_to_grad(&sum).unwrap();
        assert_eq!(p.grad_device(), DeviceKind::Cpu);
        assert_eq!(p.grad(), &[1.5, -1.5, 3.5, -3.5, 5.5, -5.5]);
        let short = Tensor::new(vec![0.5; 5], 1, 5).unwrap();
        assert!(p.add_to_grad(&short).is_err());
        assert_eq!(
            p.grad(),
            &[1.5, -1.5, 3.5, -3.5, 5.5, -5.5],
            "a wrong length changes nothing"
        );
    }

    #[test]
    fn gradients_stay_home_on_the_cpu_and_for_frozen_parameters() {
        let mut p = param();
        p.keep_grad_on(&Backend::default()).unwrap();
        assert_eq!(p.grad_device(), DeviceKind::Cpu);
        p.freeze();
        assert!(p.trainable_grad_values().is_none());
        p.keep_grad_on(&Backend::on(DeviceKind::Cuda(0))).unwrap();
        assert_eq!((p.grad_device(), p.grad_len()), (DeviceKind::Cpu, 0));
    }

    #[test]
    fn device_values_read_as_the_host_ones_and_come_home_for_host_writers() {
        let ramp: Vec<f32> = (0..6).map(|i| i as f32 * 0.25 - 0.5).collect();
        let mut p = Parameter::new("w", &[2, 3], ramp.clone()).unwrap();
        let host_twin = p.clone();
        p.value_on_stand_in_gpu(2);
        assert_eq!(p.value_device(), DeviceKind::Cuda(2));
        assert_eq!((p.value(), p.value_len(), p.len()), (ramp.as_slice(), 6, 6));
        assert_eq!(p, host_twin, "compared by their values wherever they live");
        // A write on the device (the optimizer's arena copy) is seen by the next read.
        match p.value_values_mut() {
            ValuesMut::Device(storage) => storage.overwrite(&[9.0; 6]).unwrap(),
            ValuesMut::Host(_) => panic!("the values are not on the device"),
        }
        assert_eq!(p.value(), &[9.0; 6]);
        assert!(matches!(p.value_values(), Values::Device(_)));
        // Written where they live (ZeRO-1's all-gathered values): no trip home.
        p.write_value(&[4.0; 6]).unwrap();
        assert_eq!((p.value_device(), p.value()), (DeviceKind::Cuda(2), &[4.0; 6][..]));
        assert!(p.write_value(&[4.0; 5]).is_err(), "a wrong length is an error");
        p.write_value(&[9.0; 6]).unwrap();
        // A clone shares the array until one of them writes: the other keeps its values.
        let kept = p.clone();
        if let ValuesMut::Device(storage) = p.value_values_mut() {
            storage.overwrite(&[1.0; 6]).unwrap();
        }
        assert_eq!((p.value(), kept.value()), (&[1.0; 6][..], &[9.0; 6][..]));
        // Host writers bring them home with their values.
        p.value_mut()[0] = 2.0;
        assert_eq!(p.value_device(), DeviceKind::Cpu);
        assert_eq!(p.value(), &[2.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        let mut q = kept.clone();
        q.set_value(ramp.clone());
        assert_eq!((q.value_device(), q.value()), (DeviceKind::Cpu, ramp.as_slice()));
        let mut r = kept.clone();
        r.keep_only(1..4);
        assert_eq!((r.value(), r.held_range()), (&[9.0; 3][..], 1..4));
        let mut t = kept;
        t.value_to_host().unwrap();
        assert_eq!((t.value_device(), t.value()), (DeviceKind::Cpu, &[9.0; 6][..]));
    }

    #[test]
    fn values_and_gradient_come_out_together_wherever_each_lives() {
        let mut p = param();
        p.value_on_stand_in_gpu(0);
        match p.value_and_trainable_grad_values() {
            (Values::Device(_), Some(ValuesMut::Host(g))) => g[1] = 8.0,
            _ => panic!("device values, host gradient"),
        }
        assert_eq!(p.grad()[1], 8.0);
        p.grad_on_stand_in_gpu(0);
        let _ = p.grad(); // a host copy, which the write below must drop
        match p.value_and_trainable_grad_values() {
            (Values::Device(v), Some(ValuesMut::Device(g))) => {
                assert_eq!(v.len(), 6);
                g.overwrite(&[3.0; 6]).unwrap();
            }
            _ => panic!("both on the device"),
        }
        assert_eq!(p.grad(), &[3.0; 6], "the gradient's old host copy is not read");
        p.value_to_host().unwrap();
        p.grad_to_host().unwrap();
        p.freeze();
        assert!(matches!(p.value_and_trainable_grad_values(), (Values::Host(v), None) if v == [0.5; 6]));
    }

    #[test]
    fn values_stay_home_on_the_cpu_under_f32_and_for_frozen_or_sharded_parameters() {
        let gpu = Backend::on(DeviceKind::Cuda(0));
        let mut p = param();
        p.keep_value_on(&Backend::default()).unwrap();
        p.value_where(&gpu, DeviceKind::Cuda(0), Dtype::F32).unwrap();
        assert_eq!(p.value_device(), DeviceKind::Cpu);
        // Values already on the device come home for a host input or an f32 layer.
        p.value_on_stand_in_gpu(0);
        p.value_where(&gpu, DeviceKind::Cpu, Dtype::Bf16).unwrap();
        assert_eq!((p.value_device(), p.value()), (DeviceKind::Cpu, &[0.5; 6][..]));
        let mut sharded = param();
        sharded.keep_only(0..3);
        sharded.keep_value_on(&gpu).unwrap();
        assert_eq!(sharded.value_device(), DeviceKind::Cpu);
        p.freeze();
        p.keep_value_on(&gpu).unwrap();
        assert_eq!(p.value_device(), DeviceKind::Cpu);
    }

    #[test]
    fn values_kept_on_a_gpu_go_into_the_arena_range_lent_there() {
        use crate::backend::cuda::arena::ArenaLayout;
        use crate::dispatch::arena_store::{Arena, ArenaStore, HostArenas};
        let ramp: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        let layout = ArenaLayout::new([("pad", 3, true), ("w", 6, true)]).unwrap();
        let offset = layout.view("w").unwrap().start;
        let store = HostArenas::lending(layout, 0);
        let mut p = Parameter::new("w", &[2, 3], ramp.clone()).unwrap();
        p.lend_from(
            store.lender(Arena::Values, offset, 6),
            store.lender(Arena::Grads, offset, 6),
        );
        // Another device, or none, takes no range.
        for device in [DeviceKind::Cpu, DeviceKind::Cuda(1)] {
            assert!(!into_lent_range(&mut p.value, &mut p.value_read, p.lenders.value.as_ref(), device).unwrap());
        }
        assert!(
            into_lent_range(
                &mut p.value,
                &mut p.value_read,
                p.lenders.value.as_ref(),
                DeviceKind::Cuda(0)
            )
            .unwrap()
        );
        let held = |t: &Tensor| matches!(t.values(), Values::Device(d) if d.arena_view().is_some());
        assert!(held(&p.value) && p.value_device() == DeviceKind::Cuda(0));
        let mut arena = vec![f32::NAN; 6];
        store.read(Arena::Values, offset, &mut arena).unwrap();
        assert_eq!(arena, ramp, "the values went into the range");
        assert_eq!(p.value(), &ramp[..]);
        // A write where they live writes the arena.
        p.write_value(&[9.0; 6]).unwrap();
        store.read(Arena::Values, offset, &mut arena).unwrap();
        assert_eq!(arena, vec![9.0; 6]);
        // The gradient takes its own range the same way.
        assert!(
            into_lent_range(
                &mut p.grad,
                &mut p.grad_read,
                p.lenders.grad.as_ref(),
                DeviceKind::Cuda(0)
            )
            .unwrap()
        );
        assert!(held(&p.grad));
        // Once the arenas are gone, nothing more is lent, though a held range keeps their
        // allocation alive; releasing the ranges brings their values home.
        let mut other = Parameter::new("pad", &[3], vec![1.0, 2.0, 3.0]).unwrap();
        other.lend_from(store.lender(Arena::Values, 0, 3), None);
        let lent = other.lenders.value.clone();
        assert!(
            into_lent_range(
                &mut other.value,
                &mut other.value_read,
                lent.as_ref(),
                DeviceKind::Cuda(0)
            )
            .unwrap()
        );
        drop(store);
        p.release_arena_ranges().unwrap();
        assert!(!holds_range(&p.value) && !holds_range(&p.grad));
        assert_eq!((p.value_device(), p.grad_device()), (DeviceKind::Cpu, DeviceKind::Cpu));
        let lent = p.lenders.value.clone();
        assert!(!into_lent_range(&mut p.value, &mut p.value_read, lent.as_ref(), DeviceKind::Cuda(0)).unwrap());
        assert_eq!(p.value(), &[9.0; 6]);
        assert_eq!(
            other.value(),
            &[1.0, 2.0, 3.0],
            "the other range still reads its values"
        );
        // A frozen parameter, and a clone, are lent nothing.
        let store = HostArenas::lending(ArenaLayout::new([("w", 6, true)]).unwrap(), 0);
        let mut q = Parameter::new("w", &[2, 3], ramp).unwrap();
        q.lend_from(store.lender(Arena::Values, 0, 6), None);
        let mut clone = q.clone();
        assert!(
            !into_lent_range(
                &mut clone.value,
                &mut clone.value_read,
                clone.lenders.value.as_ref(),
                DeviceKind::Cuda(0)
            )
            .unwrap()
        );
        q.freeze();
        q.lend_from(store.lender(Arena::Values, 0, 6), None);
        assert!(q.lenders.value.is_none());
    }

    #[test]
    fn a_range_updated_in_place_comes_home_with_its_new_values() {
        use crate::backend::cuda::arena::ArenaLayout;
        use crate::dispatch::arena_store::{Arena, ArenaStore, HostArenas};
        let mut store = HostArenas::lending(ArenaLayout::new([("w", 6, true)]).unwrap(), 0);
        let mut p = Parameter::new("w", &[2, 3], vec![0.5; 6]).unwrap();
        p.lend_from(store.lender(Arena::Values, 0, 6), None);
        let lent = p.lenders.value.clone();
        assert!(into_lent_range(&mut p.value, &mut p.value_read, lent.as_ref(), DeviceKind::Cuda(0)).unwrap());
        // A host copy made before an optimizer updates the range in place...
        assert_eq!(p.value(), &[0.5; 6]);
        store.write(Arena::Values, 0, &[2.0; 6]).unwrap();
        // ...is dropped by an update that failed before this parameter's turn,
        p.forget_held_value_read();
        assert_eq!(p.value(), &[2.0; 6]);
        // and, if a drop was missed, never brought home in the range's place.
        store.write(Arena::Values, 0, &[3.0; 6]).unwrap();
        p.value_to_host().unwrap();
        assert_eq!((p.value_device(), p.value()), (DeviceKind::Cpu, &[3.0f32; 6][..]));
        // Values of their own keep their copy (nothing wrote them behind its back).
        let mut own = Parameter::new("v", &[3], vec![1.0, 2.0, 3.0]).unwrap();
        own.value_on_stand_in_gpu(0);
        assert_eq!(own.value(), &[1.0, 2.0, 3.0]);
        own.forget_held_value_read();
        assert!(own.value_read.0.get().is_some());
    }

    #[test]
    fn a_copy_of_device_values_leaves_no_host_copy_behind() {
        let mut p = Parameter::new("w", &[2, 3], vec![0.5, -1.0, 2.0, 3.0, -0.0, 7.0]).unwrap();
        let want = p.value().to_vec();
        p.value_on_stand_in_gpu(0);
        assert!(p.value_read.0.get().is_none());
        assert_eq!(&*p.value_copy().unwrap(), &want[..]);
        assert_eq!(&*p.widened(), &want[..]);
        assert!(p.value_read.0.get().is_none(), "a checkpoint's read keeps nothing");
        // A host copy made by a read is used as it is.
        assert_eq!(p.value(), &want[..]);
        assert!(matches!(p.value_copy().unwrap(), Cow::Borrowed(_)));
    }
}
