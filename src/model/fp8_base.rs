//! `--base-precision fp8`: a [`LlamaModel`] whose decoder linear weights are frozen E4M3 codes
//! ([`FrozenFp8Weight`]), loaded tensor by tensor so that the model is never whole in f32.
//!
//! Each checkpoint tensor of a linear (q, k, v, o, gate, up, down) becomes one segment: an HF FP8
//! tensor with 128x128 blocks is taken as stored (codes and `weight_scale_inv` copied), any other
//! is widened to f32 alone, quantized, and its f32 values dropped before the next tensor is read.
//! Embeddings, norms and the head are loaded as every other run loads them.

use std::collections::HashMap;

use safetensors::Dtype;

use super::config::Recompute;
use super::hf_names::hf_names;
use super::llama::LlamaModel;
use crate::amp::Precision;
use crate::error::{Error, Result};
use crate::hf::{HF_FP8_BLOCK, HfModelDir, scale_inv_name};
use crate::nn::{BaseScaling, FrozenFp8Weight, Linear, VisitLinears, quantize_frozen_weight};
use crate::tensor::{QuantizedMatrix, Scales};

/// What loading an FP8 base did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fp8BaseLoad {
    /// Checkpoint tensors quantized at load time.
    pub quantized: usize,
    /// HF FP8 tensors whose codes and block scales were used as stored.
    pub used_as_stored: usize,
    /// The most f32 values held at once while the linears were loaded (one tensor's).
    pub peak_f32_values: usize,
    /// Bytes of the frozen codes and scales.
    pub fp8_bytes: usize,
}

/// The checkpoint tensors (name, rows) each decoder linear stacks, keyed by the linear's name.
fn linear_sources(model: &LlamaModel) -> HashMap<String, Vec<(String, usize)>> {
    hf_names(model.config())
        .into_iter()
        .filter_map(|(param, sources)| {
            let linear = param.strip_suffix(".weight")?;
            (linear.starts_with("layers.") && !linear.ends_with("norm")).then(|| (linear.to_string(), sources))
        })
        .collect()
}

fn internal(name: &str, reason: String) -> Error {
    Error::InvalidTensor {
        name: name.to_string(),
        reason,
    }
}

/// One checkpoint tensor `[rows, cols]` as a frozen segment; returns it and the f32 values held.
fn load_segment(
    dir: &HfModelDir,
    name: &str,
    rows: usize,
    cols: usize,
    scaling: BaseScaling,
) -> Result<(QuantizedMatrix, usize)> {
    let entry = dir.shards.entry(name)?;
    let hf_blocks = dir.config.fp8.as_ref().map(|q| q.block) == Some([HF_FP8_BLOCK, HF_FP8_BLOCK]);
    if entry.dtype == Dtype::F8_E4M3 && scaling == BaseScaling::Block && hf_blocks {
        let codes = dir.shards.bytes(name)?.to_vec();
        let scale_inv = dir.read_f32(&scale_inv_name(name))?;
        return Ok((
            QuantizedMatrix::new(codes, rows, cols, Scales::Block128x128(scale_inv))?,
            0,
        ));
    }
    let values = dir.read_f32(name)?;
    let held = values.len();
    Ok((quantize_frozen_weight(&values, rows, cols, scaling)?, held))
}

impl LlamaModel {
    /// The model of `dir` with every decoder linear weight frozen as FP8 codes (`scaling`), no f32
    /// copy of them ever made whole; the other parameters load as in [`LlamaModel::from_hf`].
    pub fn from_hf_fp8_base(
        dir: &HfModelDir,
        precision: &Precision,
        recompute: Recompute,
        scaling: BaseScaling,
    ) -> Result<(Self, Fp8BaseLoad)> {
        // The linear weights get no storage; everything else is loaded below, so nothing is drawn.
        let mut model = crate::nn::with_deferred_linear_weights(|| {
            crate::nn::without_draws(|| LlamaModel::new(&dir.config, precision, recompute, 0))
        })?;
        let sources = linear_sources(&model);
        let mut report = Fp8BaseLoad::default();
        let mut installed = 0usize;
        let mut result = Ok(());
        model.visit_linears(&mut |linear: &mut Linear| {
            if result.is_err() {
                return;
            }
            let Some(names) = sources.get(linear.name()) else {
                return; // the head keeps its checkpoint values
            };
            let cols = linear.in_features();
            let mut segments = Vec::with_capacity(names.len());
            for (name, rows) in names {
                match load_segment(dir, name, *rows, cols, scaling) {
                    Ok((segment, held)) => {
                        report.peak_f32_values = report.peak_f32_values.max(held);
                        if held == 0 {
                            report.used_as_stored += 1;
                        } else {
                            report.quantized += 1;
                        }
                        segments.push(segment);
                    }
                    Err(err) => {
                        result = Err(err);
                        return;
                    }
                }
            }
            result = FrozenFp8Weight::new(scaling, cols, segments).and_then(|w| {
                report.fp8_bytes += w.bytes();
                linear.install_frozen_fp8(w)
            });
            installed += 1;
        });
        result?;
        if installed != sources.len() {
            return Err(internal(
                "model",
                format!(
                    "{installed} linears frozen to FP8, the checkpoint map has {}",
                    sources.len()
                ),
            ));
        }
        let loaded = model.load_hf_values(dir)?;
        let expected = hf_names(model.config()).len();
        if loaded + installed != expected {
            return Err(internal(
                "model",
                format!("{loaded} parameters and {installed} FP8 linears loaded, the checkpoint map has {expected}"),
            ));
        }
        Ok((model, report))
    }

    /// Freezes every decoder linear weight of a model already in memory as FP8 codes, one
    /// segment per checkpoint tensor, as [`LlamaModel::from_hf_fp8_base`] would load them.
    pub fn freeze_base_fp8(&mut self, scaling: BaseScaling) -> Result<()> {
        let sources = linear_sources(self);
        let mut result = Ok(());
        self.visit_linears(&mut |linear: &mut Linear| {
            if let (Ok(()), Some(names)) = (&result, sources.get(linear.name())) {
                let rows: Vec<usize> = names.iter().map(|(_, r)| *r).collect();
                result = linear.freeze_to_fp8(&rows, scaling);
            }
        });
        result
    }

    /// Widens every frozen FP8 weight back to frozen f32 values (before a merged save).
    pub fn thaw_fp8_base(&mut self) -> Result<()> {
        let mut result = Ok(());
        self.visit_linears(&mut |linear: &mut Linear| {
            if result.is_ok() {
                result = linear.thaw_fp8();
            }
        });
        result
    }

    /// Whether any linear holds a frozen FP8 weight.
    pub fn has_fp8_base(&mut self) -> bool {
        let mut any = false;
        self.visit_linears(&mut |l| any |= l.frozen_fp8().is_some());
        any
    }
}
