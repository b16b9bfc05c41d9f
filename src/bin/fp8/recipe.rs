//! `fp8 recipe replay`: the delayed-scaling update over an amax trace.

use std::io::Read;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use fp8_engine::format::Fp8Format;
use fp8_engine::scaling::DelayedScaling;
use fp8_engine::tools::replay;

use crate::delayed_args::DelayedArgs;
use crate::error::CliError;
use crate::{args, raw_io};

/// Scaling recipe tools.
#[derive(Args)]
pub struct RecipeArgs {
    #[command(subcommand)]
    command: RecipeCommand,
}

#[derive(Subcommand)]
enum RecipeCommand {
    Replay(ReplayArgs),
}

/// Replay delayed scaling over an amax trace, one amax per line (one training
/// step each; `nan`, `inf` and `0` accepted, blank and `#` lines skipped).
///
/// Prints `step amax scale` per step, step counting from 1, where scale is the
/// one in force after that step's update (the scale step + 1 casts with).
/// Numbers print in their shortest form that parses back to the same f32.
#[derive(Args)]
#[command(after_help = "Example: fp8 recipe replay --history-len 16 --algo max < amax.txt")]
struct ReplayArgs {
    #[command(flatten)]
    delayed: DelayedArgs,
    /// FP8 format of the tensor: e4m3 (max 448) or e5m2 (max 57344).
    #[arg(long, value_name = "FORMAT", default_value = "e4m3", value_parser = args::fp8_format)]
    format: Fp8Format,
    /// The trace; stdin when absent or `-`.
    #[arg(value_name = "TRACE")]
    input: Option<PathBuf>,
}

/// Runs `fp8 recipe ...`.
pub fn run(args: RecipeArgs) -> Result<(), CliError> {
    match args.command {
        RecipeCommand::Replay(args) => run_replay(args),
    }
}

fn run_replay(args: ReplayArgs) -> Result<(), CliError> {
    let recipe = args.delayed.apply(&DelayedScaling::default());
    recipe.validate()?;
    let (text, label) = match args.input.as_deref() {
        Some(path) if path.as_os_str() != "-" => (
            // A trace is one line per step: 1 GiB is millions of steps, and /dev/zero is refused.
            String::from_utf8(fp8_engine::io::read_regular(path, 1 << 30, "")?)
                .map_err(|_| CliError(format!("{}: not UTF-8 text", path.display())))?,
            path.display().to_string(),
        ),
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|err| CliError(format!("reading stdin: {err}")))?;
            (text, "stdin".to_string())
        }
    };
    let amaxes = replay::parse_amax_trace(&text).map_err(|err| CliError(format!("{label}: {err}")))?;
    let steps = replay::replay(&recipe, args.format, &amaxes)?;
    raw_io::print_text(&replay::render(&steps))
}
