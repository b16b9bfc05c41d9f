//! `fp8 bench layer --breakdown`: the recorded op times of the timed steps grouped into op
//! families, forward and backward, per step; what no op accounts for (allocation, the dtype
//! rounding of layer outputs, bookkeeping) is the "outside ops" row.

use fp8_engine::op_times::{OpTime, Phase};

/// The family of a backend op, in the order the table prints them.
const FAMILIES: [(&str, &[&str]); 11] = [
    ("GEMMs", &["gemm"]),
    ("FP8 casts (quantize)", &["quantize"]),
    (
        "FP8 statistics, scaling",
        &["cast_stats", "uncast_stats", "delayed_update"],
    ),
    ("dtype conversions, transposes", &["convert", "convert_transposed"]),
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
    ("attention core", &["attention_forward", "attention_backward"]),
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
}

fn family(op: &str) -> &'static str {
    FAMILIES
        .iter()
        .find(|(_, ops)| ops.contains(&op))
        .map_or(OTHER_OPS, |(name, _)| name)
}

impl Breakdown {
    /// `ops` recorded over `steps` steps that took `total_seconds` together.
    pub fn new(ops: &[OpTime], total_seconds: f64, steps: usize) -> Self {
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
        Breakdown {
            rows,
            step_ms,
            outside_ms: step_ms - in_ops,
        }
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
    }

    pub fn json(&self) -> serde_json::Value {
        let families: Vec<_> = self
            .rows
            .iter()
            .map(|&(name, fwd, bwd, calls)| {
                serde_json::json!({"family": name, "forward_ms": fwd, "backward_ms": bwd, "calls_per_step": calls})
            })
            .collect();
        serde_json::json!({"step_ms": self.step_ms, "outside_ops_ms": self.outside_ms, "families": families})
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        let b = Breakdown::new(&ops, 0.2, 2);
        assert_eq!(
            b.rows,
            vec![
                ("GEMMs", 20.0, 40.0, 12.0),
                ("activations", 0.0, 5.0, 1.0),
                (OTHER_OPS, 1.0, 0.0, 1.0)
            ]
        );
        assert!((b.step_ms - 100.0).abs() < 1e-9 && (b.outside_ms - 34.0).abs() < 1e-9);
    }
}
