//! Off switches for the newer shortcuts of the staged CUDA path (`backend::cuda::env_switch`):
//! `FP8_CUDA_ARENAS=0` keeps AdamW on the staged per-parameter ops, `FP8_CUDA_MIRRORS=0` makes
//! casts keep no device mirrors (every GEMM uploads its operands). Unset or `1`: on.
//! (`FP8_CUDA_RESIDENT` is read by `backend::cuda::env_switch::resident_layers`, the opt-in
//! `FP8_CUDA_DEVICE_BANKS=1` by `env_switch::device_slot_banks`.)

use std::sync::OnceLock;

use crate::backend::cuda::env_switch;

/// Whether AdamW may keep its state in device arenas (`FP8_CUDA_ARENAS`).
pub(crate) fn arenas_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env_switch::on("FP8_CUDA_ARENAS"))
}

/// Whether casts may keep device mirrors (`FP8_CUDA_MIRRORS`).
pub(crate) fn mirrors_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env_switch::on("FP8_CUDA_MIRRORS"))
}
