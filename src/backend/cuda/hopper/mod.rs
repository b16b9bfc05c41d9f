//! The Hopper (sm_90a) FP8 GEMM fast path: `wgmma` + TMA, one producer and two
//! consumer warpgroups, a persistent grouped tile order (`cuda/gemm_wgmma_sm90.cu`).
//!
//! Host-side pieces, each tested on the CPU: tensor-map parameters
//! ([`tensor_map`]), the tile order ([`scheduler`], the kernel's formula), tile
//! shapes per problem ([`heuristic`]), the path choice and self-check
//! ([`self_check`]), the launcher ([`launch`], with test-only overrides), the
//! register guard ([`kernel_checks`]) and the exact first-run probes ([`probe`],
//! [`probe_epilogue`]).
//!
//! Not validated on a GPU yet, so it is off by default: `FP8_GEMM_PATH=auto`
//! (the default) runs the portable path; `FP8_GEMM_PATH=hopper` or
//! [`PathSelector::force`] selects this one. See `docs/hopper-gemm.md`.

pub mod heuristic;
pub mod kernel_checks;
pub mod launch;
pub mod probe;
pub mod probe_epilogue;
pub mod scheduler;
pub mod self_check;
pub mod tensor_map;

pub use heuristic::{TileConfig, choose};
pub use launch::{
    HopperGemm, HopperScales, LaunchPlan, LaunchShape, PlanOverride, device_capable, launch, launch_with, plan,
    plan_with,
};
pub use scheduler::TileGrid;
pub use self_check::{GemmPath, PathPreference, PathSelector, SelfCheckProblem, SelfCheckRun};
pub use tensor_map::TensorMapSpec;
