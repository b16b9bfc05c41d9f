//! Scaled GEMM, one entry point for every precision (`docs/numerics.md`, GEMM):
//!
//! `D = alpha * (A . B^T) * scale_inv_A * scale_inv_B (+ bias) (+ beta * D_old)`
//!
//! with `A [M, K]` and `B [N, K]` both K-major ("TN", the only FP8 layout the
//! Ada/Hopper tensor cores take). Inputs are FP8 codes with per-tensor, 1x128,
//! 128x128 or MXFP8 scales, or plain f32/bf16/f16 for the fallback policies.
//! The output is f32, bf16, f16, or FP8 with an output scale; the amax of the
//! f32 result (before the output cast) is always reported.
//!
//! `cpu::gemm` is the reference; `plan` checks what every backend accepts, and
//! the CUDA GEMM in `backend::cuda` takes the same `Operand`/`Output`/`GemmParams`.

pub mod cpu;
mod operand;

pub(crate) use operand::read_back;
pub use operand::{Bias, FP8_K_MULTIPLE, GemmParams, GemmPlan, GemmReport, Mat, Operand, Output, ScalePair, plan};
pub(crate) use operand::{host_bias, plan_f32};
