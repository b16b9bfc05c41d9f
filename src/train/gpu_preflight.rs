//! The memory check of a run on a GPU, before anything is loaded: the planner's peak
//! ([`crate::plan`]) and the device copies a resident run keeps beside it
//! ([`crate::plan::device_copies`]) against the GPU's free memory.
//!
//! Two levels, because a GPU run has two kinds of memory. The activations and the workspace of
//! a resident run must be on the device: when they alone do not fit, the run is refused, saying
//! how much it needs and how much is free. The rest (the optimizer's arenas, weight copies,
//! device master values and gradients) each fall back to host memory when the device has no
//! room, so a run whose whole plan does not fit still runs, more slowly: it gets a warning
//! line, not a refusal.

use crate::amp::Precision;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::hf::HfConfig;
use crate::memory::{MemoryCategory, human_bytes};
use crate::plan::{
    BasePrecision, LoraPlan, MemoryPlan, decoder_device_copies, device_copies, loss_activation_bytes, plan,
    plan_decoder,
};
use crate::tensor::Dtype;

use super::session::RunConfig;

/// What one precision of a run needs on the GPU, planned.
#[derive(Clone, Debug)]
pub struct GpuNeed {
    /// The precision's name.
    pub precision: String,
    /// The planner's peak by category.
    pub plan: MemoryPlan,
    /// Device master values and gradients beside the plan's (booked as workspace).
    pub device_copies: u128,
    /// Activations of the plan that a resident run keeps in host memory: the input and target
    /// ids (the logits and their log-sum-exp are on the device: `model::ends`); with
    /// `FP8_CUDA_RESIDENT=0`, the logits and log-sum-exp too.
    pub host_activations: u128,
    /// What the loss's backward adds on the device beside the plan's activations
    /// ([`loss_gradient_bytes`]): the plan, as the CPU ledger, counts no `dlogits`.
    pub loss_gradient: u128,
    /// Whether the plan's activations are the run's own, not an upper bound (a fine-tune's
    /// every-N recompute is planned as none): only then may the check refuse.
    pub exact: bool,
}

impl GpuNeed {
    /// What must be on the device: the activations (but those kept in host memory) and the
    /// workspace.
    pub fn hard_bytes(&self) -> u128 {
        self.plan
            .category(MemoryCategory::Activations)
            .saturating_sub(self.host_activations)
            .saturating_add(self.plan.category(MemoryCategory::Workspace))
            .saturating_add(self.loss_gradient)
    }

    /// Everything, the device copies included.
    pub fn total_bytes(&self) -> u128 {
        self.plan
            .total_bytes()
            .saturating_add(self.device_copies)
            .saturating_add(self.loss_gradient)
    }
}

/// The GPU needs of `fp8 train` on the built-in decoder, one per precision (one rank's model).
pub fn decoder_needs(precisions: &[Precision], config: &RunConfig, data: &Dataset) -> Result<Vec<GpuNeed>> {
    let micro = super::preflight::micro_batch(config)?;
    let model = config.model_for(data);
    let accumulate = config.micro_batches > 1;
    let tokens = micro.saturating_mul(data.seq_len());
    let host_activations = host_activations(tokens, model.vocab);
    Ok(precisions
        .iter()
        .map(|p| GpuNeed {
            precision: p.name().to_string(),
            plan: plan_decoder(&model, p, micro, data.seq_len(), accumulate),
            device_copies: decoder_device_copies(&model, p.compute_dtype(), accumulate),
            host_activations,
            loss_gradient: loss_gradient_bytes(tokens, model.vocab, p.compute_dtype(), model.tied_head),
            // The decoder's plan counts every-N recompute as it runs.
            exact: true,
        })
        .collect())
}

/// The planned activations of `tokens` tokens over `vocab` that stay in host memory: the input
/// and target ids, 8 bytes a token (a part of [`loss_activation_bytes`]); staged
/// (`FP8_CUDA_RESIDENT=0`), the logits and their log-sum-exp too.
fn host_activations(tokens: usize, vocab: usize) -> u128 {
    let tokens = tokens as u128;
    match crate::backend::cuda::env_switch::resident_layers() {
        true => tokens.saturating_mul(8),
        false => loss_activation_bytes(tokens, vocab as u128),
    }
}

/// Bytes the loss's backward holds on a resident GPU while the forward's activations are still
/// there: `dlogits` (f32) and its copy in the compute dtype for the head's dgrad GEMM, and for a
/// tied head that trains the table, the transposed copy its wgrad GEMM reads (none under fp32,
/// whose GEMM operands are host values; none staged).
pub fn loss_gradient_bytes(tokens: usize, vocab: usize, dtype: Dtype, tied: bool) -> u128 {
    if !crate::backend::cuda::env_switch::resident_layers() {
        return 0;
    }
    let d = match dtype {
        Dtype::F32 => 0,
        half => half.bytes() as u128,
    };
    let copies = if tied { 2 * d } else { d };
    (tokens as u128)
        .saturating_mul(vocab as u128)
        .saturating_mul(4 + copies)
}

/// The GPU needs of a fine-tune of `model` (`--init-from`), planned as `fp8 plan` plans it.
pub fn fine_tune_needs(
    precisions: &[Precision],
    config: &RunConfig,
    data: &Dataset,
    model: &HfConfig,
    held: (BasePrecision, Option<LoraPlan>, Dtype),
) -> Result<Vec<GpuNeed>> {
    precisions
        .iter()
        .map(|precision| {
            let settings = super::preflight::fine_tune_settings(precision, config, data, held.clone())?;
            let tokens = settings.micro_batch.saturating_mul(settings.seq);
            // LoRA freezes the table: a tied head then makes no transposed copy for it.
            let trained_tied = model.tie_word_embeddings && settings.lora.is_none();
            let dtype = precision.compute_dtype();
            Ok(GpuNeed {
                precision: precision.name().to_string(),
                plan: plan(model, &settings),
                device_copies: device_copies(model, &settings),
                host_activations: host_activations(tokens, model.vocab_size),
                loss_gradient: loss_gradient_bytes(tokens, model.vocab_size, dtype, trained_tied),
                exact: !matches!(config.model.recompute, crate::model::Recompute::EveryNth(_)),
            })
        })
        .collect()
}

/// Checks `needs` against `free` bytes of `gpu` (its name, for the messages): an error when the
/// activations and workspace of some precision do not fit (a warning when that plan is only an
/// upper bound), a warning line when its whole plan does not, `None` when every precision fits.
pub fn check_gpu(gpu: &str, needs: &[GpuNeed], free: u64) -> Result<Option<String>> {
    let shown = |b: u128| u64::try_from(b).map_or("more than 2^64 bytes".to_string(), human_bytes);
    if let Some(need) = needs.iter().max_by_key(|n| n.hard_bytes())
        && need.hard_bytes() > free as u128
    {
        let what = format!(
            "the activations and workspace of {} on {gpu} (`fp8 plan` shows every category; recompute, a \
             smaller micro-batch with accumulation, or a shorter sequence need less)",
            need.precision
        );
        let error = Error::NotEnoughMemory {
            what,
            needed: shown(need.hard_bytes()),
            available: human_bytes(free),
        };
        return match need.exact {
            true => Err(error),
            false => Ok(Some(format!(
                "fp8: warning: {error} (planned without the every-N recompute, an upper bound: going on)"
            ))),
        };
    }
    let Some(need) = needs.iter().max_by_key(|n| n.total_bytes()) else {
        return Ok(None);
    };
    Ok((need.total_bytes() > free as u128).then(|| {
        format!(
            "fp8: warning: {} plans {} on {gpu} ({} of them device copies of weights and gradients) and {} is \
             free: the optimizer's state and the weight copies that find no room stay in host memory, and the \
             steps are slower; an activation that finds no room later ends the run (`fp8 plan` shows the bytes \
             by category)",
            need.precision,
            shown(need.total_bytes()),
            shown(need.device_copies),
            human_bytes(free)
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(activations: u128, workspace: u128, other: u128, copies: u128) -> GpuNeed {
        let mut bytes = [(MemoryCategory::Parameters, 0u128); MemoryCategory::COUNT];
        for (i, c) in MemoryCategory::ALL.iter().enumerate() {
            bytes[i] = (*c, 0);
            match c {
                MemoryCategory::Activations => bytes[i].1 = activations,
                MemoryCategory::Workspace => bytes[i].1 = workspace,
                MemoryCategory::OptimizerState => bytes[i].1 = other,
                _ => {}
            }
        }
        GpuNeed {
            precision: "bf16".into(),
            plan: MemoryPlan {
                parameters: 1,
                trainable_parameters: 1,
                bytes,
            },
            device_copies: copies,
            host_activations: 0,
            loss_gradient: 0,
            exact: true,
        }
    }

    #[test]
    fn activations_that_do_not_fit_refuse_the_run_and_the_rest_warns() {
        let needs = [need(300, 50, 400, 100)];
        assert_eq!(
            check_gpu("cuda:0", &needs, 850).unwrap(),
            None,
            "850 bytes: all of it fits"
        );
        let warning = check_gpu("cuda:0", &needs, 849).unwrap().expect("a warning");
        assert!(
            warning.contains("850 B") && warning.contains("100 B") && warning.contains("849 B"),
            "{warning}"
        );
        assert!(
            check_gpu("cuda:0", &needs, 350).unwrap().is_some(),
            "the hard part fits exactly"
        );
        let err = check_gpu("cuda:0", &needs, 349).unwrap_err().to_string();
        assert!(
            err.contains("350 B") && err.contains("349 B") && err.contains("cuda:0"),
            "{err}"
        );
        // The precision that needs most decides, each level on its own.
        let two = [need(10, 0, 900, 0), need(800, 0, 0, 0)];
        assert!(check_gpu("g", &two, 799).is_err());
        assert!(check_gpu("g", &two, 900).unwrap().unwrap().contains("910 B"));
        assert_eq!(check_gpu("g", &[], 0).unwrap(), None);
    }

    #[test]
    fn host_activations_are_not_asked_of_the_gpu_and_an_upper_bound_only_warns() {
        let mut with_host = need(300, 50, 0, 0);
        with_host.host_activations = 200;
        assert_eq!(with_host.hard_bytes(), 150);
        assert!(
            check_gpu("g", &[with_host.clone()], 150).unwrap().is_some(),
            "the whole plan warns"
        );
        assert!(check_gpu("g", &[with_host.clone()], 149).is_err());
        with_host.exact = false;
        let warning = check_gpu("g", &[with_host], 149).unwrap().expect("a warning");
        assert!(
            warning.contains("upper bound") && warning.contains("150 B"),
            "{warning}"
        );
    }

    #[test]
    fn the_loss_gradient_counts_dlogits_and_the_heads_operand_copies() {
        if !crate::backend::cuda::env_switch::resident_layers() {
            assert_eq!(loss_gradient_bytes(10, 7, Dtype::Bf16, true), 0, "staged: on the host");
            return;
        }
        assert_eq!(
            loss_gradient_bytes(10, 7, Dtype::F32, true),
            70 * 4,
            "fp32: dlogits only"
        );
        assert_eq!(loss_gradient_bytes(10, 7, Dtype::Bf16, false), 70 * (4 + 2));
        assert_eq!(loss_gradient_bytes(10, 7, Dtype::F16, true), 70 * (4 + 2 + 2));
        let mut with_loss = need(100, 20, 0, 0);
        with_loss.loss_gradient = 30;
        assert_eq!(with_loss.hard_bytes(), 150);
        assert_eq!(with_loss.total_bytes(), with_loss.plan.total_bytes() + 30);
    }

    #[test]
    fn a_plan_past_2_to_the_64_is_said_so() {
        let huge = [need(1, 0, u128::MAX / 2, 0)];
        let warning = check_gpu("g", &huge, 1 << 40).unwrap().unwrap();
        assert!(warning.contains("2^64"), "{warning}");
    }
}
