//! `fp8 quantize` and `fp8 dequantize`: safetensors checkpoints to FP8 and back.

use std::path::PathBuf;

use clap::Args;
use fp8_engine::format::Fp8Format;
use fp8_engine::hf::{HfModelDir, write_hf_fp8};
use fp8_engine::tools::safetensors_quant::{
    ConversionSummary, FileRecipe, QuantizeOptions, dequantize_file, quantize_file,
};

use crate::error::CliError;
use crate::{args, raw_io};

/// Quantize every 2-D F32/BF16/F16 tensor of a safetensors file to FP8.
///
/// Each tensor NAME becomes NAME (F8_E4M3 or F8_E5M2) plus its scales:
/// NAME.scale_inv (F32: a scalar for `current`, [M, ceil(K/128)] for
/// `block1x128`, [ceil(M/128), ceil(K/128)] for `block128`) or NAME.scale_e8m0
/// (U8 [M, ceil(K/32)] for `mxfp8`). Other tensors are copied unchanged; the
/// recipe goes into the file's metadata. The output is written atomically.
///
/// With `--hf`, IN and OUT are Hugging Face model directories: every decoder
/// linear weight becomes F8_E4M3 with an F32 `weight_scale_inv` per 128x128
/// block and config.json gets `quantization_config` (the layout published FP8
/// checkpoints use); embeddings, norms, the head and `--keep` modules are copied.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  fp8 quantize model.safetensors model.fp8.safetensors --recipe block128\n  \
                        fp8 quantize --hf Llama-3.2-1B Llama-3.2-1B-FP8"
)]
pub struct QuantizeArgs {
    /// Input safetensors file (with --hf: model directory).
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// Output safetensors file (with --hf: model directory).
    #[arg(value_name = "OUT")]
    output: PathBuf,
    /// current (one scale per tensor), block1x128 (1x128 blocks along the last
    /// dimension), block128 (128x128 blocks) or mxfp8 (1x32 blocks, E8M0 scales).
    #[arg(long, value_parser = recipe, required_unless_present = "hf")]
    recipe: Option<FileRecipe>,
    /// Hugging Face fine-grained FP8 layout (E4M3, 128x128 blocks, exact scales unless --pow2).
    #[arg(long, conflicts_with_all = ["recipe", "format", "no_pow2"])]
    hf: bool,
    /// With --hf: weights whose name contains this stay in their dtype (repeatable, e.g. down_proj).
    #[arg(long, requires = "hf", value_name = "NAME")]
    keep: Vec<String>,
    /// FP8 format: e4m3 or e5m2.
    #[arg(long, value_name = "FORMAT", default_value = "e4m3", value_parser = args::fp8_format)]
    format: Fp8Format,
    /// Power-of-two scales (default for block1x128 and block128).
    #[arg(long, conflicts_with = "no_pow2")]
    pow2: bool,
    /// Exact `fp8_max / amax` scales (default for current).
    #[arg(long)]
    no_pow2: bool,
}

fn recipe(text: &str) -> Result<FileRecipe, String> {
    text.parse().map_err(|err: fp8_engine::Error| err.to_string())
}

/// Dequantize a file written by `fp8 quantize`: FP8 tensors back to their
/// original dtype (F32, BF16 or F16), scale tensors dropped, others copied.
/// The output is written atomically.
#[derive(Args)]
pub struct DequantizeArgs {
    /// Input safetensors file, written by `fp8 quantize`.
    #[arg(value_name = "IN.safetensors")]
    input: PathBuf,
    /// Output safetensors file.
    #[arg(value_name = "OUT.safetensors")]
    output: PathBuf,
}

fn report(verb: &str, summary: &ConversionSummary, output: &std::path::Path) -> Result<(), CliError> {
    raw_io::print_text(&format!(
        "{verb} {} tensors, copied {} unchanged: {}\n",
        summary.converted.len(),
        summary.copied.len(),
        output.display()
    ))
}

/// Runs `fp8 quantize`.
pub fn run(args: QuantizeArgs) -> Result<(), CliError> {
    if args.hf {
        let model = HfModelDir::open(&args.input)?;
        let summary = write_hf_fp8(&model, &args.output, args.pow2, &args.keep)?;
        return raw_io::print_text(&format!(
            "quantized {} weights to E4M3 with 128x128 block scales, copied {} tensors and {}: {}\n",
            summary.quantized.len(),
            summary.copied.len(),
            if summary.side_files.is_empty() {
                "no side files".to_string()
            } else {
                summary.side_files.join(", ")
            },
            args.output.display()
        ));
    }
    let Some(recipe) = args.recipe else {
        return Err(fp8_engine::Error::InvalidSetting {
            setting: "recipe",
            value: String::new(),
            reason: "--recipe is required without --hf".to_string(),
        }
        .into());
    };
    let options = QuantizeOptions {
        recipe,
        format: args.format,
        power_2_scale: match (args.pow2, args.no_pow2) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
    };
    let summary = quantize_file(&args.input, &args.output, &options)?;
    report("quantized", &summary, &args.output)
}

/// Runs `fp8 dequantize`.
pub fn run_dequantize(args: DequantizeArgs) -> Result<(), CliError> {
    let summary = dequantize_file(&args.input, &args.output)?;
    report("dequantized", &summary, &args.output)
}
