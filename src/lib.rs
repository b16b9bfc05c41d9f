//! fp8-engine: FP8 transformer training in Rust.
//!
//! The numeric contract lives in `docs/numerics.md`. Every GPU kernel has a CPU
//! twin with the same bits, so FP8 numerics can be studied and tested anywhere.
//!
//! ```
//! use fp8_engine::format::{Fp8Format, Overflow};
//!
//! let code = Fp8Format::E4M3.encode(1000.0, Overflow::Saturate);
//! assert_eq!(Fp8Format::E4M3.decode(code), 448.0); // saturated to max finite
//! ```

pub mod amp;
pub mod backend;
pub mod convert;
pub mod data;
pub mod device;
mod dispatch;
pub mod dist;
pub mod error;
pub mod format;
pub mod gemm;
pub mod hf;
pub mod io;
pub mod memory;
pub mod model;
pub mod nn;
pub mod ops;
pub mod plan;
pub mod quantize;
pub mod scaling;
pub mod tensor;
pub mod tools;
pub mod train;

pub use dispatch::op_times;
pub use error::{Error, Result};

/// The README's Rust examples run as doc tests, so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
