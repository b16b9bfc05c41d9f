//! Loading Hugging Face model directories: every dtype widens exactly, sharded equals single-file,
//! the fine-grained FP8 layout dequantizes exactly, and every bad input is an error naming the
//! tensor or field.

use std::collections::BTreeMap;
use std::path::Path;

use fp8_engine::format::Fp8Format;
use fp8_engine::hf::{HfConfig, HfModelDir, expected_tensors};
use half::{bf16, f16};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::json;

/// A tiny Llama: 2 layers, 4 query heads sharing 2 KV heads of width 8.
fn config(extra: serde_json::Value) -> serde_json::Value {
    let mut c = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16"
    });
    c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    c
}

/// Deterministic values in [-2, 2) with plenty of mantissa bits.
fn values(seed: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104729) % 10007) as f32 / 10007.0 - 0.5) * 4.0)
        .collect()
}

struct Tensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn encode(dtype: Dtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect(),
        Dtype::F16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
        _ => unreachable!(),
    }
}

/// What `encode` stores, widened back (the expected result of loading).
fn stored(dtype: Dtype, v: &[f32]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => v.to_vec(),
        Dtype::BF16 => v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect(),
        Dtype::F16 => v.iter().map(|x| f16::from_f32(*x).to_f32()).collect(),
        _ => unreachable!(),
    }
}

fn model_tensors(cfg: &serde_json::Value, dtype: Dtype) -> BTreeMap<String, (Tensor, Vec<f32>)> {
    let parsed = HfConfig::from_json(&cfg.to_string()).unwrap();
    let mut out = BTreeMap::new();
    for (i, t) in expected_tensors(&parsed).into_iter().enumerate() {
        let n = t.shape.iter().product();
        let v = values(i, n);
        let tensor = Tensor {
            dtype,
            shape: t.shape.clone(),
            bytes: encode(dtype, &v),
        };
        out.insert(t.name, (tensor, stored(dtype, &v)));
    }
    out
}

fn write_file(path: &Path, tensors: &BTreeMap<String, &Tensor>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn write_model(dir: &Path, cfg: &serde_json::Value, tensors: &BTreeMap<String, &Tensor>) {
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    write_file(&dir.join("model.safetensors"), tensors);
}

fn refs(t: &BTreeMap<String, (Tensor, Vec<f32>)>) -> BTreeMap<String, &Tensor> {
    t.iter().map(|(n, (t, _))| (n.clone(), t)).collect()
}

fn open_err(dir: &Path) -> String {
    HfModelDir::open(dir).err().expect("open must fail").to_string()
}

#[test]
fn every_float_dtype_widens_exactly() {
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        let cfg = config(json!({}));
        let tensors = model_tensors(&cfg, dtype);
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), &cfg, &refs(&tensors));
        let model = HfModelDir::open(dir.path()).unwrap();
        assert_eq!(model.config.num_key_value_heads, 2);
        for (name, (_, want)) in &tensors {
            let got = model.read_f32(name).unwrap();
            assert_eq!(got.len(), want.len());
            assert!(
                got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype:?} {name}"
            );
        }
    }
}

#[test]
fn sharded_checkpoint_reads_the_same_as_one_file() {
    let cfg = config(json!({}));
    let tensors = model_tensors(&cfg, Dtype::BF16);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    let mut weight_map = serde_json::Map::new();
    for (i, (name, (t, _))) in tensors.iter().enumerate() {
        let (shard, file) = if i % 2 == 0 {
            (&mut a, "model-00001-of-00002.safetensors")
        } else {
            (&mut b, "model-00002-of-00002.safetensors")
        };
        shard.insert(name.clone(), t);
        weight_map.insert(name.clone(), json!(file));
    }
    write_file(&dir.path().join("model-00001-of-00002.safetensors"), &a);
    write_file(&dir.path().join("model-00002-of-00002.safetensors"), &b);
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let model = HfModelDir::open(dir.path()).unwrap();
    assert_eq!(model.shards.shards().len(), 2);
    for (name, (_, want)) in &tensors {
        assert_eq!(&model.read_f32(name).unwrap(), want, "{name}");
    }

    // An index naming a file outside the directory, or a tensor that is not in its shard, is refused.
    let mut bad = index.clone();
    bad["weight_map"]["model.norm.weight"] = json!("../model-00001-of-00002.safetensors");
    std::fs::write(dir.path().join("model.safetensors.index.json"), bad.to_string()).unwrap();
    assert!(open_err(dir.path()).contains("not a plain file name"));
    let mut bad = index.clone();
    bad["weight_map"]["model.ghost.weight"] = json!("model-00001-of-00002.safetensors");
    std::fs::write(dir.path().join("model.safetensors.index.json"), bad.to_string()).unwrap();
    assert!(open_err(dir.path()).contains("model.ghost.weight"));
}

#[test]
fn bad_checkpoints_name_the_tensor() {
    let cfg = config(json!({}));
    let tensors = model_tensors(&cfg, Dtype::BF16);
    let dir = tempfile::tempdir().unwrap();

    let mut missing = refs(&tensors);
    missing.remove("model.layers.1.mlp.up_proj.weight");
    write_model(dir.path(), &cfg, &missing);
    let err = open_err(dir.path());
    assert!(
        err.contains("model.layers.1.mlp.up_proj.weight") && err.contains("missing"),
        "{err}"
    );

    let extra = Tensor {
        dtype: Dtype::F32,
        shape: vec![2],
        bytes: encode(Dtype::F32, &[1.0, 2.0]),
    };
    let mut with_extra = refs(&tensors);
    with_extra.insert("model.layers.0.mlp.extra.weight".into(), &extra);
    write_model(dir.path(), &cfg, &with_extra);
    let err = open_err(dir.path());
    assert!(err.contains("model.layers.0.mlp.extra.weight"), "{err}");
    // Older exports carry the rotary frequencies; they are recomputed, so they are ignored.
    let mut with_inv_freq = refs(&tensors);
    with_inv_freq.insert("model.layers.0.self_attn.rotary_emb.inv_freq".into(), &extra);
    write_model(dir.path(), &cfg, &with_inv_freq);
    HfModelDir::open(dir.path()).unwrap();

    let wrong = Tensor {
        dtype: Dtype::BF16,
        shape: vec![32, 16],
        bytes: encode(Dtype::BF16, &values(0, 512)),
    };
    let mut wrong_shape = refs(&tensors);
    wrong_shape.insert("model.layers.0.self_attn.k_proj.weight".into(), &wrong);
    write_model(dir.path(), &cfg, &wrong_shape);
    let err = open_err(dir.path());
    assert!(
        err.contains("k_proj") && err.contains("[32, 16]") && err.contains("[16, 32]"),
        "{err}"
    );

    // A truncated file names the first tensor past the end.
    write_model(dir.path(), &cfg, &refs(&tensors));
    let path = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..(len - 100) as usize]).unwrap();
    let err = open_err(dir.path());
    assert!(err.contains("truncated") && err.contains("tensor '"), "{err}");

    // Tied embeddings: the head tensor must not be there.
    let tied = config(json!({"tie_word_embeddings": true}));
    write_model(dir.path(), &tied, &refs(&tensors));
    assert!(open_err(dir.path()).contains("lm_head.weight"));

    // An unsupported architecture is named before any tensor is read.
    write_model(
        dir.path(),
        &config(json!({"architectures": ["PhiForCausalLM"]})),
        &refs(&tensors),
    );
    let err = open_err(dir.path());
    assert!(err.contains("config.json") && err.contains("PhiForCausalLM"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("config.json"), cfg.to_string()).unwrap();
    assert!(open_err(empty.path()).contains("no model.safetensors"));
}

#[test]
fn qwen2_needs_its_qkv_biases() {
    let cfg = config(json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}));
    let tensors = model_tensors(&cfg, Dtype::F32);
    assert!(tensors.contains_key("model.layers.1.self_attn.v_proj.bias"));
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &cfg, &refs(&tensors));
    let model = HfModelDir::open(dir.path()).unwrap();
    assert!(model.config.qkv_bias);
    let mut no_bias = refs(&tensors);
    no_bias.remove("model.layers.0.self_attn.q_proj.bias");
    write_model(dir.path(), &cfg, &no_bias);
    assert!(open_err(dir.path()).contains("q_proj.bias"));
}

/// Fine-grained FP8 checkpoint: linear weights as E4M3 codes with f32 block scales. Dequantized
/// values are code value x block scale, each one exact f32 product.
#[test]
fn fp8_block_layout_dequantizes_exactly() {
    for block in [[16usize, 16usize], [128, 128]] {
        let cfg = config(
            json!({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": block}}),
        );
        let parsed = HfConfig::from_json(&cfg.to_string()).unwrap();
        let mut tensors = model_tensors(&cfg, Dtype::BF16);
        let mut want = BTreeMap::new();
        for t in expected_tensors(&parsed).into_iter().filter(|t| t.quantizable) {
            let (rows, cols) = (t.shape[0], t.shape[1]);
            let (srows, scols) = (rows.div_ceil(block[0]), cols.div_ceil(block[1]));
            let codes: Vec<u8> = (0..rows * cols).map(|i| ((i * 37 + 11) % 256) as u8).collect();
            // NaN codes are not valid weights; map them to zero.
            let codes: Vec<u8> = codes
                .into_iter()
                .map(|c| if c & 0x7f == 0x7f { 0 } else { c })
                .collect();
            let scales: Vec<f32> = (0..srows * scols)
                .map(|i| 2f32.powi(-(i as i32 % 5)) * 1.5 + i as f32 * 1e-3)
                .collect();
            let expect: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    (Fp8Format::E4M3.decode(codes[i]) as f64 * scales[(r / block[0]) * scols + c / block[1]] as f64)
                        as f32
                })
                .collect();
            tensors.insert(
                t.name.clone(),
                (
                    Tensor {
                        dtype: Dtype::F8_E4M3,
                        shape: t.shape.clone(),
                        bytes: codes,
                    },
                    Vec::new(),
                ),
            );
            tensors.insert(
                format!("{}_scale_inv", t.name),
                (
                    Tensor {
                        dtype: Dtype::F32,
                        shape: vec![srows, scols],
                        bytes: encode(Dtype::F32, &scales),
                    },
                    Vec::new(),
                ),
            );
            want.insert(t.name, expect);
        }
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), &cfg, &refs(&tensors));
        let model = HfModelDir::open(dir.path()).unwrap();
        assert_eq!(want.len(), 14);
        for (name, expect) in &want {
            let got = model.read_f32(name).unwrap();
            assert!(
                got.iter().zip(expect).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{block:?} {name}"
            );
        }
        // FP8 weights without a quantization_config are refused, naming the tensor.
        std::fs::write(dir.path().join("config.json"), config(json!({})).to_string()).unwrap();
        let err = open_err(dir.path());
        assert!(err.contains("F8_E4M3") && err.contains("_proj.weight"), "{err}");
    }
}
