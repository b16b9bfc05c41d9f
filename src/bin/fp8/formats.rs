//! `fp8 formats`: the limits of every format in one table, like `torch.finfo`.

use clap::Args;
use fp8_engine::format::{Format, FormatLimits};

use crate::error::CliError;
use crate::number_text::readable;
use crate::raw_io::print_text;
use crate::table::Table;

/// Print the limits and special encodings of every format in one table.
///
/// Values are exact: short ones as decimals, powers of two as 2^e with the
/// decimal (or ~approximation) in parentheses, long ones as m*2^e.
#[derive(Args)]
pub struct FormatsArgs {}

/// Runs `fp8 formats`.
pub fn run(_args: FormatsArgs) -> Result<(), CliError> {
    let mut table = Table::new(&[
        "format",
        "s/e/m",
        "bias",
        "max finite",
        "max code",
        "min normal",
        "min subnormal",
        "eps",
        "inf (+/-)",
        "NaN codes",
    ]);
    for format in Format::ALL {
        table.push(row(format));
    }
    print_text(&table.render())
}

fn row(format: Format) -> Vec<String> {
    let limits: &FormatLimits = format.limits();
    let hex = |code: u16| format!("0x{code:0width$X}", width = format.storage_bits() as usize / 4);
    let optional = |value: Option<f64>| value.map_or_else(|| "-".to_string(), readable);
    let infinity = limits
        .infinity
        .map_or_else(|| "none".to_string(), |(pos, neg)| format!("{}/{}", hex(pos), hex(neg)));
    let nan = limits
        .nan
        .iter()
        .map(|&(lo, hi)| {
            if lo == hi {
                hex(lo)
            } else {
                format!("{}-{}", hex(lo), hex(hi))
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        format.name().to_string(),
        format!("{}/{}/{}", limits.sign_bits, limits.exponent_bits, limits.mantissa_bits),
        limits.bias.to_string(),
        readable(limits.max_finite),
        hex(limits.max_finite_code),
        readable(limits.min_normal),
        optional(limits.min_subnormal),
        optional(limits.epsilon),
        infinity,
        if nan.is_empty() { "none".to_string() } else { nan },
    ]
}
