//! `fp8 generate`: text from a Hugging Face checkpoint, streamed as it is generated.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use fp8_engine::model::Sampler;

use crate::base_args::BaseArgs;
use crate::error::CliError;
use crate::eval::load_model;

/// Continue a prompt with a model (key/value cache; greedy at temperature 0).
///
/// The prompt is tokenized with the tokenizer's special tokens (e.g. <s>/BOS);
/// generation stops after --max-new-tokens or at an end-of-sequence token.
/// Text is printed as it comes; with --json, one object
/// {"tokens":[..],"text":".."} with the generated ids only (prompt excluded).
#[derive(Args)]
#[command(
    after_help = "Example:\n  fp8 generate --model Llama-3.2-1B --prompt \"FP8 training is\" --max-new-tokens 32"
)]
pub struct GenerateArgs {
    /// Hugging Face model directory (config.json, safetensors, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// The text to continue.
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// fp32, bf16, fp16, fp8-delayed, fp8-current, fp8-block or mxfp8.
    #[arg(long, default_value = "fp32")]
    pub precision: String,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Generate with the LoRA adapters of this PEFT directory (adapter_config.json +
    /// adapter_model.safetensors, as `fp8 train --lora-rank` writes to OUT/PRECISION/adapter).
    #[arg(long, value_name = "DIR")]
    pub lora: Option<PathBuf>,
    /// How the linear weights are held (an FP8 base: inference on E4M3 codes).
    #[command(flatten, next_help_heading = "Base weights")]
    pub base: BaseArgs,
}

pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    let mut sampler = Sampler::new(args.temperature, args.top_p, args.seed)?;
    let (mut model, tokenizer) = load_model(
        &args.model,
        &args.precision,
        &args.base,
        args.lora.as_deref(),
        "fp8 generate",
    )?;
    let prompt = tokenizer.encode(&args.prompt, true)?;
    let stop = fp8_engine::hf::stop_ids(&args.model, &tokenizer)?;
    let mut stream = tokenizer.stream(true);
    let stdout = std::io::stdout();
    let json = args.json;
    if !json {
        print!("{}", args.prompt);
    }
    let tokens = model.generate(&prompt, args.max_new_tokens, &mut sampler, &stop, &mut |id| {
        let piece = stream.push(id)?;
        if !json && !piece.is_empty() {
            let mut out = stdout.lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
        Ok(())
    })?;
    let text = tokenizer.decode(&tokens, true)?;
    if json {
        println!("{}", serde_json::json!({ "tokens": tokens, "text": text }));
    } else {
        println!();
    }
    Ok(())
}
