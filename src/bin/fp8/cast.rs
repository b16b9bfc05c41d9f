//! `fp8 cast`: raw little-endian f32 on stdin -> one FP8 byte per value on stdout.

use clap::Args;
use fp8_engine::convert::quantize;
use fp8_engine::format::{Fp8Format, Overflow};
use rayon::prelude::*;

use crate::error::CliError;
use crate::{args, raw_io};

/// Values per parallel task: a 32 KiB f32 buffer on the worker's stack, and
/// ~10 us of work, large enough to hide rayon's per-task cost.
const CHUNK: usize = 8192;

/// Cast raw little-endian f32 from stdin to FP8, one byte per value on stdout.
///
/// q = cast(x * S), round to nearest even; out-of-range values clamp to
/// +-max finite (448 for e4m3, 57344 for e5m2) unless --no-saturate is given.
///
/// stdin is read whole into memory and converted before anything is written,
/// so an N-byte input needs about 1.25 N bytes of RAM.
#[derive(Args)]
#[command(after_help = "Example: fp8 cast --to e4m3 --scale 0.5 < x.f32 > x.e4m3")]
pub struct CastArgs {
    /// Target format: e4m3 or e5m2.
    #[arg(long, value_name = "FORMAT", value_parser = args::fp8_format)]
    to: Fp8Format,
    /// Multiply every value by S before the cast; finite and greater than zero.
    #[arg(long, value_name = "S", default_value = "1", value_parser = args::scale, allow_hyphen_values = true)]
    scale: f32,
    /// Overflow the OCP way instead of clamping: to NaN in e4m3 (no inf), to +-inf in e5m2.
    #[arg(long)]
    no_saturate: bool,
}

/// Runs `fp8 cast`.
pub fn run(args: CastArgs) -> Result<(), CliError> {
    let input = raw_io::read_stdin("little-endian f32 data")?;
    if !input.len().is_multiple_of(4) {
        return Err(CliError(format!(
            "stdin holds {} bytes, which is not a whole number of 4-byte f32 values ({} left over)",
            input.len(),
            input.len() % 4
        )));
    }
    let overflow = if args.no_saturate {
        Overflow::NonSaturating
    } else {
        Overflow::Saturate
    };
    let mut codes = vec![0u8; input.len() / 4];
    cast_le_f32(&input, &mut codes, args.to, args.scale, overflow)?;
    raw_io::write_stdout(&codes)
}

/// `codes[i] = cast(f32::from_le_bytes(raw[4i..4i+4]) * scale)`, chunks in parallel.
fn cast_le_f32(
    raw: &[u8],
    codes: &mut [u8],
    format: Fp8Format,
    scale: f32,
    overflow: Overflow,
) -> Result<(), CliError> {
    codes
        .par_chunks_mut(CHUNK)
        .zip(raw.par_chunks(4 * CHUNK))
        .try_for_each(|(codes, raw)| {
            let mut values = [0.0f32; CHUNK];
            let values = &mut values[..codes.len()];
            for (value, bytes) in values.iter_mut().zip(raw.chunks_exact(4)) {
                *value = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
            quantize(values, codes, format, scale, overflow)
                .map(|_amax| ())
                .map_err(CliError::from)
        })
}
