//! Llama-family self-attention: a pre-norm fused q/k/v projection (optional biases, as Qwen2),
//! rotary position embeddings on q and k, grouped-query attention (`kv_heads` key/value heads,
//! each serving `heads / kv_heads` query heads) and an output projection without bias.
//!
//! The full attention op takes as many key/value heads as query heads, so forward repeats each
//! key/value head over its group and backward sums the group's gradients back (the same sums
//! transformers' `repeat_kv` makes autograd do). Generation uses [`GroupedQueryAttention::forward_cached`],
//! which reads the grouped cache in place.

use super::init::child_seed;
use super::layernorm_linear::LayerNormLinear;
use super::linear::Linear;
use super::linears::VisitLinears;
use super::no_forward;
use super::norm::NormConfig;
use super::param::{Module, Parameter};
use super::replay::Replay;
use crate::amp::Precision;
use crate::dispatch::{AttentionShape, Backend, CachedAttentionShape, RopeShape, RopeTable, Values, ValuesMut};
use crate::error::{Error, Result};
use crate::scaling::{DelayedSlot, Fp8TensorStats};
use crate::tensor::{DeviceKind, Dtype, Tensor};

/// Shape and options of a [`GroupedQueryAttention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GqaConfig {
    /// Model width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`; 1 is multi-query, `heads` is multi-head).
    pub kv_heads: usize,
    /// Features per head (need not be `hidden / heads`).
    pub head_dim: usize,
    /// Biases on q, k and v (Qwen2); the output projection never has one.
    pub qkv_bias: bool,
    /// The input norm (RMSNorm with a plain weight for the Llama family).
    pub norm: NormConfig,
    /// Backward recomputes everything from the saved input.
    pub recompute: bool,
}

impl GqaConfig {
    fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads.max(1)
    }
}

/// Keys (rotated) and values of the tokens seen so far, one sequence, one layer.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    len: usize,
}

impl KvCache {
    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

struct GqaSaved {
    /// Rotated queries `[tokens, heads * d]`.
    q: Vec<f32>,
    /// Rotated keys and values repeated to every query head `[tokens, heads * d]`.
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
    lse: Vec<f32>,
    shape: AttentionShape,
}

/// `Y = o_proj(attention(rope(q), rope(k), v))` with `[q | k | v] = qkv(norm(X))`.
/// Parameters: `name.qkv.norm.weight`, `name.qkv.linear.weight` `[(heads + 2 kv_heads) d, hidden]`
/// (rows: q, then k, then v, head-major), `name.qkv.linear.bias`, `name.o_proj.weight`.
pub struct GroupedQueryAttention {
    name: String,
    config: GqaConfig,
    dtype: Dtype,
    qkv: LayerNormLinear,
    out_proj: Linear,
    replay: Replay,
    saved: Option<GqaSaved>,
    backend: Backend,
}

impl GroupedQueryAttention {
    /// A layer with weights drawn from `seed`.
    pub fn new(name: &str, config: &GqaConfig, precision: &Precision, seed: u64) -> Result<Self> {
        if config.kv_heads == 0 || config.head_dim == 0 || !config.heads.is_multiple_of(config.kv_heads) {
            return Err(Error::LayerShape {
                layer: name.to_string(),
                detail: format!(
                    "{} query heads cannot be grouped over {} key/value heads of {} features",
                    config.heads, config.kv_heads, config.head_dim
                ),
            });
        }
        let width = config.q_width() + 2 * config.kv_width();
        Ok(GroupedQueryAttention {
            name: name.to_string(),
            config: *config,
            dtype: precision.compute_dtype(),
            qkv: LayerNormLinear::new(
                &format!("{name}.qkv"),
                config.hidden,
                width,
                config.qkv_bias,
                config.norm,
                false,
                precision,
                child_seed(seed, 1),
            )?,
            out_proj: Linear::new(
                &format!("{name}.o_proj"),
                config.q_width(),
                config.hidden,
                false,
                precision,
                child_seed(seed, 2),
            )?,
            replay: Replay::new(config.recompute),
            saved: None,
            backend: Backend::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GqaConfig {
        &self.config
    }

    /// `x` `[batch * seq, hidden]` -> `[batch * seq, hidden]`, each sequence starting at position 0.
    pub fn forward(&mut self, x: &Tensor, batch: usize, seq: usize, rope: &RopeTable) -> Result<Tensor> {
        let y = self.run(x, batch, seq, rope, false)?;
        if self.replay.enabled() {
            self.clear_saved();
            self.replay.keep(x, batch, seq);
        }
        Ok(y)
    }

    fn check_rows(&self, x: &Tensor, tokens: usize) -> Result<()> {
        x.expect(&self.name, "input", Some(tokens), self.config.hidden)
    }

    /// q, k, v of the first `tokens` rows of `x` with q and k rotated (positions
    /// `first_position + row % seq`); rows past `tokens` are padding.
    fn project(
        &mut self,
        x: &Tensor,
        (tokens, seq): (usize, usize),
        first_position: usize,
        rope: &RopeTable,
        replay: bool,
    ) -> Result<[Vec<f32>; 3]> {
        let c = self.config;
        let qkv = self.qkv.run(x, replay)?;
        let [mut q, mut k, v] = split(qkv.data(), tokens, [c.q_width(), c.kv_width(), c.kv_width()]);
        for (part, heads) in [(&mut q, c.heads), (&mut k, c.kv_heads)] {
            let shape = RopeShape {
                rows: tokens,
                seq,
                heads,
                head_dim: c.head_dim,
                first_position,
            };
            self.backend
                .kernels()
                .rope_forward(ValuesMut::Host(part), shape, rope)?;
            self.dtype.round_slice(part);
        }
        Ok([q, k, v])
    }

    pub(crate) fn run(
        &mut self,
        x: &Tensor,
        batch: usize,
        seq: usize,
        rope: &RopeTable,
        replay: bool,
    ) -> Result<Tensor> {
        // The head repeat and sum and the Q/K rotation run on host values (not yet on device
        // tensors): a GPU tensor is `DeviceMismatch` here, not a panic at its first host read.
        x.values().host("grouped attention forward")?;
        let c = self.config;
        let tokens = batch.saturating_mul(seq);
        self.check_rows(x, tokens)?;
        let [q, k, v] = self.project(x, (tokens, seq), 0, rope, replay)?;
        let (k, v) = (repeat_heads(&k, tokens, &c), repeat_heads(&v, tokens, &c));
        let shape = AttentionShape {
            batch,
            seq,
            heads: c.heads,
            head_dim: c.head_dim,
        };
        let mut out = vec![0.0; tokens * c.q_width()];
        let mut lse = vec![0.0; batch * c.heads * seq];
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        self.backend.kernels().attention_forward(
            Values::Host(&q),
            Values::Host(&k),
            Values::Host(&v),
            shape,
            scale,
            self.dtype,
            ValuesMut::Host(&mut out),
            ValuesMut::Host(&mut lse),
        )?;
        self.dtype.round_slice(&mut out);
        let y = self
            .out_proj
            .forward_pass(&Tensor::new(out.clone(), tokens, c.q_width())?, replay)?;
        self.saved = Some(GqaSaved {
            q,
            k,
            v,
            out,
            lse,
            shape,
        });
        Ok(y)
    }

    /// dX; accumulates the parameter gradients.
    pub fn backward(&mut self, dy: &Tensor, rope: &RopeTable) -> Result<Tensor> {
        dy.values().host("grouped attention backward")?; // host values only, as the forward
        if let Some(kept) = self.replay.take(&self.name)? {
            self.run(&kept.x, kept.batch, kept.seq, rope, true)?;
        }
        let c = self.config;
        let dout = self.out_proj.backward(dy)?;
        let s = self.saved.take().ok_or_else(|| no_forward(&self.name))?;
        let n = s.q.len();
        let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        self.backend.kernels().attention_backward(
            dout.values(),
            Values::Host(&s.q),
            Values::Host(&s.k),
            Values::Host(&s.v),
            Values::Host(&s.out),
            Values::Host(&s.lse),
            s.shape,
            scale,
            self.dtype,
            ValuesMut::Host(&mut dq),
            ValuesMut::Host(&mut dk),
            ValuesMut::Host(&mut dv),
        )?;
        let tokens = dout.rows();
        let (mut dk, dv) = (sum_heads(&dk, tokens, &c), sum_heads(&dv, tokens, &c));
        for (part, heads) in [(&mut dq, c.heads), (&mut dk, c.kv_heads)] {
            let shape = RopeShape {
                rows: tokens,
                seq: s.shape.seq,
                heads,
                head_dim: c.head_dim,
                first_position: 0,
            };
            self.backend
                .kernels()
                .rope_backward(ValuesMut::Host(part), shape, rope)?;
        }
        let mut dqkv = join(&[&dq, &dk, &dv], tokens, [c.q_width(), c.kv_width(), c.kv_width()]);
        self.dtype.round_slice(&mut dqkv);
        let width = c.q_width() + 2 * c.kv_width();
        self.qkv.backward(&Tensor::new(dqkv, tokens, width)?)
    }

    /// Forward of the next `new` tokens of one sequence after the `cache.len()` cached ones (rows
    /// of `x` past `new` are zero padding, which FP8 GEMMs need); appends their keys and values to
    /// `cache`. The output has as many rows as `x`. Keeps nothing for backward.
    pub fn forward_cached(&mut self, x: &Tensor, new: usize, cache: &mut KvCache, rope: &RopeTable) -> Result<Tensor> {
        x.values().host("grouped attention forward_cached")?; // host values only, as the forward
        let c = self.config;
        let rows = x.rows();
        if new > rows {
            return Err(Error::LayerShape {
                layer: self.name.clone(),
                detail: format!("{new} new tokens in a {rows}-row input"),
            });
        }
        self.check_rows(x, rows)?;
        let [q, k, v] = self.project(x, (new, new.max(1)), cache.len, rope, false)?;
        cache.k.extend_from_slice(&k);
        cache.v.extend_from_slice(&v);
        cache.len += new;
        let shape = CachedAttentionShape {
            queries: new,
            keys: cache.len,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        };
        let mut out = vec![0.0; rows * c.q_width()];
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        self.backend.kernels().attention_cached(
            &q,
            &cache.k,
            &cache.v,
            shape,
            scale,
            self.dtype,
            &mut out[..new * c.q_width()],
        )?;
        let y = self.out_proj.forward(&Tensor::new(out, rows, c.q_width())?)?;
        self.clear_saved();
        Ok(y)
    }

    pub(crate) fn clear_saved(&mut self) {
        self.qkv.clear_saved();
        self.out_proj.clear_saved();
        self.saved = None;
        self.replay.clear();
    }
}

/// `[tokens, sum(widths)]` -> one `[tokens, width]` matrix per part.
fn split<const N: usize>(x: &[f32], tokens: usize, widths: [usize; N]) -> [Vec<f32>; N] {
    let total: usize = widths.iter().sum();
    std::array::from_fn(|part| {
        let start: usize = widths[..part].iter().sum();
        let mut out = Vec::with_capacity(tokens * widths[part]);
        for row in x.chunks(total.max(1)).take(tokens) {
            out.extend_from_slice(&row[start..start + widths[part]]);
        }
        out
    })
}

/// The inverse of [`split`].
fn join<const N: usize>(parts: &[&[f32]; N], tokens: usize, widths: [usize; N]) -> Vec<f32> {
    let mut out = Vec::with_capacity(tokens * widths.iter().sum::<usize>());
    for t in 0..tokens {
        for (part, &w) in parts.iter().zip(&widths) {
            out.extend_from_slice(&part[t * w..(t + 1) * w]);
        }
    }
    out
}

/// `[tokens, kv_heads * d]` -> `[tokens, heads * d]`, query head `h` getting key/value head `h / group`.
fn repeat_heads(x: &[f32], tokens: usize, c: &GqaConfig) -> Vec<f32> {
    let (d, group) = (c.head_dim, c.group());
    if group == 1 {
        return x.to_vec();
    }
    let mut out = Vec::with_capacity(tokens * c.q_width());
    for row in x.chunks(c.kv_width()).take(tokens) {
        for head in row.chunks(d) {
            for _ in 0..group {
                out.extend_from_slice(head);
            }
        }
    }
    out
}

/// The adjoint of [`repeat_heads`]: each key/value head's gradient is the sum over its group.
fn sum_heads(dx: &[f32], tokens: usize, c: &GqaConfig) -> Vec<f32> {
    let (d, group) = (c.head_dim, c.group());
    if group == 1 {
        return dx.to_vec();
    }
    let mut out = vec![0.0; tokens * c.kv_width()];
    for (row, dst) in dx.chunks(c.q_width()).zip(out.chunks_mut(c.kv_width())) {
        for (h, head) in row.chunks(d).enumerate() {
            let kv = &mut dst[(h / group) * d..][..d];
            kv.iter_mut().zip(head).for_each(|(a, b)| *a += b);
        }
    }
    out
}

impl Module for GroupedQueryAttention {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.qkv.visit_parameters(f);
        self.out_proj.visit_parameters(f);
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        self.backend = Backend::on(device);
        self.qkv.to_device(device)?;
        self.out_proj.to_device(device)
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, &self.name);
        self.qkv.check_against_cpu(on);
        self.out_proj.check_against_cpu(on);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.qkv.visit_fp8_slots(f);
        self.out_proj.visit_fp8_slots(f);
    }

    fn saved_activation_bytes(&self) -> usize {
        let attention = self.saved.as_ref().map_or(0, |s| {
            (s.q.len() + s.k.len() + s.v.len() + s.out.len()) * self.dtype.bytes() + 4 * s.lse.len()
        });
        self.replay.bytes(self.dtype.bytes())
            + attention
            + self.qkv.saved_activation_bytes()
            + self.out_proj.saved_activation_bytes()
    }

    fn weight_cache_bytes(&self) -> usize {
        self.qkv.weight_cache_bytes() + self.out_proj.weight_cache_bytes()
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.qkv.collect_fp8_stats(out);
        self.out_proj.collect_fp8_stats(out);
    }
}

impl VisitLinears for GroupedQueryAttention {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut Linear)) {
        self.qkv.visit_linears(f);
        f(&mut self.out_proj);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeat_and_sum_heads_are_adjoint() {
        let c = GqaConfig {
            hidden: 8,
            heads: 6,
            kv_heads: 2,
            head_dim: 2,
            qkv_bias: false,
            norm: NormConfig::default(),
            recompute: false,
        };
        let x: Vec<f32> = (0..3 * 4).map(|i| i as f32).collect();
        let g: Vec<f32> = (0..3 * 12).map(|i| (i as f32 * 0.37).sin()).collect();
        let rx = repeat_heads(&x, 3, &c);
        assert_eq!(&rx[..12], &[0., 1., 0., 1., 0., 1., 2., 3., 2., 3., 2., 3.]);
        let sg = sum_heads(&g, 3, &c);
        let lhs: f32 = rx.iter().zip(&g).map(|(a, b)| a * b).sum();
        let rhs: f32 = x.iter().zip(&sg).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-4, "{lhs} vs {rhs}");
        let parts = split(&rx, 3, [4, 8]);
        assert_eq!(join(&[&parts[0], &parts[1]], 3, [4, 8]), rx);
    }
}
