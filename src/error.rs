//! The crate's error type: every failure a user can cause is a value, never a panic.

use thiserror::Error;

/// Everything that can go wrong in fp8-engine, with the offending values in the message.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// Two buffers that must have the same number of elements do not.
    #[error("length mismatch: {what}: source has {src} elements, destination has {dst}")]
    LengthMismatch { what: &'static str, src: usize, dst: usize },
    /// A scale that is not finite and positive.
    #[error("invalid scale {value}: a scale must be finite and greater than zero")]
    InvalidScale { value: f32 },
    /// A format name that is not known.
    #[error("unknown format '{name}' (expected one of: {expected})")]
    UnknownFormat { name: String, expected: &'static str },
    /// A format that cannot be used for this operation.
    #[error("format {format} cannot be used here: {reason}")]
    UnsupportedFormat { format: &'static str, reason: &'static str },
    /// A SIMD instruction set was requested that this CPU does not have.
    #[error("instruction set {isa} is not available on this CPU")]
    IsaUnavailable { isa: &'static str },
    /// A SIMD path gave different bits than the scalar reference in its self-check.
    #[error("instruction set {isa} failed its self-check against the scalar path: {detail}")]
    IsaMismatch { isa: &'static str, detail: String },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
