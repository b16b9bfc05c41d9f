//! Load time and peak memory of a Hugging Face checkpoint.
//!
//! ```sh
//! cargo run --release --example hf_load -- generate /tmp/llama-1b   # Llama-3.2-1B shapes, random bf16 (2.5 GB)
//! cargo run --release --example hf_load -- generate /tmp/llama-7b tests/fixtures/plan/llama-2-7b.json
//!                                         # any config's shapes, random, in its torch_dtype (13.5 GB here)
//! cargo run --release --example hf_load -- load /tmp/llama-1b       # open + check, then widen every tensor to f32
//! cargo run --release --example hf_load -- load-fp8 /tmp/llama-1b   # the model with an FP8 base (128x128 blocks)
//! ```
//! `load` prints the time to open (config, memory maps, header checks), the time to convert each
//! tensor to f32 one at a time (what a loader does before handing weights to layers), and the peak
//! resident memory (VmHWM).

use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use fp8_engine::hf::{HfConfig, HfModelDir, expected_tensors};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

const LLAMA_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
  "tie_word_embeddings": true, "torch_dtype": "bfloat16"
}"#;

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// A random checkpoint of `config_json`'s shapes in `dir`: config.json and one
/// model.safetensors in the config's torch_dtype (float16 or bfloat16).
fn generate(dir: &Path, config_json: &str) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.json"), config_json)?;
    let config = HfConfig::from_json(config_json)?;
    let fp16 = config.dtype.as_deref() == Some("float16");
    let tensors = expected_tensors(&config);
    // A cheap xorshift stream per tensor (tensors in parallel, the same values on any machine)
    // around +-0.02, what trained weights look like.
    let data: Vec<Vec<u8>> = tensors
        .par_iter()
        .enumerate()
        .map(|(i, t)| {
            let n: usize = t.shape.iter().product();
            let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
            let mut bytes = Vec::with_capacity(2 * n);
            for _ in 0..n {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let x = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04;
                let bits = match fp16 {
                    true => half::f16::from_f32(x).to_bits(),
                    false => half::bf16::from_f32(x).to_bits(),
                };
                bytes.extend_from_slice(&bits.to_le_bytes());
            }
            bytes
        })
        .collect();
    let dtype = if fp16 { Dtype::F16 } else { Dtype::BF16 };
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&data)
        .map(|(t, d)| Ok((t.name.clone(), TensorView::new(dtype, t.shape.clone(), d)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))?;
    println!(
        "wrote {} ({} parameters, {}) in {:.1} s",
        dir.display(),
        config.parameter_count(),
        if fp16 { "float16" } else { "bfloat16" },
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn load(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let model = HfModelDir::open(dir)?;
    let opened = start.elapsed();
    let mut values = 0usize;
    let mut checksum = 0f64;
    for t in expected_tensors(&model.config) {
        let v = model.read_f32(&t.name)?;
        values += v.len();
        checksum += f64::from(v[v.len() / 2]);
    }
    let total = start.elapsed();
    println!(
        "{}: {} tensors, {values} values; open+check {:.3} s, open+convert all to f32 {:.2} s \
         ({:.2} GB/s of bf16 read); peak RSS {:.0} MiB (largest tensor as f32: {:.0} MiB); checksum {checksum:.4}",
        dir.display(),
        model.shards.entries().len(),
        opened.as_secs_f64(),
        total.as_secs_f64(),
        2.0 * values as f64 / total.as_secs_f64() / 1e9,
        peak_rss_mib(),
        expected_tensors(&model.config)
            .iter()
            .map(|t| t.shape.iter().product::<usize>())
            .max()
            .unwrap_or(0) as f64
            * 4.0
            / (1 << 20) as f64,
    );
    Ok(())
}

/// `LlamaModel::from_hf_fp8_base`: every decoder linear quantized to E4M3 at load, tensor by tensor.
fn load_fp8(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let model = HfModelDir::open(dir)?;
    let precision = "bf16".parse()?;
    let (_, report) = fp8_engine::model::LlamaModel::from_hf_fp8_base(
        &model,
        &precision,
        fp8_engine::model::Recompute::None,
        fp8_engine::nn::BaseScaling::Block,
    )?;
    println!(
        "{}: FP8 base in {:.1} s: {} tensors quantized, {:.0} MiB of codes and scales, at most {} values \
         ({:.0} MiB) in f32 at once; peak RSS {:.0} MiB",
        dir.display(),
        start.elapsed().as_secs_f64(),
        report.quantized,
        report.fp8_bytes as f64 / (1 << 20) as f64,
        report.peak_f32_values,
        report.peak_f32_values as f64 * 4.0 / (1 << 20) as f64,
        peak_rss_mib(),
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, dir] if cmd == "generate" => generate(Path::new(dir), LLAMA_1B),
        [cmd, dir, config] if cmd == "generate" => generate(Path::new(dir), &std::fs::read_to_string(config)?),
        [cmd, dir] if cmd == "load" => load(Path::new(dir)),
        [cmd, dir] if cmd == "load-fp8" => load_fp8(Path::new(dir)),
        _ => Err("usage: hf_load generate DIR [CONFIG.json] | hf_load load DIR | hf_load load-fp8 DIR".into()),
    }
}
