//! `fp8`: the command-line tool of fp8-engine. One module per subcommand;
//! every failure is one line on stderr and a non-zero exit code.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod allocator;
mod args;
mod base_args;
mod bench;
mod bench_gemm;
mod bench_gemm_cpu;
mod bench_gemm_cuda;
mod bench_gemm_inputs;
mod bench_gemm_runner;
mod bench_layer;
mod bench_layer_breakdown;
mod bench_memory;
mod cast;
mod decode;
mod delayed_args;
mod dist_args;
mod error;
mod eval;
mod fine_tune;
mod formats;
mod generate;
mod info;
mod inspect;
mod number_text;
mod plan;
mod quantize;
mod raw_io;
mod recipe;
mod show;
mod table;
mod timing;
mod train;

#[cfg(test)]
mod fuzz_args;

use error::CliError;

#[derive(Parser)]
#[command(name = "fp8", version, about = "FP8 formats, quantization and training tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Formats(formats::FormatsArgs),
    Show(show::ShowArgs),
    Cast(cast::CastArgs),
    Decode(decode::DecodeArgs),
    Info(info::InfoArgs),
    Bench(bench::BenchArgs),
    Recipe(recipe::RecipeArgs),
    Quantize(quantize::QuantizeArgs),
    Dequantize(quantize::DequantizeArgs),
    Inspect(inspect::InspectArgs),
    Train(Box<train::TrainArgs>),
    Eval(eval::EvalArgs),
    Generate(generate::GenerateArgs),
    Plan(plan::PlanArgs),
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Formats(args) => formats::run(args),
        Command::Show(args) => show::run(args),
        Command::Cast(args) => cast::run(args),
        Command::Decode(args) => decode::run(args),
        Command::Info(args) => info::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Recipe(args) => recipe::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Dequantize(args) => quantize::run_dequantize(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Train(args) => train::run_train(*args),
        Command::Eval(args) => eval::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Plan(args) => plan::run(args),
    }
}

/// clap's usage errors span several lines (message, tip, usage); keep the
/// message part on one line so every failure of the tool reads the same.
/// Parses a command line. Negative numbers are values (`--clip -1` reaches the flag's own
/// check instead of clap's "unexpected argument '-1'"), in every subcommand.
fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let command = Cli::command().allow_negative_numbers(true).mut_subcommands(|c| {
        c.allow_negative_numbers(true)
            .mut_subcommands(|c| c.allow_negative_numbers(true))
    });
    command
        .try_get_matches_from(args)
        .and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches))
}

fn one_line(err: &clap::Error) -> String {
    let rendered = err.to_string();
    let message = rendered.split("\n\n").next().unwrap_or_default();
    let words: Vec<&str> = message.split_whitespace().collect();
    words.join(" ").trim_start_matches("error: ").to_string()
}

/// Runs `f` on a thread of a rayon pool (`RAYON_NUM_THREADS` threads, else one per CPU), so
/// that each parallel op is split from a worker that takes part in it, instead of from a
/// thread outside the pool that hands the op over and sleeps until it is done: three futex
/// wake-ups and context switches per op, ~7% of an `fp8 train` step on 2 cores
/// (docs/benchmarks.md). Stacks of 8 MiB, like the main thread's.
fn on_worker_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    match rayon::ThreadPoolBuilder::new().stack_size(8 << 20).build() {
        Ok(pool) => pool.install(f),
        Err(_) => f(),
    }
}

/// `fp8 train | head` closes stdout while the tool still prints: `println!` then fails with
/// EPIPE and panics (and `eprintln!` with `2>&1 | head`). That panic ends the process with one
/// `fp8: error:` line and status 1, as `fp8 cast` does on a closed stdout, instead of a panic
/// message and a backtrace. SIGPIPE stays ignored (Rust's default): a closed socket of the NCCL
/// rendezvous must be an error the code sees, not a signal that kills the process.
fn stop_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        let why = ["failed printing to stdout: ", "failed printing to stderr: "]
            .iter()
            .find_map(|prefix| message.strip_prefix(prefix));
        if let Some(why) = why
            && (why.contains("os error 32") || why.contains("Broken pipe"))
        {
            // Not `eprintln!`: with `2>&1 | head` stderr is the same closed pipe (then this
            // line is lost), and a panic inside the hook would abort.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "fp8: error: stdout was closed by its reader ({why}); stopped"
            );
            std::process::exit(1);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    allocator::keep_freed_memory();
    stop_on_closed_stdout();
    let parsed = parse(std::env::args_os());
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => {
            // --help, --version, and help shown for a missing subcommand print as clap renders them.
            let shows_help = matches!(
                err.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            );
            if shows_help {
                let _ = err.print();
            } else {
                eprintln!("fp8: error: {}", fp8_engine::io::escaped(&one_line(&err)));
            }
            return ExitCode::from(err.exit_code().clamp(0, 255) as u8);
        }
    };
    match on_worker_thread(|| run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Escaped: messages may quote names from input files (newlines, terminal escapes).
            eprintln!("fp8: error: {}", fp8_engine::io::escaped(&err.to_string()));
            ExitCode::FAILURE
        }
    }
}
