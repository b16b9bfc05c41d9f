//! Off switches read from the environment (`FP8_CUDA_ARENAS`, `FP8_CUDA_MIRRORS`,
//! `FP8_CUDA_PINNED`, `FP8_CUDA_RESIDENT`, `FP8_CUDA_ATTENTION_MMA`), so a GPU session can pin a
//! failure or a slowdown on one path without a rebuild. Unset or `1`: on; `0`: off; anything
//! else is reported once and leaves the switch on. Opt-in switches for paths not yet run on a
//! GPU, `FP8_CUDA_DEVICE_BANKS` and `FP8_CUDA_ARENA_VIEWS`, are off unless set to `1`.

/// Whether switch `var` is on (read on every call: callers keep the answer in a `OnceLock`).
pub(crate) fn on(var: &str) -> bool {
    read(var, true)
}

/// Whether the opt-in switch `var` is set to 1 (a path not yet validated on a GPU).
fn opted_in(var: &str) -> bool {
    read(var, false)
}

/// Switch `var`: `1` on, `0` off, unset `unset`; anything else is reported and gives `unset`.
fn read(var: &str, unset: bool) -> bool {
    let Ok(value) = std::env::var(var) else {
        return unset;
    };
    parse(Some(&value)).unwrap_or_else(|bad| {
        let state = if unset { "on" } else { "off" };
        eprintln!("fp8-engine: warning: {var}={bad} is not 0 or 1; leaving it {state}");
        unset
    })
}

/// Whether layers on a GPU keep their activations there between ops (on unless
/// `FP8_CUDA_RESIDENT=0`, read once; `docs/cuda-backend.md`, Device-resident tensors). On by
/// default since the H200 run of 2026-11-28 (`train_resident`: every step of `fp8 train` the
/// same as staged, in fp32, bf16 and fp8-delayed); `0` keeps every op staged.
pub(crate) fn resident_layers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| on("FP8_CUDA_RESIDENT"))
}

/// Whether resident layers keep their delayed-scaling slot banks on the GPU
/// (`FP8_CUDA_DEVICE_BANKS=1`, read once; off until a GPU run validates it:
/// `docs/cuda-backend.md`, slot banks on the device).
pub(crate) fn device_slot_banks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| opted_in("FP8_CUDA_DEVICE_BANKS"))
}

/// Whether the optimizer's arenas lend parameters their ranges as device values and gradients
/// (`FP8_CUDA_ARENA_VIEWS=1`, read once; off until a GPU run validates it:
/// `docs/cuda-backend.md`, Optimizer state on the device).
pub(crate) fn arena_views() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| opted_in("FP8_CUDA_ARENA_VIEWS"))
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
    use super::parse;

    #[test]
    fn switches_are_on_unless_set_to_zero_and_other_values_are_reported() {
        assert_eq!(parse(None), Ok(true));
        assert_eq!(parse(Some("1")), Ok(true));
        assert_eq!(parse(Some(" 0 ")), Ok(false));
        assert_eq!(parse(Some("off")), Err("off".to_string()));
    }
}
