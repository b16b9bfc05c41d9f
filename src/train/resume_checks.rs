//! What a resume checks beyond the checkpoint's own integrity: that every
//! loaded value is in its range, and that the run being continued is the same
//! run, naming the first setting that differs.

use serde_json::Value;

use crate::scaling::DelayedSlot;

/// Settings of the run config that may change across a resume: they do not change the steps
/// already taken (`steps` extends or shortens the run, `checkpoint_every` only adds files).
pub const RESUMABLE_CHANGES: [&str; 2] = ["steps", "checkpoint_every"];

/// Why a delayed-scaling slot read from a checkpoint cannot be used, if it cannot: scales must
/// be finite and positive, amax values non-negative (an overflowed amax may be inf, never NaN).
pub fn slot_problem(slot: &DelayedSlot) -> Option<String> {
    for (what, value) in [("scale", slot.scale), ("scale_inv", slot.scale_inv)] {
        if !(value.is_finite() && value > 0.0) {
            return Some(format!("{what} {value} is not finite and positive"));
        }
    }
    slot.history.iter().position(|a| a.is_nan() || *a < 0.0).map(|i| {
        format!(
            "amax history entry {i} is {}, not a non-negative number",
            slot.history[i]
        )
    })
}

/// The first difference between the run identity saved in a checkpoint and this run's, as
/// `path: saved in the checkpoint, current in this run`; `None` when they agree. Members of the
/// `run` object named in [`RESUMABLE_CHANGES`] are not compared.
pub fn run_difference(saved: &Value, current: &Value) -> Option<String> {
    difference("", saved, current)
}

fn difference(path: &str, saved: &Value, current: &Value) -> Option<String> {
    match (saved, current) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|key| {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                if path == "run" && RESUMABLE_CHANGES.contains(&key.as_str()) {
                    return None;
                }
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => difference(&child, x, y),
                    (x, y) => Some(describe(&child, x, y)),
                }
            })
        }
        (a, b) if a == b => None,
        (a, b) => Some(describe(path, Some(a), Some(b))),
    }
}

fn describe(path: &str, saved: Option<&Value>, current: Option<&Value>) -> String {
    let show = |v: Option<&Value>| v.map_or("absent".to_string(), |v| crate::io::escaped(&v.to_string()));
    format!(
        "{} is {} in the checkpoint and {} in this run",
        if path.is_empty() { "the run" } else { path },
        show(saved),
        show(current)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_differing_field_is_named_and_resumable_changes_pass() {
        let saved = json!({"precision": "fp32", "run": {"steps": 10, "lr": 0.1, "model": {"hidden": 64}}});
        let longer = json!({"precision": "fp32", "run": {"steps": 20, "lr": 0.1, "model": {"hidden": 64}}});
        assert_eq!(run_difference(&saved, &longer), None);
        let wider = json!({"precision": "fp32", "run": {"steps": 10, "lr": 0.1, "model": {"hidden": 32}}});
        assert_eq!(
            run_difference(&saved, &wider).unwrap(),
            "run.model.hidden is 64 in the checkpoint and 32 in this run"
        );
        let other = json!({"precision": "bf16", "run": {"steps": 10, "lr": 0.1, "model": {"hidden": 64}}});
        assert!(
            run_difference(&saved, &other)
                .unwrap()
                .starts_with("precision is \"fp32\"")
        );
    }

    #[test]
    fn slots_out_of_range_are_named() {
        let good = DelayedSlot {
            scale: 2.0,
            scale_inv: 0.5,
            history: vec![0.0, f32::INFINITY],
        };
        assert_eq!(slot_problem(&good), None);
        let bad_scale = DelayedSlot {
            scale: f32::NAN,
            ..good.clone()
        };
        assert!(slot_problem(&bad_scale).unwrap().contains("scale NaN"));
        let bad_amax = DelayedSlot {
            history: vec![1.0, -1.0],
            ..good
        };
        assert!(slot_problem(&bad_amax).unwrap().contains("entry 1"));
    }
}
