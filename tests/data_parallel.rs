//! Data parallelism on CPU ranks (docs/distributed.md): N ranks with one micro-batch each give
//! per-step losses, gradient norms and final checkpoints bit-identical to one rank with N
//! micro-batches, for every precision, with and without ZeRO-1, whatever the bucket size; skip
//! decisions agree; ZeRO-1 divides the optimizer state; checkpoints resume at any world size;
//! bad settings are errors, not panics.

use std::fs;
use std::path::{Path, PathBuf};

use fp8_engine::Error;
use fp8_engine::amp::Precision;
use fp8_engine::data::Dataset;
use fp8_engine::data::addition::AdditionConfig;
use fp8_engine::device::{Device, DeviceChoice};
use fp8_engine::dist::{DataParallel, Wire};
use fp8_engine::model::{LanguageModel, ModelConfig};
use fp8_engine::nn::{Module, VisitLinears};
use fp8_engine::train::data_parallel::run_data_parallel;
use fp8_engine::train::metrics::{StepMetrics, read_metrics};
use fp8_engine::train::session::{RunConfig, RunControl, RunInputs, RunOutput, run};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fp8-dp-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn data() -> Dataset {
    let config = AdditionConfig {
        digits: 2,
        heldout_size: 32,
        ..AdditionConfig::default()
    };
    Dataset::addition(config, 7).expect("task")
}

/// A 32-wide, 1-layer decoder; 32 sequences a step, so 4 ranks get 8 sequences (a multiple of
/// 16 tokens, as FP8 GEMMs need).
fn config(micro_batches: usize, steps: u64) -> RunConfig {
    RunConfig {
        model: ModelConfig {
            hidden: 32,
            heads: 2,
            layers: 1,
            ffn_hidden: 64,
            ..ModelConfig::default()
        },
        steps,
        batch: 32,
        micro_batches,
        warmup: 1,
        seed: 11,
        ..RunConfig::default()
    }
}

fn precision(name: &str) -> Precision {
    name.parse().expect("precision name")
}

fn single(p: &Precision, config: &RunConfig, dir: &Path, control: RunControl) -> RunOutput {
    let cpu = Device::select(DeviceChoice::Cpu).expect("cpu");
    run(
        &cpu,
        &RunInputs {
            precision: p,
            config,
            data: &data(),
            dir,
            control,
        },
        &mut |_| {},
    )
    .expect("single-rank run")
}

fn parallel(
    world: usize,
    options: &DataParallel,
    p: &Precision,
    config: &RunConfig,
    dir: &Path,
    control: RunControl,
) -> Result<Vec<RunOutput>, Error> {
    let data = data();
    let inputs = RunInputs {
        precision: p,
        config,
        data: &data,
        dir,
        control,
    };
    run_data_parallel(world, options, &inputs.decoder_builder(), &inputs, &mut |_| {})
}

fn metrics(dir: &Path) -> Vec<StepMetrics> {
    read_metrics(&dir.join("metrics.jsonl")).expect("metrics")
}

/// Losses, norms, loss scales and FP8 statistics of every step, and the final checkpoint
/// (weights, moments, scaling slots), bit for bit.
fn assert_same_run(what: &str, a: &Path, b: &Path) {
    let (ma, mb) = (metrics(a), metrics(b));
    assert_eq!(ma.len(), mb.len(), "{what}: steps");
    for (x, y) in ma.iter().zip(&mb) {
        assert_eq!(
            x.loss.to_bits(),
            y.loss.to_bits(),
            "{what}: step {} loss {} vs {}",
            x.step,
            x.loss,
            y.loss
        );
        assert_eq!(
            x.grad_norm.to_bits(),
            y.grad_norm.to_bits(),
            "{what}: step {} grad norm",
            x.step
        );
        assert_eq!(
            x.loss_scale.to_bits(),
            y.loss_scale.to_bits(),
            "{what}: step {} loss scale",
            x.step
        );
        assert_eq!(x.fp8, y.fp8, "{what}: step {} FP8 statistics", x.step);
    }
    let ca = fs::read(a.join("checkpoint.safetensors")).expect("checkpoint");
    let cb = fs::read(b.join("checkpoint.safetensors")).expect("checkpoint");
    assert!(ca == cb, "{what}: final checkpoints differ");
}

#[test]
fn world_size_n_matches_n_micro_batches_bit_for_bit_for_every_precision() {
    for name in ["fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8"] {
        let p = precision(name);
        for world in [2usize, 4] {
            let config = config(world, 3);
            let reference = scratch(&format!("{name}-micro{world}"));
            let one = single(&p, &config, &reference, RunControl::default());
            for zero in [0u8, 1] {
                let dir = scratch(&format!("{name}-world{world}-zero{zero}"));
                let options = DataParallel {
                    zero,
                    ..DataParallel::default()
                };
                let outs = parallel(world, &options, &p, &config, &dir, RunControl::default()).expect("dp run");
                assert_eq!(outs.len(), world);
                let what = format!("{name} world {world} zero {zero}");
                assert_same_run(&what, &reference, &dir);
                for (rank, out) in outs.iter().enumerate() {
                    let curve: Vec<u32> = out.curve.iter().map(|c| c.1.to_bits()).collect();
                    let want: Vec<u32> = one.curve.iter().map(|c| c.1.to_bits()).collect();
                    assert_eq!(curve, want, "{what}: rank {rank} sees the global losses");
                }
                assert_eq!(
                    outs[0].summary.heldout_loss.to_bits(),
                    one.summary.heldout_loss.to_bits(),
                    "{what}: held-out loss"
                );
            }
        }
    }
}

#[test]
fn without_the_amax_reduce_delayed_scaling_drifts_from_one_rank() {
    use fp8_engine::scaling::{DelayedScaling, Recipe};
    let unreduced = Precision::Fp8(Recipe::Delayed(DelayedScaling {
        reduce_amax: false,
        ..DelayedScaling::default()
    }));
    let config = config(2, 3);
    let reference = scratch("unreduced-micro2");
    single(&unreduced, &config, &reference, RunControl::default());
    let dir = scratch("unreduced-world2");
    parallel(
        2,
        &DataParallel::default(),
        &unreduced,
        &config,
        &dir,
        RunControl::default(),
    )
    .expect("dp run");
    let (a, b) = (metrics(&reference), metrics(&dir));
    assert_eq!(
        a[0].loss.to_bits(),
        b[0].loss.to_bits(),
        "step 0 casts with scale 1 everywhere"
    );
    let differ = a
        .iter()
        .zip(&b)
        .skip(1)
        .any(|(x, y)| x.loss.to_bits() != y.loss.to_bits());
    assert!(differ, "each rank's own scales must change the later losses");
}

#[test]
fn bucket_size_and_skipped_steps_change_nothing_between_ranks() {
    // A huge initial loss scale overflows the first steps' fp16 gradients: every rank skips
    // them together, as the single rank does, and the scale backs off the same way.
    let p = precision("fp16");
    let config = RunConfig {
        loss_scale: Some(2f32.powi(40)),
        ..config(2, 4)
    };
    let reference = scratch("skip-micro2");
    let one = single(&p, &config, &reference, RunControl::default());
    assert!(one.skipped_steps >= 1, "the huge scale must force skips");
    for (bucket_bytes, overlap) in [(4usize, true), (4, false), (1000, true), (64 << 20, true)] {
        let dir = scratch(&format!("skip-world2-bucket{bucket_bytes}-{overlap}"));
        let options = DataParallel {
            bucket_bytes,
            overlap,
            ..DataParallel::default()
        };
        let outs = parallel(2, &options, &p, &config, &dir, RunControl::default()).expect("dp run");
        assert!(outs.iter().all(|o| o.skipped_steps == one.skipped_steps));
        assert_same_run(&format!("bucket {bucket_bytes} overlap {overlap}"), &reference, &dir);
    }
}

/// Two micro-batches per rank: the overlapped reduce folds the first micro-batch's gradients
/// in while the second one's backward runs; the result is the reduce after backward, bit for
/// bit, for every bucket size, with a bf16 wire too.
#[test]
fn overlap_with_several_micro_batches_per_rank_changes_no_bit() {
    for name in ["fp32", "bf16", "fp8-delayed"] {
        let p = precision(name);
        let config = config(4, 3);
        for (bucket_bytes, wire) in [(4usize, Wire::F32), (5000, Wire::F32), (4, Wire::Bf16)] {
            let mut dirs = Vec::new();
            for overlap in [false, true] {
                let dir = scratch(&format!("overlap-{name}-{bucket_bytes}-{wire:?}-{overlap}"));
                let options = DataParallel {
                    bucket_bytes,
                    wire,
                    overlap,
                    ..DataParallel::default()
                };
                parallel(2, &options, &p, &config, &dir, RunControl::default()).expect("dp run");
                dirs.push(dir);
            }
            let what = format!("{name} bucket {bucket_bytes} {wire:?}: overlap vs after backward");
            assert_same_run(&what, &dirs[0], &dirs[1]);
        }
    }
}

#[test]
fn bf16_wire_is_deterministic_and_close_but_not_the_f32_sum() {
    let p = precision("fp32");
    let config = config(2, 3);
    let options = DataParallel {
        wire: Wire::Bf16,
        ..DataParallel::default()
    };
    let (a, b) = (scratch("wire-a"), scratch("wire-b"));
    parallel(2, &options, &p, &config, &a, RunControl::default()).expect("dp run");
    parallel(2, &options, &p, &config, &b, RunControl::default()).expect("dp run");
    assert_same_run("bf16 wire twice", &a, &b);
    let f32_dir = scratch("wire-f32");
    parallel(
        2,
        &DataParallel::default(),
        &p,
        &config,
        &f32_dir,
        RunControl::default(),
    )
    .expect("dp run");
    let (bf, f) = (metrics(&a), metrics(&f32_dir));
    assert_eq!(
        bf[0].loss.to_bits(),
        f[0].loss.to_bits(),
        "the first forward precedes any reduce"
    );
    assert_ne!(
        bf[0].grad_norm.to_bits(),
        f[0].grad_norm.to_bits(),
        "bf16 rounds the gradients"
    );
    assert!((bf[0].grad_norm / f[0].grad_norm - 1.0).abs() < 1e-2);
}

#[test]
fn zero1_shards_the_optimizer_state() {
    let p = precision("bf16");
    // Two steps: unsharded AdamW allocates its moments at the first step, after the
    // activations are freed, so only from the second step on do both runs hold moments and
    // activations at once (the steady state the peak comparison is about).
    let config = config(4, 2);
    let whole = parallel(
        4,
        &DataParallel::default(),
        &p,
        &config,
        &scratch("mem-zero0"),
        RunControl::default(),
    )
    .expect("dp run");
    let options = DataParallel {
        zero: 1,
        ..DataParallel::default()
    };
    let sharded = parallel(4, &options, &p, &config, &scratch("mem-zero1"), RunControl::default()).expect("dp run");
    let full = whole[0].optimizer_state_bytes;
    assert!(full > 0);
    assert!(whole.iter().all(|o| o.optimizer_state_bytes == full));
    let shards: Vec<u64> = sharded.iter().map(|o| o.optimizer_state_bytes).collect();
    assert_eq!(
        shards.iter().sum::<u64>(),
        full,
        "the shards cover the state once: {shards:?}"
    );
    for s in &shards {
        assert!(*s <= full.div_ceil(4) + 8, "{s} of {full}");
    }
    assert!(sharded[1].summary.peak_bytes < whole[1].summary.peak_bytes);
}

/// ZeRO-1 shards the f32 masters of the linear weights under bf16, fp16 and fp8-delayed: each rank
/// holds the replicated values (embeddings, norms, biases) and its slice of the weights, and
/// the slices of the four ranks add up to the unsharded weights exactly. fp32 runs keep every
/// master on every rank (their compute weights are the masters).
#[test]
fn zero1_shards_the_linear_weights_masters() {
    let config = config(4, 2);
    for name in ["bf16", "fp16", "fp8-delayed", "fp32"] {
        let p = precision(name);
        let data = data();
        let inputs = RunInputs {
            precision: &p,
            config: &config,
            data: &data,
            dir: Path::new("."),
            control: RunControl::default(),
        };
        let mut model = inputs.decoder().expect("model");
        let total = model.parameter_count() as u64;
        let mut weights = 0u64;
        model.visit_linears(&mut |linear| weights += linear.weight().len() as u64);
        let replicated = total - weights;
        let whole = parallel(
            4,
            &DataParallel::default(),
            &p,
            &config,
            &scratch(&format!("masters-{name}-zero0")),
            RunControl::default(),
        )
        .expect("dp run");
        assert!(whole.iter().all(|o| o.master_weight_bytes == 4 * total), "{name}");
        let options = DataParallel {
            zero: 1,
            ..DataParallel::default()
        };
        let dir = scratch(&format!("masters-{name}-zero1"));
        let sharded = parallel(4, &options, &p, &config, &dir, RunControl::default()).expect("dp run");
        let held: Vec<u64> = sharded.iter().map(|o| o.master_weight_bytes).collect();
        if name == "fp32" {
            assert!(
                held.iter().all(|&h| h == 4 * total),
                "fp32 keeps whole masters: {held:?}"
            );
            continue;
        }
        let slices: u64 = held.iter().map(|h| h - 4 * replicated).sum();
        assert_eq!(
            slices,
            4 * weights,
            "{name}: the slices cover the weights once: {held:?}"
        );
        for h in &held {
            assert!(*h <= 4 * (replicated + total.div_ceil(4)), "{name}: {h} of {held:?}");
        }
        assert!(sharded[0].summary.peak_bytes < whole[0].summary.peak_bytes, "{name}");
        // The checkpoint holds the whole masters again (rank 0 gathered them).
        let reference = scratch(&format!("masters-{name}-micro4"));
        single(&p, &config, &reference, RunControl::default());
        assert_same_run(&format!("{name} sharded masters"), &reference, &dir);
    }
}

#[test]
fn checkpoints_resume_at_any_world_size() {
    // Both shard the linear weights' f32 masters under ZeRO-1: the checkpoint gathers them.
    for name in ["fp8-delayed", "bf16"] {
        let p = precision(name);
        let config = config(2, 4);
        let straight = scratch(&format!("resume-{name}-straight"));
        single(&p, &config, &straight, RunControl::default());
        let stop = RunControl {
            stop_after: Some(2),
            ..RunControl::default()
        };
        // Two ranks with ZeRO-1 write the checkpoint; one rank continues it; and the other way.
        let resumed = scratch(&format!("resume-{name}-2-to-1"));
        let zero1 = DataParallel {
            zero: 1,
            ..DataParallel::default()
        };
        parallel(2, &zero1, &p, &config, &resumed, stop).expect("first half");
        let ckpt = resumed.join("checkpoint.safetensors");
        let go_on = RunControl {
            resume: Some(&ckpt),
            ..RunControl::default()
        };
        single(&p, &config, &resumed, go_on);
        assert_same_run(&format!("{name}: 2 ranks (ZeRO-1) then 1"), &straight, &resumed);

        let resumed = scratch(&format!("resume-{name}-1-to-2"));
        single(&p, &config, &resumed, stop);
        let ckpt = resumed.join("checkpoint.safetensors");
        let go_on = RunControl {
            resume: Some(&ckpt),
            ..RunControl::default()
        };
        parallel(2, &zero1, &p, &config, &resumed, go_on).expect("second half");
        assert_same_run(&format!("{name}: 1 rank then 2 (ZeRO-1)"), &straight, &resumed);
    }
}

#[test]
fn bad_settings_are_errors() {
    let p = precision("fp32");
    let dir = scratch("bad");
    let err = |world, options: &DataParallel, config: &RunConfig| {
        parallel(world, options, &p, config, &dir, RunControl::default()).expect_err("must fail")
    };
    let e = err(3, &DataParallel::default(), &config(2, 1));
    assert!(e.to_string().contains("multiple of the world size 3"), "{e}");
    let e = err(3, &DataParallel::default(), &config(3, 1));
    assert!(e.to_string().contains("batch"), "32 sequences in 3 micro-batches: {e}");
    let e = err(0, &DataParallel::default(), &config(2, 1));
    assert!(e.to_string().contains("world_size"), "{e}");
    let zero2 = DataParallel {
        zero: 2,
        ..DataParallel::default()
    };
    assert!(err(2, &zero2, &config(2, 1)).to_string().contains("zero"));
}

fn fp8(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fp8"))
        .args(args)
        .output()
        .expect("run fp8")
}

#[test]
fn the_cli_runs_ranks_and_refuses_uneven_splits() {
    let small = [
        "train",
        "--steps",
        "2",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--layers",
        "1",
        "--batch",
        "32",
        "--quiet",
        "--precision",
        "fp8-delayed",
        "--device",
        "cpu",
    ];
    let (ranks, micro) = (scratch("cli-world2"), scratch("cli-micro2"));
    let mut args = small.to_vec();
    args.extend([
        "--world-size",
        "2",
        "--zero",
        "1",
        "--bucket-mb",
        "0.001",
        "--out",
        ranks.to_str().unwrap(),
    ]);
    let out = fp8(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("rank 1/2") && stderr.contains("ZeRO-1") && stderr.contains("master weights"),
        "{stderr}"
    );
    let mut args = small.to_vec();
    args.extend(["--micro-batches", "2", "--out", micro.to_str().unwrap()]);
    assert!(fp8(&args).status.success());
    let (a, b) = (metrics(&ranks.join("fp8-delayed")), metrics(&micro.join("fp8-delayed")));
    let losses = |m: &[StepMetrics]| m.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        losses(&a),
        losses(&b),
        "--world-size 2 and --micro-batches 2 train the same"
    );

    let after = scratch("cli-world2-no-overlap");
    let mut args = small.to_vec();
    args.extend(["--world-size", "2", "--no-overlap", "--out", after.to_str().unwrap()]);
    assert!(fp8(&args).status.success());
    assert_eq!(
        losses(&metrics(&after.join("fp8-delayed"))),
        losses(&b),
        "--no-overlap trains the same"
    );

    let bad = scratch("cli-bad");
    for (flags, says) in [
        (vec!["--world-size", "3"], "multiple"),
        (vec!["--world-size", "0"], "--world-size 0"),
        (vec!["--world-size", "2", "--grad-wire", "f8"], "grad_wire"),
        (vec!["--world-size", "2", "--zero", "3"], "zero"),
        (vec!["--gpus", "2"], "--world-size N"),
        (vec!["--gpus", "1", "--world-size", "2"], "give one"),
    ] {
        let mut args = small.to_vec();
        args.extend(flags.iter().copied());
        args.extend(["--out", bad.to_str().unwrap()]);
        let out = fp8(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(
            stderr.contains(says) && !stderr.contains("panicked"),
            "{flags:?}: {stderr}"
        );
    }
}

/// Launched once per rank (torchrun's variables) on the CPU backend: a clear error that points
/// to --world-size, before any training; bad variables are named.
#[test]
fn a_launch_by_environment_on_the_cpu_is_refused_with_a_pointer_to_world_size() {
    let out_dir = scratch("cli-env");
    let run = |vars: &[(&str, &str)]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fp8"))
            .args(["train", "--steps", "1", "--quiet", "--device", "cpu", "--out"])
            .arg(&out_dir)
            .envs(vars.iter().copied())
            .output()
            .expect("run fp8")
    };
    for (vars, says) in [
        (vec![("RANK", "0"), ("WORLD_SIZE", "2")], "--world-size N"),
        (vec![("RANK", "2"), ("WORLD_SIZE", "2")], "RANK"),
        (vec![("WORLD_SIZE", "2")], "RANK"),
    ] {
        let out = run(&vars);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{vars:?}: {stderr}");
        assert!(
            stderr.contains(says) && !stderr.contains("panicked"),
            "{vars:?}: {stderr}"
        );
    }
    assert!(
        !out_dir.join("summary.json").exists(),
        "nothing trained before the error"
    );
}

/// A Llama-family model with LoRA adapters (frozen base) on two ranks: backward hands over
/// the trainable parameters only, layer by layer, and the overlapped reduce gives the bits of
/// the reduce after backward, with two micro-batches per rank.
#[test]
fn a_lora_llama_overlaps_its_adapters_gradients_bit_for_bit() {
    use fp8_engine::hf::HfConfig;
    use fp8_engine::model::{LlamaModel, LoraConfig, Recompute};
    use fp8_engine::nn::LoraSettings;
    let hf = HfConfig::from_json(
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 4, "vocab_size": 12, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
            "rope_theta": 100.0, "tie_word_embeddings": true, "hidden_act": "silu"}"#,
    )
    .expect("config");
    let p = precision("fp32");
    let lora = LoraConfig::new(
        LoraSettings {
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
        },
        "q_proj,v_proj,down_proj",
    )
    .expect("lora");
    let build = || -> fp8_engine::Result<Box<dyn LanguageModel>> {
        let mut model = LlamaModel::new(&hf, &p, Recompute::None, 3)?;
        model.enable_lora(&lora, 7)?;
        Ok(Box::new(model))
    };
    let config = config(4, 2);
    let mut dirs = Vec::new();
    for overlap in [false, true] {
        let dir = scratch(&format!("lora-overlap-{overlap}"));
        let options = DataParallel {
            bucket_bytes: 64,
            overlap,
            ..DataParallel::default()
        };
        run_data_parallel(
            2,
            &options,
            &build,
            &RunInputs {
                precision: &p,
                config: &config,
                data: &data(),
                dir: &dir,
                control: RunControl::default(),
            },
            &mut |_| {},
        )
        .expect("dp run");
        dirs.push(dir);
    }
    assert_same_run("LoRA Llama: overlap vs after backward", &dirs[0], &dirs[1]);
}
