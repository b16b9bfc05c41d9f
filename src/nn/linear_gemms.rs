//! The three GEMMs of a linear layer (forward, dgrad, wgrad) under a precision,
//! with the weight's compute copies and the FP8 bookkeeping. Every op a linear
//! layer runs (casts, conversions, GEMMs, statistics, the delayed-scaling update)
//! goes through its [`Backend`], so the same code runs on any device the
//! backend implements.
//!
//! | precision | forward `Y = X W^T` | dgrad `dX = dY W` | wgrad `dW += dY^T X` |
//! |---|---|---|---|
//! | fp32/bf16/fp16 | X x W (dtype) | dY x W read transposed | dY, X read transposed |
//! | FP8 | E4M3 X x E4M3 W | E5M2 dY x E4M3 W^T copy | E5M2 dY^T x E4M3 X^T |
//!
//! (E4M3 for gradients too under the block and MXFP8 defaults.) The FP8 transposed copies come
//! from the same cast as the row-wise ones (fused cast + transpose or column-wise block
//! quantizers); plain operands are read in place with swapped strides (`gemm::Mat::transposed`),
//! so the plain policies keep one weight copy and the input in its own layout. Weight copies
//! are made once per parameter version: once per optimizer step, reused by every micro-batch.

use super::no_forward;
use super::param::Parameter;
use crate::amp::{Fp8Recipe, Precision};
use crate::dispatch::{Backend, Cast, Deferred, Fp8Stats, PlainMat, Values, ValuesMut, fp8_cast};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::gemm::{Bias, FP8_K_MULTIPLE, GemmParams, Mat, Operand};
use crate::scaling::Fp8TensorStats;
use crate::scaling::{DelayedSlot, SlotBank, TensorRole};
use crate::tensor::QuantizedMatrix;
use crate::tensor::scratch;
use crate::tensor::{DeviceKind, Dtype, HalfValues, Tensor};

/// The weight's compute copies, made at one parameter version.
enum WeightCopy {
    /// Row-wise `[out, in]` for forward, column-wise `[in, out]` for dgrad.
    Fp8(Box<Cast>),
    /// `[out, in]` in the compute dtype; dgrad reads it transposed.
    Plain(PlainMat),
    /// None: a frozen weight held in 16 bits of the compute dtype is read as it is held
    /// (`stored_operand`); held in the other 16-bit dtype it gets a `Plain` copy.
    Stored,
}

/// How a slice of the weight is cast exactly as the layer casts the whole weight (element-wise:
/// ZeRO-1 with sharded masters casts slices on their ranks and gathers the results).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum WeightSliceCast {
    /// Rounded to a 16-bit compute dtype.
    Plain(Dtype),
    /// Delayed scaling: cast to `format` with the slot's `scale`, shared by every rank.
    Fp8 { format: Fp8Format, scale: f32 },
}

/// What the forward keeps for wgrad: FP8 `X^T`, K-major over tokens, or the plain `X`
/// (`[tokens, in]`, read transposed).
enum SavedInput {
    Fp8(Fp8Format, QuantizedMatrix),
    Plain(PlainMat),
}

/// The output gradient as a plain GEMM operand: converted to a 16-bit dtype, or f32 values in
/// host memory (borrowed from a host `dy`).
enum PlainOrHost<'a> {
    Plain(PlainMat),
    Host(std::borrow::Cow<'a, [f32]>),
}

impl PlainOrHost<'_> {
    /// `[rows, cols]` (`transposed`: the transpose of the stored `cols x rows` values, read in
    /// place) for the GEMM of `backend` ([`PlainMat::operand_on`]).
    fn operand_on(&self, backend: &Backend, (rows, cols, transposed): (usize, usize, bool)) -> Result<Operand<'_>> {
        match self {
            PlainOrHost::Plain(m) => m.operand_on(backend, (rows, cols, transposed)),
            PlainOrHost::Host(v) => Ok(Operand::F32(Mat::checked(v, rows, cols, transposed)?)),
        }
    }
}

/// The operand of a frozen weight held in 16 bits of the compute dtype (`WeightCopy::Stored`),
/// `[rows, cols]` or (`transposed`) read as the transpose of its `[cols, rows]` values, in place.
fn stored_operand<'a>(
    stored: Option<&'a HalfValues>,
    (rows, cols, transposed): (usize, usize, bool),
    layer: &str,
) -> Result<Operand<'a>> {
    let half = stored.ok_or_else(|| internal(layer, "the weight is no longer held in 16 bits"))?;
    match transposed {
        true => Operand::half_transposed(half, rows, cols),
        false => Operand::half(half, rows, cols),
    }
}

/// A forward's input, wherever it lives: borrowed from the caller, or handed over (then kept
/// without a copy where the saved operand is the input itself).
enum Input<'a> {
    Borrowed(Values<'a>),
    Owned(Tensor),
}

impl Input<'_> {
    fn values(&self) -> Values<'_> {
        match self {
            Input::Borrowed(x) => *x,
            Input::Owned(x) => x.values(),
        }
    }
}

fn internal(layer: &str, what: &str) -> Error {
    Error::LayerShape {
        layer: layer.to_string(),
        detail: format!("internal: {what}"),
    }
}

/// Stat slots in [`TensorRole`] order.
const ROLES: [(TensorRole, &str); 5] = [
    (TensorRole::Input, "input"),
    (TensorRole::Weight, "weight"),
    (TensorRole::Output, "output"),
    (TensorRole::OutputGrad, "output_grad"),
    (TensorRole::InputGrad, "input_grad"),
];

fn role_index(role: TensorRole) -> usize {
    ROLES.iter().position(|(r, _)| *r == role).unwrap_or(0)
}

/// Forward, dgrad and wgrad of one linear layer.
pub(crate) struct LinearGemms {
    layer: String,
    precision: Precision,
    in_features: usize,
    out_features: usize,
    /// Delayed scaling only: the five slots of `docs/numerics.md`, delayed scaling.
    slots: Option<SlotBank>,
    weight: Option<(u64, WeightCopy)>,
    /// An installed FP8 weight copy's amax and statistics, recorded at its first training
    /// forward as the layer's own cast would be.
    installed_stats: Option<(Deferred<f32>, Fp8Stats)>,
    saved: Option<(usize, SavedInput)>,
    /// The input scale of the last training forward, so a recompute casts the same codes.
    forward_input_scale: f32,
    /// Finished when the step's statistics are collected (a GPU's counts stay there till then).
    stats: [Option<Fp8Stats>; 5],
    backend: Backend,
    /// Delayed scaling updated once per optimizer step by the training step (which may
    /// max-reduce the amaxes across ranks first) instead of after every forward and backward.
    update_per_step: bool,
}

impl LinearGemms {
    /// GEMMs for a `[out, in]` weight under `precision`; FP8 needs both dims multiples of 16.
    pub(crate) fn new(layer: &str, in_features: usize, out_features: usize, precision: &Precision) -> Result<Self> {
        precision.validate()?;
        if precision.is_fp8()
            && (!in_features.is_multiple_of(FP8_K_MULTIPLE) || !out_features.is_multiple_of(FP8_K_MULTIPLE))
        {
            return Err(Error::LayerShape {
                layer: layer.to_string(),
                detail: format!(
                    "weight {out_features}x{in_features}: {} needs in and out features that are multiples of \
                     {FP8_K_MULTIPLE}",
                    precision.name()
                ),
            });
        }
        let slots = match precision {
            Precision::Fp8(Fp8Recipe::Delayed(r)) => Some(SlotBank::new(ROLES.len(), r.amax_history_len)),
            _ => None,
        };
        Ok(LinearGemms {
            layer: layer.to_string(),
            precision: precision.clone(),
            in_features,
            out_features,
            slots,
            weight: None,
            installed_stats: None,
            saved: None,
            forward_input_scale: 1.0,
            stats: Default::default(),
            backend: Backend::default(),
            update_per_step: false,
        })
    }

    /// Runs the ops on `backend` from now on.
    pub(crate) fn set_backend(&mut self, backend: Backend) {
        self.backend = backend;
    }

    /// Checks every op against its CPU twin (`Module::check_against_cpu`).
    pub(crate) fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, &self.layer);
    }

    /// Checks that `tensor`, an input of `op`, lives on the device the ops run on.
    pub(crate) fn expect_on(&self, op: &'static str, tensor: &crate::tensor::Tensor) -> Result<()> {
        self.backend.expect_on(op, tensor)
    }

    pub(crate) fn precision(&self) -> &Precision {
        &self.precision
    }

    /// The backend the ops run on (a frozen FP8 weight runs its GEMMs there too).
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    fn dtype(&self) -> Dtype {
        self.precision.compute_dtype()
    }

    /// The scale a cast of `role` uses now (a bank on the GPU: as its last update left it,
    /// waiting for that update only).
    fn slot_scale(&self, role: TensorRole) -> Result<f32> {
        self.slots.as_ref().map_or(Ok(1.0), |s| s.scale_now(role_index(role)))
    }

    /// Records a cast's or GEMM output's amax in its slot: folded in on the GPU for a bank kept
    /// there, nothing read back.
    fn record(&mut self, role: TensorRole, amax: &Deferred<f32>) -> Result<()> {
        if let Some(slots) = &mut self.slots {
            self.backend.kernels().record_amax(slots, role_index(role), amax)?;
        }
        Ok(())
    }

    /// Takes the bank up to the GPU when the layer's tensors live there and the backend keeps
    /// banks on it (`Backend::holds_slot_banks`); anything else (a host input, shadow mode, a
    /// backend moved to another device) brings it home.
    fn place_slots(&mut self, input: DeviceKind) -> Result<()> {
        let Some(slots) = &mut self.slots else { return Ok(()) };
        match input == self.backend.device() && input != DeviceKind::Cpu {
            true => self.backend.keep_slot_bank(slots),
            false => slots.bring_home(),
        }
    }

    /// The delayed-scaling update (`docs/numerics.md`) of the forward or backward slots.
    fn update(&mut self, roles: &[TensorRole]) -> Result<()> {
        if self.update_per_step {
            return Ok(());
        }
        self.update_now(roles)
    }

    fn update_now(&mut self, roles: &[TensorRole]) -> Result<()> {
        if let (Some(slots), Precision::Fp8(Fp8Recipe::Delayed(recipe))) = (&mut self.slots, &self.precision) {
            let indices: Vec<usize> = roles.iter().map(|&r| role_index(r)).collect();
            let formats: Vec<Fp8Format> = roles.iter().map(|&r| recipe.format.for_role(r)).collect();
            self.backend
                .kernels()
                .delayed_update(slots, &indices, &formats, recipe)?;
        }
        Ok(())
    }

    fn stat_name(&self, role: TensorRole) -> String {
        format!("{}.{}", self.layer, ROLES[role_index(role)].1)
    }

    /// Stats of a GEMM output kept in high precision: as if cast per tensor with the slot's scale
    /// (delayed) or the just-in-time scale of its amax (other recipes).
    fn output_stats(&mut self, role: TensorRole, values: Values, amax: Deferred<f32>) -> Result<()> {
        let Precision::Fp8(recipe) = &self.precision else {
            return Ok(());
        };
        let format = recipe.format_for(role);
        let scale = match recipe {
            Fp8Recipe::Delayed(_) => self.slot_scale(role)?.into(),
            // The just-in-time scale of the amax, made where the amax is (on a GPU: left there).
            _ => self.backend.kernels().current_scale(amax.clone(), format, false, 0.0)?,
        };
        let stats = self
            .backend
            .kernels()
            .uncast_stats(self.stat_name(role), values, format, amax, scale)?;
        self.stats[role_index(role)] = Some(stats);
        Ok(())
    }

    fn check_tokens(&self, rows: usize) -> Result<()> {
        if self.precision.is_fp8() && !rows.is_multiple_of(FP8_K_MULTIPLE) {
            return Err(Error::LayerShape {
                layer: self.layer.clone(),
                detail: format!(
                    "input {rows}x{}: {} needs a token count (rows) that is a multiple of {FP8_K_MULTIPLE}",
                    self.in_features,
                    self.precision.name()
                ),
            });
        }
        Ok(())
    }

    /// How the weight copy can be made from slices: `None` for f32 (the GEMMs read the master)
    /// and for scales that depend on the whole tensor (current, block, MXFP8).
    pub(crate) fn weight_slice_cast(&self) -> Option<WeightSliceCast> {
        match &self.precision {
            Precision::Fp8(Fp8Recipe::Delayed(r)) => Some(WeightSliceCast::Fp8 {
                format: r.format.for_role(TensorRole::Weight),
                // (A bank on the GPU: as its last update left it, with `SlotBank::scale`'s panic.)
                scale: self
                    .slots
                    .as_ref()
                    .map_or(1.0, |s| s.scale(role_index(TensorRole::Weight))),
            }),
            Precision::Fp8(_) => None,
            _ => (self.dtype() != Dtype::F32).then_some(WeightSliceCast::Plain(self.dtype())),
        }
    }

    /// Installs a plain weight copy made outside at parameter `version` (gathered slices).
    pub(crate) fn install_plain_weight(&mut self, version: u64, copy: PlainMat) -> Result<()> {
        let n = self.in_features * self.out_features;
        let matches = matches!(
            (&copy, self.weight_slice_cast()),
            (PlainMat::Bf16(v, _), Some(WeightSliceCast::Plain(Dtype::Bf16))) if v.len() == n
        ) || matches!(
            (&copy, self.weight_slice_cast()),
            (PlainMat::F16(v, _), Some(WeightSliceCast::Plain(Dtype::F16))) if v.len() == n
        );
        if !matches {
            return Err(internal(&self.layer, "an installed weight copy does not fit the layer"));
        }
        self.weight = Some((version, WeightCopy::Plain(copy)));
        self.installed_stats = None;
        Ok(())
    }

    /// Installs an FP8 weight copy made outside at parameter `version` with the whole tensor's
    /// `[saturated, underflow, nonzero, nonfinite]` counts: the first training forward records
    /// the weight amax and sets the statistics, as the layer's own cast would.
    pub(crate) fn install_fp8_weight(&mut self, version: u64, cast: Cast, counts: [u64; 4]) -> Result<()> {
        let cast_scale = cast.scale.get()?;
        let fits = cast.tensor.shape() == [self.out_features, self.in_features]
            && matches!(self.weight_slice_cast(), Some(WeightSliceCast::Fp8 { format, scale })
                if format == cast.tensor.format() && scale == cast_scale);
        if !fits {
            return Err(internal(
                &self.layer,
                "an installed FP8 weight copy does not fit the layer",
            ));
        }
        let name = self.stat_name(TensorRole::Weight);
        let total = self.in_features * self.out_features;
        let amax = cast.amax.get()?;
        let stats = fp8_cast::stats_from_counts(name, cast.tensor.format(), amax, cast_scale, total, counts);
        self.installed_stats = Some((amax.into(), Fp8Stats::Ready(stats)));
        self.weight = Some((version, WeightCopy::Fp8(Box::new(cast))));
        Ok(())
    }

    /// The parameter version of the weight copy held (`None` before the first forward).
    pub(crate) fn weight_version(&self) -> Option<u64> {
        self.weight.as_ref().map(|(version, _)| *version)
    }

    /// Whether the weight copy's amax is still to be recorded by a training forward (an
    /// installed copy's, or one a forward-only pass made: [`Self::defer_weight_record`]).
    pub(crate) fn weight_record_pending(&self) -> bool {
        self.installed_stats.is_some()
    }

    /// Keeps the FP8 weight copy's amax and statistics for the next training forward to record,
    /// as an installed copy's ([`Self::install_fp8_weight`]): a forward-only pass made the copy,
    /// and its record went with the slots the pass put back (`nn::defer_weight_records`).
    pub(crate) fn defer_weight_record(&mut self) {
        if let Some((_, WeightCopy::Fp8(cast))) = &self.weight
            && let Some(stats) = &self.stats[role_index(TensorRole::Weight)]
        {
            self.installed_stats = Some((cast.amax.clone(), stats.clone()));
        }
    }

    /// Makes the weight copies if the parameter changed since the last ones.
    fn refresh_weight(&mut self, weight: &Parameter, replay: bool) -> Result<()> {
        if self.weight_version() == Some(weight.version()) {
            if !replay && let Some((amax, stats)) = self.installed_stats.take() {
                self.record(TensorRole::Weight, &amax)?;
                self.stats[role_index(TensorRole::Weight)] = Some(stats);
            }
            return Ok(());
        }
        if weight.is_sharded() {
            // Its values are spread over the ranks: the optimizer installs the copy.
            return Err(internal(&self.layer, "a sharded master weight has no installed copy"));
        }
        // The old f32 copy's buffer serves the new one (`PlainMat::new`).
        if matches!(self.weight, Some((_, WeightCopy::Plain(PlainMat::F32(_)))))
            && let Some((_, WeightCopy::Plain(PlainMat::F32(old)))) = self.weight.take()
        {
            scratch::recycle(old);
        }
        let (out, inp) = (self.out_features, self.in_features);
        let backend = self.backend.clone();
        let kernels = backend.kernels();
        // A frozen weight held in 16 bits of the compute dtype is its own operand.
        let stored = !matches!(self.precision, Precision::Fp8(_))
            && weight.half_values().is_some_and(|h| h.dtype() == self.dtype());
        // Else f32 master values where they live (a layer on a GPU keeps them there: its casts
        // read them in place), or 16-bit frozen ones widened on the host (exact).
        let widened = match stored {
            true => None,
            false => weight.host_op_values(),
        };
        let values = weight.op_values(&widened);
        let copy = match &self.precision {
            Precision::Fp8(recipe) => {
                let scale = self.slot_scale(TensorRole::Weight)?;
                let cast = kernels.quantize(recipe, TensorRole::Weight, values, out, inp, scale)?;
                if !replay {
                    self.record(TensorRole::Weight, &cast.amax)?;
                    let name = self.stat_name(TensorRole::Weight);
                    self.stats[1] = Some(kernels.cast_stats(name, values, &cast)?);
                }
                WeightCopy::Fp8(Box::new(cast))
            }
            _ if stored => WeightCopy::Stored,
            // Else one compute copy, as for f32 values.
            _ => WeightCopy::Plain(kernels.convert(self.dtype(), values)?),
        };
        self.weight = Some((weight.version(), copy));
        self.installed_stats = None;
        Ok(())
    }

    /// `Y = X W^T (+ bias)` for `x` `[rows, in]`, rounded to the compute dtype, where `x` lives
    /// (host memory, or the backend's GPU; the bias in either, read where it is). `replay`: a
    /// recompute in backward, which casts with the scales of the original forward and records
    /// nothing.
    pub(crate) fn forward(
        &mut self,
        x: Values,
        rows: usize,
        weight: &Parameter,
        bias: Option<Values>,
        replay: bool,
    ) -> Result<Tensor> {
        self.forward_input(Input::Borrowed(x), rows, weight, bias, replay)
    }

    /// [`Self::forward`] taking `x`: an f32 input in host memory is kept for wgrad as it is
    /// (no copy).
    pub(crate) fn forward_owned(
        &mut self,
        x: Tensor,
        weight: &Parameter,
        bias: Option<Values>,
        replay: bool,
    ) -> Result<Tensor> {
        let rows = x.rows();
        self.forward_input(Input::Owned(x), rows, weight, bias, replay)
    }

    fn forward_input(
        &mut self,
        input: Input,
        rows: usize,
        weight: &Parameter,
        bias: Option<Values>,
        replay: bool,
    ) -> Result<Tensor> {
        let x = input.values();
        self.check_tokens(rows)?;
        self.place_slots(x.device())?;
        self.refresh_weight(weight, replay)?;
        let (inp, out) = (self.in_features, self.out_features);
        if x.len() != rows * inp {
            return Err(internal(&self.layer, "the input is not [rows, in]"));
        }
        // The output where the input lives. Every GEMM below writes all of `y` (beta = 0): a
        // recycled buffer or a new device array needs no zeroing.
        let mut y = self.backend.output_at(x.device(), rows, out)?;
        let Some((_, copy)) = &self.weight else {
            return Err(internal(&self.layer, "no weight copy after refresh"));
        };
        let backend = self.backend.clone();
        let kernels = backend.kernels();
        let input_scale = if replay {
            self.forward_input_scale
        } else {
            self.slot_scale(TensorRole::Input)?
        };
        let (saved, report, input_cast) = match (&self.precision, copy) {
            (Precision::Fp8(recipe), WeightCopy::Fp8(w)) => {
                let xq = kernels.quantize(recipe, TensorRole::Input, x, rows, inp, input_scale)?;
                let params = GemmParams {
                    bias: bias.map(Bias::of),
                    split_accumulator: false, // forward: fast accumulation allowed (`docs/numerics.md`, GEMM)
                    ..GemmParams::default()
                };
                let a = Operand::Fp8(xq.tensor.format(), xq.tensor.rowwise());
                let b = Operand::Fp8(w.tensor.format(), w.tensor.rowwise());
                let report = kernels.gemm_into(&a, &b, y.values_mut(), params)?;
                let stats = match replay {
                    true => None,
                    false => Some(kernels.cast_stats(self.stat_name(TensorRole::Input), x, &xq)?),
                };
                let amax = xq.amax.clone();
                let (format, _, columnwise) = xq.tensor.into_parts();
                let columnwise =
                    columnwise.ok_or_else(|| internal(&self.layer, "the input cast made no column-wise copy"))?;
                (SavedInput::Fp8(format, columnwise), report, Some((amax, stats)))
            }
            (_, copy @ (WeightCopy::Plain(_) | WeightCopy::Stored)) => {
                let w = match copy {
                    WeightCopy::Plain(w) => w.operand_on(&self.backend, (out, inp, false))?,
                    _ => stored_operand(weight.half_values(), (out, inp, false), &self.layer)?,
                };
                // One conversion: the forward's operand, then wgrad's (an owned f32 input is
                // kept as it is; a borrowed one is copied).
                // (A device input's conversion comes back to the host: plain operands are
                // host matrices until they get device copies, `docs/cuda-backend.md`.)
                let xm = match input {
                    Input::Owned(t) if self.dtype() == Dtype::F32 && t.device() == DeviceKind::Cpu => {
                        PlainMat::F32(t.into_data())
                    }
                    _ => kernels.convert(self.dtype(), x)?,
                };
                // Only FP8 records an output amax: a plain GEMM's is not read back.
                let params = GemmParams {
                    bias: bias.map(Bias::of),
                    report_amax: false,
                    ..GemmParams::default()
                };
                let xo = xm.operand_on(&self.backend, (rows, inp, false))?;
                let report = kernels.gemm_into(&xo, &w, y.values_mut(), params)?;
                (SavedInput::Plain(xm), report, None)
            }
            _ => return Err(internal(&self.layer, "the weight copy does not follow the precision")),
        };
        if let (false, Some((amax, stats))) = (replay, input_cast) {
            self.forward_input_scale = input_scale;
            self.record(TensorRole::Input, &amax)?;
            self.stats[0] = stats;
        }
        if !replay {
            self.record(TensorRole::Output, &report)?;
            self.output_stats(TensorRole::Output, y.values(), report)?;
            self.update(&TensorRole::FORWARD)?;
        }
        kernels.round(y.values_mut(), self.dtype())?;
        self.saved = Some((rows, saved));
        Ok(y)
    }

    /// dX (rounded to the compute dtype); accumulates `dW` into `weight_grad` and `db` into
    /// `bias_grad`, wherever they live (a frozen weight passes `None` and skips the wgrad
    /// GEMM). `stored`: the weight's values when it is frozen in 16 bits (it has no compute
    /// copy).
    pub(crate) fn backward(
        &mut self,
        dy: Values,
        stored: Option<&HalfValues>,
        weight_grad: Option<ValuesMut>,
        bias_grad: Option<ValuesMut>,
    ) -> Result<Tensor> {
        let (inp, out) = (self.in_features, self.out_features);
        let Some((rows, saved)) = self.saved.take() else {
            return Err(no_forward(&self.layer));
        };
        if dy.len() != rows * out {
            return Err(Error::LayerShape {
                layer: self.layer.clone(),
                detail: format!(
                    "output gradient has {} values, the forward output was {rows}x{out}",
                    dy.len()
                ),
            });
        }
        self.place_slots(dy.device())?;
        let backend = self.backend.clone();
        let kernels = backend.kernels();
        if let Some(db) = bias_grad {
            kernels.column_sum(dy, out, db)?;
        }
        let Some((_, copy)) = &self.weight else {
            return Err(internal(&self.layer, "no weight copy in backward"));
        };
        // Where `dy` lives; both dgrad GEMMs write all of `dx` (beta = 0).
        let mut dx = backend.output_at(dy.device(), rows, inp)?;
        // wgrad: its amax is recorded nowhere.
        let accumulate = GemmParams {
            beta: 1.0,
            report_amax: false,
            ..GemmParams::default()
        };
        let (dgrad_amax, output_grad_cast) = match (&self.precision, copy, &saved) {
            (Precision::Fp8(recipe), WeightCopy::Fp8(w), SavedInput::Fp8(x_format, xt)) => {
                let scale = self.slot_scale(TensorRole::OutputGrad)?;
                let dyq = kernels.quantize(recipe, TensorRole::OutputGrad, dy, rows, out, scale)?;
                let dy_format = dyq.tensor.format();
                let dgrad = kernels.gemm_into(
                    &Operand::Fp8(dy_format, dyq.tensor.rowwise()),
                    &Operand::Fp8(w.tensor.format(), fp8_cast::columnwise(&w.tensor)),
                    dx.values_mut(),
                    GemmParams::default(),
                )?;
                if let Some(dw) = weight_grad {
                    kernels.gemm_into(
                        &Operand::Fp8(dy_format, fp8_cast::columnwise(&dyq.tensor)),
                        &Operand::Fp8(*x_format, xt),
                        dw,
                        accumulate,
                    )?;
                }
                let stats = kernels.cast_stats(self.stat_name(TensorRole::OutputGrad), dy, &dyq)?;
                (dgrad, Some((dyq.amax.clone(), stats)))
            }
            (_, copy @ (WeightCopy::Plain(_) | WeightCopy::Stored), SavedInput::Plain(x)) => {
                // f32 operands are host matrices (the f32 GEMM's reference path): a device `dy`
                // comes back once for both GEMMs, a host one is read in place. 16-bit ones are
                // converted where `dy` lives (a device conversion keeps its result there).
                let dym = match self.dtype() {
                    Dtype::F32 => PlainOrHost::Host(dy.to_host()?),
                    dtype => PlainOrHost::Plain(kernels.convert(dtype, dy)?),
                };
                // dX = dY W: B is W^T, `[in, out]`, read from W `[out, in]`.
                let wt = match copy {
                    WeightCopy::Plain(w) => w.operand_on(&backend, (inp, out, true))?,
                    _ => stored_operand(stored, (inp, out, true), &self.layer)?,
                };
                let dym_op = dym.operand_on(&backend, (rows, out, false))?;
                let plain = GemmParams {
                    report_amax: false,
                    ..GemmParams::default()
                };
                let dgrad = kernels.gemm_into(&dym_op, &wt, dx.values_mut(), plain)?;
                if let Some(dw) = weight_grad {
                    // dW = dY^T X: A is dY^T `[out, tokens]`, B is X^T `[in, tokens]`, both read
                    // from their `[tokens, ...]` storage.
                    let dyt = dym.operand_on(&backend, (out, rows, true))?;
                    let xt = x.operand_on(&backend, (inp, rows, true))?;
                    kernels.gemm_into(&dyt, &xt, dw, accumulate)?;
                }
                (dgrad, None)
            }
            _ => {
                return Err(internal(
                    &self.layer,
                    "saved input and weight copy do not follow the precision",
                ));
            }
        };
        if let SavedInput::Plain(PlainMat::F32(x)) = saved {
            scratch::recycle(x);
        }
        if let Some((amax, stats)) = output_grad_cast {
            self.record(TensorRole::OutputGrad, &amax)?;
            self.stats[3] = Some(stats);
        }
        self.record(TensorRole::InputGrad, &dgrad_amax)?;
        self.output_stats(TensorRole::InputGrad, dx.values(), dgrad_amax)?;
        self.update(&TensorRole::BACKWARD)?;
        kernels.round(dx.values_mut(), self.dtype())?;
        Ok(dx)
    }

    /// Drops what the forward saved (recompute makes it again).
    pub(crate) fn clear_saved(&mut self) {
        self.saved = None;
    }

    pub(crate) fn saved_bytes(&self) -> usize {
        match &self.saved {
            None => 0,
            Some((_, SavedInput::Plain(m))) => m.bytes(),
            Some((_, SavedInput::Fp8(_, q))) => q.bytes(),
        }
    }

    pub(crate) fn weight_cache_bytes(&self) -> usize {
        match &self.weight {
            None => 0,
            Some((_, WeightCopy::Fp8(cast))) => fp8_cast::tensor_bytes(&cast.tensor),
            Some((_, WeightCopy::Plain(w))) => w.bytes(),
            Some((_, WeightCopy::Stored)) => 0,
        }
    }

    /// Calls `f` on the five delayed-scaling slots as `<layer>.<role>` (nothing under other precisions).
    pub(crate) fn visit_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        let Some(slots) = &mut self.slots else { return };
        for (i, (_, name)) in ROLES.iter().enumerate() {
            slots.with_slot(i, |slot| f(&format!("{}.{name}", self.layer), slot));
        }
    }

    /// From now on (`on = false`: no longer) the forward and backward only record amaxes and the
    /// training step runs the delayed update of all five slots with [`Self::update_step`]: the
    /// amax of a slot over a step is then the max over its micro-batches (`docs/distributed.md`).
    pub(crate) fn set_update_per_step(&mut self, on: bool) {
        self.update_per_step = on;
    }

    /// Appends this step's amax of each of the five slots (nothing without delayed scaling; a
    /// bank on the GPU is read there, one download).
    pub(crate) fn push_current_amaxes(&self, out: &mut Vec<f32>) {
        if let Some(slots) = &self.slots {
            out.extend(slots.current_amaxes());
        }
    }

    /// Overwrites the five current amaxes with the next values of `amaxes` (the order of
    /// [`Self::push_current_amaxes`]).
    pub(crate) fn set_current_amaxes(&mut self, amaxes: &mut dyn Iterator<Item = f32>) {
        if let Some(slots) = &mut self.slots {
            for i in 0..ROLES.len() {
                if let Some(amax) = amaxes.next() {
                    slots.set_current_amax(i, amax);
                }
            }
        }
    }

    /// The GPU holding the delayed-scaling bank, if it is kept on one (tests).
    #[cfg(test)]
    pub(crate) fn slots_device(&self) -> Option<usize> {
        self.slots.as_ref().and_then(SlotBank::device_ordinal)
    }

    /// The delayed update of all five slots (forward and backward roles) at the end of a step.
    pub(crate) fn update_step(&mut self) -> Result<()> {
        let roles: Vec<TensorRole> = ROLES.iter().map(|(role, _)| *role).collect();
        self.update_now(&roles)
    }

    /// Appends the amaxes and counts this step's statistics still leave on a GPU (so that the
    /// whole model's are read in one go: `train::fp8_stats_reads`).
    pub(crate) fn pending_stats(&self, scalars: &mut Vec<Deferred<f32>>, counts: &mut Vec<Deferred<[u64; 4]>>) {
        for s in self.stats.iter().flatten() {
            if let Fp8Stats::Counted(c) = s {
                scalars.extend([c.amax.clone(), c.scale.clone()]);
                counts.push(c.counts.clone());
            }
        }
    }

    /// This step's statistics, finished (counts and amaxes a GPU kept are read now: a few
    /// values per cast, once per step).
    ///
    /// # Panics
    /// If those reads fail (the GPU is gone), as `Parameter::value`.
    pub(crate) fn collect_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        out.extend(self.stats.iter().flatten().map(|s| {
            s.finish().unwrap_or_else(|e| {
                panic!(
                    "FP8 statistics of '{}' could not come back from their GPU: {e}",
                    self.layer
                )
            })
        }));
    }
}
