//! `fp8 decode`: one FP8 or E8M0 byte per value on stdin -> little-endian f32 on stdout.

use clap::Args;
use fp8_engine::convert::dequantize;
use fp8_engine::format::{Format, Fp8Format, decode_e8m0};
use rayon::prelude::*;

use crate::error::CliError;
use crate::{args, raw_io};

/// Codes per parallel task (a 32 KiB f32 buffer on the worker's stack).
const CHUNK: usize = 8192;

/// What `decode` reads: an FP8 data format or E8M0 scales.
#[derive(Clone, Copy, Debug)]
enum Source {
    Fp8(Fp8Format),
    E8m0,
}

fn source(text: &str) -> Result<Source, String> {
    let allowed = [Format::E4M3, Format::E5M2, Format::E8M0];
    match args::format_among(text, &allowed, "decode reads one-byte codes")? {
        Format::E8M0 => Ok(Source::E8m0),
        other => other
            .fp8()
            .map(Source::Fp8)
            .ok_or_else(|| format!("format {other} is not a one-byte format")),
    }
}

/// Decode bytes from stdin (e4m3, e5m2 or e8m0 codes) to little-endian f32 on stdout.
///
/// y = decode(q) * S: exact decoding, then one f32 multiply. Give the
/// reciprocal of the scale `cast` used to get back the original range.
///
/// stdin is read whole into memory and converted before anything is written,
/// so an N-byte input needs about 5 N bytes of RAM.
#[derive(Args)]
#[command(after_help = "Example: fp8 decode --from e4m3 --scale 2 < x.e4m3 > x.f32")]
pub struct DecodeArgs {
    /// Format of the input bytes: e4m3, e5m2 or e8m0.
    #[arg(long, value_name = "FORMAT", value_parser = source)]
    from: Source,
    /// Multiply every decoded value by S (the scale_inv); finite and greater than zero.
    #[arg(long, value_name = "S", default_value = "1", value_parser = args::scale, allow_hyphen_values = true)]
    scale: f32,
}

/// Runs `fp8 decode`.
pub fn run(args: DecodeArgs) -> Result<(), CliError> {
    let codes = raw_io::read_stdin("one-byte codes")?;
    let mut raw = vec![0u8; 4 * codes.len()];
    decode_to_le_f32(&codes, &mut raw, args.from, args.scale)?;
    raw_io::write_stdout(&raw)
}

/// `raw[4i..4i+4] = (decode(codes[i]) * scale).to_le_bytes()`, chunks in parallel.
fn decode_to_le_f32(codes: &[u8], raw: &mut [u8], from: Source, scale: f32) -> Result<(), CliError> {
    raw.par_chunks_mut(4 * CHUNK)
        .zip(codes.par_chunks(CHUNK))
        .try_for_each(|(raw, codes)| {
            let mut values = [0.0f32; CHUNK];
            let values = &mut values[..codes.len()];
            match from {
                Source::Fp8(format) => dequantize(codes, values, format, scale)?,
                Source::E8m0 => {
                    for (value, &code) in values.iter_mut().zip(codes) {
                        *value = decode_e8m0(code) * scale;
                    }
                }
            }
            for (bytes, value) in raw.chunks_exact_mut(4).zip(values.iter()) {
                bytes.copy_from_slice(&value.to_le_bytes());
            }
            Ok(())
        })
}
