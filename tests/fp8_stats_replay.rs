//! The FP8 statistics in `metrics.jsonl` are the scaling state itself: the `scale`
//! logged per delayed-scaling slot is the slot's scale bit for bit, so replaying the
//! logged amaxes through `DelayedSlot::update` reproduces every logged scale.

use std::collections::BTreeMap;

use fp8_engine::amp::Precision;
use fp8_engine::data::Dataset;
use fp8_engine::data::addition::AdditionConfig;
use fp8_engine::device::{Device, DeviceChoice};
use fp8_engine::format::Fp8Format;
use fp8_engine::model::ModelConfig;
use fp8_engine::scaling::{DelayedScaling, DelayedSlot, Recipe};
use fp8_engine::train::metrics::StepMetrics;
use fp8_engine::train::session::{RunConfig, RunControl, RunInputs, run};

#[test]
fn replaying_logged_amaxes_reproduces_every_logged_scale_exactly() {
    // A short history so the window both fills and drops entries within the run.
    let recipe = DelayedScaling {
        amax_history_len: 4,
        ..DelayedScaling::default()
    };
    let precision = Precision::Fp8(Recipe::Delayed(recipe.clone()));
    let config = RunConfig {
        model: ModelConfig {
            hidden: 32,
            heads: 2,
            layers: 2,
            ffn_hidden: 64,
            ..ModelConfig::default()
        },
        steps: 24,
        batch: 16,
        warmup: 2,
        seed: 5,
        ..RunConfig::default()
    };
    let data = Dataset::addition(
        AdditionConfig {
            digits: 2,
            heldout_size: 64,
            ..AdditionConfig::default()
        },
        7,
    )
    .expect("task");
    let dir = std::env::temp_dir().join(format!("fp8-stats-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let mut logged: Vec<StepMetrics> = Vec::new();
    run(
        &cpu(),
        &RunInputs {
            precision: &precision,
            config: &config,
            data: &data,
            dir: &dir,
            control: RunControl::default(),
        },
        &mut |m| logged.push(m.clone()),
    )
    .expect("run");
    let _ = std::fs::remove_dir_all(&dir);

    let mut slots: BTreeMap<String, DelayedSlot> = BTreeMap::new();
    let (mut checked, mut changed) = (0usize, 0usize);
    for step in &logged {
        assert!(!step.fp8.is_empty(), "step {} logged no FP8 statistics", step.step);
        for stats in &step.fp8 {
            let format = match stats.format.as_str() {
                "e4m3" => Fp8Format::E4M3,
                "e5m2" => Fp8Format::E5M2,
                other => panic!("{}: unexpected format {other}", stats.name),
            };
            let slot = slots
                .entry(stats.name.clone())
                .or_insert_with(|| DelayedSlot::new(recipe.amax_history_len));
            assert_eq!(
                stats.scale.to_bits(),
                slot.scale.to_bits(),
                "step {} {}: logged scale {} but the replayed slot holds {}",
                step.step,
                stats.name,
                stats.scale,
                slot.scale
            );
            checked += 1;
            changed += usize::from(slot.scale != 1.0);
            slot.record_cast(stats.amax);
            slot.update(&recipe, format);
        }
    }
    // 2 layers x 4 linears x 5 slots, every step; most scales have moved away from 1.
    assert_eq!(slots.len(), 40, "{:?}", slots.keys().collect::<Vec<_>>());
    assert_eq!(checked, 40 * 24);
    assert!(
        changed > checked / 2,
        "only {changed} of {checked} scales differ from 1"
    );
}

fn cpu() -> Device {
    Device::select(DeviceChoice::Cpu).expect("the CPU device")
}
