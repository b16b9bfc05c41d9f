//! The tool's error: a one-line message; the process exits with status 1.

use std::fmt;

/// A failure of a subcommand, printed as `fp8: error: MESSAGE`.
#[derive(Debug)]
pub struct CliError(pub String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<fp8_engine::Error> for CliError {
    fn from(err: fp8_engine::Error) -> Self {
        CliError(err.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> Self {
        CliError(format!("I/O: {err}"))
    }
}
