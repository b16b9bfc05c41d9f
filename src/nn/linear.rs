//! `Linear`: `Y = X W^T (+ b)` with its backward, under any precision.

use super::frozen_fp8::{BaseScaling, FrozenFp8Weight, quantize_weight};
use super::init;
use super::linear_gemms::{LinearGemms, WeightSliceCast};
use super::lora::LoraAdapter;
use super::param::{Module, Parameter};
use crate::amp::Precision;
use crate::dispatch::Backend;
use crate::error::Result;
use crate::scaling::DelayedSlot;
use crate::scaling::Fp8TensorStats;
use crate::tensor::DeviceKind;
use crate::tensor::Tensor;

/// A fully connected layer: weight `[out, in]` (f32 master), optional bias `[out]`.
///
/// Under FP8 it runs the three GEMMs of `docs/numerics.md`, GEMM (E4M3 forward, E5M2 x E4M3 dgrad and
/// wgrad from fused cast + transpose copies) and keeps five delayed-scaling slots
/// (delayed recipe); under bf16/fp16 its GEMM inputs and outputs are rounded to the
/// dtype with f32 accumulation.
pub struct Linear {
    name: String,
    in_features: usize,
    out_features: usize,
    weight: Parameter,
    bias: Option<Parameter>,
    gemms: LinearGemms,
    /// LoRA adapters, each on its own range of output rows (`nn::lora`).
    adapters: Vec<LoraAdapter>,
    /// The weight frozen as FP8 codes (`--base-precision fp8`); `weight` is then an empty
    /// placeholder that no visitor sees.
    frozen_fp8: Option<FrozenFp8Weight>,
}

impl Linear {
    /// Calls `f` on every GEMM set of the layer: its own, then each adapter's.
    pub(crate) fn visit_gemms(&mut self, f: &mut dyn FnMut(&mut LinearGemms)) {
        f(&mut self.gemms);
        self.adapters.iter_mut().for_each(|a| a.visit_gemms(f));
    }

    /// A layer named `name` (parameters `name.weight`, `name.bias`), weights drawn from
    /// N(0, 1/in) with `seed`, bias zero. FP8 needs `in` and `out` multiples of 16.
    pub fn new(
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
        precision: &Precision,
        seed: u64,
    ) -> Result<Self> {
        let std = 1.0 / (in_features.max(1) as f64).sqrt();
        let weight = if init::deferring_weights() {
            Parameter::placeholder(format!("{name}.weight"), &[out_features, in_features])
        } else {
            Parameter::new(
                format!("{name}.weight"),
                &[out_features, in_features],
                init::normal(seed, out_features * in_features, std),
            )?
        };
        let bias = bias
            .then(|| Parameter::new(format!("{name}.bias"), &[out_features], vec![0.0; out_features]))
            .transpose()?;
        Ok(Linear {
            gemms: LinearGemms::new(name, in_features, out_features, precision)?,
            name: name.to_string(),
            in_features,
            out_features,
            weight,
            bias,
            adapters: Vec::new(),
            frozen_fp8: None,
        })
    }

    /// The same layer kept in high precision whatever the policy (FP8 becomes bf16): for an LM head
    /// or any layer whose dims FP8 cannot take.
    pub fn new_high_precision(
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
        precision: &Precision,
        seed: u64,
    ) -> Result<Self> {
        init::not_deferring(|| Linear::new(name, in_features, out_features, bias, &precision.without_fp8(), seed))
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The precision its GEMMs run in.
    pub fn precision(&self) -> &Precision {
        self.gemms.precision()
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The weight `[out, in]`.
    pub fn weight(&self) -> &Parameter {
        &self.weight
    }

    /// The weight, mutable (e.g. to load values; call [`Parameter::mark_updated`] after).
    pub fn weight_mut(&mut self) -> &mut Parameter {
        &mut self.weight
    }

    /// How ZeRO-1 with sharded masters casts slices of the weight as this layer casts the whole
    /// one; `None` when it cannot (see [`LinearGemms::weight_slice_cast`]) or the weight is
    /// frozen, held as FP8 codes or read by adapters.
    pub(crate) fn weight_slice_cast(&self) -> Option<WeightSliceCast> {
        let plain = self.adapters.is_empty() && self.frozen_fp8.is_none() && !self.weight.is_frozen();
        plain.then(|| self.gemms.weight_slice_cast()).flatten()
    }

    /// Installs the weight's bf16/fp16 compute copy, gathered from slices, at its version.
    pub(crate) fn install_plain_weight(&mut self, copy: crate::dispatch::PlainMat) -> Result<()> {
        self.gemms.install_plain_weight(self.weight.version(), copy)
    }

    /// Installs the weight's FP8 copy, gathered from slices, at its version, with the whole
    /// tensor's statistics counts.
    pub(crate) fn install_fp8_weight(&mut self, cast: crate::dispatch::Cast, counts: [u64; 4]) -> Result<()> {
        self.gemms.install_fp8_weight(self.weight.version(), cast, counts)
    }

    /// The bias, if the layer has one.
    pub fn bias(&self) -> Option<&Parameter> {
        self.bias.as_ref()
    }

    /// `Y = X W^T + b` for `x` `[tokens, in]`; saves what backward needs.
    pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        self.forward_pass(x, false)
    }

    /// The forward; `replay` recomputes it in backward without touching the FP8 state. The
    /// output lives where `x` does (host memory, or the backend's GPU).
    pub(crate) fn forward_pass(&mut self, x: &Tensor, replay: bool) -> Result<Tensor> {
        x.expect(&self.name, "input", None, self.in_features)?;
        self.gemms.expect_on("linear forward", x)?;
        self.values_where(x.device())?;
        let bias_host = self.bias.as_ref().and_then(Parameter::host_op_values);
        let bias = self.bias.as_ref().map(|b| b.op_values(&bias_host));
        let mut y = match &self.frozen_fp8 {
            Some(w) => {
                let dtype = self.gemms.precision().compute_dtype();
                w.forward(
                    self.gemms.backend(),
                    self.gemms.precision(),
                    x.values(),
                    x.rows(),
                    bias,
                    dtype,
                )?
            }
            None => self.gemms.forward(x.values(), x.rows(), &self.weight, bias, replay)?,
        };
        // Adapters add their update (with dropout, through the op's mask) where `x` and `y` live.
        let backend = self.gemms.backend().clone();
        for adapter in &mut self.adapters {
            adapter.forward_add_on(&backend, x.values(), x.rows(), &mut y, replay)?;
        }
        Ok(y)
    }

    /// [`Self::forward_pass`] on an input the caller no longer needs: under fp32 the saved
    /// input for wgrad is `x` itself instead of a copy (a copy of a megabyte-sized activation
    /// and its fresh pages per layer call). Same results.
    pub(crate) fn forward_owned(&mut self, x: Tensor, replay: bool) -> Result<Tensor> {
        if self.frozen_fp8.is_some() || !self.adapters.is_empty() {
            return self.forward_pass(&x, replay);
        }
        x.expect(&self.name, "input", None, self.in_features)?;
        self.gemms.expect_on("linear forward", &x)?;
        self.values_where(x.device())?;
        let bias_host = self.bias.as_ref().and_then(Parameter::host_op_values);
        let bias = self.bias.as_ref().map(|b| b.op_values(&bias_host));
        self.gemms.forward_owned(x, &self.weight, bias, replay)
    }

    /// dX for `dy` `[tokens, out]`, where `dy` lives; accumulates dW and db into the
    /// parameters' grads.
    pub fn backward(&mut self, dy: &Tensor) -> Result<Tensor> {
        dy.expect(&self.name, "output gradient", None, self.out_features)?;
        self.gemms.expect_on("linear backward", dy)?;
        // The trainable gradients where `dy` lives (a weight frozen in FP8 has none: only its
        // bias, if any, trains).
        self.grads_where(dy.device())?;
        let mut dx = match &self.frozen_fp8 {
            Some(w) => {
                if let Some(db) = self.bias.as_mut().and_then(|b| b.trainable_grad_values()) {
                    self.gemms
                        .backend()
                        .kernels()
                        .column_sum(dy.values(), self.out_features, db)?;
                }
                let dtype = self.gemms.precision().compute_dtype();
                w.backward(self.gemms.backend(), self.gemms.precision(), dy.values(), dtype)?
            }
            None => {
                let bias_grad = self.bias.as_mut().and_then(|b| b.trainable_grad_values());
                let (stored, weight_grad) = self.weight.half_and_trainable_grad();
                self.gemms.backward(dy.values(), stored, weight_grad, bias_grad)?
            }
        };
        let backend = self.gemms.backend().clone();
        for adapter in &mut self.adapters {
            adapter.backward_add_on(&backend, dy.values(), self.out_features, &mut dx)?;
        }
        Ok(dx)
    }

    /// Moves the trainable weight's and bias's master values to where the input lives
    /// (`Parameter::value_where`): a layer on device tensors keeps them there, so its weight
    /// casts and its GEMM's epilogue read them in place and the optimizer's arenas update them
    /// there, instead of them going up every forward and down and up every optimizer step. A
    /// weight frozen as FP8 codes has no master values (its codes are held apart).
    fn values_where(&mut self, device: DeviceKind) -> Result<()> {
        let backend = self.gemms.backend().clone();
        let dtype = self.gemms.precision().compute_dtype();
        let weight = self.frozen_fp8.is_none().then_some(&mut self.weight);
        for p in weight.into_iter().chain(self.bias.as_mut()) {
            p.value_where(&backend, device, dtype)?;
        }
        Ok(())
    }

    /// Moves the trainable gradients to where `dy` lives (`Parameter::grad_where`): a layer on
    /// device tensors keeps them there, instead of each dW going down and up every backward
    /// (`docs/cuda-backend.md`).
    fn grads_where(&mut self, device: DeviceKind) -> Result<()> {
        let backend = self.gemms.backend().clone();
        let dtype = self.gemms.precision().compute_dtype();
        for p in std::iter::once(&mut self.weight).chain(self.bias.as_mut()) {
            p.grad_where(&backend, device, dtype)?;
        }
        Ok(())
    }

    /// Adds a LoRA adapter on its rows of the output (the ranges of a layer's adapters must not
    /// overlap, and it must take this layer's input).
    pub fn add_adapter(&mut self, adapter: LoraAdapter) -> Result<()> {
        let (offset, out) = adapter.rows();
        let overlaps = self.adapters.iter().any(|a| {
            let (o, n) = a.rows();
            offset < o + n && o < offset + out
        });
        if offset + out > self.out_features || adapter.a().shape()[1] != self.in_features || overlaps {
            return Err(crate::error::Error::LayerShape {
                layer: self.name.clone(),
                detail: format!(
                    "adapter {} on rows {offset}..{} with {} inputs does not fit a free row range of this {}x{} \
                     layer",
                    adapter.module(),
                    offset + out,
                    adapter.a().shape()[1],
                    self.out_features,
                    self.in_features
                ),
            });
        }
        self.adapters.push(adapter);
        Ok(())
    }

    /// The LoRA adapters, in the order they were added.
    pub fn adapters(&self) -> &[LoraAdapter] {
        &self.adapters
    }

    /// The LoRA adapters, mutable (to load trained values).
    pub fn adapters_mut(&mut self) -> &mut [LoraAdapter] {
        &mut self.adapters
    }

    /// Turns the adapters' dropout on (training) or off (evaluation).
    pub fn set_lora_dropout(&mut self, on: bool) {
        self.adapters.iter_mut().for_each(|a| a.set_dropout_active(on));
    }

    /// Folds every adapter into the weight (`LoraAdapter::merge_into`) and removes them; a frozen
    /// FP8 weight is first widened back to f32 ([`Linear::thaw_fp8`]).
    pub fn merge_adapters(&mut self) -> Result<()> {
        if !self.adapters.is_empty() {
            self.thaw_fp8()?;
        }
        let adapters = std::mem::take(&mut self.adapters);
        for adapter in &adapters {
            adapter.merge_into(self.weight.value_mut());
        }
        if !adapters.is_empty() {
            self.weight.mark_updated();
        }
        Ok(())
    }

    /// Quantizes the weight to frozen FP8 codes, one segment per run of `segment_rows` rows (the
    /// checkpoint tensors a fused weight stacks), and drops the f32 values.
    pub fn freeze_to_fp8(&mut self, segment_rows: &[usize], scaling: BaseScaling) -> Result<()> {
        let inp = self.in_features;
        let mut segments = Vec::with_capacity(segment_rows.len());
        let mut start = 0;
        for &rows in segment_rows {
            let end = (start + rows) * inp;
            let values = self
                .weight
                .value()
                .get(start * inp..end)
                .ok_or_else(|| self.segments_error(segment_rows))?;
            segments.push(quantize_weight(values, rows, inp, scaling)?);
            start += rows;
        }
        self.install_frozen_fp8(FrozenFp8Weight::new(scaling, inp, segments)?)
    }

    /// Replaces the weight with frozen FP8 codes of the same shape (the f32 values, if any, are dropped).
    pub fn install_frozen_fp8(&mut self, mut weight: FrozenFp8Weight) -> Result<()> {
        if weight.out_features() != self.out_features {
            let rows: Vec<usize> = weight.segments().iter().map(|s| s.rows()).collect();
            return Err(self.segments_error(&rows));
        }
        // On a GPU the codes stay there (a weight installed after `to_device` too).
        weight.hold_on(self.gemms.backend())?;
        self.weight.release();
        self.frozen_fp8 = Some(weight);
        Ok(())
    }

    fn segments_error(&self, rows: &[usize]) -> crate::error::Error {
        crate::error::Error::LayerShape {
            layer: self.name.clone(),
            detail: format!(
                "FP8 weight segments of {rows:?} rows do not stack to this {}x{} weight",
                self.out_features, self.in_features
            ),
        }
    }

    /// The frozen FP8 weight, when the layer holds one.
    pub fn frozen_fp8(&self) -> Option<&FrozenFp8Weight> {
        self.frozen_fp8.as_ref()
    }

    /// Widens a frozen FP8 weight back to a frozen f32 weight (the codes' exact values), e.g. to
    /// merge adapters or save the model; nothing to do otherwise.
    pub fn thaw_fp8(&mut self) -> Result<()> {
        if let Some(w) = self.frozen_fp8.take() {
            let shape = [self.out_features, self.in_features];
            self.weight = Parameter::new(self.weight.name().to_string(), &shape, w.dequantize()?)?;
            self.weight.freeze();
        }
        Ok(())
    }

    /// Drops the saved input (a recomputing parent makes it again, an evaluation-only forward needs none).
    pub fn clear_saved(&mut self) {
        self.gemms.clear_saved();
        self.adapters.iter_mut().for_each(LoraAdapter::clear_saved);
    }
}

impl Module for Linear {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        if self.frozen_fp8.is_none() {
            f(&mut self.weight);
        }
        if let Some(bias) = &mut self.bias {
            f(bias);
        }
        for adapter in &mut self.adapters {
            adapter.visit_parameters(f);
        }
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        let backend = Backend::on(device);
        if let Some(w) = &mut self.frozen_fp8 {
            // First, so a GPU out of memory leaves the linear where it was.
            w.hold_on(&backend)?;
        }
        self.adapters.iter_mut().for_each(|a| a.set_backend(backend.clone()));
        self.gemms.set_backend(backend);
        Ok(())
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.gemms.check_against_cpu(on);
        self.adapters.iter_mut().for_each(|a| a.check_against_cpu(on));
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.gemms.visit_slots(f);
        self.adapters.iter_mut().for_each(|a| a.visit_slots(f));
    }

    fn saved_activation_bytes(&self) -> usize {
        self.gemms.saved_bytes() + self.adapters.iter().map(LoraAdapter::saved_bytes).sum::<usize>()
    }

    fn weight_cache_bytes(&self) -> usize {
        self.gemms.weight_cache_bytes()
            + self.frozen_fp8.as_ref().map_or(0, FrozenFp8Weight::bytes)
            + self.adapters.iter().map(LoraAdapter::weight_cache_bytes).sum::<usize>()
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.gemms.collect_stats(out);
        self.adapters.iter().for_each(|a| a.collect_stats(out));
    }
}
