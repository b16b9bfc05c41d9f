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
    /// A GPU was asked for but none can be used (no driver, no device, unsupported device).
    #[error("no usable GPU: {reason}")]
    NoGpu { reason: String },
    /// The crate was compiled on a machine without nvcc, so it has no kernels to run.
    #[error("built without CUDA kernels (no nvcc at build time): run scripts/install-nvcc.sh and rebuild")]
    KernelsMissing,
    /// A CUDA driver call failed; `name` is the CUDA error name (e.g. CUDA_ERROR_OUT_OF_MEMORY).
    #[error("CUDA error {name} in {call}: {message}")]
    Cuda {
        call: String,
        name: String,
        message: String,
    },
    /// A device name that is not `auto`, `cpu`, `cuda` or `cuda:N`.
    #[error("unknown device '{name}' (expected auto, cpu, cuda or cuda:N)")]
    UnknownDevice { name: String },
    /// Buffers or shapes passed to a GPU kernel do not fit together.
    #[error("GPU kernel {kernel}: {detail}")]
    KernelArgs { kernel: &'static str, detail: String },
    /// A recipe setting outside its valid range.
    #[error("invalid recipe setting {setting} = {value}: {reason}")]
    InvalidRecipe {
        setting: &'static str,
        value: String,
        reason: String,
    },
    /// A buffer whose length does not match the shape it is used with.
    #[error("shape mismatch: {what}: shape {rows}x{cols} needs {expected} elements, got {got}")]
    ShapeMismatch {
        what: &'static str,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    /// A file that is not what it claims to be (corrupt header, missing metadata).
    #[error("{path}: {reason}")]
    InvalidFile { path: String, reason: String },
    /// A tensor that cannot be processed, named.
    #[error("tensor '{name}': {reason}")]
    InvalidTensor { name: String, reason: String },
    /// A module index past the end of a scaling state.
    #[error("no module {module}: the scaling state has {modules} modules")]
    NoSuchModule { module: usize, modules: usize },
    /// A precision name that is not one of the known ones.
    #[error("unknown precision '{name}' (expected one of: {expected})")]
    UnknownPrecision { name: String, expected: &'static str },
    /// A precision the device cannot run (e.g. FP8 without FP8 tensor cores).
    #[error("precision {precision} is not available on {device}: {reason}")]
    PrecisionUnsupported {
        precision: String,
        device: String,
        reason: String,
    },
    /// A layer given an input of the wrong shape, or built with dimensions its precision cannot take.
    #[error("layer {layer}: {detail}")]
    LayerShape { layer: String, detail: String },
    /// A shape that an operation cannot work with (zero-sized where it must not be, overflow).
    #[error("invalid shape for {what}: {reason}")]
    InvalidShape { what: &'static str, reason: String },
    /// An index (token id, class target) past the end of what it indexes.
    #[error("{what} {index} at position {position} is out of range: must be below {len}")]
    IndexOutOfRange {
        what: &'static str,
        index: u64,
        position: usize,
        len: usize,
    },
    /// A line of a text input that does not parse.
    #[error("line {line}: {reason}: '{text}'")]
    InvalidLine {
        line: usize,
        text: String,
        reason: &'static str,
    },
    /// A training or data setting outside its valid range (learning rate, schedule, dataset shape).
    #[error("invalid setting {setting} = {value}: {reason}")]
    InvalidSetting {
        setting: &'static str,
        value: String,
        reason: String,
    },
    /// A well-formed checkpoint that does not fit the live model or optimizer; nothing was loaded.
    #[error("{path}: checkpoint does not match the model: {reason}")]
    CheckpointMismatch { path: String, reason: String },
    /// A job that needs more memory than the machine has (checked before allocating).
    #[error("{what} needs {needed}, and {available} are available")]
    NotEnoughMemory {
        what: String,
        needed: String,
        available: String,
    },
    /// An op the backend of a device does not implement (yet); nothing ran.
    #[error("op {op} is not implemented on {device} yet (run on the CPU with --device cpu)")]
    Unsupported { op: &'static str, device: String },
    /// Shadow mode: an op's result broke its contract against its CPU twin (`docs/numerics.md`,
    /// Op contracts between backends); `index` is the first element that differs.
    #[error(
        "op {op} in layer {layer} differs from its CPU twin at element {index}: {primary} vs {cpu} on the CPU, \
         |difference| / bound = {ratio:.3} with bound {bound:e} (0: the same bits)"
    )]
    TwinMismatch {
        op: &'static str,
        layer: String,
        index: usize,
        primary: f64,
        cpu: f64,
        /// How far apart the op's contract allows the two there (0: the same bits).
        bound: f64,
        /// `|primary - cpu| / bound`: above 1 is the breach (infinite for a bound of 0).
        ratio: f64,
    },
    /// An op got an input that lives on another device than the one it runs on.
    #[error("op {op} runs on {expected} but got an input on {got}")]
    DeviceMismatch {
        op: &'static str,
        expected: String,
        got: String,
    },
    /// A collective operation of a data-parallel group failed (`docs/distributed.md`): ranks
    /// disagreed on the call, a rank stopped, or the transport failed.
    #[error("collective {op} on rank {rank}: {reason}")]
    Collective {
        op: &'static str,
        rank: usize,
        reason: String,
    },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
