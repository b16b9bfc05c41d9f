//! Number formats: FP8 E4M3/E5M2 data, E8M0 scales, and bf16/fp16 (from `half`).
//!
//! Encoding is round-to-nearest-even, saturating by default; decoding is exact.

mod catalog;
mod e8m0;
mod fp8;
mod limits;

pub use catalog::Format;
pub use e8m0::{E8M0, decode_e8m0, encode_e8m0};
pub use fp8::{E4M3, E5M2, Fp8Format, Overflow};
pub use limits::{BF16_LIMITS, E4M3_LIMITS, E5M2_LIMITS, E8M0_LIMITS, FP16_LIMITS, FormatLimits};
