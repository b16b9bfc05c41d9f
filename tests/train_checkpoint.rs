//! Checkpoints end to end: a small model trained on the addition task with every training
//! piece (micro-batches, loss scaling with a forced skip, clipping, AdamW, a cosine schedule,
//! an FP8 delayed-scaling slot, a data stream and a run RNG) resumes bit for bit; and every
//! kind of bad checkpoint is refused before anything changes.

use std::fs;
use std::path::{Path, PathBuf};

use fp8_engine::Error;
use fp8_engine::amp::loss_scaler::{DynamicLossScaler, LossScalerConfig};
use fp8_engine::data::addition::{AdditionConfig, AdditionTask, VOCAB_SIZE};
use fp8_engine::data::{Batch, DataStream, IGNORE_INDEX, SplitMix64};
use fp8_engine::format::{Fp8Format, Overflow};
use fp8_engine::nn::{Module, Parameter};
use fp8_engine::scaling::{DelayedScaling, DelayedSlot};
use fp8_engine::train::accumulate::accumulate_gradients;
use fp8_engine::train::adamw::{AdamW, AdamWConfig};
use fp8_engine::train::checkpoint::{TrainProgress, load_checkpoint, save_checkpoint};
use fp8_engine::train::schedule::{LrSchedule, ScheduleKind};
use fp8_engine::train::step::apply_gradients;

/// logits(position i) = Q(emb)[input_i] + pos[i], where Q(emb) is `emb` through E4M3 with the
/// slot's delayed scale, cached per parameter version (a stand-in for an FP8 linear layer).
struct Bigram {
    emb: Parameter,
    pos: Parameter,
    slot: DelayedSlot,
    cache: Option<(u64, Vec<f32>)>,
}

impl Module for Bigram {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        f(&mut self.emb);
        f(&mut self.pos);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        f("emb.weight", &mut self.slot);
    }
}

impl Bigram {
    fn new(seq: usize, seed: u64, history: usize) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut init = |n: usize| (0..n).map(|_| (rng.next_f32() - 0.5) * 0.2).collect::<Vec<f32>>();
        Bigram {
            emb: Parameter::new("emb.weight", &[VOCAB_SIZE, VOCAB_SIZE], init(VOCAB_SIZE * VOCAB_SIZE)).unwrap(),
            pos: Parameter::new("pos.bias", &[seq, VOCAB_SIZE], init(seq * VOCAB_SIZE)).unwrap(),
            slot: DelayedSlot::new(history),
            cache: None,
        }
    }

    fn quantized_emb(&mut self) -> Vec<f32> {
        if self.cache.as_ref().map(|c| c.0) != Some(self.emb.version()) {
            let scale = self.slot.scale;
            let amax = self.emb.value().iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let q = self
                .emb
                .value()
                .iter()
                .map(|&x| Fp8Format::E4M3.decode(Fp8Format::E4M3.encode(x * scale, Overflow::Saturate)) / scale)
                .collect();
            self.slot.record_cast(amax);
            self.cache = Some((self.emb.version(), q));
        }
        self.cache.as_ref().unwrap().1.clone()
    }

    /// Mean cross-entropy over counted targets; adds `seed * d(loss)/d(params)` to the gradients.
    fn forward_backward(&mut self, batch: &Batch, seed: f32) -> f32 {
        let emb = self.quantized_emb();
        let counted = batch.counted_targets() as f32;
        let mut loss = 0.0f64;
        for (i, (&x, &t)) in batch.inputs.iter().zip(&batch.targets).enumerate() {
            if t == IGNORE_INDEX {
                continue;
            }
            let p = i % batch.seq;
            let logits: Vec<f32> = (0..VOCAB_SIZE)
                .map(|v| emb[x as usize * VOCAB_SIZE + v] + self.pos.value()[p * VOCAB_SIZE + v])
                .collect();
            let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
            let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
            loss += (sum.ln() + max - logits[t as usize]) as f64;
            for (v, logit) in logits.iter().enumerate() {
                let prob = (logit - max).exp() / sum;
                let d = (prob - (v == t as usize) as u32 as f32) / counted * seed;
                self.emb.grad_mut()[x as usize * VOCAB_SIZE + v] += d;
                self.pos.grad_mut()[p * VOCAB_SIZE + v] += d;
            }
        }
        (loss / counted as f64) as f32
    }
}

struct Run {
    model: Bigram,
    optimizer: AdamW,
    scaler: DynamicLossScaler,
    progress: TrainProgress,
}

const TOTAL_STEPS: u64 = 12;

fn task() -> AdditionTask {
    AdditionTask::new(
        AdditionConfig {
            digits: 2,
            ..AdditionConfig::default()
        },
        5,
    )
    .unwrap()
}

fn new_run(task: &AdditionTask, init_seed: u64) -> Run {
    Run {
        model: Bigram::new(task.seq_len(), init_seed, 4),
        optimizer: AdamW::new(AdamWConfig {
            lr: 0.05,
            ..AdamWConfig::default()
        })
        .unwrap(),
        scaler: DynamicLossScaler::new(LossScalerConfig {
            growth_interval: 3,
            ..LossScalerConfig::default()
        })
        .unwrap(),
        progress: TrainProgress {
            step: 0,
            data: DataStream::new(77),
            rng: SplitMix64::new(78),
            config: serde_json::json!({"task": "addition", "digits": 2}),
        },
    }
}

/// Trains until `progress.step == until`; returns each step's loss bits and scale.
fn train(run: &mut Run, task: &AdditionTask, until: u64) -> Vec<(u32, f32)> {
    let schedule = LrSchedule::new(ScheduleKind::Cosine, 0.05, 2, TOTAL_STEPS, 0.005).unwrap();
    let recipe = DelayedScaling::default();
    let mut trace = Vec::new();
    while run.progress.step < until {
        let step = run.progress.step;
        let data = &mut run.progress.data;
        let loss = accumulate_gradients(&mut run.model, 2, run.scaler.scale(), |m, micro| {
            Ok(m.forward_backward(&task.train_batch(data, 8), micro.backward_seed))
        })
        .unwrap();
        // The run's own RNG perturbs the gradients (like dropout would), and step 4 overflows.
        let noise = run.progress.rng.next_f32() - 0.5;
        run.model.pos.grad_mut()[0] += noise * 1e-3 * run.scaler.scale();
        if step == 4 {
            run.model.emb.grad_mut()[3] = f32::INFINITY;
        }
        let out = apply_gradients(
            &mut run.model,
            &mut run.scaler,
            &mut run.optimizer,
            schedule.lr_at(step),
            Some(1.0),
        )
        .unwrap();
        assert_eq!(out.skipped, step == 4);
        run.model.slot.update(&recipe, Fp8Format::E4M3);
        trace.push((loss.mean.to_bits(), out.loss_scale));
        run.progress.step += 1;
    }
    trace
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|x| x.to_bits()).collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fp8-train-ckpt-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn resuming_from_a_checkpoint_continues_the_same_trajectory_bit_for_bit() {
    let task = task();
    let mut straight = new_run(&task, 1);
    let full = train(&mut straight, &task, TOTAL_STEPS);
    assert!(
        f32::from_bits(full.last().unwrap().0) < f32::from_bits(full[0].0),
        "the model learns"
    );
    assert_eq!(
        full[5].1,
        full[4].1 / 2.0,
        "the scale backs off after the overflow at step 4"
    );

    let dir = temp_dir("resume");
    let path = dir.join("step6.safetensors");
    let mut first = new_run(&task, 1);
    let head = train(&mut first, &task, 6);
    save_checkpoint(
        &path,
        &mut first.model,
        &first.optimizer,
        &first.scaler,
        &first.progress,
    )
    .unwrap();

    // A different initialization and a fresh optimizer, scaler and data stream: all of it is replaced.
    let mut resumed = new_run(&task, 999);
    resumed.progress = load_checkpoint(&path, &mut resumed.model, &mut resumed.optimizer, &mut resumed.scaler).unwrap();
    assert_eq!(resumed.progress.step, 6);
    let tail = train(&mut resumed, &task, TOTAL_STEPS);

    let joined: Vec<(u32, f32)> = head.into_iter().chain(tail).collect();
    assert_eq!(joined, full);
    assert_eq!(bits(resumed.model.emb.value()), bits(straight.model.emb.value()));
    assert_eq!(bits(resumed.model.pos.value()), bits(straight.model.pos.value()));
    assert_eq!(resumed.model.slot, straight.model.slot);
    assert_eq!(resumed.optimizer.state(), straight.optimizer.state());
    assert_eq!(resumed.scaler.state(), straight.scaler.state());
    assert_eq!(resumed.progress, straight.progress);
    fs::remove_dir_all(&dir).unwrap();
}

/// Everything a failed load must leave untouched.
fn snapshot(run: &mut Run) -> String {
    let mut params = Vec::new();
    run.model
        .visit_parameters(&mut |p| params.push((p.name().to_string(), bits(p.value()), p.version())));
    format!(
        "{params:?} {:?} {:?} {:?}",
        run.model.slot,
        run.optimizer.state(),
        run.scaler.state()
    )
}

fn saved_checkpoint(dir: &Path) -> (PathBuf, Vec<u8>) {
    let task = task();
    let mut run = new_run(&task, 1);
    train(&mut run, &task, 3);
    let path = dir.join("good.safetensors");
    save_checkpoint(&path, &mut run.model, &run.optimizer, &run.scaler, &run.progress).unwrap();
    // Saving again over the file is atomic: no temporary file is left behind.
    save_checkpoint(&path, &mut run.model, &run.optimizer, &run.scaler, &run.progress).unwrap();
    let names: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let bytes = fs::read(&path).unwrap();
    (path, bytes)
}

/// Loads `bytes` into a live run trained differently and checks nothing changed.
fn load_fails(dir: &Path, name: &str, bytes: &[u8], run: &mut Run) -> Error {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    let before = snapshot(run);
    let err = load_checkpoint(&path, &mut run.model, &mut run.optimizer, &mut run.scaler).unwrap_err();
    assert_eq!(snapshot(run), before, "{name}: a failed load changed the live state");
    assert!(
        err.to_string().contains(name),
        "{name}: the error does not name the file: {err}"
    );
    err
}

fn live_run() -> Run {
    let task = task();
    let mut run = new_run(&task, 42);
    train(&mut run, &task, 2);
    run
}

#[test]
fn corrupt_files_are_refused_without_a_partial_load() {
    let dir = temp_dir("corrupt");
    let (_, good) = saved_checkpoint(&dir);
    let mut run = live_run();

    let truncated = &good[..good.len() - 7];
    let err = load_fails(&dir, "truncated.safetensors", truncated, &mut run);
    assert!(matches!(err, Error::InvalidFile { .. }), "{err}");

    let mut bad_header = good.clone();
    bad_header[8..16].copy_from_slice(b"{garbage");
    let err = load_fails(&dir, "bad_header.safetensors", &bad_header, &mut run);
    assert!(matches!(err, Error::InvalidFile { .. }), "{err}");

    let mut huge_header = good.clone();
    huge_header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = load_fails(&dir, "huge_header.safetensors", &huge_header, &mut run);
    assert!(matches!(err, Error::InvalidFile { .. }), "{err}");

    let mut flipped = good.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x10;
    let err = load_fails(&dir, "flipped.safetensors", &flipped, &mut run);
    assert!(
        matches!(err, Error::InvalidFile { .. }) && err.to_string().contains("checksum"),
        "{err}"
    );

    let err = load_fails(&dir, "empty.safetensors", &[], &mut run);
    assert!(matches!(err, Error::InvalidFile { .. }), "{err}");

    // A valid safetensors file that is not a checkpoint.
    let plain = safetensors::serialize(Vec::<(&str, safetensors::tensor::TensorView)>::new(), None).unwrap();
    let err = load_fails(&dir, "plain.safetensors", &plain, &mut run);
    assert!(err.to_string().contains("not an fp8-engine checkpoint"), "{err}");

    let missing = dir.join("missing.safetensors");
    let err = load_checkpoint(&missing, &mut run.model, &mut run.optimizer, &mut run.scaler).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}

/// A model that differs from the saved one in one way.
struct Variant {
    inner: Bigram,
    extra_param: Option<Parameter>,
    drop_pos: bool,
    extra_slot: Option<DelayedSlot>,
}

impl Module for Variant {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        f(&mut self.inner.emb);
        if !self.drop_pos {
            f(&mut self.inner.pos);
        }
        if let Some(p) = &mut self.extra_param {
            f(p);
        }
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        f("emb.weight", &mut self.inner.slot);
        if let Some(s) = &mut self.extra_slot {
            f("head.input", s);
        }
    }
}

#[test]
fn checkpoints_that_do_not_fit_the_model_are_mismatches_and_change_nothing() {
    let dir = temp_dir("mismatch");
    let (path, _) = saved_checkpoint(&dir);
    let seq = task().seq_len();
    let base = || Variant {
        inner: Bigram::new(seq, 3, 4),
        extra_param: None,
        drop_pos: false,
        extra_slot: None,
    };
    let variants: Vec<(&str, Variant)> = vec![
        (
            "extra parameter",
            Variant {
                extra_param: Some(Parameter::new("head.bias", &[2], vec![1.0, 2.0]).unwrap()),
                ..base()
            },
        ),
        (
            "missing parameter",
            Variant {
                drop_pos: true,
                ..base()
            },
        ),
        (
            "other shape",
            Variant {
                inner: Bigram::new(seq + 1, 3, 4),
                ..base()
            },
        ),
        (
            "other history length",
            Variant {
                inner: Bigram::new(seq, 3, 8),
                ..base()
            },
        ),
        (
            "extra FP8 slot",
            Variant {
                extra_slot: Some(DelayedSlot::new(4)),
                ..base()
            },
        ),
    ];
    for (what, mut model) in variants {
        let mut optimizer = AdamW::new(AdamWConfig::default()).unwrap();
        let mut scaler = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        let mut before = Vec::new();
        model.visit_parameters(&mut |p| before.push((bits(p.value()), p.version())));
        let slot_before = model.inner.slot.clone();
        let err = load_checkpoint(&path, &mut model, &mut optimizer, &mut scaler).unwrap_err();
        assert!(matches!(err, Error::CheckpointMismatch { .. }), "{what}: {err}");
        let mut after = Vec::new();
        model.visit_parameters(&mut |p| after.push((bits(p.value()), p.version())));
        assert_eq!(after, before, "{what}: parameters changed");
        assert_eq!(model.inner.slot, slot_before, "{what}: slot changed");
        assert_eq!(optimizer.steps_taken(), 0, "{what}: optimizer changed");
        assert_eq!(scaler.scale(), 65536.0, "{what}: scaler changed");
    }
    // Other optimizer settings make the saved moments mean something else; another lr does not.
    let saved = AdamWConfig {
        lr: 0.05,
        ..AdamWConfig::default()
    };
    for (what, config, fits) in [
        (
            "other weight decay",
            AdamWConfig {
                weight_decay: 0.1,
                ..saved
            },
            false,
        ),
        (
            "decayed vectors",
            AdamWConfig {
                decay_vectors: true,
                ..saved
            },
            false,
        ),
        ("other beta2", AdamWConfig { beta2: 0.95, ..saved }, false),
        ("other lr", AdamWConfig { lr: 0.2, ..saved }, true),
    ] {
        let mut model = base();
        let mut optimizer = AdamW::new(config).unwrap();
        let mut scaler = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        let result = load_checkpoint(&path, &mut model, &mut optimizer, &mut scaler);
        match (fits, result) {
            (true, result) => assert!(result.is_ok(), "{what}: {:?}", result.err()),
            (false, Err(Error::CheckpointMismatch { reason, .. })) => {
                assert!(reason.contains("optimizer settings"), "{what}: {reason}")
            }
            (false, other) => panic!("{what}: expected a mismatch, got {other:?}"),
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_checkpoint_of_another_format_version_is_refused() {
    use fp8_engine::tools::safetensors_io::{OutTensor, parse, serialize, sorted_tensors};
    let dir = temp_dir("version");
    let (_, good) = saved_checkpoint(&dir);
    let file = parse(&good, "good").unwrap();
    let tensors: Vec<(String, OutTensor)> = sorted_tensors(&file)
        .iter()
        .map(|(n, v)| (n.clone(), OutTensor::copy_of(v)))
        .collect();
    let mut metadata = file.metadata.clone();
    metadata.insert("fp8_engine.checkpoint".into(), "3".into());
    let bytes = serialize(&tensors, metadata, "v3").unwrap();
    let mut run = live_run();
    let err = load_fails(&dir, "v3.safetensors", &bytes, &mut run);
    assert!(err.to_string().contains("version 3"), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}
