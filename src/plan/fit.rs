//! The cheapest change that makes a plan fit a memory limit. Changes are ranked by what they cost
//! the run: recompute costs about one more forward, a smaller micro-batch (the same batch through
//! gradient accumulation) costs GEMM efficiency, an FP8 base costs weight precision, LoRA changes
//! what is trained. The first combination in that order whose plan fits is the suggestion. An FP8
//! base is only suggested together with LoRA.

use super::{BasePrecision, LoraPlan, MemoryPlan, PlanSettings, lora::LoraTarget, plan};
use crate::hf::HfConfig;

/// One change to a run's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `--recompute every`.
    Recompute,
    /// `--micro-batch N` (accumulate to keep the batch).
    MicroBatch(usize),
    /// `--base-precision fp8`.
    Fp8Base,
    /// `--lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj`.
    Lora,
}

impl Change {
    /// The command-line flags that make the change.
    pub fn flags(&self) -> String {
        match self {
            Change::Recompute => "--recompute every".into(),
            Change::MicroBatch(n) => format!("--micro-batch {n} (accumulate gradients to keep the batch)"),
            Change::Fp8Base => "--base-precision fp8".into(),
            Change::Lora => "--lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj".into(),
        }
    }

    /// Rank of the change's cost to the run (lower is cheaper).
    fn cost(&self) -> u32 {
        match self {
            Change::Recompute => 1,
            Change::MicroBatch(_) => 1,
            Change::Fp8Base => 2,
            Change::Lora => 4,
        }
    }
}

/// A set of changes and the plan they give.
#[derive(Clone, Debug, PartialEq)]
pub struct Suggestion {
    /// What to change.
    pub changes: Vec<Change>,
    /// The settings with the changes made.
    pub settings: PlanSettings,
    /// Their plan.
    pub plan: MemoryPlan,
}

/// The cheapest set of changes to `settings` whose plan fits in `limit` bytes, or `None` when even
/// all of them together do not fit.
pub fn cheapest_fit(config: &HfConfig, settings: &PlanSettings, limit: u128) -> Option<Suggestion> {
    let mut micro_batches = vec![settings.micro_batch];
    while let Some(&last) = micro_batches.last().filter(|&&m| m > 1) {
        micro_batches.push(last / 2);
    }
    let mut candidates = Vec::new();
    for recompute in [settings.recompute, true] {
        for &micro_batch in &micro_batches {
            for fp8 in [settings.base == BasePrecision::Fp8, true] {
                for lora in [settings.lora.is_some(), true] {
                    // An FP8 base without adapters would train only embeddings, norms and head:
                    // not a change anyone asking for a fit means.
                    if fp8 && settings.base != BasePrecision::Fp8 && !lora {
                        continue;
                    }
                    let mut changes = Vec::new();
                    if recompute && !settings.recompute {
                        changes.push(Change::Recompute);
                    }
                    if micro_batch != settings.micro_batch {
                        changes.push(Change::MicroBatch(micro_batch));
                    }
                    if fp8 && settings.base != BasePrecision::Fp8 {
                        changes.push(Change::Fp8Base);
                    }
                    if lora && settings.lora.is_none() {
                        changes.push(Change::Lora);
                    }
                    let candidate = PlanSettings {
                        recompute,
                        micro_batch,
                        // A smaller micro-batch keeps the batch by accumulating.
                        accumulate: settings.accumulate || micro_batch < settings.micro_batch,
                        base: if fp8 { BasePrecision::Fp8 } else { settings.base },
                        lora: if lora && settings.lora.is_none() {
                            Some(LoraPlan {
                                rank: 16,
                                targets: vec![
                                    LoraTarget::QProj,
                                    LoraTarget::KProj,
                                    LoraTarget::VProj,
                                    LoraTarget::OProj,
                                ],
                            })
                        } else {
                            settings.lora.clone()
                        },
                        ..settings.clone()
                    };
                    candidates.push((changes, candidate));
                }
            }
        }
    }
    let cost = |changes: &[Change]| -> u32 {
        changes
            .iter()
            .map(|c| match c {
                // Each halving of the micro-batch counts once.
                Change::MicroBatch(m) => (settings.micro_batch / (*m).max(1)).max(1).ilog2(),
                other => other.cost(),
            })
            .sum()
    };
    candidates
        .into_iter()
        .map(|(changes, settings)| {
            let plan = plan(config, &settings);
            Suggestion {
                changes,
                settings,
                plan,
            }
        })
        .filter(|s| s.plan.total_bytes() <= limit)
        .min_by_key(|s| (cost(&s.changes), s.plan.total_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> HfConfig {
        HfConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
                "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}"#,
        )
        .unwrap()
    }

    fn start() -> PlanSettings {
        PlanSettings {
            precision: "bf16".parse().unwrap(),
            base: BasePrecision::Same,
            lora: None,
            frozen_dtype: crate::tensor::Dtype::F32,
            micro_batch: 4,
            seq: 2048,
            recompute: false,
            accumulate: false,
        }
    }

    #[test]
    fn the_suggestion_fits_and_nothing_cheaper_does() {
        let c = config();
        const GIB: u128 = 1 << 30;
        let s = cheapest_fit(&c, &start(), 24 * GIB).expect("7B fits 24 GiB with LoRA and an FP8 base");
        assert!(s.plan.total_bytes() <= 24 * GIB);
        assert!(s.changes.contains(&Change::Lora), "{:?}", s.changes);
        // Every cheaper change, all of them at once, does not fit.
        let cheaper = PlanSettings {
            recompute: true,
            micro_batch: 1,
            ..start()
        };
        assert!(plan(&c, &cheaper).total_bytes() > 24 * GIB);
        // Full training of 7B (16 bytes a value for masters, gradients and moments) never fits.
        let full = cheapest_fit(
            &c,
            &PlanSettings {
                recompute: true,
                micro_batch: 1,
                ..start()
            },
            100 * GIB,
        )
        .unwrap();
        assert!(full.changes.contains(&Change::Lora) || full.changes.contains(&Change::Fp8Base));
        // A limit nothing meets.
        assert!(cheapest_fit(&c, &start(), GIB).is_none());
        // A limit the settings already meet: no change.
        let roomy = cheapest_fit(&c, &start(), 10_000 * GIB).unwrap();
        assert!(roomy.changes.is_empty());
    }
}
