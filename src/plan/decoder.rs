//! The plan of the built-in decoder (`fp8 train` without `--init-from`, [`DecoderModel`]): the
//! same categories and the same ledger terms as a Llama plan, for its own layers.
//!
//! [`DecoderModel`]: crate::model::DecoderModel
//!
//! Every value is trained: f32 masters, gradients (twice with accumulation), two f32 moments, a
//! compute copy, and the GEMMs' weight caches (fused q/k/v `[3h, h]`, the projection `[h, h]`,
//! fc1 `[ffn or 2 ffn, h]`, fc2 `[h, ffn]`, the separate head in high precision). A layer saves,
//! at d bytes a value: both norms' inputs (T h each, plus f32 rstd, and mean for LayerNorm), q,
//! k, v and the attention output (4 T h) with an f32 log-sum-exp per head, the four GEMM inputs
//! (FP8 codes under FP8), and fc1's output; with recompute only its input (T h). Sizes from the
//! command line can be absurd: the sums saturate instead of wrapping.

use super::{LinearShape, MemoryPlan};
use crate::amp::Precision;
use crate::memory::MemoryCategory;
use crate::model::{ModelConfig, Recompute};
use crate::scaling::Recipe;

/// A byte count that saturates at `u128::MAX` (then it is more than any memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Bytes(u128);

impl std::ops::Add for Bytes {
    type Output = Bytes;
    fn add(self, rhs: Bytes) -> Bytes {
        Bytes(self.0.saturating_add(rhs.0))
    }
}

impl std::ops::Mul for Bytes {
    type Output = Bytes;
    fn mul(self, rhs: Bytes) -> Bytes {
        Bytes(self.0.saturating_mul(rhs.0))
    }
}

fn b(v: usize) -> Bytes {
    Bytes(v as u128)
}

/// Bytes of one FP8 scale layout of a `[rows, cols]` tensor under `recipe`.
fn scale_bytes(recipe: &Recipe, rows: Bytes, cols: Bytes) -> Bytes {
    let up = |v: Bytes, n: u128| Bytes(v.0.div_ceil(n));
    match recipe {
        Recipe::Delayed(_) | Recipe::Current(_) => Bytes(4),
        Recipe::Block(_) => Bytes(4) * up(rows, 128) * up(cols, 128),
        Recipe::Mxfp8(_) => rows * up(cols, 32),
    }
}

/// The weight caches of a `[out, in]` weight: FP8 `W` and `W^T` with their scales, or one copy.
fn weight_cache(precision: &Precision, w: (Bytes, Bytes)) -> Bytes {
    let (out, inp) = w;
    match precision {
        Precision::Fp8(r) => Bytes(2) * out * inp + scale_bytes(r, out, inp) + scale_bytes(r, inp, out),
        other => out * inp * b(other.compute_dtype().bytes()),
    }
}

/// A saved GEMM input `[tokens, in]`: FP8 codes and scales, or d bytes a value.
fn gemm_input(precision: &Precision, tokens: Bytes, inp: Bytes) -> Bytes {
    match precision {
        Precision::Fp8(r) => tokens * inp + scale_bytes(r, tokens, inp),
        other => tokens * inp * b(other.compute_dtype().bytes()),
    }
}

/// The linears of one decoder layer, `[out, in]`: fused q/k/v, the projection, fc1 (both
/// halves under SwiGLU) and fc2.
pub(super) fn decoder_linears(model: &ModelConfig) -> [LinearShape; 4] {
    let (h, ffn) = (model.hidden as u128, model.ffn_hidden as u128);
    let fc1_out = if model.swiglu { 2 * ffn } else { ffn };
    [
        LinearShape { out: 3 * h, inp: h },
        LinearShape { out: h, inp: h },
        LinearShape { out: fc1_out, inp: h },
        LinearShape { out: h, inp: ffn },
    ]
}

/// The plan of training `model` under `precision` on micro-batches of `micro_batch` sequences of
/// `seq` tokens; `accumulate`: more than one micro-batch per step.
pub fn plan_decoder(
    model: &ModelConfig,
    precision: &Precision,
    micro_batch: usize,
    seq: usize,
    accumulate: bool,
) -> MemoryPlan {
    let d = b(precision.compute_dtype().bytes());
    let (h, vocab) = (b(model.hidden), b(model.vocab));
    let layer_norm = !model.rmsnorm;
    let linears = decoder_linears(model).map(|w| (Bytes(w.out), Bytes(w.inp)));
    let fc1_out = linears[2].0;
    // A norm's weight, and its bias under LayerNorm.
    let norm_values = if layer_norm { Bytes(2) * h } else { h };
    let layer_values = linears
        .iter()
        .map(|&(out, inp)| out * inp + out)
        .fold(Bytes(0), |a, v| a + v)
        + Bytes(2) * norm_values;
    let head = (!model.tied_head).then_some((vocab, h));
    let values = b(model.layers) * layer_values
        + (vocab + b(model.max_seq)) * h
        + norm_values
        + head.map_or(Bytes(0), |(o, i)| o * i);

    let mut cache = b(model.layers)
        * linears
            .iter()
            .map(|w| weight_cache(precision, *w))
            .fold(Bytes(0), |a, v| a + v);
    let head_cache = head.map_or(Bytes(0), |w| weight_cache(&precision.without_fp8(), w));
    let compute = if d == Bytes(4) { Bytes(0) } else { values * d };
    let mut bytes = [Bytes(0); MemoryCategory::COUNT];
    let mut set = |c: MemoryCategory, v: Bytes| {
        let i = MemoryCategory::ALL.iter().position(|x| *x == c).unwrap_or(0);
        bytes[i] = bytes[i] + v;
    };
    set(MemoryCategory::MasterWeights, Bytes(4) * values);
    let gradient_copies = if accumulate { Bytes(2) } else { Bytes(1) };
    set(MemoryCategory::Gradients, gradient_copies * Bytes(4) * values);
    set(MemoryCategory::OptimizerState, Bytes(8) * values);
    if precision.is_fp8() {
        cache = cache + head_cache;
        set(MemoryCategory::Parameters, compute);
        set(MemoryCategory::Fp8Copies, cache);
    } else {
        // A linear's weight cache is its compute copy: the larger of the two is held.
        set(MemoryCategory::Parameters, compute.max(cache + head_cache));
    }

    let tokens = b(micro_batch) * b(seq);
    let rstd = Bytes(4) * tokens * if layer_norm { Bytes(2) } else { Bytes(1) };
    let norm_saved = tokens * h * d + rstd;
    let full_layer = Bytes(2) * norm_saved
        + Bytes(4) * tokens * h * d
        + Bytes(4) * b(model.heads) * tokens
        + linears
            .iter()
            .map(|&(_, inp)| gemm_input(precision, tokens, inp))
            .fold(Bytes(0), |a, v| a + v)
        + tokens * fc1_out * d;
    // Layers 0, n, 2n, ... recompute under every-n.
    let recomputing = match model.recompute {
        Recompute::None => 0,
        Recompute::Every => model.layers,
        Recompute::EveryNth(n) => model.layers.div_ceil(n.max(1)),
    };
    let layers = b(recomputing) * tokens * h * d + b(model.layers - recomputing) * full_layer;
    // Input and target ids, f32 logits and log-sum-exp, the final norm's output and saved input,
    // and the separate head's input.
    let own = Bytes(super::loss_activation_bytes(tokens.0, vocab.0))
        + tokens * h * d
        + norm_saved
        + head.map_or(Bytes(0), |_| tokens * h * d);
    set(MemoryCategory::Activations, layers + own);
    MemoryPlan {
        parameters: values.0,
        trainable_parameters: values.0,
        bytes: std::array::from_fn(|i| (MemoryCategory::ALL[i], bytes[i].0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_sizes_saturate_instead_of_wrapping() {
        let model = ModelConfig {
            hidden: usize::MAX / 4,
            ffn_hidden: usize::MAX / 2,
            layers: usize::MAX,
            ..ModelConfig::default()
        };
        let plan = plan_decoder(&model, &"fp8-block".parse().unwrap(), usize::MAX, usize::MAX, true);
        assert_eq!(plan.total_bytes(), u128::MAX);
        let mut held = plan.bytes.iter().filter(|(c, _)| *c != MemoryCategory::Workspace);
        assert!(held.all(|(_, b)| *b > u64::MAX as u128), "{:?}", plan.bytes);
    }

    #[test]
    fn recompute_keeps_one_input_per_recomputing_layer() {
        let model = ModelConfig {
            layers: 4,
            ..ModelConfig::default()
        };
        let plan = |recompute| {
            let m = ModelConfig {
                recompute,
                ..model.clone()
            };
            plan_decoder(&m, &Precision::Fp32, 2, 16, false).category(MemoryCategory::Activations)
        };
        let (none, every, every_2) = (
            plan(Recompute::None),
            plan(Recompute::Every),
            plan(Recompute::EveryNth(2)),
        );
        // Layers 0 and 2 recompute under every-2: halfway between keeping everything and nothing.
        assert_eq!(2 * every_2, none + every);
        assert!(every < every_2 && every_2 < none);
    }
}
