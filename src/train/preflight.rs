//! Checks made before any training starts, so that a run fails in its first
//! second rather than after hours: every precision's shape rules (FP8 token
//! counts of training and held-out batches included), and whether the memory
//! the largest run needs fits the machine. Every size product is checked, so
//! absurd sizes are errors, never overflows or allocator aborts.

use crate::amp::{Fp8Recipe, Precision};
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::hf::HfConfig;
use crate::memory::MemoryCategory;
use crate::model::{DecoderModel, ModelConfig, Recompute};
use crate::nn::FP8_DIM_MULTIPLE;
use crate::plan::{BasePrecision, LoraPlan, MemoryPlan, PlanSettings, plan, plan_decoder};

use super::session::RunConfig;

/// Bytes per parameter value during training: f32 master (4), gradient (4), AdamW moments (8),
/// a 16-bit compute copy (2) and FP8 weight copies with their transposes (2): 20.
const BYTES_PER_PARAMETER: u64 = 20;

/// Saved f32 values per token and layer, in units of `hidden` and of `ffn` (napkin math from
/// the layers' backward inputs: norms, q/k/v, attention output, projections, residuals about
/// 12 x hidden; the MLP's pre- and post-activation 2 x ffn, 3 x ffn with SwiGLU).
const SAVED_HIDDEN_PER_TOKEN: u64 = 12;

/// The ranks of a data-parallel run that live in this process (threads, each holding its own
/// model), and the ZeRO stage that shards their optimizer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRanks {
    /// Ranks in this process (1 without data parallelism, or when launched once per rank).
    pub ranks: usize,
    /// 0: every rank holds all optimizer state; 1: each holds its 1/ranks share, and of the f32
    /// masters that ZeRO-1 shards ([`sharded_master_bytes`]).
    pub zero: u8,
}

impl HostRanks {
    /// One rank: a run without data parallelism.
    pub const ONE: HostRanks = HostRanks { ranks: 1, zero: 0 };

    /// The bytes of `ranks` copies of one rank's `plan`, with the optimizer state and the
    /// `sharded_masters` bytes of f32 masters held once over all of them under ZeRO-1 (each rank
    /// keeps a 1/ranks share; rounding up is ignored).
    pub fn total_bytes(&self, plan: &MemoryPlan, sharded_masters: u128) -> u128 {
        let ranks = self.ranks.max(1) as u128;
        let masters = sharded_masters.min(plan.category(MemoryCategory::MasterWeights));
        let once = plan.category(MemoryCategory::OptimizerState) + masters;
        let per_rank = plan.total_bytes();
        match self.zero {
            0 => per_rank.saturating_mul(ranks),
            _ => (per_rank - once).saturating_mul(ranks).saturating_add(once),
        }
    }
}

/// Bytes of f32 masters that ZeRO-1 shards in `model` under `precision` (`docs/distributed.md`,
/// ZeRO-1): the weights of the linear layers whose compute copy is an element-wise cast (bf16,
/// fp16, FP8 with delayed scaling) and the untied head's (a 16-bit copy under every FP8 recipe);
/// none under fp32.
pub fn sharded_master_bytes(model: &ModelConfig, precision: &Precision) -> u128 {
    let (h, ffn, vocab) = (model.hidden as u128, model.ffn_hidden as u128, model.vocab as u128);
    let fc1_out = if model.swiglu { ffn.saturating_mul(2) } else { ffn };
    // qkv (3h x h), the projection (h x h), fc1 and fc2.
    let layer = [h.saturating_mul(4), fc1_out, ffn]
        .iter()
        .fold(0u128, |sum, n| sum.saturating_add(n.saturating_mul(h)));
    let layers = match precision {
        Precision::Fp8(Fp8Recipe::Delayed(_)) | Precision::Bf16 | Precision::Fp16 => {
            layer.saturating_mul(model.layers as u128)
        }
        Precision::Fp8(_) | Precision::Fp32 => 0,
    };
    let head = match (model.tied_head, precision) {
        (true, _) | (_, Precision::Fp32) => 0,
        _ => vocab.saturating_mul(h),
    };
    layers.saturating_add(head).saturating_mul(4)
}

/// Everything [`check_run`] looks at, for each precision about to run.
pub fn check_run(precisions: &[Precision], config: &RunConfig, data: &Dataset) -> Result<()> {
    check_run_on(precisions, config, data, HostRanks::ONE)
}

/// [`check_run`] for `host` ranks in this process (`fp8 train --world-size N`): `config.batch`
/// and `config.micro_batches` are the step's totals over all ranks, and the memory check counts
/// every rank's model.
pub fn check_run_on(precisions: &[Precision], config: &RunConfig, data: &Dataset, host: HostRanks) -> Result<()> {
    let micro = micro_batch(config)?;
    let model = config.model_for(data);
    // Each rank runs micro_batches / ranks micro-batches per step: a running sum from two on.
    let accumulate = config.micro_batches / host.ranks.max(1) > 1;
    // The memory planner's peak of the largest precision, as `fp8 plan` plans a fine-tune.
    let planned = precisions
        .iter()
        .map(|p| (p, plan_decoder(&model, p, micro, data.seq_len(), accumulate)))
        .map(|(p, plan)| {
            let bytes = host.total_bytes(&plan, sharded_master_bytes(&model, p));
            (p, plan, bytes)
        })
        .max_by_key(|(_, _, bytes)| *bytes);
    if let Some((precision, plan, bytes)) = planned {
        let ranks = match host.ranks {
            0 | 1 => String::new(),
            n => format!("{n} ranks in this process (ZeRO-{}), each with ", host.zero),
        };
        let what = format!(
            "training ({ranks}{} layers x {} wide, MLP {}, {} sequences of {} tokens per micro-batch; planned under {}: {})",
            model.layers,
            model.hidden,
            model.ffn_hidden,
            micro,
            data.seq_len(),
            precision.name(),
            plan_categories(&plan)
        );
        crate::io::ensure_fits(&what, u64::try_from(bytes).ok())?;
    }
    let heldout: Vec<usize> = data.heldout_batches(micro).iter().map(|b| b.batch).collect();
    for precision in precisions {
        if precision.is_fp8() {
            check_fp8_tokens(precision, micro, data.seq_len(), &heldout)?;
        }
        // Builds the model once: every layer checks its own shape rules (FP8 widths, heads).
        DecoderModel::new(&model, precision, config.seed)?;
    }
    Ok(())
}

/// [`check_run`] for a model loaded from a checkpoint of `model`'s config: batch shapes under
/// every precision, and the memory planner's peak ([`crate::plan`]) of the largest precision
/// against the host's available memory, before any weight is read; `base` and `lora` are planned
/// as the run will hold them.
pub fn check_fine_tune(
    precisions: &[Precision],
    config: &RunConfig,
    data: &Dataset,
    model: &HfConfig,
    base: BasePrecision,
    lora: Option<LoraPlan>,
    frozen_dtype: crate::tensor::Dtype,
) -> Result<()> {
    let micro = micro_batch(config)?;
    let needed = precisions
        .iter()
        .map(|precision| {
            let settings = fine_tune_settings(precision, config, data, (base, lora.clone(), frozen_dtype))?;
            Ok(plan(model, &settings).total_bytes())
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    let what = format!(
        "fine-tuning ({} parameters, {micro} sequences of {} tokens; `fp8 plan` shows the bytes by category)",
        model.parameter_count(),
        data.seq_len()
    );
    crate::io::ensure_fits(&what, u64::try_from(needed).ok())?;
    let heldout: Vec<usize> = data.heldout_batches(micro).iter().map(|b| b.batch).collect();
    for precision in precisions.iter().filter(|p| p.is_fp8()) {
        check_fp8_tokens(precision, micro, data.seq_len(), &heldout)?;
    }
    Ok(())
}

/// The non-zero categories of a plan, e.g. `master weights 1.0 MiB, activations 3.0 GiB`.
fn plan_categories(plan: &MemoryPlan) -> String {
    let parts: Vec<String> = plan
        .bytes
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(c, b)| {
            let shown = u64::try_from(*b).map_or("more than 2^64 bytes".to_string(), crate::memory::human_bytes);
            format!("{} {shown}", c.name())
        })
        .collect();
    parts.join(", ")
}

/// The planner's settings of a fine-tune of `config` under `precision`, its frozen base held as
/// `held` (base precision, adapters, frozen dtype).
pub(crate) fn fine_tune_settings(
    precision: &Precision,
    config: &RunConfig,
    data: &Dataset,
    (base, lora, frozen_dtype): (BasePrecision, Option<LoraPlan>, crate::tensor::Dtype),
) -> Result<PlanSettings> {
    Ok(PlanSettings {
        precision: precision.clone(),
        base,
        lora,
        frozen_dtype,
        micro_batch: micro_batch(config)?,
        seq: data.seq_len(),
        recompute: plans_recompute(config),
        accumulate: config.micro_batches > 1,
    })
}

/// Whether the planner plans `config`'s recompute as "every layer": it knows all or nothing, and
/// every-N keeps more than "every" and less than "none", so it is planned as none.
pub(crate) fn plans_recompute(config: &RunConfig) -> bool {
    match config.model.recompute {
        Recompute::None => false,
        Recompute::Every => true,
        Recompute::EveryNth(_) => false,
    }
}

pub(crate) fn micro_batch(config: &RunConfig) -> Result<usize> {
    if config.micro_batches == 0 || config.batch == 0 || !config.batch.is_multiple_of(config.micro_batches) {
        return Err(Error::InvalidSetting {
            setting: "batch",
            value: config.batch.to_string(),
            reason: format!(
                "must be a positive multiple of the micro-batch count {}",
                config.micro_batches
            ),
        });
    }
    Ok(config.batch / config.micro_batches)
}

/// FP8 GEMMs take token counts (batch x seq rows) that are multiples of [`FP8_DIM_MULTIPLE`],
/// in training micro-batches and in every held-out batch (the last one may be smaller).
fn check_fp8_tokens(precision: &Precision, micro: usize, seq: usize, heldout: &[usize]) -> Result<()> {
    let rows = |batch: usize| batch.saturating_mul(seq);
    let fails = |batch: usize| !rows(batch).is_multiple_of(FP8_DIM_MULTIPLE);
    if fails(micro) {
        return Err(Error::InvalidSetting {
            setting: "batch",
            value: micro.to_string(),
            reason: format!(
                "{} needs token counts that are multiples of {FP8_DIM_MULTIPLE}: {micro} sequences per micro-batch \
                 x {seq} tokens = {} (choose --batch / --micro-batches so that it is)",
                precision.name(),
                rows(micro)
            ),
        });
    }
    if let Some(&last) = heldout.iter().find(|&&b| fails(b)) {
        let total: usize = heldout.iter().sum();
        return Err(Error::InvalidSetting {
            setting: "batch",
            value: micro.to_string(),
            reason: format!(
                "{} needs token counts that are multiples of {FP8_DIM_MULTIPLE}: the {total} held-out sequences in \
                 batches of {micro} leave one of {last} sequences x {seq} tokens = {} (the held-out split is fixed by \
                 the task: choose a micro-batch size that makes every held-out batch a multiple, or another task size)",
                precision.name(),
                rows(last)
            ),
        });
    }
    Ok(())
}

/// Bytes a training run of `model` with micro-batches of `micro` x `seq` tokens needs at least,
/// or `None` if the count overflows 64 bits.
pub fn estimate_bytes(model: &ModelConfig, micro: usize, seq: usize) -> Option<u64> {
    let [vocab, max_seq, h, layers, ffn] =
        [model.vocab, model.max_seq, model.hidden, model.layers, model.ffn_hidden].map(|v| v as u64);
    let mlp_mats = if model.swiglu { 3 } else { 2 };
    // Per layer: q, k, v and output projections (4 h^2), the MLP's matrices, biases and norms.
    // (Every product checked: a debug build panics on an unchecked overflow.)
    let per_layer = h
        .checked_mul(h)?
        .checked_mul(4)?
        .checked_add(h.checked_mul(ffn)?.checked_mul(mlp_mats)?)?
        .checked_add(h.checked_mul(8)?.checked_add(ffn)?)?;
    let embeddings = vocab.checked_add(max_seq)?.checked_mul(h)?;
    let head = if model.tied_head { 0 } else { vocab.checked_mul(h)? };
    let parameters = per_layer
        .checked_mul(layers)?
        .checked_add(embeddings)?
        .checked_add(head)?;
    let tokens = (micro as u64).checked_mul(seq as u64)?;
    let saved_per_token = h
        .checked_mul(SAVED_HIDDEN_PER_TOKEN)?
        .checked_add(ffn.checked_mul(mlp_mats + 1)?)?;
    let activations = tokens
        .checked_mul(saved_per_token)?
        .checked_mul(layers)?
        .checked_mul(4)?;
    // Logits, their gradient and softmax statistics: about 3 f32 per token and vocabulary entry.
    let logits = tokens.checked_mul(vocab)?.checked_mul(12)?;
    parameters
        .checked_mul(BYTES_PER_PARAMETER)?
        .checked_add(activations)?
        .checked_add(logits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::addition::AdditionConfig;

    fn addition(digits: usize) -> Dataset {
        Dataset::addition(
            AdditionConfig {
                digits,
                ..AdditionConfig::default()
            },
            1,
        )
        .unwrap()
    }

    fn fp8() -> Precision {
        "fp8-delayed".parse().unwrap()
    }

    #[test]
    fn estimates_grow_with_sizes_and_overflow_to_none() {
        let small = ModelConfig::default();
        let base = estimate_bytes(&small, 16, 8).unwrap();
        let wider = ModelConfig {
            hidden: 128,
            ..small.clone()
        };
        assert!(estimate_bytes(&wider, 16, 8).unwrap() > base);
        assert!(estimate_bytes(&small, 32, 8).unwrap() > base);
        let huge = ModelConfig {
            hidden: 4_611_686_018_427_387_920,
            ..small.clone()
        };
        assert_eq!(estimate_bytes(&huge, 16, 8), None);
        assert_eq!(estimate_bytes(&small, usize::MAX, 8), None);
    }

    #[test]
    fn fp8_token_counts_are_checked_for_training_and_heldout_batches() {
        let data = addition(1);
        let config = RunConfig {
            batch: 3,
            ..RunConfig::default()
        };
        let err = check_run(&[fp8()], &config, &data).unwrap_err().to_string();
        assert!(err.contains("3 sequences per micro-batch"), "{err}");
        // fp32 has no such rule.
        check_run(&["fp32".parse().unwrap()], &config, &data).unwrap();
        // 16 x 5 tokens trains, but the held-out split leaves a short last batch.
        let config = RunConfig {
            batch: 16,
            model: ModelConfig {
                hidden: 16,
                heads: 2,
                layers: 1,
                ffn_hidden: 64,
                ..ModelConfig::default()
            },
            ..RunConfig::default()
        };
        let err = check_run(&[fp8()], &config, &data).unwrap_err().to_string();
        assert!(err.contains("held-out sequences"), "{err}");
    }

    #[test]
    fn host_ranks_count_every_rank_and_zero1_holds_the_optimizer_state_once() {
        let model = ModelConfig::default();
        let plan = plan_decoder(&model, &"fp32".parse().unwrap(), 4, 8, false);
        let (total, optimizer) = (plan.total_bytes(), plan.category(MemoryCategory::OptimizerState));
        assert!(optimizer > 0 && optimizer < total);
        assert_eq!(HostRanks::ONE.total_bytes(&plan, 0), total);
        assert_eq!(HostRanks { ranks: 4, zero: 0 }.total_bytes(&plan, 0), 4 * total);
        assert_eq!(
            HostRanks { ranks: 4, zero: 1 }.total_bytes(&plan, 0),
            4 * (total - optimizer) + optimizer
        );
        // ZeRO-1 on one rank shards nothing.
        assert_eq!(HostRanks { ranks: 1, zero: 1 }.total_bytes(&plan, 0), total);
        // Sharded masters are held once too, and only under ZeRO-1.
        let masters = 4096;
        assert_eq!(
            HostRanks { ranks: 4, zero: 1 }.total_bytes(&plan, masters),
            4 * (total - optimizer - masters) + optimizer + masters
        );
        assert_eq!(HostRanks { ranks: 4, zero: 0 }.total_bytes(&plan, masters), 4 * total);
    }

    /// [`sharded_master_bytes`] is what the model's layers can shard: the f32 bytes of every
    /// linear weight whose copy is cast element-wise.
    #[test]
    fn sharded_master_bytes_are_the_weights_the_layers_can_cast_in_slices() {
        use crate::nn::VisitLinears;
        for (swiglu, tied_head) in [(false, false), (true, true)] {
            let model = ModelConfig {
                hidden: 16,
                heads: 2,
                ffn_hidden: 32,
                swiglu,
                tied_head,
                ..ModelConfig::default()
            };
            for name in [
                "fp32",
                "bf16",
                "fp16",
                "fp8-delayed",
                "fp8-current",
                "fp8-block",
                "mxfp8",
            ] {
                let precision: Precision = name.parse().unwrap();
                let mut built = DecoderModel::new(&model, &precision, 1).unwrap();
                let mut want = 0u128;
                built.visit_linears(&mut |linear| {
                    if linear.weight_slice_cast().is_some() {
                        want += 4 * linear.weight().len() as u128;
                    }
                });
                assert_eq!(sharded_master_bytes(&model, &precision), want, "{name} {model:?}");
                match name {
                    "fp32" => assert_eq!(want, 0, "fp32 computes on its masters"),
                    "bf16" | "fp8-delayed" => assert!(want > 0, "{name}"),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn fp8_widths_are_checked_by_building_the_model() {
        let config = RunConfig {
            model: ModelConfig {
                hidden: 24,
                heads: 2,
                ffn_hidden: 96,
                ..ModelConfig::default()
            },
            ..RunConfig::default()
        };
        let err = check_run(&[fp8()], &config, &addition(2)).unwrap_err().to_string();
        assert!(err.contains("multiples of 16"), "{err}");
    }
}
