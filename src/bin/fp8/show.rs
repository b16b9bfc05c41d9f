//! `fp8 show VALUE`: how one number lands in each format: code, fields,
//! decoded value, neighbours, relative error and what happened on the way.

use clap::Args;
use fp8_engine::format::{Format, Overflow};

use crate::args;
use crate::error::CliError;
use crate::number_text::{exact_decimal, readable};
use crate::raw_io::print_text;
use crate::table::Table;

/// Show how one number encodes in each format.
///
/// For every format (or only --format): the code in hex and as sign/exponent/mantissa bits, the decoded value, the
/// representable neighbours below and above that value, the relative error (decoded - x) / x, and flags:
///
/// saturated: x (or inf) clamped to +-max finite; flushed-to-zero: a nonzero x decodes to 0; overflow-to-inf,
/// overflow-to-nan: a finite x overflowed (--no-saturate only); subnormal: decodes to a subnormal; negative-to-nan:
/// e8m0 has no sign.
#[derive(Args)]
#[command(after_help = "Examples: fp8 show 1000    fp8 show -1e-7 --format e5m2    fp8 show 500 --no-saturate")]
pub struct ShowArgs {
    /// The number: decimal or scientific (1000, -2.5e-3), inf, -inf or nan; rounded to f32 first.
    #[arg(value_name = "VALUE", allow_hyphen_values = true)]
    value: String,
    /// Only this format: e4m3, e5m2, e8m0, bf16 or fp16 (default: all).
    #[arg(long, value_name = "FORMAT", value_parser = args::format)]
    format: Option<Format>,
    /// Overflow the OCP/IEEE way (to inf, or NaN where there is no inf) instead of clamping to +-max.
    #[arg(long)]
    no_saturate: bool,
}

/// Runs `fp8 show`.
pub fn run(args: ShowArgs) -> Result<(), CliError> {
    let x: f32 = args.value.trim().parse().map_err(|_| {
        CliError(format!(
            "value '{}' is not a number (expected decimal, scientific, inf, -inf or nan)",
            args.value
        ))
    })?;
    let overflow = if args.no_saturate {
        Overflow::NonSaturating
    } else {
        Overflow::Saturate
    };
    let formats: Vec<Format> = args.format.map_or_else(|| Format::ALL.to_vec(), |f| vec![f]);

    let mut table = Table::new(&[
        "format",
        "code",
        "bits s/e/m",
        "value",
        "below",
        "above",
        "rel error",
        "flags",
    ]);
    for format in formats {
        table.push(row(format, x, overflow));
    }
    let exact_x = exact_decimal(x as f64);
    let x_text = if exact_x.len() <= 64 { exact_x } else { format!("{x:e}") };
    let mode = match overflow {
        Overflow::Saturate => "saturating",
        Overflow::NonSaturating => "non-saturating",
    };
    print_text(&format!(
        "x = {x_text} (f32 0x{:08X}), {mode}\n{}",
        x.to_bits(),
        table.render()
    ))
}

fn row(format: Format, x: f32, overflow: Overflow) -> Vec<String> {
    let code = format.encode(x, overflow);
    let decoded = format.decode(code);
    let (below, above) = format.neighbours(code);
    let neighbour = |n: Option<f32>| n.map_or_else(|| "-".to_string(), |v| readable(v as f64));
    let flags = flags(format, x, decoded, overflow);
    vec![
        format.name().to_string(),
        format!("0x{code:0width$X}", width = format.storage_bits() as usize / 4),
        bit_fields(format, code),
        readable(decoded as f64),
        neighbour(below),
        neighbour(above),
        relative_error(x, decoded),
        if flags.is_empty() {
            "-".to_string()
        } else {
            flags.join(",")
        },
    ]
}

/// The code in binary, sign, exponent and mantissa fields apart: `0 1111 110`.
fn bit_fields(format: Format, code: u16) -> String {
    let limits = format.limits();
    let total = (limits.sign_bits + limits.exponent_bits + limits.mantissa_bits) as usize;
    let binary = format!("{code:0total$b}");
    let (sign, rest) = binary.split_at(limits.sign_bits as usize);
    let (exponent, mantissa) = rest.split_at(limits.exponent_bits as usize);
    [sign, exponent, mantissa]
        .iter()
        .filter(|field| !field.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `(decoded - x) / x`, or `-` where it means nothing (x zero, inf or NaN, or decoded not finite).
fn relative_error(x: f32, decoded: f32) -> String {
    if x == 0.0 || !x.is_finite() || !decoded.is_finite() {
        return "-".into();
    }
    // Both are f32, so the f64 difference is exact short of a 2^29 exponent gap.
    let error = (decoded as f64 - x as f64) / x as f64;
    if error == 0.0 {
        "0".into()
    } else {
        format!("{error:+.4e}")
    }
}

fn flags(format: Format, x: f32, decoded: f32, overflow: Overflow) -> Vec<&'static str> {
    let limits = format.limits();
    let mut flags = Vec::new();
    let unsigned = limits.sign_bits == 0;
    if unsigned && x < 0.0 {
        flags.push("negative-to-nan");
    } else if !x.is_nan() {
        // Saturation is the clamp changing the result: the same value cast
        // without it would have left the finite range (464 -> 448 in e4m3 is rounding, not saturation).
        let unclamped = format.decode(format.encode(x, Overflow::NonSaturating));
        if overflow == Overflow::Saturate && !unclamped.is_finite() && decoded.is_finite() {
            flags.push("saturated");
        }
        if overflow == Overflow::NonSaturating && x.is_finite() && !decoded.is_finite() {
            flags.push(if decoded.is_nan() {
                "overflow-to-nan"
            } else {
                "overflow-to-inf"
            });
        }
    }
    if x != 0.0 && !x.is_nan() && decoded == 0.0 {
        flags.push("flushed-to-zero");
    }
    if decoded != 0.0 && decoded.is_finite() && (decoded.abs() as f64) < limits.min_normal {
        flags.push("subnormal");
    }
    flags
}
