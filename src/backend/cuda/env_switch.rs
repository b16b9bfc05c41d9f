//! Off switches read from the environment (`FP8_CUDA_ARENAS`, `FP8_CUDA_MIRRORS`,
//! `FP8_CUDA_PINNED`), so a GPU session can pin a failure or a slowdown on one shortcut of the
//! staged path without a rebuild. Unset or `1`: on; `0`: off; anything else is reported once
//! and leaves the switch on. Opt-in switches (`FP8_CUDA_RESIDENT`) are the reverse: off unless
//! set to `1`, for paths that have not yet run on a GPU.

/// Whether switch `var` is on (read on every call: callers keep the answer in a `OnceLock`).
pub(crate) fn on(var: &str) -> bool {
    let value = std::env::var(var).ok();
    parse(value.as_deref()).unwrap_or_else(|bad| {
        eprintln!("fp8-engine: warning: {var}={bad} is not 0 or 1; leaving it on");
        true
    })
}

/// Whether opt-in switch `var` is on: `1` turns on a path not yet validated on a GPU; unset or
/// `0`: off; anything else is reported once and leaves it off.
pub(crate) fn opted_in(var: &str) -> bool {
    let value = std::env::var(var).ok();
    parse_opt_in(value.as_deref()).unwrap_or_else(|bad| {
        eprintln!("fp8-engine: warning: {var}={bad} is not 0 or 1; leaving it off");
        false
    })
}

/// `None`, `0`: off; `1`: on; anything else is returned as the error.
fn parse_opt_in(value: Option<&str>) -> Result<bool, String> {
    match value {
        None => Ok(false),
        set => parse(set),
    }
}

/// Whether layers on a GPU keep their activations there between ops (`FP8_CUDA_RESIDENT=1`,
/// read once; `docs/cuda-backend.md`, Device-resident tensors).
pub(crate) fn resident_layers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| opted_in("FP8_CUDA_RESIDENT"))
}

/// `None`, `1`: on; `0`: off; anything else is returned as the error.
fn parse(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, parse_opt_in};

    #[test]
    fn opt_in_switches_are_off_unless_set_to_one_and_other_values_are_reported() {
        assert_eq!(parse_opt_in(None), Ok(false));
        assert_eq!(parse_opt_in(Some("0")), Ok(false));
        assert_eq!(parse_opt_in(Some(" 1 ")), Ok(true));
        assert_eq!(parse_opt_in(Some("yes")), Err("yes".to_string()));
    }

    #[test]
    fn switches_are_on_unless_set_to_zero_and_other_values_are_reported() {
        assert_eq!(parse(None), Ok(true));
        assert_eq!(parse(Some("1")), Ok(true));
        assert_eq!(parse(Some(" 0 ")), Ok(false));
        assert_eq!(parse(Some("off")), Err("off".to_string()));
    }
}
