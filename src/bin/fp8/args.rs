//! Value parsers shared by the subcommands. Each returns a one-line message
//! naming the bad value and what would have been accepted.

use fp8_engine::Error;
use fp8_engine::format::{Format, Fp8Format};

/// Any format name the crate knows (`e4m3`, `e5m2`, `e8m0`, `bf16`, `fp16` and aliases).
pub fn format(text: &str) -> Result<Format, String> {
    text.parse::<Format>().map_err(|err| err.to_string())
}

/// A format restricted to the ones a subcommand handles: an unknown name and a
/// known but unusable one both get a message listing `allowed`.
pub fn format_among(text: &str, allowed: &[Format], reason: &'static str) -> Result<Format, String> {
    let names = || allowed.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
    match text.parse::<Format>() {
        Ok(found) if allowed.contains(&found) => Ok(found),
        Ok(found) => Err(format!(
            "format {found} cannot be used here: {reason} (expected one of: {})",
            names()
        )),
        Err(_) => Err(format!("unknown format '{text}' (expected one of: {})", names())),
    }
}

/// An FP8 data format: `e4m3` or `e5m2`.
pub fn fp8_format(text: &str) -> Result<Fp8Format, String> {
    let found = format_among(
        text,
        &[Format::E4M3, Format::E5M2],
        "only FP8 data formats are one byte per value",
    )?;
    found
        .fp8()
        .ok_or_else(|| format!("format {found} is not an FP8 data format"))
}

/// A scale: a number that is finite and greater than zero once rounded to f32.
pub fn scale(text: &str) -> Result<f32, String> {
    let value: f32 = text
        .trim()
        .parse()
        .map_err(|_| format!("scale '{text}' is not a number"))?;
    if value.is_finite() && value > 0.0 {
        return Ok(value);
    }
    let message = Error::InvalidScale { value }.to_string();
    // "1e-50" is a fine positive number that becomes 0 in f32: say so.
    match text.trim().parse::<f64>() {
        Ok(wide) if wide.is_finite() && wide > 0.0 => Err(format!("{message} ('{text}' rounds to {value} in f32)")),
        _ => Err(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales() {
        assert_eq!(scale("0.5"), Ok(0.5));
        assert_eq!(scale("1e3"), Ok(1000.0));
        for bad in ["0", "-1", "inf", "nan", "1e-50", "1e39", "abc", ""] {
            let message = scale(bad).unwrap_err().to_lowercase();
            assert!(
                message.contains(&format!("'{bad}'")) || message.contains(bad),
                "{bad}: {message}"
            );
        }
    }

    #[test]
    fn formats_among_a_subset() {
        assert_eq!(fp8_format("E4M3FN"), Ok(Fp8Format::E4M3));
        assert!(fp8_format("bf16").unwrap_err().contains("e4m3, e5m2"));
        assert!(fp8_format("e9m9").unwrap_err().contains("unknown format 'e9m9'"));
    }
}
