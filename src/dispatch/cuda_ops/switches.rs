//! Off switches for the newer shortcuts of the staged CUDA path, so a GPU session
//! can pin a failure on one of them without a rebuild: `FP8_CUDA_ARENAS=0` keeps
//! AdamW on the staged per-parameter ops, `FP8_CUDA_MIRRORS=0` makes casts keep
//! no device mirrors (every GEMM uploads its operands). Unset or `1`: on.

use std::sync::OnceLock;

/// Whether AdamW may keep its state in device arenas (`FP8_CUDA_ARENAS`).
pub(crate) fn arenas_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| read("FP8_CUDA_ARENAS"))
}

/// Whether casts may keep device mirrors (`FP8_CUDA_MIRRORS`).
pub(crate) fn mirrors_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| read("FP8_CUDA_MIRRORS"))
}

fn read(var: &str) -> bool {
    let value = std::env::var(var).ok();
    parse(value.as_deref()).unwrap_or_else(|bad| {
        eprintln!("fp8-engine: warning: {var}={bad} is not 0 or 1; leaving it on");
        true
    })
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
