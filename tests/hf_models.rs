//! The tiny Llama, Mistral and Qwen2 checkpoints of tests/fixtures/hf/models (written by
//! `transformers`, scripts/fixtures/make_tiny_models.py) are read the way `transformers` reads
//! them: an f64 forward written from the conventions (rotate-half RoPE with the engine's
//! frequencies, grouped-query attention, q/k/v biases, RMSNorm with a plain weight, SwiGLU, tied
//! head) over the loaded weights reproduces the recorded logits, loss and greedy tokens. This pins
//! the checkpoint conventions independently of the engine's layers, which are tested against the
//! same fixtures.

use std::path::{Path, PathBuf};

use fp8_engine::hf::{HfConfig, HfModelDir};
use serde_json::Value;

fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf/models")
        .join(name)
}

struct Weights<'a> {
    dir: &'a HfModelDir,
}

impl Weights<'_> {
    fn get(&self, name: &str) -> Vec<f64> {
        self.dir.read_f32(name).unwrap().into_iter().map(f64::from).collect()
    }
    fn try_get(&self, name: &str) -> Option<Vec<f64>> {
        self.dir.shards.entries().contains_key(name).then(|| self.get(name))
    }
}

/// `x [n, in] . w [out, in]^T + b`.
fn linear(x: &[f64], w: &[f64], b: Option<&[f64]>, n: usize, inp: usize, out: usize) -> Vec<f64> {
    let mut y = vec![0.0; n * out];
    for t in 0..n {
        for o in 0..out {
            let dot: f64 = (0..inp).map(|i| x[t * inp + i] * w[o * inp + i]).sum();
            y[t * out + o] = dot + b.map_or(0.0, |b| b[o]);
        }
    }
    y
}

fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let h = w.len();
    x.chunks(h)
        .flat_map(|row| {
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / h as f64 + eps).sqrt();
            row.iter().zip(w).map(move |(v, g)| v * inv * g)
        })
        .collect()
}

/// Rotate-half RoPE of every head of `x [n, heads * d]`; frequencies and angles in f32 as transformers.
fn rope(x: &mut [f64], n: usize, heads: usize, d: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    for t in 0..n {
        for h in 0..heads {
            let v: Vec<f64> = x[(t * heads + h) * d..][..d].to_vec();
            for i in 0..2 * half {
                let angle = f64::from(t as f32 * inv_freq[i % half]);
                let rot = if i < half { -v[i + half] } else { v[i - half] };
                x[(t * heads + h) * d + i] = v[i] * angle.cos() + rot * angle.sin();
            }
        }
    }
}

/// Logits `[n, vocab]` of token ids `ids` (one sequence).
fn forward(c: &HfConfig, w: &Weights<'_>, ids: &[u32]) -> Vec<f64> {
    let (n, h, d) = (ids.len(), c.hidden_size, c.head_dim);
    let (heads, kv_heads, inter) = (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size);
    let embed = w.get("model.embed_tokens.weight");
    let mut x: Vec<f64> = ids
        .iter()
        .flat_map(|&t| embed[t as usize * h..][..h].to_vec())
        .collect();
    let inv_freq = c.rope.inv_freq();
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let xn = rmsnorm(&x, &w.get(&format!("{p}.input_layernorm.weight")), c.rms_norm_eps);
        let proj = |name: &str, out: usize| {
            let bias = w.try_get(&format!("{p}.self_attn.{name}.bias"));
            linear(
                &xn,
                &w.get(&format!("{p}.self_attn.{name}.weight")),
                bias.as_deref(),
                n,
                h,
                out,
            )
        };
        let (mut q, mut k, v) = (
            proj("q_proj", heads * d),
            proj("k_proj", kv_heads * d),
            proj("v_proj", kv_heads * d),
        );
        rope(&mut q, n, heads, d, &inv_freq);
        rope(&mut k, n, kv_heads, d, &inv_freq);
        let mut attn = vec![0.0; n * heads * d];
        for hq in 0..heads {
            let hk = hq / c.kv_group();
            for i in 0..n {
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..d)
                            .map(|e| q[(i * heads + hq) * d + e] * k[(j * kv_heads + hk) * d + e])
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    for e in 0..d {
                        attn[(i * heads + hq) * d + e] += (s - m).exp() / z * v[(j * kv_heads + hk) * d + e];
                    }
                }
            }
        }
        let o = linear(
            &attn,
            &w.get(&format!("{p}.self_attn.o_proj.weight")),
            None,
            n,
            heads * d,
            h,
        );
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let xn = rmsnorm(
            &x,
            &w.get(&format!("{p}.post_attention_layernorm.weight")),
            c.rms_norm_eps,
        );
        let gate = linear(&xn, &w.get(&format!("{p}.mlp.gate_proj.weight")), None, n, h, inter);
        let up = linear(&xn, &w.get(&format!("{p}.mlp.up_proj.weight")), None, n, h, inter);
        let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let down = linear(&act, &w.get(&format!("{p}.mlp.down_proj.weight")), None, n, inter, h);
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
    }
    let xn = rmsnorm(&x, &w.get("model.norm.weight"), c.rms_norm_eps);
    let head = if c.tie_word_embeddings {
        embed
    } else {
        w.get("lm_head.weight")
    };
    linear(&xn, &head, None, n, h, c.vocab_size)
}

fn argmax(row: &[f64]) -> u32 {
    row.iter()
        .enumerate()
        .fold(
            (0, f64::NEG_INFINITY),
            |best, (i, &v)| if v > best.1 { (i, v) } else { best },
        )
        .0 as u32
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn fixtures_match_transformers_logits_loss_and_greedy_tokens() {
    for (name, qkv_bias, tied) in [
        ("llama", false, true),
        ("mistral", false, false),
        ("qwen2", true, false),
    ] {
        let dir = HfModelDir::open(&model_dir(name)).unwrap();
        let c = &dir.config;
        assert_eq!(
            (c.qkv_bias, c.tie_word_embeddings, c.kv_group()),
            (qkv_bias, tied, 2),
            "{name}"
        );
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(model_dir(name).join("reference.json")).unwrap()).unwrap();
        let tokens = ids(&reference["ids"]);
        let w = Weights { dir: &dir };
        let logits = forward(c, &w, &tokens);
        let want: Vec<f64> = reference["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
            .collect();
        assert_eq!(logits.len(), want.len());
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = logits.iter().zip(&want).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        // transformers ran in f32: its logits carry ~1e-6 relative error; a convention slip (rope
        // layout, head grouping, a missing bias) moves them by 1e-2 or more.
        assert!(
            worst <= 1e-5 * scale,
            "{name}: max |diff| {worst} vs max |logit| {scale}"
        );
        let vocab = c.vocab_size;
        let loss: f64 = (0..tokens.len() - 1)
            .map(|t| {
                let row = &logits[t * vocab..][..vocab];
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - row[tokens[t + 1] as usize]
            })
            .sum::<f64>()
            / (tokens.len() - 1) as f64;
        let want_loss = reference["loss"].as_f64().unwrap();
        assert!(
            (loss - want_loss).abs() <= 1e-5 * want_loss,
            "{name}: loss {loss} vs {want_loss}"
        );
        let mut seq = ids(&reference["prompt"]);
        let greedy = ids(&reference["greedy"]);
        for _ in 0..greedy.len() {
            let logits = forward(c, &w, &seq);
            seq.push(argmax(&logits[(seq.len() - 1) * vocab..]));
        }
        assert_eq!(&seq[seq.len() - greedy.len()..], &greedy[..], "{name}: greedy tokens");
    }
}
