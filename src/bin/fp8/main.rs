//! `fp8`: the command-line tool of fp8-engine. One module per subcommand;
//! every failure is one line on stderr and a non-zero exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod error;

use error::CliError;

#[derive(Parser)]
#[command(name = "fp8", version, about = "FP8 formats, quantization and training tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {}
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fp8: error: {err}");
            ExitCode::FAILURE
        }
    }
}
