//! Llama-family self-attention: a pre-norm fused q/k/v projection (optional biases, as Qwen2),
//! rotary position embeddings on q and k, grouped-query attention (`kv_heads` key/value heads,
//! each serving `heads / kv_heads` query heads) and an output projection without bias.
//!
//! The full attention op takes as many key/value heads as query heads, so forward repeats each
//! key/value head over its group and backward sums the group's gradients back (the same sums
//! transformers' `repeat_kv` makes autograd do). Training keeps every tensor where its input
//! lives (host memory, or a GPU's for device tensors): the split, repeat, sum and join are column
//! copies and f32 adds through the op trait. Generation uses
//! [`GroupedQueryAttention::forward_cached`], which reads the grouped cache in place (host only).

use super::columns::{join_columns, split_columns};
use super::init::child_seed;
use super::layernorm_linear::LayerNormLinear;
use super::linear::Linear;
use super::linears::VisitLinears;
use super::no_forward;
use super::norm::NormConfig;
use super::param::{Module, Parameter};
use super::replay::Replay;
use crate::amp::Precision;
use crate::dispatch::{
    AttentionShape, Backend, CachedAttentionShape, ColumnCopy, RopeShape, RopeTable, Values, ValuesMut,
};
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

/// What attention keeps for backward, where the layer's input lives.
struct GqaSaved {
    /// Rotated queries `[tokens, heads * d]`.
    q: Tensor,
    /// Rotated keys and values repeated to every query head `[tokens, heads * d]`.
    k: Tensor,
    v: Tensor,
    out: Tensor,
    /// `[batch * heads * seq, 1]`.
    lse: Tensor,
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
    /// `first_position + row % seq`), where `x` lives; rows past `tokens` are padding.
    fn project(
        &mut self,
        x: &Tensor,
        (tokens, seq): (usize, usize),
        first_position: usize,
        rope: &RopeTable,
        replay: bool,
    ) -> Result<[Tensor; 3]> {
        let c = self.config;
        let qkv = self.qkv.run(x, replay)?;
        let [mut q, mut k, v] = split(&self.backend, &qkv, tokens, [c.q_width(), c.kv_width(), c.kv_width()])?;
        qkv.recycle();
        let kernels = self.backend.kernels();
        for (part, heads) in [(&mut q, c.heads), (&mut k, c.kv_heads)] {
            let shape = RopeShape {
                rows: tokens,
                seq,
                heads,
                head_dim: c.head_dim,
                first_position,
            };
            kernels.rope_forward(part.values_mut(), shape, rope)?;
            kernels.round(part.values_mut(), self.dtype)?;
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
        // A tensor on a device these ops cannot read (any GPU's on the CPU backend) is
        // `DeviceMismatch` naming the layer's op, before any work.
        self.backend.expect_on("grouped attention forward", x)?;
        let c = self.config;
        let tokens = batch.saturating_mul(seq);
        self.check_rows(x, tokens)?;
        let [q, k, v] = self.project(x, (tokens, seq), 0, rope, replay)?;
        let (k, v) = (repeat_heads(&self.backend, &c, k)?, repeat_heads(&self.backend, &c, v)?);
        let shape = AttentionShape {
            batch,
            seq,
            heads: c.heads,
            head_dim: c.head_dim,
        };
        // The attention forward writes all of `out` and `lse`.
        let mut out = self.backend.output_like(&q, tokens, c.q_width())?;
        let mut lse = self.backend.output_like(&q, batch * c.heads * seq, 1)?;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        self.backend.kernels().attention_forward(
            q.values(),
            k.values(),
            v.values(),
            shape,
            scale,
            self.dtype,
            out.values_mut(),
            lse.values_mut(),
        )?;
        self.backend.kernels().round(out.values_mut(), self.dtype)?;
        // The output projection keeps its own copy for wgrad (backward keeps this one).
        let y = self.out_proj.forward_owned(out.kept_copy(), replay)?;
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

    /// dX, where `dy` lives; accumulates the parameter gradients.
    pub fn backward(&mut self, dy: &Tensor, rope: &RopeTable) -> Result<Tensor> {
        self.backend.expect_on("grouped attention backward", dy)?;
        if let Some(kept) = self.replay.take(&self.name)? {
            self.run(&kept.x, kept.batch, kept.seq, rope, true)?;
        }
        let c = self.config;
        let dout = self.out_proj.backward(dy)?;
        let s = self.saved.take().ok_or_else(|| no_forward(&self.name))?;
        let (tokens, cols) = s.q.shape();
        // The attention backward writes all of dq, dk and dv.
        let mut grads = Vec::with_capacity(3);
        for _ in 0..3 {
            grads.push(self.backend.output_like(&dout, tokens, cols)?);
        }
        let [mut dq, mut dk, mut dv]: [Tensor; 3] = grads.try_into().expect("three gradients");
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        self.backend.kernels().attention_backward(
            dout.values(),
            s.q.values(),
            s.k.values(),
            s.v.values(),
            s.out.values(),
            s.lse.values(),
            s.shape,
            scale,
            self.dtype,
            dq.values_mut(),
            dk.values_mut(),
            dv.values_mut(),
        )?;
        for dead in [dout, s.q, s.k, s.v, s.out, s.lse] {
            dead.recycle();
        }
        let (mut dk, dv) = (sum_heads(&self.backend, &c, dk)?, sum_heads(&self.backend, &c, dv)?);
        for (part, heads) in [(&mut dq, c.heads), (&mut dk, c.kv_heads)] {
            let shape = RopeShape {
                rows: tokens,
                seq: s.shape.seq,
                heads,
                head_dim: c.head_dim,
                first_position: 0,
            };
            self.backend.kernels().rope_backward(part.values_mut(), shape, rope)?;
        }
        let mut dqkv = join_columns(&self.backend, [&dq, &dk, &dv])?;
        for dead in [dq, dk, dv] {
            dead.recycle();
        }
        self.backend.kernels().round(dqkv.values_mut(), self.dtype)?;
        let dx = self.qkv.backward(&dqkv);
        dqkv.recycle();
        dx
    }

    /// Forward of the next `new` tokens of one sequence after the `cache.len()` cached ones (rows
    /// of `x` past `new` are zero padding, which FP8 GEMMs need); appends their keys and values to
    /// `cache`. The output has as many rows as `x`. Keeps nothing for backward.
    pub fn forward_cached(&mut self, x: &Tensor, new: usize, cache: &mut KvCache, rope: &RopeTable) -> Result<Tensor> {
        // The cache and `attention_cached` take host values.
        const OP: &str = "grouped attention forward_cached";
        x.values().host(OP)?;
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
        let (q, k, v) = (q.values().host(OP)?, k.values().host(OP)?, v.values().host(OP)?);
        cache.k.extend_from_slice(k);
        cache.v.extend_from_slice(v);
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
            q,
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

/// The first `rows` rows of `t` `[tokens, sum(widths)]`, one `[rows, width]` tensor per part,
/// where `t` lives. Fewer rows than `t` has (generation's padding) only of host values.
fn split<const N: usize>(backend: &Backend, t: &Tensor, rows: usize, widths: [usize; N]) -> Result<[Tensor; N]> {
    let total: usize = widths.iter().sum();
    let src = match t.rows() == rows {
        true => t.values(),
        false => {
            let host = t.values().host("grouped attention forward_cached")?;
            Values::Host(host.get(..rows * total).ok_or_else(|| Error::LayerShape {
                layer: "grouped attention".to_string(),
                detail: format!("{rows} rows asked of a {}-row projection", t.rows()),
            })?)
        }
    };
    split_columns(backend, src, rows, widths)
}

/// `[tokens, kv_heads * d]` -> `[tokens, heads * d]`, query head `h` getting key/value head
/// `h / group`: one column copy per query head, where `x` lives (`x` itself for groups of one).
fn repeat_heads(backend: &Backend, c: &GqaConfig, x: Tensor) -> Result<Tensor> {
    let (d, group) = (c.head_dim, c.group());
    if group == 1 {
        return Ok(x);
    }
    let rows = x.rows();
    // The copies write every head of every row.
    let mut out = backend.output_like(&x, rows, c.q_width())?;
    for h in 0..c.heads {
        let copy = ColumnCopy {
            rows,
            width: d,
            a_cols: c.kv_width(),
            a_first: (h / group) * d,
            out_cols: c.q_width(),
            out_first: h * d,
        };
        backend.kernels().copy_columns(x.values(), out.values_mut(), copy)?;
    }
    x.recycle();
    Ok(out)
}

/// The adjoint of [`repeat_heads`]: each key/value head's gradient is the sum over its group,
/// where `dx` lives (`dx` itself for groups of one). The f32 sum starts from zero and adds the
/// group's heads in order, `((0 + g0) + g1) + ...` (zero's sign included), so host and device
/// tensors on every backend give the same bits.
fn sum_heads(backend: &Backend, c: &GqaConfig, dx: Tensor) -> Result<Tensor> {
    let (d, group) = (c.head_dim, c.group());
    if group == 1 {
        return Ok(dx);
    }
    let (rows, width) = (dx.rows(), c.kv_width());
    let kernels = backend.kernels();
    let mut sum = backend.output_like(&dx, rows, width)?;
    match sum.values_mut() {
        ValuesMut::Host(values) => values.fill(0.0),
        ValuesMut::Device(values) => values.zero()?,
    }
    // Each member's heads (member `i` of every group) side by side, then one add of all of them;
    // `spare` takes each add's result (an op's output cannot be its input).
    let mut member = backend.output_like(&dx, rows, width)?;
    let mut spare = backend.output_like(&dx, rows, width)?;
    for i in 0..group {
        for kv in 0..c.kv_heads {
            let copy = ColumnCopy {
                rows,
                width: d,
                a_cols: c.q_width(),
                a_first: (kv * group + i) * d,
                out_cols: width,
                out_first: kv * d,
            };
            kernels.copy_columns(dx.values(), member.values_mut(), copy)?;
        }
        kernels.residual_add(sum.values(), member.values(), Dtype::F32, spare.values_mut())?;
        std::mem::swap(&mut sum, &mut spare);
    }
    for dead in [dx, member, spare] {
        dead.recycle();
    }
    Ok(sum)
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

    fn config(heads: usize, kv_heads: usize, head_dim: usize) -> GqaConfig {
        GqaConfig {
            hidden: 8,
            heads,
            kv_heads,
            head_dim,
            qkv_bias: false,
            norm: NormConfig::default(),
            recompute: false,
        }
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.data().iter().map(|v| v.to_bits()).collect()
    }

    /// The host loop the op-based [`sum_heads`] replaced, whose bits it keeps: `out[kv] += head`
    /// from zero, query heads in order (groups of one copied).
    fn sum_heads_reference(dx: &[f32], c: &GqaConfig) -> Vec<f32> {
        let (d, group) = (c.head_dim, c.group());
        if group == 1 {
            return dx.to_vec();
        }
        let mut out = vec![0.0f32; dx.len() / c.q_width() * c.kv_width()];
        for (row, dst) in dx.chunks(c.q_width()).zip(out.chunks_mut(c.kv_width())) {
            for (h, head) in row.chunks(d).enumerate() {
                let kv = &mut dst[(h / group) * d..][..d];
                kv.iter_mut().zip(head).for_each(|(a, b)| *a += b);
            }
        }
        out
    }

    #[test]
    fn repeat_and_sum_heads_are_adjoint() {
        let (c, cpu) = (config(6, 2, 2), Backend::default());
        let x: Vec<f32> = (0..3 * 4).map(|i| i as f32).collect();
        let g: Vec<f32> = (0..3 * 12).map(|i| (i as f32 * 0.37).sin()).collect();
        let rx = repeat_heads(&cpu, &c, Tensor::new(x.clone(), 3, 4).unwrap()).unwrap();
        assert_eq!(rx.shape(), (3, 12));
        assert_eq!(&rx.data()[..12], &[0., 1., 0., 1., 0., 1., 2., 3., 2., 3., 2., 3.]);
        let sg = sum_heads(&cpu, &c, Tensor::new(g.clone(), 3, 12).unwrap()).unwrap();
        assert_eq!(sg.shape(), (3, 4));
        let lhs: f32 = rx.data().iter().zip(&g).map(|(a, b)| a * b).sum();
        let rhs: f32 = x.iter().zip(sg.data()).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-4, "{lhs} vs {rhs}");
        let parts = split(&cpu, &rx, 3, [4, 8]).unwrap();
        assert_eq!((parts[0].shape(), parts[1].shape()), ((3, 4), (3, 8)));
        assert_eq!(join_columns(&cpu, [&parts[0], &parts[1]]).unwrap(), rx);
    }

    #[test]
    fn summed_heads_have_the_bits_of_adding_each_head_in_order_from_zero() {
        let cpu = Backend::default();
        for (heads, kv_heads) in [(8, 2), (6, 3), (4, 1), (5, 5)] {
            let c = config(heads, kv_heads, 3);
            let (tokens, qw) = (4, c.q_width());
            // Magnitudes far apart, so the order of the adds shows in the bits.
            let mut dx: Vec<f32> = (0..tokens * qw)
                .map(|i| (i as f32 * 0.37).sin() * 10f32.powi((i % 5) as i32 * 3 - 6))
                .collect();
            // Row 0: every head -0.0, whose sum from zero is +0.0 (a copy of the first head
            // would keep -0.0); row 1: signed zeros among other values.
            dx[..qw].fill(-0.0);
            dx[qw..2 * qw].iter_mut().step_by(2).for_each(|v| *v = -0.0);
            let want: Vec<u32> = sum_heads_reference(&dx, &c).iter().map(|v| v.to_bits()).collect();
            let got = sum_heads(&cpu, &c, Tensor::new(dx.clone(), tokens, qw).unwrap()).unwrap();
            assert_eq!(bits(&got), want, "{heads} heads over {kv_heads}");
            let row0_zero = if c.group() > 1 { 0 } else { (-0.0f32).to_bits() };
            assert!(
                bits(&got)[..c.kv_width()].iter().all(|&b| b == row0_zero),
                "{heads}/{kv_heads}"
            );
        }
    }

    #[test]
    fn groups_of_one_share_the_tensor() {
        let (c, cpu) = (config(4, 4, 2), Backend::default());
        let x = Tensor::new((0..3 * 8).map(|i| i as f32 - 0.5).collect(), 3, 8).unwrap();
        assert_eq!(repeat_heads(&cpu, &c, x.clone()).unwrap(), x);
        assert_eq!(sum_heads(&cpu, &c, x.clone()).unwrap(), x);
    }

    #[test]
    fn a_split_of_fewer_rows_takes_the_leading_rows_of_host_values_only() {
        let cpu = Backend::default();
        let t = Tensor::new((0..4 * 5).map(|i| i as f32).collect(), 4, 5).unwrap();
        let [a, b] = split(&cpu, &t, 2, [2, 3]).unwrap();
        assert_eq!(a.data(), &[0., 1., 5., 6.]);
        assert_eq!(b.data(), &[2., 3., 4., 7., 8., 9.]);
        let err = split(&cpu, &t, 5, [2, 3]).unwrap_err();
        assert!(matches!(err, Error::LayerShape { .. }), "{err}");
    }
}
