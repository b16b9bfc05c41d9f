//! The training loop end to end on the CPU backend: resume continues bit for
//! bit, recompute changes memory and nothing else, the fp16 loss scaler skips
//! and recovers from a huge initial scale, FP8 tracks fp32, the answer loss is
//! the loss of the answer digits, and the tied head's gradient matches finite
//! differences.

use std::fs;
use std::path::{Path, PathBuf};

use fp8_engine::amp::Precision;
use fp8_engine::data::Dataset;
use fp8_engine::data::addition::AdditionConfig;
use fp8_engine::device::{Device, DeviceChoice};
use fp8_engine::model::{DecoderModel, ModelConfig, Recompute};
use fp8_engine::nn::Module;
use fp8_engine::train::metrics::read_metrics;
use fp8_engine::train::session::{RunConfig, RunControl, RunInputs, RunOutput, run};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fp8-train-run-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn data() -> Dataset {
    let config = AdditionConfig {
        digits: 2,
        heldout_size: 64,
        ..AdditionConfig::default()
    };
    Dataset::addition(config, 7).expect("task")
}

fn small(layers: usize, recompute: Recompute) -> RunConfig {
    RunConfig {
        model: ModelConfig {
            hidden: 32,
            heads: 2,
            layers,
            ffn_hidden: 64,
            recompute,
            ..ModelConfig::default()
        },
        steps: 6,
        batch: 16,
        micro_batches: 2,
        warmup: 2,
        seed: 3,
        ..RunConfig::default()
    }
}

fn precision(name: &str) -> Precision {
    name.parse().expect("precision name")
}

fn train(p: &Precision, config: &RunConfig, dir: &Path, control: RunControl) -> RunOutput {
    run(
        &cpu(),
        &RunInputs {
            precision: p,
            config,
            data: &data(),
            dir,
            control,
        },
        &mut |_| {},
    )
    .expect("run")
}

#[test]
fn resume_continues_the_same_trajectory_bit_for_bit() {
    let p = precision("fp8-delayed");
    let config = small(2, Recompute::None);
    let straight = scratch("straight");
    train(&p, &config, &straight, RunControl::default());

    let resumed = scratch("resumed");
    let half = RunControl {
        stop_after: Some(3),
        ..RunControl::default()
    };
    let first = train(&p, &config, &resumed, half);
    assert_eq!(first.curve.len(), 3);
    let ckpt = resumed.join("checkpoint.safetensors");
    let control = RunControl {
        resume: Some(&ckpt),
        ..RunControl::default()
    };
    let second = train(&p, &config, &resumed, control);
    assert_eq!(
        second.curve.first().map(|c| c.0),
        Some(3),
        "the resumed run starts at step 3"
    );

    let a = read_metrics(&straight.join("metrics.jsonl")).expect("metrics");
    let b = read_metrics(&resumed.join("metrics.jsonl")).expect("metrics");
    assert_eq!(a.len(), 6);
    assert_eq!(b.len(), 6);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.step, y.step);
        assert_eq!(x.loss.to_bits(), y.loss.to_bits(), "step {} loss", x.step);
        assert_eq!(
            x.grad_norm.to_bits(),
            y.grad_norm.to_bits(),
            "step {} grad norm",
            x.step
        );
        assert_eq!(x.fp8, y.fp8, "step {} FP8 statistics", x.step);
    }
    let final_a = fs::read(straight.join("checkpoint.safetensors")).expect("checkpoint");
    let final_b = fs::read(&ckpt).expect("checkpoint");
    assert!(final_a == final_b, "final checkpoints differ");
}

#[test]
fn resume_refuses_a_checkpoint_of_another_run() {
    let p = precision("fp32");
    let config = small(1, Recompute::None);
    let dir = scratch("other");
    let stop = RunControl {
        stop_after: Some(1),
        ..RunControl::default()
    };
    train(&p, &config, &dir, stop);
    let ckpt = dir.join("checkpoint.safetensors");
    let other = RunConfig { lr: 1e-2, ..config };
    let control = RunControl {
        resume: Some(&ckpt),
        ..RunControl::default()
    };
    let err = run(
        &cpu(),
        &RunInputs {
            precision: &p,
            config: &other,
            data: &data(),
            dir: &dir,
            control,
        },
        &mut |_| {},
    )
    .expect_err("must refuse");
    assert!(err.to_string().contains("another run"), "{err}");
}

#[test]
fn resume_refuses_other_recipe_settings_or_another_objective() {
    use fp8_engine::scaling::{DelayedScaling, Recipe};
    let delayed = |margin| {
        Precision::Fp8(Recipe::Delayed(DelayedScaling {
            margin,
            ..DelayedScaling::default()
        }))
    };
    let config = small(1, Recompute::None);
    let dir = scratch("other-recipe");
    let stop = RunControl {
        stop_after: Some(1),
        ..RunControl::default()
    };
    train(&delayed(0), &config, &dir, stop);
    let ckpt = dir.join("checkpoint.safetensors");
    let answers_only = Dataset::addition(
        AdditionConfig {
            digits: 2,
            heldout_size: 64,
            prompt_loss: false,
            ..AdditionConfig::default()
        },
        7,
    )
    .expect("task");
    for (what, p, data) in [
        ("margin 1", delayed(1), data()),
        ("answer-only loss", delayed(0), answers_only),
    ] {
        let control = RunControl {
            resume: Some(&ckpt),
            ..RunControl::default()
        };
        let err = run(
            &cpu(),
            &RunInputs {
                precision: &p,
                config: &config,
                data: &data,
                dir: &dir,
                control,
            },
            &mut |_| {},
        )
        .expect_err(what);
        assert!(err.to_string().contains("another run"), "{what}: {err}");
    }
}

#[test]
fn recompute_halves_activation_memory_with_identical_losses() {
    let p = precision("fp8-delayed");
    let plain = train(
        &p,
        &small(4, Recompute::None),
        &scratch("norecompute"),
        RunControl::default(),
    );
    let recomputed = train(
        &p,
        &small(4, Recompute::Every),
        &scratch("recompute"),
        RunControl::default(),
    );
    for ((s1, l1), (s2, l2)) in plain.curve.iter().zip(&recomputed.curve) {
        assert_eq!(s1, s2);
        assert_eq!(l1.to_bits(), l2.to_bits(), "step {s1}: {l1} vs {l2}");
    }
    assert_eq!(
        plain.summary.heldout_loss.to_bits(),
        recomputed.summary.heldout_loss.to_bits()
    );
    let ratio = plain.peak_activation_bytes as f64 / recomputed.peak_activation_bytes as f64;
    assert!(ratio >= 2.0, "activation memory only {ratio:.2}x lower with recompute");
}

#[test]
fn fp16_loss_scaler_skips_steps_from_a_huge_scale_and_recovers() {
    let p = precision("fp16");
    let config = RunConfig {
        steps: 30,
        loss_scale: Some(2f32.powi(40)),
        ..small(1, Recompute::None)
    };
    let dir = scratch("fp16");
    let out = train(&p, &config, &dir, RunControl::default());
    assert!(out.skipped_steps >= 1, "no step was skipped from a 2^40 scale");
    let metrics = read_metrics(&dir.join("metrics.jsonl")).expect("metrics");
    let last = metrics.last().expect("steps");
    assert!(last.loss_scale < 2f32.powi(40), "the scale never backed off");
    assert!(last.grad_norm.is_finite(), "the last step still overflows");
    assert!(
        last.loss.is_finite() && last.loss < metrics[0].loss,
        "no recovery: {} -> {}",
        metrics[0].loss,
        last.loss
    );
}

#[test]
fn fp8_and_bf16_track_fp32() {
    let config = RunConfig {
        steps: 40,
        ..small(2, Recompute::None)
    };
    let reference = train(&precision("fp32"), &config, &scratch("ref32"), RunControl::default());
    for name in ["bf16", "fp8-delayed", "fp8-current", "fp8-block"] {
        let out = train(&precision(name), &config, &scratch(name), RunControl::default());
        let rel = (out.summary.heldout_loss / reference.summary.heldout_loss - 1.0).abs();
        assert!(
            rel < 0.03,
            "{name}: held-out loss {} vs fp32 {} ({:.2}%)",
            out.summary.heldout_loss,
            reference.summary.heldout_loss,
            100.0 * rel
        );
    }
}

#[test]
fn answer_loss_is_the_held_out_loss_when_only_answers_take_a_loss() {
    let config = RunConfig {
        steps: 3,
        ..small(1, Recompute::None)
    };
    let task = |prompt_loss| {
        let config = AdditionConfig {
            digits: 2,
            heldout_size: 64,
            prompt_loss,
            ..AdditionConfig::default()
        };
        Dataset::addition(config, 7).expect("task")
    };
    let fp32 = precision("fp32");
    let run_on = |data: &Dataset, name: &str| {
        run(
            &cpu(),
            &RunInputs {
                precision: &fp32,
                config: &config,
                data,
                dir: &scratch(name),
                control: RunControl::default(),
            },
            &mut |_| {},
        )
        .expect("run")
        .summary
    };
    let answers = run_on(&task(false), "answers-only");
    assert_eq!(answers.heldout_answer_loss, answers.heldout_loss);
    let every = run_on(&task(true), "every-position");
    // Every position: 3 of the 8 targets are answer digits and the rest cost at least 0, and
    // the random operand digits keep the whole clearly above 0 after 3 steps.
    assert!(every.heldout_answer_loss.is_finite() && every.heldout_answer_loss > 0.0);
    assert!(every.heldout_loss >= 3.0 / 8.0 * every.heldout_answer_loss);
    assert_ne!(every.heldout_loss, every.heldout_answer_loss);
}

#[test]
fn tied_head_gradients_match_finite_differences() {
    let config = ModelConfig {
        vocab: 12,
        max_seq: 8,
        hidden: 16,
        heads: 2,
        layers: 1,
        ffn_hidden: 32,
        tied_head: true,
        ..ModelConfig::default()
    };
    let p = precision("fp32");
    let (batch, seq) = (2, 8);
    let inputs: Vec<u32> = (0..batch * seq).map(|i| (i * 5 % 12) as u32).collect();
    let targets: Vec<u32> = (0..batch * seq).map(|i| ((i * 7 + 3) % 12) as u32).collect();
    let mut model = DecoderModel::new(&config, &p, 11).expect("model");
    model.forward_loss(&inputs, &targets, batch, seq).expect("forward");
    model.backward(1.0).expect("backward");
    let mut analytic = Vec::new();
    model.visit_parameters(&mut |param| {
        if param.name() == "embed.tokens" {
            analytic = param.grad().to_vec();
        }
    });
    let loss_with = |delta: f32, index: usize| {
        let mut m = DecoderModel::new(&config, &p, 11).expect("model");
        m.visit_parameters(&mut |param| {
            if param.name() == "embed.tokens" {
                param.value_mut()[index] += delta;
                param.mark_updated();
            }
        });
        f64::from(m.forward_loss(&inputs, &targets, batch, seq).expect("forward"))
    };
    let h = 1e-2f32;
    for index in [0, 5, 17, 40, 100, 150, 191] {
        let fd = (loss_with(h, index) - loss_with(-h, index)) / (2.0 * f64::from(h));
        let got = f64::from(analytic[index]);
        assert!(
            (fd - got).abs() <= 2e-3 + 2e-2 * fd.abs(),
            "embed.tokens[{index}]: analytic {got} vs finite difference {fd}"
        );
    }
}

fn cpu() -> Device {
    Device::select(DeviceChoice::Cpu).expect("the CPU device")
}

#[test]
fn check_cpu_on_the_cpu_passes_and_keeps_every_step_bit_for_bit() {
    // CPU shadowed by the CPU: every op (embedding, norms, attention, GEMMs, casts, delayed
    // updates, loss, clipping, AdamW) is checked against its twin and must agree.
    for name in ["fp32", "fp8-delayed"] {
        let p = precision(name);
        let config = small(1, Recompute::None);
        let (plain, checked) = (scratch(&format!("plain-{name}")), scratch(&format!("checked-{name}")));
        train(&p, &config, &plain, RunControl::default());
        let control = RunControl {
            check_cpu: true,
            ..RunControl::default()
        };
        train(&p, &config, &checked, control);
        let a = read_metrics(&plain.join("metrics.jsonl")).expect("metrics");
        let b = read_metrics(&checked.join("metrics.jsonl")).expect("metrics");
        assert_eq!(a.len(), config.steps as usize);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.loss.to_bits(), y.loss.to_bits(), "{name} step {} loss", x.step);
            assert_eq!(
                x.grad_norm.to_bits(),
                y.grad_norm.to_bits(),
                "{name} step {} grad norm",
                x.step
            );
        }
    }
}
