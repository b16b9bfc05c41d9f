//! What a training run writes for people and plots: one JSON object per step
//! in `DIR/PRECISION/metrics.jsonl`, and `DIR/summary.json` with one entry per
//! compared precision.
//!
//! JSON has no inf/NaN: such values are written as `null` and read back as NaN.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::nn::Fp8TensorStats;
use crate::tools::safetensors_io::write_atomic;

/// Serde for floats that may be non-finite: written as numbers or `null`, `null` read as NaN.
mod nullable {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize + Copy + Into<f64>, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        let wide: f64 = (*value).into();
        if wide.is_finite() {
            value.serialize(s)
        } else {
            s.serialize_none()
        }
    }

    pub fn deserialize<'de, T: Deserialize<'de> + From<f32>, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_else(|| T::from(f32::NAN)))
    }
}

/// One line of `metrics.jsonl`: one optimizer step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// 0-based step index.
    pub step: u64,
    /// Mean training loss of the step's micro-batches (unscaled).
    #[serde(with = "nullable")]
    pub loss: f32,
    /// Learning rate the update used.
    #[serde(with = "nullable")]
    pub lr: f32,
    /// Global gradient norm before clipping (unscaled; non-finite on a skipped step).
    #[serde(with = "nullable")]
    pub grad_norm: f64,
    /// Loss scale the step's backward ran with (1 without loss scaling).
    #[serde(with = "nullable")]
    pub loss_scale: f32,
    /// Tokens of this step divided by its wall time.
    #[serde(with = "nullable")]
    pub tokens_per_s: f64,
    /// One entry per FP8 tensor slot (empty for non-FP8 precisions).
    pub fp8: Vec<Fp8TensorStats>,
}

/// One precision's results in `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionSummary {
    /// Loss of the last step.
    #[serde(with = "nullable")]
    pub final_train_loss: f32,
    /// Mean loss over the held-out split.
    #[serde(with = "nullable")]
    pub heldout_loss: f32,
    /// Mean loss over the held-out answers only (NaN/null where the task has none, or in a
    /// summary written before this field existed).
    #[serde(with = "nullable", default = "nan")]
    pub heldout_answer_loss: f32,
    /// Share of held-out sequences predicted exactly (NaN/null where the task has none).
    #[serde(with = "nullable")]
    pub heldout_accuracy: f64,
    /// Training tokens per second over the whole run.
    #[serde(with = "nullable")]
    pub tokens_per_s: f64,
    /// Peak bytes of all memory categories together.
    pub peak_bytes: u64,
    /// On a GPU, the most bytes its allocations held at once during the run, as the driver
    /// counts them (`CudaDevice::allocation_peak`: every device buffer, the CUDA context not
    /// included); absent on the CPU. From the second precision of a `--compare` on, it includes
    /// what the earlier ones left allocated (the staging pool's spares live for the process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_peak_bytes: Option<u64>,
    /// Model FLOP/s: `tokens_per_s` times the training FLOPs per token (`model::flops`); null
    /// where not counted (a fine-tuned Hugging Face model) or in an older summary.
    #[serde(with = "nullable", default = "nan_f64")]
    pub model_flop_per_s: f64,
    /// `model_flop_per_s` over the GPU's dense bf16 peak (`model::flops::bf16_peak_tflops`);
    /// null on the CPU, on a GPU without a known peak, or where FLOPs are not counted.
    #[serde(with = "nullable", default = "nan_f64")]
    pub mfu: f64,
}

fn nan() -> f32 {
    f32::NAN
}

fn nan_f64() -> f64 {
    f64::NAN
}

/// `summary.json`: precision name (`fp32`, `bf16`, `fp8-delayed`, ...) to its results, sorted.
pub type Summary = BTreeMap<String, PrecisionSummary>;

/// Writes `summary.json` atomically (pretty-printed).
pub fn write_summary(path: &Path, summary: &Summary) -> Result<()> {
    let mut text = serde_json::to_string_pretty(summary).map_err(|err| Error::Io {
        path: path.display().to_string(),
        message: format!("cannot serialize the summary: {err}"),
    })?;
    text.push('\n');
    write_atomic(path, text.as_bytes())
}

/// The largest `metrics.jsonl` a resume reads (a 3000-step FP8 run writes about 30 MB).
const MAX_METRICS_BYTES: u64 = 1 << 30;

/// The largest `summary.json` read (a few hundred bytes per precision).
const MAX_SUMMARY_BYTES: u64 = 1 << 20;

/// Reads `summary.json`.
pub fn read_summary(path: &Path) -> Result<Summary> {
    let bytes = crate::io::read_regular(path, MAX_SUMMARY_BYTES, "")?;
    let text = String::from_utf8_lossy(&bytes);
    serde_json::from_str(&text).map_err(|err| Error::InvalidFile {
        path: path.display().to_string(),
        reason: format!("not a summary: {err}"),
    })
}

/// Appends [`StepMetrics`] lines to a `metrics.jsonl`, flushing after each so a crash loses nothing written.
pub struct MetricsWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsWriter {
    /// Starts a new file (creating its directory), replacing any old one.
    pub fn create(path: &Path) -> Result<Self> {
        Self::open(path, false)
    }

    /// Opens the file after checking it is nothing or a regular file (a device or a symlink at
    /// the path is refused, as for every output): truncated, or appended to with `append`.
    fn open(path: &Path, append: bool) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|err| io_error(dir, "cannot create directory", err))?;
        }
        crate::io::check_output_path(path)?;
        let file = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|err| io_error(path, "cannot create", err))?;
        Ok(MetricsWriter {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    /// Continues a run resumed at `next_step`: keeps the lines of earlier steps (a run that
    /// went past its last checkpoint before stopping wrote lines that will be written again),
    /// drops the rest, and appends after them. A missing file starts empty. A torn last line
    /// (the run was killed while writing it) is dropped; a bad line before it is an error.
    /// The kept lines are rewritten atomically, so a kill during the resume loses nothing.
    pub fn resume(path: &Path, next_step: u64) -> Result<Self> {
        // Lines are kept verbatim and only their `step` is read: a line whose FP8 stats hold a
        // `null` (a NaN amax) does not parse as `Fp8TensorStats` but is still a valid record.
        let mut kept = String::new();
        if fs::symlink_metadata(path).is_ok() {
            let bytes = crate::io::read_regular(path, MAX_METRICS_BYTES, "")?;
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<(usize, &str)> = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).collect();
            for (position, (index, line)) in lines.iter().enumerate() {
                let step = serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
                let step = match step {
                    Some(step) => step,
                    None if position + 1 == lines.len() => break,
                    None => {
                        return Err(Error::InvalidFile {
                            path: path.display().to_string(),
                            reason: format!("line {}: not a metrics record with a step", index + 1),
                        });
                    }
                };
                if step < next_step {
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
        }
        // A resume into a new --out has no directory yet (the first GPU run's resume across devices).
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|err| io_error(dir, "cannot create directory", err))?;
        }
        write_atomic(path, kept.as_bytes())?;
        Self::open(path, true)
    }

    /// Writes one line and flushes it.
    pub fn append(&mut self, metrics: &StepMetrics) -> Result<()> {
        let line = serde_json::to_string(metrics).map_err(|err| Error::Io {
            path: self.path.display().to_string(),
            message: format!("cannot serialize step {}: {err}", metrics.step),
        })?;
        writeln!(self.out, "{line}")
            .and_then(|_| self.out.flush())
            .map_err(|err| io_error(&self.path, "cannot write", err))
    }
}

/// Reads every line of a `metrics.jsonl`; a line that does not parse is an error naming it.
pub fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>> {
    let file = File::open(path).map_err(|err| io_error(path, "cannot read", err))?;
    let mut out = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|err| io_error(path, "cannot read", err))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).map_err(|err| Error::InvalidFile {
            path: path.display().to_string(),
            reason: format!("line {}: not a metrics record: {err}", index + 1),
        })?);
    }
    Ok(out)
}

fn io_error(path: &Path, what: &str, err: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        message: format!("{what}: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fp8-metrics-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn line(step: u64, loss: f32) -> StepMetrics {
        StepMetrics {
            step,
            loss,
            lr: 1e-3,
            grad_norm: 0.5,
            loss_scale: 65536.0,
            tokens_per_s: 1234.5,
            fp8: vec![Fp8TensorStats {
                name: "layers.0.fc1.input".into(),
                format: "e4m3".into(),
                amax: 3.5,
                scale: 128.0,
                saturated: 0.0,
                underflow: 0.01,
                nonfinite: 0,
            }],
        }
    }

    #[test]
    fn lines_have_exactly_the_issue_keys() {
        let value = serde_json::to_value(line(3, 2.0)).unwrap();
        let mut keys: Vec<&str> = value.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(
            keys,
            ["fp8", "grad_norm", "loss", "loss_scale", "lr", "step", "tokens_per_s"]
        );
        let mut fp8_keys: Vec<&str> = value["fp8"][0]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        fp8_keys.sort();
        assert_eq!(
            fp8_keys,
            ["amax", "format", "name", "nonfinite", "saturated", "scale", "underflow"]
        );
        let summary = serde_json::to_value(PrecisionSummary {
            final_train_loss: 1.0,
            heldout_loss: 1.1,
            heldout_answer_loss: f32::NAN,
            heldout_accuracy: 0.5,
            tokens_per_s: 10.0,
            peak_bytes: 7,
            device_peak_bytes: None,
            model_flop_per_s: f64::NAN,
            mfu: f64::NAN,
        })
        .unwrap();
        let mut keys: Vec<&str> = summary.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "final_train_loss",
                "heldout_accuracy",
                "heldout_answer_loss",
                "heldout_loss",
                "mfu",
                "model_flop_per_s",
                "peak_bytes",
                "tokens_per_s"
            ]
        );
    }

    #[test]
    fn writer_appends_lines_that_read_back_and_resume_drops_later_steps() {
        let dir = temp_dir("writer");
        let path = dir.join("fp8-delayed/metrics.jsonl");
        let mut writer = MetricsWriter::create(&path).unwrap();
        let mut nan = line(2, f32::NAN);
        nan.grad_norm = f64::INFINITY;
        for m in [line(0, 3.0), line(1, 2.5), nan.clone(), line(3, 2.0)] {
            writer.append(&m).unwrap();
        }
        // Flushed line by line: readable before the writer is dropped.
        let back = read_metrics(&path).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back[1], line(1, 2.5));
        assert!(back[2].loss.is_nan() && back[2].grad_norm.is_nan());
        assert!(
            fs::read_to_string(&path)
                .unwrap()
                .lines()
                .nth(2)
                .unwrap()
                .contains("\"loss\":null")
        );
        drop(writer);
        let mut resumed = MetricsWriter::resume(&path, 2).unwrap();
        resumed.append(&line(2, 2.25)).unwrap();
        let steps: Vec<(u64, f32)> = read_metrics(&path).unwrap().iter().map(|m| (m.step, m.loss)).collect();
        assert_eq!(steps, vec![(0, 3.0), (1, 2.5), (2, 2.25)]);
        fs::write(&path, "{\"step\": 1}\n").unwrap();
        let err = read_metrics(&path).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn resume_keeps_earlier_lines_verbatim_even_with_a_nan_amax() {
        let dir = temp_dir("nan-amax");
        let path = dir.join("metrics.jsonl");
        let mut nan_amax = line(0, 3.0);
        nan_amax.fp8[0].amax = f32::NAN;
        let mut writer = MetricsWriter::create(&path).unwrap();
        writer.append(&nan_amax).unwrap();
        writer.append(&line(1, 2.0)).unwrap();
        drop(writer);
        let first = fs::read_to_string(&path).unwrap().lines().next().unwrap().to_string();
        assert!(first.contains("\"amax\":null"), "{first}");
        let mut resumed = MetricsWriter::resume(&path, 1).unwrap();
        resumed.append(&line(1, 1.5)).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], first);
        assert!(lines[1].contains("\"loss\":1.5"), "{}", lines[1]);
        // A bad line before the last one is damage, not a torn write: an error naming it.
        fs::write(&path, "not json\n{\"step\": 0}\n").unwrap();
        let err = MetricsWriter::resume(&path, 1).err().unwrap().to_string();
        assert!(err.contains("line 1"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn resume_drops_a_torn_last_line() {
        let dir = temp_dir("torn");
        let path = dir.join("metrics.jsonl");
        let mut writer = MetricsWriter::create(&path).unwrap();
        writer.append(&line(0, 3.0)).unwrap();
        writer.append(&line(1, 2.0)).unwrap();
        drop(writer);
        let text = fs::read_to_string(&path).unwrap();
        // Killed halfway through writing step 1's line.
        fs::write(&path, &text[..text.len() - 20]).unwrap();
        let mut resumed = MetricsWriter::resume(&path, 2).unwrap();
        resumed.append(&line(1, 1.5)).unwrap();
        let steps: Vec<(u64, f32)> = read_metrics(&path).unwrap().iter().map(|m| (m.step, m.loss)).collect();
        assert_eq!(steps, vec![(0, 3.0), (1, 1.5)]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_resume_into_a_new_directory_creates_it_and_starts_empty() {
        let dir = temp_dir("resume-new-dir");
        let path = dir.join("fp8-delayed").join("metrics.jsonl");
        let mut resumed = MetricsWriter::resume(&path, 3).unwrap();
        resumed.append(&line(3, 2.5)).unwrap();
        let steps: Vec<u64> = read_metrics(&path).unwrap().iter().map(|m| m.step).collect();
        assert_eq!(steps, vec![3]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_summary_from_before_the_answer_loss_reads_it_as_nan() {
        let dir = temp_dir("old-summary");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("summary.json");
        let old = r#"{"fp32": {"final_train_loss": 0.5, "heldout_loss": 0.6, "heldout_accuracy": 1.0,
                      "tokens_per_s": 10.0, "peak_bytes": 3}}"#;
        fs::write(&path, old).unwrap();
        let summary = read_summary(&path).unwrap();
        assert!(summary["fp32"].heldout_answer_loss.is_nan());
        assert!(summary["fp32"].model_flop_per_s.is_nan() && summary["fp32"].mfu.is_nan());
        assert_eq!(summary["fp32"].heldout_loss, 0.6);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn summary_round_trips() {
        let dir = temp_dir("summary");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("summary.json");
        let mut summary = Summary::new();
        for (name, loss) in [("fp32", 0.5f32), ("fp8-delayed", 0.52)] {
            summary.insert(
                name.to_string(),
                PrecisionSummary {
                    final_train_loss: loss,
                    heldout_loss: loss + 0.1,
                    heldout_answer_loss: loss / 4.0,
                    heldout_accuracy: 0.9,
                    tokens_per_s: 5000.0,
                    peak_bytes: 1 << 20,
                    device_peak_bytes: (name == "fp8-delayed").then_some(3 << 30),
                    model_flop_per_s: 2.5e12,
                    mfu: 0.25,
                },
            );
        }
        write_summary(&path, &summary).unwrap();
        assert_eq!(read_summary(&path).unwrap(), summary);
        fs::remove_dir_all(&dir).unwrap();
    }
}
