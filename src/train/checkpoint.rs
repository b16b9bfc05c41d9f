//! Training checkpoints in one safetensors file, written atomically, loaded
//! all-or-nothing.
//!
//! Tensors (all F32, little-endian):
//! * `param.<name>`: master weights, shape of the parameter (compute copies
//!   are derived from them, so they are not saved);
//! * `adamw.m.<name>`, `adamw.v.<name>`: AdamW moments (absent before the first step);
//! * `fp8.<slot>.scale`, `fp8.<slot>.scale_inv` (`[1]`), `fp8.<slot>.history`
//!   (`[history length]`): every delayed-scaling slot of the model.
//!
//! Metadata (`__metadata__`, strings): `fp8_engine.checkpoint` (format
//! version), `parameters` and `fp8_slots` (the inventory, JSON), `adamw`
//! (hyperparameters and step count), `loss_scaler` (state, scales exact through
//! `exact_f32`), `progress` (step, data stream, RNG state, the run's config
//! JSON), and `checksum`: FNV-1a 64 over every tensor's name, shape and bytes
//! in name order, then every other metadata key and value in key order, so
//! flipped bits in the data and edits of the metadata (a step count) are caught.
//!
//! Loading parses and checks everything against the live model (names,
//! shapes, counts, dtypes, checksum, metadata) before it changes anything.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use safetensors::Dtype;
use serde::{Deserialize, Serialize};

use crate::amp::loss_scaler::{DynamicLossScaler, LossScalerState};
use crate::data::{DataStream, SplitMix64};
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::scaling::DelayedSlot;
use crate::tools::safetensors_io::{self, OutTensor};

use super::adamw::{AdamW, AdamWConfig, AdamWState, Moments};

/// Bumped when the layout changes; this build writes this version.
/// Version 2: the checksum covers the metadata too.
pub const CHECKPOINT_VERSION: &str = "2";

/// Versions this build reads: version 1 (checksum over the tensors only) has the same layout, so
/// checkpoints of earlier builds still resume; its metadata is range-checked like any other.
const READABLE_VERSIONS: [&str; 2] = ["1", CHECKPOINT_VERSION];

/// The metadata a file's checksum covers, by its version.
fn covered(metadata: &HashMap<String, String>) -> Option<&HashMap<String, String>> {
    (metadata.get(KEY_VERSION).map(String::as_str) != Some("1")).then_some(metadata)
}

const KEY_VERSION: &str = "fp8_engine.checkpoint";

/// What the training loop keeps besides the model, optimizer and scaler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainProgress {
    /// Optimizer steps completed (the next step's index).
    pub step: u64,
    /// Where the training data stream stands.
    pub data: DataStream,
    /// The run's own generator (initialization, dropout), after the last step.
    pub rng: SplitMix64,
    /// The run's settings, so a resume can check it continues the same run.
    pub config: serde_json::Value,
}

/// The parameter list as the metadata records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ParamEntry {
    name: String,
    shape: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct AdamWMeta {
    config: AdamWConfig,
    step: u64,
    has_moments: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ScalerMeta {
    state: LossScalerState,
}

/// The live model's inventory: parameters and FP8 slots, in visiting order.
struct Inventory {
    params: Vec<ParamEntry>,
    slots: Vec<(String, usize)>,
}

fn inventory(model: &mut dyn Module) -> Inventory {
    let mut params = Vec::new();
    model.visit_parameters(&mut |p| {
        params.push(ParamEntry {
            name: p.name().to_string(),
            shape: p.shape().to_vec(),
        })
    });
    let mut slots = Vec::new();
    model.visit_fp8_slots(&mut |name, slot| slots.push((name.to_string(), slot.history.len())));
    Inventory { params, slots }
}

fn param_key(name: &str) -> String {
    format!("param.{name}")
}

fn moment_keys(name: &str) -> (String, String) {
    (format!("adamw.m.{name}"), format!("adamw.v.{name}"))
}

fn slot_keys(name: &str) -> [String; 3] {
    [
        format!("fp8.{name}.scale"),
        format!("fp8.{name}.scale_inv"),
        format!("fp8.{name}.history"),
    ]
}

/// FNV-1a, 64 bits: simple, dependency-free, and any flipped bit changes it.
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// Checksum of tensors given as (name, shape, bytes), taken in name order, then of the metadata
/// (every key but `checksum` itself), in key order. Version-1 files (`metadata: None`) covered
/// the tensors only.
fn checksum<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8])>,
    metadata: Option<&HashMap<String, String>>,
) -> String {
    let mut sorted: Vec<_> = tensors.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut hash = Fnv1a::new();
    for (name, shape, data) in sorted {
        hash.write(name.as_bytes());
        hash.write(&[0]);
        hash.write(&(shape.len() as u64).to_le_bytes());
        for &d in shape {
            hash.write(&(d as u64).to_le_bytes());
        }
        hash.write(&(data.len() as u64).to_le_bytes());
        hash.write(data);
    }
    let keys: BTreeMap<&String, &String> = metadata
        .into_iter()
        .flatten()
        .filter(|(k, _)| *k != "checksum")
        .collect();
    for (key, value) in keys {
        for text in [key, value] {
            hash.write(&(text.len() as u64).to_le_bytes());
            hash.write(text.as_bytes());
        }
    }
    format!("{:016x}", hash.0)
}

fn duplicate<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = BTreeSet::new();
    names.into_iter().find(|n| !seen.insert(*n))
}

fn json<T: Serialize>(value: &T, path: &Path) -> Result<String> {
    serde_json::to_string(value).map_err(|err| Error::Io {
        path: path.display().to_string(),
        message: format!("cannot serialize checkpoint metadata: {err}"),
    })
}

/// Writes a checkpoint of the model, optimizer, scaler and progress to `path` atomically
/// (a temporary file renamed over it: a crash leaves the old checkpoint or the new one).
pub fn save_checkpoint(
    path: &Path,
    model: &mut dyn Module,
    optimizer: &AdamW,
    scaler: &DynamicLossScaler,
    progress: &TrainProgress,
) -> Result<()> {
    let inv = inventory(model);
    if let Some(name) = duplicate(inv.params.iter().map(|p| p.name.as_str())) {
        return Err(Error::InvalidTensor {
            name: name.to_string(),
            reason: "two parameters have this name; a checkpoint needs unique names".to_string(),
        });
    }
    if let Some(name) = duplicate(inv.slots.iter().map(|s| s.0.as_str())) {
        return Err(Error::InvalidTensor {
            name: name.to_string(),
            reason: "two FP8 slots have this name; a checkpoint needs unique names".to_string(),
        });
    }
    let state = optimizer.state()?;
    let moments = &state.moments;
    let has_moments = !moments.is_empty();
    if has_moments {
        let fits = moments.len() == inv.params.len()
            && moments
                .iter()
                .zip(&inv.params)
                .all(|(m, p)| m.name == p.name && m.shape == p.shape);
        if !fits {
            return Err(Error::InvalidTensor {
                name: "adamw".to_string(),
                reason: "optimizer state does not belong to this model's parameters".to_string(),
            });
        }
    }

    let mut tensors: Vec<(String, OutTensor<'static>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, values: &[f32]| {
        tensors.push((
            name,
            OutTensor {
                dtype: Dtype::F32,
                shape,
                data: Cow::Owned(safetensors_io::f32_bytes(values)),
            },
        ))
    };
    // Read without keeping host copies of values kept on a GPU (`Parameter::value_copy`).
    let mut read = Ok(());
    model.visit_parameters(&mut |p| {
        if read.is_ok() {
            read = p
                .value_copy()
                .map(|values| add(param_key(p.name()), p.shape().to_vec(), &values));
        }
    });
    read?;
    for m in moments {
        let (mk, vk) = moment_keys(&m.name);
        add(mk, m.shape.clone(), &m.m);
        add(vk, m.shape.clone(), &m.v);
    }
    model.visit_fp8_slots(&mut |name, slot| {
        let [scale, scale_inv, history] = slot_keys(name);
        add(scale, vec![1], &[slot.scale]);
        add(scale_inv, vec![1], &[slot.scale_inv]);
        add(history, vec![slot.history.len()], &slot.history);
    });

    let adamw = AdamWMeta {
        config: *optimizer.config(),
        step: optimizer.steps_taken(),
        has_moments,
    };
    let mut metadata = HashMap::from([
        (KEY_VERSION.to_string(), CHECKPOINT_VERSION.to_string()),
        ("parameters".to_string(), json(&inv.params, path)?),
        (
            "fp8_slots".to_string(),
            json(&inv.slots.iter().map(|s| &s.0).collect::<Vec<_>>(), path)?,
        ),
        ("adamw".to_string(), json(&adamw, path)?),
        (
            "loss_scaler".to_string(),
            json(&ScalerMeta { state: scaler.state() }, path)?,
        ),
        ("progress".to_string(), json(progress, path)?),
    ]);
    let sum = checksum(
        tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.shape.as_slice(), t.data.as_ref())),
        Some(&metadata),
    );
    metadata.insert("checksum".to_string(), sum);
    let bytes = safetensors_io::serialize(&tensors, metadata, &path.display().to_string())?;
    safetensors_io::write_atomic(path, &bytes)
}

/// Everything a load will apply, gathered and checked first.
struct Staged {
    params: Vec<Vec<f32>>,
    slots: Vec<DelayedSlot>,
    optimizer: AdamWState,
    scaler: LossScalerState,
    progress: TrainProgress,
}

/// Restores a checkpoint written by [`save_checkpoint`] into the live `model`, `optimizer` and
/// `scaler`, and returns the progress to continue from. Any problem (unreadable, truncated or
/// corrupt file, other format version, a parameter or slot missing, extra or of another shape,
/// a scaler mode that differs) is an error and leaves everything as it was. Gradients are
/// zeroed and every parameter is marked updated, so compute copies are rebuilt.
pub fn load_checkpoint(
    path: &Path,
    model: &mut dyn Module,
    optimizer: &mut AdamW,
    scaler: &mut DynamicLossScaler,
) -> Result<TrainProgress> {
    let bytes = safetensors_io::read_file(path)?;
    let staged = stage(path, &bytes, model, optimizer.config(), scaler)?;
    let mut values = staged.params.into_iter();
    model.visit_parameters(&mut |p| {
        p.set_value(values.next().expect("staged one value list per parameter"));
        p.zero_grad();
        p.mark_updated();
    });
    let mut slots = staged.slots.into_iter();
    model.visit_fp8_slots(&mut |_, slot| *slot = slots.next().expect("staged one state per slot"));
    optimizer.set_state(staged.optimizer);
    scaler.set_state(staged.scaler)?;
    Ok(staged.progress)
}

/// The progress recorded in a checkpoint (step, streams, the run's settings), after the file's
/// checksum is verified; nothing is loaded. `fp8 train --resume` reads the saved settings with it.
pub fn read_progress(path: &Path) -> Result<TrainProgress> {
    let bytes = safetensors_io::read_file(path)?;
    let label = path.display().to_string();
    let corrupt = |reason: String| Error::InvalidFile {
        path: label.clone(),
        reason,
    };
    let file = safetensors_io::parse(&bytes, &label)?;
    let views: BTreeMap<String, _> = file.tensors.tensors().into_iter().collect();
    let sum = checksum(
        views.iter().map(|(n, v)| (n.as_str(), v.shape(), v.data())),
        covered(&file.metadata),
    );
    let version = file.metadata.get(KEY_VERSION).map(String::as_str);
    if file.metadata.get("checksum") != Some(&sum) || !version.is_some_and(|v| READABLE_VERSIONS.contains(&v)) {
        return Err(corrupt(format!(
            "not a version {} fp8-engine checkpoint with a matching checksum",
            READABLE_VERSIONS.join(" or ")
        )));
    }
    let text = file
        .metadata
        .get("progress")
        .ok_or_else(|| corrupt("metadata 'progress' is missing".into()))?;
    serde_json::from_str(text).map_err(|err| corrupt(format!("metadata 'progress' does not parse: {err}")))
}

fn stage(
    path: &Path,
    bytes: &[u8],
    model: &mut dyn Module,
    optimizer: &AdamWConfig,
    scaler: &DynamicLossScaler,
) -> Result<Staged> {
    let label = path.display().to_string();
    let corrupt = |reason: String| Error::InvalidFile {
        path: label.clone(),
        reason,
    };
    let mismatch = |reason: String| Error::CheckpointMismatch {
        path: label.clone(),
        reason,
    };
    let file = safetensors_io::parse(bytes, &label)?;
    let meta = |key: &str| {
        file.metadata
            .get(key)
            .ok_or_else(|| corrupt(format!("not an fp8-engine checkpoint: metadata '{key}' is missing")))
    };
    let version = meta(KEY_VERSION)?;
    if !READABLE_VERSIONS.contains(&version.as_str()) {
        let version = crate::io::escaped(version);
        return Err(corrupt(format!(
            "checkpoint format version {version}, this build reads versions {}",
            READABLE_VERSIONS.join(" and ")
        )));
    }
    fn parse_json<T: for<'de> Deserialize<'de>>(text: &str, key: &str, corrupt: &dyn Fn(String) -> Error) -> Result<T> {
        serde_json::from_str(text).map_err(|err| corrupt(format!("metadata '{key}' does not parse: {err}")))
    }
    let views: BTreeMap<String, _> = file.tensors.tensors().into_iter().collect();
    let expected_sum = meta("checksum")?;
    let actual_sum = checksum(
        views.iter().map(|(n, v)| (n.as_str(), v.shape(), v.data())),
        covered(&file.metadata),
    );
    if *expected_sum != actual_sum {
        return Err(corrupt(format!(
            "checksum mismatch (stored {}, the data and metadata give {actual_sum}): the file is corrupt or was edited",
            crate::io::escaped(expected_sum)
        )));
    }
    let saved_params: Vec<ParamEntry> = parse_json(meta("parameters")?, "parameters", &corrupt)?;
    let saved_slots: Vec<String> = parse_json(meta("fp8_slots")?, "fp8_slots", &corrupt)?;
    let adamw: AdamWMeta = parse_json(meta("adamw")?, "adamw", &corrupt)?;
    let scaler_meta: ScalerMeta = parse_json(meta("loss_scaler")?, "loss_scaler", &corrupt)?;
    let progress: TrainProgress = parse_json(meta("progress")?, "progress", &corrupt)?;
    // Ranges: the optimizer cannot have taken more steps than the run (skipped steps take none).
    if adamw.step > progress.step {
        return Err(corrupt(format!(
            "optimizer step {} is past the run's step {}",
            adamw.step, progress.step
        )));
    }

    // The file against its own inventory: a tensor the metadata does not account for, or the
    // reverse, means the file was not written by save_checkpoint.
    let mut listed = BTreeSet::new();
    for p in &saved_params {
        listed.insert(param_key(&p.name));
        if adamw.has_moments {
            let (m, v) = moment_keys(&p.name);
            listed.extend([m, v]);
        }
    }
    for s in &saved_slots {
        listed.extend(slot_keys(s));
    }
    let present: BTreeSet<String> = views.keys().cloned().collect();
    if let Some(name) = listed.symmetric_difference(&present).next() {
        return Err(corrupt(format!(
            "tensor '{name}' is {} the file but {} its inventory",
            if present.contains(name) { "in" } else { "missing from" },
            if present.contains(name) { "not in" } else { "in" },
        )));
    }

    // The file against the live model.
    let live = inventory(model);
    let saved_names: BTreeSet<&str> = saved_params.iter().map(|p| p.name.as_str()).collect();
    let live_names: BTreeSet<&str> = live.params.iter().map(|p| p.name.as_str()).collect();
    if let Some(name) = live_names.difference(&saved_names).next() {
        return Err(mismatch(format!(
            "parameter '{name}' of the model is missing from the checkpoint"
        )));
    }
    if let Some(name) = saved_names.difference(&live_names).next() {
        return Err(mismatch(format!(
            "the checkpoint has parameter '{name}', which the model does not"
        )));
    }
    if saved_params.len() != live.params.len() {
        return Err(mismatch(format!(
            "{} parameters in the checkpoint, {} in the model (a repeated name?)",
            saved_params.len(),
            live.params.len()
        )));
    }
    let saved_slot_names: BTreeSet<&str> = saved_slots.iter().map(|s| s.as_str()).collect();
    let live_slot_names: BTreeSet<&str> = live.slots.iter().map(|s| s.0.as_str()).collect();
    if let Some(name) = live_slot_names.difference(&saved_slot_names).next() {
        return Err(mismatch(format!(
            "FP8 slot '{name}' of the model is missing from the checkpoint"
        )));
    }
    if let Some(name) = saved_slot_names.difference(&live_slot_names).next() {
        return Err(mismatch(format!(
            "the checkpoint has FP8 slot '{name}', which the model does not"
        )));
    }
    if saved_slots.len() != live.slots.len() {
        return Err(mismatch(format!(
            "{} FP8 slots in the checkpoint, {} in the model",
            saved_slots.len(),
            live.slots.len()
        )));
    }
    if scaler_meta.state.enabled != scaler.is_enabled() {
        let mode = |on: bool| if on { "enabled" } else { "disabled" };
        return Err(mismatch(format!(
            "loss scaling is {} in the checkpoint and {} in this run",
            mode(scaler_meta.state.enabled),
            mode(scaler.is_enabled())
        )));
    }
    if !(scaler_meta.state.scale.is_finite() && scaler_meta.state.scale > 0.0) {
        return Err(corrupt(format!(
            "loss scale {} is not finite and positive",
            scaler_meta.state.scale
        )));
    }
    // The moments only mean the same thing under the same betas, eps and decay; the learning rate
    // may change (schedules pass their own to every step).
    if (AdamWConfig {
        lr: optimizer.lr,
        ..adamw.config
    }) != *optimizer
    {
        return Err(mismatch(format!(
            "optimizer settings differ: {:?} in the checkpoint, {optimizer:?} in this run",
            adamw.config
        )));
    }
    if adamw.has_moments != (adamw.step > 0) {
        return Err(corrupt(format!(
            "optimizer step {} does not fit {} moments",
            adamw.step,
            if adamw.has_moments { "saved" } else { "absent" }
        )));
    }

    let read = |key: &str, shape: &[usize], what: &str| -> Result<Vec<f32>> {
        let view = &views[key];
        if view.dtype() != Dtype::F32 {
            return Err(corrupt(format!(
                "tensor '{key}' is {:?}, checkpoints hold F32",
                view.dtype()
            )));
        }
        if view.shape() != shape {
            return Err(mismatch(format!(
                "{what} has shape {:?} in the checkpoint and {shape:?} in the model",
                view.shape()
            )));
        }
        match safetensors_io::float_values(view) {
            Some(values) => Ok(values.to_f32()),
            None => Err(corrupt(format!("tensor '{key}' does not decode"))),
        }
    };

    let mut params = Vec::with_capacity(live.params.len());
    let mut moments = Vec::new();
    for p in &live.params {
        params.push(read(&param_key(&p.name), &p.shape, &format!("parameter '{}'", p.name))?);
        if adamw.has_moments {
            let (mk, vk) = moment_keys(&p.name);
            let what = format!("AdamW moment of '{}'", p.name);
            moments.push(Moments {
                name: p.name.clone(),
                shape: p.shape.clone(),
                m: read(&mk, &p.shape, &what)?,
                v: read(&vk, &p.shape, &what)?,
            });
        }
    }
    let mut slots = Vec::with_capacity(live.slots.len());
    for (name, history_len) in &live.slots {
        let [scale, scale_inv, history] = slot_keys(name);
        let what = format!("FP8 slot '{name}'");
        let slot = DelayedSlot {
            scale: read(&scale, &[1], &what)?[0],
            scale_inv: read(&scale_inv, &[1], &what)?[0],
            history: read(&history, &[*history_len], &format!("amax history of {what}"))?,
        };
        if let Some(reason) = super::resume_checks::slot_problem(&slot) {
            return Err(corrupt(format!("{what}: {reason}")));
        }
        slots.push(slot);
    }
    Ok(Staged {
        params,
        slots,
        optimizer: AdamWState {
            step: adamw.step,
            moments,
        },
        scaler: scaler_meta.state,
        progress,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amp::loss_scaler::LossScalerConfig;
    use crate::train::test_util::ParamList;

    fn model() -> ParamList {
        let mut m = ParamList::new(&[
            ("w", &[2, 3], vec![0.5, -1.0, 2.0, f32::MIN_POSITIVE, -0.0, 1e30]),
            ("b", &[3], vec![0.1, 0.2, 0.3]),
        ]);
        m.slots.push((
            "fc.input".into(),
            DelayedSlot {
                scale: 3.5,
                scale_inv: 1.0 / 3.5,
                history: vec![0.0, 1.25, 7.0],
            },
        ));
        m
    }

    fn trained(m: &mut ParamList) -> (AdamW, DynamicLossScaler) {
        let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
        let mut scaler = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        for s in 0..3 {
            m.visit_parameters(&mut |p| {
                p.grad_mut()
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, g)| *g = (i + s) as f32 * 0.1)
            });
            opt.step(m, 0.01).unwrap();
            scaler.update(s == 1);
        }
        (opt, scaler)
    }

    fn progress() -> TrainProgress {
        let mut data = DataStream::new(17);
        data.rng.next_u64();
        data.batches = 3;
        TrainProgress {
            step: 3,
            data,
            rng: SplitMix64::new(u64::MAX),
            config: serde_json::json!({"precision": "fp8-delayed", "lr": 0.01}),
        }
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fp8-ckpt-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn round_trip_is_bit_exact() {
        let path = temp("round.safetensors");
        let mut saved = model();
        let (opt, scaler) = trained(&mut saved);
        save_checkpoint(&path, &mut saved, &opt, &scaler, &progress()).unwrap();

        let mut fresh = ParamList::new(&[("w", &[2, 3], vec![0.0; 6]), ("b", &[3], vec![9.0; 3])]);
        fresh.slots.push(("fc.input".into(), DelayedSlot::new(3)));
        fresh.params[0].grad_mut().copy_from_slice(&[5.0; 6]);
        let mut opt2 = AdamW::new(AdamWConfig::default()).unwrap();
        let mut scaler2 = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        let back = load_checkpoint(&path, &mut fresh, &mut opt2, &mut scaler2).unwrap();
        assert_eq!(back, progress());
        for (a, b) in saved.params.iter().zip(&fresh.params) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(a.value()), bits(b.value()));
            assert!(b.grad().iter().all(|&g| g == 0.0));
            assert_eq!(b.version(), 1);
        }
        assert_eq!(fresh.slots, saved.slots);
        assert_eq!(opt2.state(), opt.state());
        assert_eq!(scaler2.state(), scaler.state());
    }

    /// The checkpoint at `path` re-serialized after `edit` changed its metadata (the tensors are
    /// copied unchanged and passed to `edit`).
    fn rewritten(path: &Path, edit: impl FnOnce(&[(String, OutTensor<'_>)], &mut HashMap<String, String>)) -> Vec<u8> {
        let bytes = std::fs::read(path).unwrap();
        let file = safetensors_io::parse(&bytes, "t").unwrap();
        let tensors: Vec<(String, OutTensor<'_>)> = safetensors_io::sorted_tensors(&file)
            .iter()
            .map(|(n, v)| (n.clone(), OutTensor::copy_of(v)))
            .collect();
        let mut metadata = file.metadata.clone();
        edit(&tensors, &mut metadata);
        safetensors_io::serialize(&tensors, metadata, "t").unwrap()
    }

    /// The checkpoint at `path` with metadata `key` replaced by `value` (checksum left as it was).
    fn with_metadata(path: &Path, key: &str, value: String) -> Vec<u8> {
        rewritten(path, |_, metadata| {
            metadata.insert(key.to_string(), value);
        })
    }

    #[test]
    fn edited_metadata_fails_the_checksum_and_out_of_range_fields_are_refused() {
        let path = temp("edited.safetensors");
        let mut saved = model();
        let (opt, scaler) = trained(&mut saved);
        save_checkpoint(&path, &mut saved, &opt, &scaler, &progress()).unwrap();
        let progress_json = serde_json::to_string(&TrainProgress { step: 2, ..progress() }).unwrap();
        let edited = temp("edited2.safetensors");
        std::fs::write(&edited, with_metadata(&path, "progress", progress_json)).unwrap();
        let load = |p: &Path| {
            let mut opt2 = AdamW::new(AdamWConfig::default()).unwrap();
            let mut scaler2 = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
            load_checkpoint(p, &mut model(), &mut opt2, &mut scaler2)
        };
        let err = load(&edited).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        // A valid checksum over an impossible state: 3 optimizer steps in a run at step 1.
        let mut m = model();
        save_checkpoint(&path, &mut m, &opt, &scaler, &TrainProgress { step: 1, ..progress() }).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("optimizer step 3 is past the run's step 1"), "{err}");
        // A NaN scale in an FP8 slot.
        let mut m = model();
        m.slots[0].1.scale = f32::NAN;
        save_checkpoint(&path, &mut m, &opt, &scaler, &progress()).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("scale NaN"), "{err}");
    }

    /// A version-1 file (written before the checksum covered the metadata) still loads, bit-exactly.
    #[test]
    fn version_1_checkpoints_still_load() {
        let path = temp("v1.safetensors");
        let mut saved = model();
        let (opt, scaler) = trained(&mut saved);
        save_checkpoint(&path, &mut saved, &opt, &scaler, &progress()).unwrap();
        // What an earlier build wrote: version 1, the checksum over the tensors only.
        let v1_bytes = rewritten(&path, |tensors, metadata| {
            metadata.insert(KEY_VERSION.to_string(), "1".to_string());
            let tensor_sum = checksum(
                tensors
                    .iter()
                    .map(|(n, t)| (n.as_str(), t.shape.as_slice(), t.data.as_ref())),
                None,
            );
            metadata.insert("checksum".to_string(), tensor_sum);
        });
        let v1 = temp("v1b.safetensors");
        std::fs::write(&v1, v1_bytes).unwrap();
        let mut fresh = model();
        let mut opt2 = AdamW::new(AdamWConfig::default()).unwrap();
        let mut scaler2 = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        assert_eq!(
            load_checkpoint(&v1, &mut fresh, &mut opt2, &mut scaler2).unwrap(),
            progress()
        );
        assert_eq!(read_progress(&v1).unwrap(), progress());
        assert_eq!(opt2.state(), opt.state());
        // Its tensors are still covered: a flipped byte of tensor data is caught.
        let mut bad = std::fs::read(&v1).unwrap();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        std::fs::write(&v1, bad).unwrap();
        let err = load_checkpoint(&v1, &mut model(), &mut opt2, &mut scaler2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
    }

    #[test]
    fn a_checkpoint_before_the_first_step_has_no_moments() {
        let path = temp("fresh.safetensors");
        let mut m = model();
        let opt = AdamW::new(AdamWConfig::default()).unwrap();
        let scaler = DynamicLossScaler::disabled();
        save_checkpoint(&path, &mut m, &opt, &scaler, &progress()).unwrap();
        let mut opt2 = AdamW::new(AdamWConfig::default()).unwrap();
        let mut scaler2 = DynamicLossScaler::disabled();
        load_checkpoint(&path, &mut model(), &mut opt2, &mut scaler2).unwrap();
        assert_eq!(*opt2.state().unwrap(), AdamWState::default());
        // The same with the optimizer's arenas made before the first step, as a GPU run makes
        // them (zero moments in the arenas, none to save).
        let mut arenas = AdamW::new(AdamWConfig::default()).unwrap();
        arenas.use_host_arenas(true);
        arenas.prepare(&mut m).unwrap();
        assert_eq!(*arenas.state().unwrap(), AdamWState::default());
        save_checkpoint(&path, &mut m, &arenas, &scaler, &progress()).unwrap();
        load_checkpoint(&path, &mut model(), &mut opt2, &mut scaler2).unwrap();
        assert_eq!(*opt2.state().unwrap(), AdamWState::default());
        // Enabled scaling in this run, disabled in the file: refused.
        let mut enabled = DynamicLossScaler::new(LossScalerConfig::default()).unwrap();
        let err = load_checkpoint(&path, &mut model(), &mut opt2, &mut enabled).unwrap_err();
        assert!(matches!(err, Error::CheckpointMismatch { .. }), "{err}");
    }
}
