//! `--base-precision fp8`: the frozen FP8 linear weights are bit for bit what `fp8 quantize --hf`
//! writes, an HF FP8 checkpoint is used as stored, loading holds one tensor in f32 at a time, and
//! the model with the FP8 base computes what the f32 model does to FP8 accuracy.

mod hf_cli;
use hf_cli::{fixture, fp8};

use std::collections::HashMap;
use std::path::Path;

use fp8_engine::format::Fp8Format;
use fp8_engine::hf::{HfConfig, HfModelDir, expected_tensors, scale_inv_name};
use fp8_engine::model::{LlamaModel, LoraConfig, Recompute, hf_names};
use fp8_engine::nn::{BaseScaling, Linear, LoraSettings, Module, VisitLinears};
use fp8_engine::tensor::{QuantizedMatrix, Scales};

fn load(dir: &HfModelDir, scaling: BaseScaling) -> (LlamaModel, fp8_engine::model::Fp8BaseLoad) {
    LlamaModel::from_hf_fp8_base(dir, &"fp32".parse().unwrap(), Recompute::None, scaling).unwrap()
}

/// Every frozen segment of `model` with the checkpoint tensor it came from.
fn segments(model: &mut LlamaModel) -> Vec<(String, QuantizedMatrix)> {
    let sources: HashMap<String, Vec<(String, usize)>> = hf_names(model.config()).into_iter().collect();
    let mut out = Vec::new();
    model.visit_linears(&mut |l: &mut Linear| {
        let Some(w) = l.frozen_fp8() else { return };
        // No f32 copy of a frozen weight is kept.
        assert_eq!(l.weight().len(), 0, "{}", l.name());
        let names = &sources[&format!("{}.weight", l.name())];
        assert_eq!(names.len(), w.segments().len());
        for ((name, rows), seg) in names.iter().zip(w.segments()) {
            assert_eq!(seg.rows(), *rows);
            out.push((name.clone(), seg.clone()));
        }
    });
    out
}

fn largest_linear(config: &HfConfig) -> usize {
    expected_tensors(config)
        .iter()
        .filter(|t| t.quantizable)
        .map(|t| t.shape.iter().product::<usize>())
        .max()
        .unwrap()
}

#[test]
fn the_fp8_base_is_what_quantize_hf_writes_and_an_fp8_checkpoint_is_used_as_stored() {
    for name in ["llama", "qwen2"] {
        let src = fixture(&format!("models/{name}"));
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("fp8");
        let run = fp8(&["quantize", src.to_str().unwrap(), out.to_str().unwrap(), "--hf"]);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let hf = HfModelDir::open(&src).unwrap();
        let exported = HfModelDir::open(&out).unwrap();
        let layers = hf.config.num_hidden_layers;

        let (mut model, report) = load(&hf, BaseScaling::Block);
        assert_eq!((report.quantized, report.used_as_stored), (7 * layers, 0));
        assert_eq!(report.peak_f32_values, largest_linear(&hf.config));
        let ours = segments(&mut model);
        assert_eq!(ours.len(), 7 * layers);
        let bytes: usize = ours.iter().map(|(_, s)| s.data().len() + 4 * s.scales().len()).sum();
        assert_eq!(report.fp8_bytes, bytes);
        for (tensor, seg) in &ours {
            assert_eq!(
                seg.data(),
                exported.shards.bytes(tensor).unwrap(),
                "{name}: codes of {tensor}"
            );
            let scales = exported.read_f32(&scale_inv_name(tensor)).unwrap();
            assert_eq!(
                seg.scales(),
                &Scales::Block128x128(scales),
                "{name}: scales of {tensor}"
            );
        }

        // The exported FP8 checkpoint: codes and scales taken as stored, nothing widened.
        let (mut again, report) = load(&exported, BaseScaling::Block);
        assert_eq!(
            (report.quantized, report.used_as_stored, report.peak_f32_values),
            (0, 7 * layers, 0)
        );
        assert_eq!(segments(&mut again), ours);
    }
}

fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + i / 3) % vocab) as u32).collect()
}

fn loss(model: &mut LlamaModel) -> f32 {
    let vocab = model.vocab();
    let (batch, seq) = (2, 16);
    let all = ids(batch * seq + 1, vocab);
    model.forward_loss(&all[..batch * seq], &all[1..], batch, seq).unwrap()
}

#[test]
fn an_fp8_base_computes_what_the_f32_model_does_to_fp8_accuracy_under_both_scalings() {
    let hf = HfModelDir::open(&fixture("models/llama")).unwrap();
    let mut full = LlamaModel::from_hf(&hf, &"fp32".parse().unwrap(), Recompute::None).unwrap();
    let reference = loss(&mut full);
    for scaling in [BaseScaling::Block, BaseScaling::Tensor] {
        let (mut model, _) = load(&hf, scaling);
        for (tensor, seg) in segments(&mut model) {
            let expect = matches!(
                (scaling, seg.scales()),
                (BaseScaling::Block, Scales::Block128x128(_)) | (BaseScaling::Tensor, Scales::PerTensor(_))
            );
            assert!(expect, "{tensor}: {:?}", seg.scales().kind());
            // Each value within E4M3's half ulp (2^-4 relative) of the checkpoint's, or flushed tiny.
            let codes = seg.dequantize::<f32>(Fp8Format::E4M3).unwrap();
            let exact = hf.read_f32(&tensor).unwrap();
            let amax = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (c, e) in codes.iter().zip(&exact) {
                assert!(
                    (c - e).abs() <= e.abs() / 16.0 + amax / 448.0 / 64.0,
                    "{tensor}: {c} vs {e}"
                );
            }
        }
        // Only the embeddings, norms and head are parameters now.
        let linear: usize = expected_tensors(&hf.config)
            .iter()
            .filter(|t| t.quantizable)
            .map(|t| t.shape.iter().product::<usize>())
            .sum();
        assert_eq!(
            model.parameter_count() as u128,
            hf.config.parameter_count() - linear as u128
        );
        let fp8_loss = loss(&mut model);
        assert!(
            (fp8_loss - reference).abs() < 0.02 * reference,
            "{scaling:?}: {fp8_loss} vs f32 {reference}"
        );
    }
}

#[test]
fn lora_on_an_fp8_base_merges_into_the_codes_exact_values() {
    let hf = HfModelDir::open(&fixture("models/llama")).unwrap();
    let (mut model, _) = load(&hf, BaseScaling::Block);
    let before = segments(&mut model);
    let settings = LoraSettings {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
    };
    model
        .enable_lora(&LoraConfig::new(settings, "q_proj,o_proj").unwrap(), 3)
        .unwrap();
    // B starts at zero: the merged weights are exactly the codes' values, in f32.
    model.merge_lora().unwrap();
    let tensors: HashMap<String, Vec<f32>> = model
        .hf_tensors()
        .unwrap()
        .into_iter()
        .map(|(name, _, values)| (name, values))
        .collect();
    for (tensor, seg) in before {
        let want = seg.dequantize::<f32>(Fp8Format::E4M3).unwrap();
        assert_eq!(tensors[&tensor], want, "{tensor}");
    }
}

/// A Llama checkpoint of `config` with random bf16 values, written to `dir`.
fn write_bf16_checkpoint(dir: &Path, config_json: &str) -> HfModelDir {
    use fp8_engine::tools::safetensors_io::{OutTensor, serialize};
    use std::borrow::Cow;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config_json).unwrap();
    let config = HfConfig::from_json(config_json).unwrap();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let tensors: Vec<(String, OutTensor<'_>)> = expected_tensors(&config)
        .into_iter()
        .map(|t| {
            let n: usize = t.shape.iter().product();
            let data: Vec<u8> = (0..n)
                .flat_map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let x = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
                    half::bf16::from_f32(x).to_le_bytes()
                })
                .collect();
            let tensor = OutTensor {
                dtype: safetensors::Dtype::BF16,
                shape: t.shape.clone(),
                data: Cow::Owned(data),
            };
            (t.name, tensor)
        })
        .collect();
    let bytes = serialize(&tensors, HashMap::new(), "test").unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    HfModelDir::open(dir).unwrap()
}

#[test]
fn loading_a_bf16_checkpoint_holds_one_tensor_in_f32_at_a_time() {
    // 4 layers of q 256x256, k and v 128x256, o 256x256, gate and up 512x256, down 256x512.
    let config = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 512, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;
    let tmp = tempfile::tempdir().unwrap();
    let hf = write_bf16_checkpoint(tmp.path(), config);
    let (mut model, report) = load(&hf, BaseScaling::Block);
    // The counting hook of the loader: the most f32 values held at once is the largest single
    // linear tensor (gate, up or down: 131072 values), not a fused weight, let alone the model.
    assert_eq!(report.peak_f32_values, 512 * 256);
    assert_eq!(report.quantized, 28);
    // Nothing else holds the linears in high precision: every one is codes plus scales, and the
    // weight caches the memory ledger counts are exactly those bytes (1 per value + 4 per block).
    let segs = segments(&mut model);
    assert_eq!(segs.len(), 28);
    let linear_values: usize = segs.iter().map(|(_, s)| s.data().len()).sum();
    assert_eq!(linear_values, 4 * (256 * 256 * 2 + 2 * 128 * 256 + 3 * 512 * 256));
    let blocks: usize = segs.iter().map(|(_, s)| s.scales().len()).sum();
    assert_eq!(model.weight_cache_bytes(), linear_values + 4 * blocks);
    assert_eq!(report.fp8_bytes, linear_values + 4 * blocks);
}

#[test]
fn a_model_whose_fp8_base_cannot_reach_the_gpu_stays_whole_on_the_cpu() {
    // On a GPU the frozen codes get a device copy when the model moves; GPU 99 does not exist,
    // so the move fails with a typed error and every module is back on the CPU.
    let hf = HfModelDir::open(&fixture("models/llama")).unwrap();
    let (mut model, _) = load(&hf, BaseScaling::Block);
    let before = loss(&mut model);
    let err = model
        .to_device(fp8_engine::device::DeviceKind::Cuda(99))
        .expect_err("there is no GPU 99");
    let text = err.to_string();
    assert!(
        text.contains("GPU") || text.contains("CUDA") || text.contains("kernel"),
        "{text}"
    );
    let mut on = Vec::new();
    model.visit_parameters(&mut |p| on.push(p.device()));
    assert!(on.iter().all(|d| *d == fp8_engine::device::DeviceKind::Cpu));
    assert_eq!(
        loss(&mut model).to_bits(),
        before.to_bits(),
        "the ops run on the CPU again"
    );
}
