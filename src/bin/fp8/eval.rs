//! `fp8 eval`: the loss and perplexity of a Hugging Face checkpoint on a text file.

use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;
use fp8_engine::amp::Precision;
use fp8_engine::hf::HfModelDir;
use fp8_engine::model::{LlamaModel, Recompute};
use indicatif::{ProgressBar, ProgressStyle};

use crate::base_args::BaseArgs;
use crate::error::CliError;

/// Mean next-token loss of a model on a text file.
///
/// The file is tokenized whole without special tokens and cut into consecutive
/// non-overlapping windows of --seq tokens (a final shorter window is dropped);
/// the loss is the mean cross-entropy over every predicted position (seq - 1 per
/// window). Prints the tokens evaluated, the loss and the perplexity.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  fp8 eval --model Llama-3.2-1B --text wiki.txt --seq 512 --precision fp8-current\n  fp8 eval --model Llama-3.2-1B --text wiki.txt --base-precision fp8 --lora runs/ft/bf16/adapter"
)]
pub struct EvalArgs {
    /// Hugging Face model directory (config.json, safetensors, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// UTF-8 text file to evaluate on.
    #[arg(long, value_name = "FILE")]
    pub text: PathBuf,
    /// Tokens per window (default: the model's max_position_embeddings, at most 1024).
    #[arg(long, value_name = "N")]
    pub seq: Option<usize>,
    /// fp32, bf16, fp16, fp8-delayed, fp8-current, fp8-block or mxfp8.
    #[arg(long, default_value = "fp32")]
    pub precision: String,
    /// Print one JSON object: {"tokens":..,"loss":..,"perplexity":..}.
    #[arg(long)]
    pub json: bool,
    /// Evaluate with the LoRA adapters of this PEFT directory (adapter_config.json +
    /// adapter_model.safetensors, as `fp8 train --lora-rank` writes to OUT/PRECISION/adapter).
    #[arg(long, value_name = "DIR")]
    pub lora: Option<PathBuf>,
    /// How the linear weights are held (an FP8 base: inference on E4M3 codes).
    #[command(flatten, next_help_heading = "Base weights")]
    pub base: BaseArgs,
}

/// A model directory's model under `precision` with the base `base` asks for and the LoRA
/// adapters of `lora`, if any, and its tokenizer; `tool` names the command on stderr. Nothing
/// is trained, so the embeddings, norms and head are frozen and held as `--frozen-dtype` says.
pub fn load_model(
    dir: &std::path::Path,
    precision: &str,
    base: &BaseArgs,
    lora: Option<&std::path::Path>,
    tool: &str,
) -> Result<(LlamaModel, fp8_engine::hf::HfTokenizer), CliError> {
    let precision = Precision::from_str(precision)?;
    base.plan_base()?;
    base.frozen_dtype()?;
    let hf = HfModelDir::open(dir)?;
    let tokenizer = hf.tokenizer()?;
    let mut model = base.load(&hf, &precision, Recompute::None, tool)?;
    if let Some(lora) = lora {
        model.load_adapter(lora)?;
    }
    model.freeze_embeddings_norms_head();
    base.hold_frozen(&mut model, &hf)?;
    Ok((model, tokenizer))
}

/// Reads a UTF-8 text file.
pub fn read_text(path: &std::path::Path) -> Result<String, CliError> {
    let bytes = fp8_engine::io::read_regular(path, fp8_engine::data::text::DEFAULT_MAX_TEXT_BYTES, "")?;
    String::from_utf8(bytes).map_err(|err| {
        CliError(format!(
            "{}: not UTF-8 text (byte {})",
            path.display(),
            err.utf8_error().valid_up_to()
        ))
    })
}

pub fn run(args: EvalArgs) -> Result<(), CliError> {
    let (mut model, tokenizer) = load_model(
        &args.model,
        &args.precision,
        &args.base,
        args.lora.as_deref(),
        "fp8 eval",
    )?;
    let text = read_text(&args.text)?;
    let ids = tokenizer.encode(&text, false)?;
    let seq = args.seq.unwrap_or(model.config().max_position_embeddings.min(1024));
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("fp8 eval {bar:30} {pos}/{len} windows {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let result = model.evaluate_text(&ids, seq, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let result = result?;
    if args.json {
        let json = serde_json::json!({
            "tokens": result.tokens,
            "loss": result.loss,
            "perplexity": result.perplexity(),
        });
        println!("{json}");
    } else {
        println!(
            "tokens {} ({} windows of {seq}, {} predicted; {} in the file)",
            result.tokens,
            result.windows,
            result.predicted,
            ids.len()
        );
        println!("loss {:.6}", result.loss);
        println!("perplexity {:.4}", result.perplexity());
    }
    Ok(())
}
