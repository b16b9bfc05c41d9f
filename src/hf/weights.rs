//! Reading checkpoint tensors as f32 (from F32, BF16, F16, or the fine-grained
//! FP8 layout: E4M3 codes times the f32 `weight_scale_inv` of their block), and
//! the tensor names and shapes a Llama-family config implies.

use half::f16;
use rayon::prelude::*;
use safetensors::Dtype;

use super::config::HfConfig;
use super::shards::Shards;
use crate::error::{Error, Result};
use crate::format::Fp8Format;

/// One tensor the model needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedTensor {
    /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Shape (`[out, in]` for linear weights).
    pub shape: Vec<usize>,
    /// A linear weight that a fine-grained FP8 checkpoint may store as E4M3 + `weight_scale_inv`.
    pub quantizable: bool,
}

/// Every tensor of the model `config` describes, in checkpoint order (embeddings, layers, norm, head).
pub fn expected_tensors(config: &HfConfig) -> Vec<ExpectedTensor> {
    let h = config.hidden_size;
    let q = config.num_attention_heads * config.head_dim;
    let kv = config.num_key_value_heads * config.head_dim;
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, quantizable: bool| {
        out.push(ExpectedTensor {
            name,
            shape,
            quantizable,
        })
    };
    push("model.embed_tokens.weight".into(), vec![config.vocab_size, h], false);
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        push(format!("{p}.input_layernorm.weight"), vec![h], false);
        for (proj, out_features) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            push(format!("{p}.self_attn.{proj}.weight"), vec![out_features, h], true);
            if config.qkv_bias {
                push(format!("{p}.self_attn.{proj}.bias"), vec![out_features], false);
            }
        }
        push(format!("{p}.self_attn.o_proj.weight"), vec![h, q], true);
        push(format!("{p}.post_attention_layernorm.weight"), vec![h], false);
        let i_size = config.intermediate_size;
        push(format!("{p}.mlp.gate_proj.weight"), vec![i_size, h], true);
        push(format!("{p}.mlp.up_proj.weight"), vec![i_size, h], true);
        push(format!("{p}.mlp.down_proj.weight"), vec![h, i_size], true);
    }
    push("model.norm.weight".into(), vec![h], false);
    if !config.tie_word_embeddings {
        push("lm_head.weight".into(), vec![config.vocab_size, h], false);
    }
    out
}

/// The name of the block scales that go with FP8 weight `name` (`x.weight` -> `x.weight_scale_inv`).
pub fn scale_inv_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

/// Tensors a checkpoint may carry that the model recomputes (older Llama exports saved these).
fn ignorable(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

/// Checks `shards` holds exactly the tensors `config` needs: each present with its shape and a float
/// dtype (or E4M3 + block scales for quantizable weights of an FP8 checkpoint), and nothing unknown.
pub fn check_checkpoint(shards: &Shards, config: &HfConfig) -> Result<()> {
    let expected = expected_tensors(config);
    for t in &expected {
        let entry = shards.entry(&t.name)?;
        if entry.shape != t.shape {
            return Err(Error::InvalidTensor {
                name: t.name.clone(),
                reason: format!(
                    "shape {:?} in the checkpoint, the config needs {:?}",
                    entry.shape, t.shape
                ),
            });
        }
        if entry.dtype == Dtype::F8_E4M3 {
            let block = fp8_block(config, &t.name, t.quantizable)?;
            let scales = shards.entry(&scale_inv_name(&t.name))?;
            let want = vec![t.shape[0].div_ceil(block[0]), t.shape[1].div_ceil(block[1])];
            if scales.shape != want || scales.dtype != Dtype::F32 {
                return Err(Error::InvalidTensor {
                    name: scale_inv_name(&t.name),
                    reason: format!(
                        "{:?} {:?}; blocks of {block:?} need F32 {want:?}",
                        scales.dtype, scales.shape
                    ),
                });
            }
        } else if !matches!(entry.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(Error::InvalidTensor {
                name: t.name.clone(),
                reason: format!(
                    "dtype {:?} is not supported (F32, BF16, F16, or F8_E4M3 with block scales)",
                    entry.dtype
                ),
            });
        }
    }
    for name in shards.entries().keys() {
        let known = expected
            .iter()
            .any(|t| *name == t.name || (t.quantizable && *name == scale_inv_name(&t.name) && config.fp8.is_some()));
        if !known && !ignorable(name) {
            return Err(Error::InvalidTensor {
                name: name.escape_debug().to_string(),
                reason: format!("not a tensor of a {} with this config", config.architecture.hf_name()),
            });
        }
    }
    Ok(())
}

fn fp8_block(config: &HfConfig, name: &str, quantizable: bool) -> Result<[usize; 2]> {
    match (&config.fp8, quantizable) {
        (Some(q), true) => Ok(q.block),
        _ => Err(Error::InvalidTensor {
            name: name.to_string(),
            reason: "stored as F8_E4M3, but config.json has no fp8 quantization_config for it".to_string(),
        }),
    }
}

/// Tensor `name` as f32 values, row-major, after checking its shape is `shape`. FP8 weights are
/// dequantized exactly (code value times its block's `scale_inv`, one f32 rounding).
pub fn read_f32(shards: &Shards, config: &HfConfig, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let entry = shards.entry(name)?;
    if entry.shape != shape {
        return Err(Error::InvalidTensor {
            name: name.to_string(),
            reason: format!("shape {:?} in the checkpoint, expected {shape:?}", entry.shape),
        });
    }
    let bytes = shards.bytes(name)?;
    let count: usize = shape.iter().product();
    let mut out = vec![0f32; count];
    // Chunks of 64 Ki elements: big enough to amortise rayon, small enough to balance 2..64 cores.
    const CHUNK: usize = 1 << 16;
    match entry.dtype {
        Dtype::F32 => out
            .par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(4 * CHUNK))
            .for_each(|(o, b)| {
                for (x, w) in o.iter_mut().zip(b.chunks_exact(4)) {
                    *x = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                }
            }),
        // bf16 is the top half of an f32: widening is a shift.
        Dtype::BF16 => out
            .par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(2 * CHUNK))
            .for_each(|(o, b)| {
                for (x, w) in o.iter_mut().zip(b.chunks_exact(2)) {
                    *x = f32::from_bits((u32::from(u16::from_le_bytes([w[0], w[1]]))) << 16);
                }
            }),
        Dtype::F16 => out
            .par_chunks_mut(CHUNK)
            .zip(bytes.par_chunks(2 * CHUNK))
            .for_each(|(o, b)| {
                for (x, w) in o.iter_mut().zip(b.chunks_exact(2)) {
                    *x = f16::from_bits(u16::from_le_bytes([w[0], w[1]])).to_f32();
                }
            }),
        Dtype::F8_E4M3 if shape.len() == 2 => {
            let quantizable = expected_tensors(config).iter().any(|t| t.name == name && t.quantizable);
            let block = fp8_block(config, name, quantizable)?;
            let scales_name = scale_inv_name(name);
            let (rows, cols) = (shape[0], shape[1]);
            let scales = read_f32(
                shards,
                config,
                &scales_name,
                &[rows.div_ceil(block[0]), cols.div_ceil(block[1])],
            )?;
            let lut: Vec<f32> = (0..=255u8).map(|c| Fp8Format::E4M3.decode(c)).collect();
            let scale_cols = cols.div_ceil(block[1]);
            out.par_chunks_mut(cols)
                .zip(bytes.par_chunks(cols))
                .enumerate()
                .for_each(|(r, (o, codes))| {
                    let srow = &scales[(r / block[0]) * scale_cols..][..scale_cols];
                    for (c, (x, &code)) in o.iter_mut().zip(codes).enumerate() {
                        *x = lut[code as usize] * srow[c / block[1]];
                    }
                });
        }
        other => {
            return Err(Error::InvalidTensor {
                name: name.to_string(),
                reason: format!("dtype {other:?} cannot be read as f32 here"),
            });
        }
    }
    Ok(out)
}
