//! `fp8 bench layer --breakdown`: the recorded op times of the timed steps grouped into op
//! families, forward and backward, per step; what no op accounts for (allocation,
//! bookkeeping, the host work of the layers between their ops) is the "outside ops" row. On the staged CUDA backend a
//! second table splits the ops' time into copies, waits for the GPU, allocations and the rest.

use fp8_engine::op_times::{OpTime, Phase, Transfer, TransferTimes};

/// The family of a backend op, in the order the table prints them.
const FAMILIES: [(&str, &[&str]); 11] = [
    ("GEMMs", &["gemm", "gemm_into"]),
    ("FP8 casts (quantize)", &["quantize"]),
    (
        "FP8 statistics, scaling",
        &["cast_stats", "uncast_stats", "record_amax", "delayed_update"],
    ),
    (
        "dtype conversions, transposes, roundings, column copies",
        &["convert", "convert_transposed", "round", "copy_columns"],
    ),
    (
        "norms",
        &[
            "layernorm_forward",
            "layernorm_backward",
            "rmsnorm_forward",
            "rmsnorm_backward",
        ],
    ),
    (
        "activations",
        &["gelu_forward", "gelu_backward", "swiglu_forward", "swiglu_backward"],
    ),
    (
        "attention core, rotary embedding",
        &[
            "attention_forward",
            "attention_backward",
            "attention_cached",
            "rope_forward",
            "rope_backward",
        ],
    ),
    ("residual adds", &["residual_add"]),
    ("bias gradients", &["column_sum"]),
    ("optimizer", &["adamw", "sum_squares", "unscale_and_check"]),
    (
        "embedding, loss",
        &[
            "embedding_forward",
            "embedding_backward",
            "cross_entropy_forward",
            "cross_entropy_backward",
        ],
    ),
];
/// Ops not listed above (added to the backend later) are counted here.
const OTHER_OPS: &str = "other ops";

/// Milliseconds per step of each family, forward and backward.
pub struct Breakdown {
    /// (family, forward ms, backward ms, calls per step).
    rows: Vec<(&'static str, f64, f64, f64)>,
    /// Mean step time, and the part of it outside every op (ms).
    step_ms: f64,
    outside_ms: f64,
    /// Time in all ops, per step (ms).
    in_ops_ms: f64,
    /// Per step, inside the ops: (kind, ms, bytes, calls) of the staged copies, waits and
    /// allocations; empty when nothing was staged (the CPU backend).
    transfers: Vec<(Transfer, f64, f64, f64)>,
}

fn family(op: &str) -> &'static str {
    FAMILIES
        .iter()
        .find(|(_, ops)| ops.contains(&op))
        .map_or(OTHER_OPS, |(name, _)| name)
}

impl Breakdown {
    /// `ops` recorded over `steps` steps that took `total_seconds` together.
    pub fn new(ops: &[OpTime], transfers: &TransferTimes, total_seconds: f64, steps: usize) -> Self {
        let per_step = 1e3 / steps as f64;
        let mut rows: Vec<(&'static str, f64, f64, f64)> = FAMILIES
            .iter()
            .map(|(name, _)| *name)
            .chain([OTHER_OPS])
            .map(|name| (name, 0.0, 0.0, 0.0))
            .collect();
        let mut in_ops = 0.0;
        for t in ops {
            let ms = t.total.as_secs_f64() * per_step;
            in_ops += ms;
            if let Some(row) = rows.iter_mut().find(|r| r.0 == family(t.op)) {
                match t.phase {
                    Phase::Backward => row.2 += ms,
                    _ => row.1 += ms,
                }
                row.3 += t.calls as f64 / steps as f64;
            }
        }
        rows.retain(|r| r.3 > 0.0);
        let step_ms = total_seconds * per_step;
        let transfers = match transfers.iter().any(|t| t.calls > 0) {
            true => Transfer::ALL
                .iter()
                .zip(transfers)
                .map(|(&kind, t)| {
                    let ms = t.total.as_secs_f64() * per_step;
                    (kind, ms, t.bytes as f64 / steps as f64, t.calls as f64 / steps as f64)
                })
                .collect(),
            false => Vec::new(),
        };
        Breakdown {
            rows,
            step_ms,
            outside_ms: step_ms - in_ops,
            in_ops_ms: in_ops,
            transfers,
        }
    }

    /// Time in the ops not spent copying, waiting or allocating (host work inside the ops:
    /// padding, host-side transposes, launches, frees), per step (ms).
    fn rest_of_ops_ms(&self) -> f64 {
        self.in_ops_ms - self.transfers.iter().map(|t| t.1).sum::<f64>()
    }

    pub fn print(&self, precision: &str) {
        println!("{precision}: time per step by op family (mean of the timed steps)");
        println!(
            "{:<32} {:>10} {:>10} {:>8} {:>8}",
            "family", "fwd ms", "bwd ms", "share", "calls"
        );
        let share = |ms: f64| 100.0 * ms / self.step_ms.max(f64::MIN_POSITIVE);
        for &(name, fwd, bwd, calls) in &self.rows {
            println!(
                "{name:<32} {fwd:>10.2} {bwd:>10.2} {:>7.1}% {calls:>8.0}",
                share(fwd + bwd)
            );
        }
        println!(
            "{:<32} {:>21.2} {:>7.1}%",
            "outside ops",
            self.outside_ms,
            share(self.outside_ms)
        );
        println!("{:<32} {:>21.2}", "step", self.step_ms);
        if self.transfers.is_empty() {
            return;
        }
        println!("{precision}: inside the staged CUDA ops, per step");
        println!(
            "{:<32} {:>10} {:>10} {:>8} {:>8}",
            "part", "ms", "GB/s", "share", "calls"
        );
        for &(kind, ms, bytes, calls) in &self.transfers {
            if kind.is_saving() {
                // Not time: bytes a device copy saved uploading.
                println!("{:<32} {:>10} {:>10.3} GB {calls:>8.0}", kind.label(), "-", bytes / 1e9);
                continue;
            }
            let rate = match kind {
                Transfer::HostToDevice | Transfer::DeviceToHost if ms > 0.0 => format!("{:.1}", bytes / ms / 1e6),
                _ => "-".to_string(),
            };
            println!(
                "{:<32} {ms:>10.2} {rate:>10} {:>7.1}% {calls:>8.0}",
                kind.label(),
                share(ms)
            );
        }
        let rest = self.rest_of_ops_ms();
        println!(
            "{:<32} {rest:>10.2} {:>10} {:>7.1}%",
            "rest of the ops (host work)",
            "-",
            share(rest)
        );
    }

    pub fn json(&self) -> serde_json::Value {
        let families: Vec<_> = self
            .rows
            .iter()
            .map(|&(name, fwd, bwd, calls)| {
                serde_json::json!({"family": name, "forward_ms": fwd, "backward_ms": bwd, "calls_per_step": calls})
            })
            .collect();
        let transfers: Vec<_> = self
            .transfers
            .iter()
            .map(|&(kind, ms, bytes, calls)| {
                serde_json::json!({"part": kind.label(), "ms": ms, "bytes": bytes, "calls_per_step": calls})
            })
            .collect();
        let mut doc =
            serde_json::json!({"step_ms": self.step_ms, "outside_ops_ms": self.outside_ms, "families": families});
        if !transfers.is_empty() {
            doc["staged"] = serde_json::json!({"parts": transfers, "rest_of_ops_ms": self.rest_of_ops_ms()});
        }
        doc
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fp8_engine::op_times::TransferTime;

    use super::*;

    fn op(op: &'static str, phase: Phase, ms: u64, calls: u64) -> OpTime {
        OpTime {
            op,
            phase,
            total: Duration::from_millis(ms),
            calls,
        }
    }

    #[test]
    fn ops_fall_into_families_per_phase_and_step() {
        let ops = [
            op("gemm", Phase::Forward, 40, 8),
            op("gemm", Phase::Backward, 80, 16),
            op("gelu_backward", Phase::Backward, 10, 2),
            op("a_new_op", Phase::Forward, 2, 2),
        ];
        // Two steps of 100 ms: 66 ms per step in ops, 34 outside.
        let b = Breakdown::new(&ops, &TransferTimes::default(), 0.2, 2);
        assert_eq!(
            b.rows,
            vec![
                ("GEMMs", 20.0, 40.0, 12.0),
                ("activations", 0.0, 5.0, 1.0),
                (OTHER_OPS, 1.0, 0.0, 1.0)
            ]
        );
        assert!((b.step_ms - 100.0).abs() < 1e-9 && (b.outside_ms - 34.0).abs() < 1e-9);
        assert!(b.transfers.is_empty(), "nothing staged: no second table");
        assert!(b.json().get("staged").is_none());
    }

    #[test]
    fn staged_parts_are_split_out_of_the_ops_time_per_step() {
        let ops = [op("gemm", Phase::Forward, 60, 4)];
        let mut transfers = TransferTimes::default();
        transfers[0] = TransferTime {
            total: Duration::from_millis(20),
            bytes: 4_000_000,
            calls: 6,
        };
        transfers[2] = TransferTime {
            total: Duration::from_millis(10),
            bytes: 0,
            calls: 2,
        };
        // Two steps: 30 ms of GEMMs per step, of which 10 copying up and 5 waiting.
        let b = Breakdown::new(&ops, &transfers, 0.1, 2);
        assert_eq!(b.transfers.len(), Transfer::ALL.len());
        assert_eq!(b.transfers[0], (Transfer::HostToDevice, 10.0, 2_000_000.0, 3.0));
        assert_eq!(b.transfers[2], (Transfer::WaitForGpu, 5.0, 0.0, 1.0));
        assert!((b.rest_of_ops_ms() - 15.0).abs() < 1e-9);
        let staged = &b.json()["staged"];
        assert_eq!(staged["parts"].as_array().unwrap().len(), Transfer::ALL.len());
        assert!((staged["rest_of_ops_ms"].as_f64().unwrap() - 15.0).abs() < 1e-9);
    }
}
