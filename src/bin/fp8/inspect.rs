//! `fp8 inspect`: per-tensor statistics of a safetensors file.

use std::path::PathBuf;

use clap::Args;
use fp8_engine::tools::inspect::{inspect_file, render};

use crate::error::CliError;
use crate::raw_io;

/// Per tensor: shape, dtype and amax; for FP8 tensors written by `fp8 quantize`
/// also the share of values saturated and flushed to zero, and with
/// --reference the signal-to-quantization-noise ratio in dB.
#[derive(Args)]
#[command(after_help = "Example: fp8 inspect model.fp8.safetensors --reference model.safetensors")]
pub struct InspectArgs {
    /// The safetensors file to inspect.
    #[arg(value_name = "FILE.safetensors")]
    file: PathBuf,
    /// The original (unquantized) file, to measure clipping, flushing and SQNR.
    #[arg(long, value_name = "ORIG.safetensors")]
    reference: Option<PathBuf>,
}

/// Runs `fp8 inspect`.
pub fn run(args: InspectArgs) -> Result<(), CliError> {
    let reports = inspect_file(&args.file, args.reference.as_deref())?;
    raw_io::print_text(&render(&reports))
}
