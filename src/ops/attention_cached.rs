//! Causal attention of a few new queries against a key/value cache (generation with a KV
//! cache), forward only, with grouped-query heads read in place.
//!
//! The `queries` new tokens sit at positions `keys - queries .. keys`; query `i` attends to
//! keys `0..=keys - queries + i`. Query head `h` reads key/value head `h / (heads / kv_heads)`.
//! Scores are f32 dot products times `softmax_scale`, the softmax is in f32 (the training
//! forward's `softmax_exp::exp`), the probabilities
//! and the output are rounded to `dtype` as in [`super::attention_forward`], so a cached step
//! agrees with a full recompute to the rounding of a reordered sum.

use rayon::prelude::*;

use super::check::len;
use super::softmax_exp::exp_shifted;
use crate::error::{Error, Result};
use crate::tensor::Dtype;

/// Shape of a cached attention step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedAttentionShape {
    /// New tokens (rows of `q` and `out`).
    pub queries: usize,
    /// Cached tokens including the new ones (rows of `k` and `v`).
    pub keys: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
}

/// The argument check of both backends, on the lengths of `[q, k, v, out]`: true when there
/// is nothing to compute (no query, head or feature).
pub(crate) fn nothing_to_do(shape: &CachedAttentionShape, [q, k, v, out]: [usize; 4]) -> Result<bool> {
    let CachedAttentionShape {
        queries,
        keys,
        heads,
        kv_heads,
        head_dim: d,
    } = *shape;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) || queries > keys {
        return Err(Error::InvalidShape {
            what: "cached attention",
            reason: format!("{heads} heads over {kv_heads} key/value heads, {queries} queries over {keys} keys"),
        });
    }
    let width = |heads: usize| heads.saturating_mul(d);
    len("cached attention q", queries, width(heads), q)?;
    len("cached attention out", queries, width(heads), out)?;
    len("cached attention k", keys, width(kv_heads), k)?;
    len("cached attention v", keys, width(kv_heads), v)?;
    Ok(queries == 0 || heads == 0 || d == 0)
}

/// `out [queries, heads * head_dim]` from `q [queries, heads * head_dim]` and the cache
/// `k`, `v` `[keys, kv_heads * head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_cached(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: CachedAttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    out: &mut [f32],
) -> Result<()> {
    if nothing_to_do(&shape, [q.len(), k.len(), v.len(), out.len()])? {
        return Ok(());
    }
    let CachedAttentionShape {
        queries,
        keys,
        heads,
        kv_heads,
        head_dim: d,
    } = shape;
    let group = heads / kv_heads;
    let kv_width = kv_heads * d;
    out.par_chunks_mut(d).enumerate().for_each(|(row_head, o)| {
        let (i, h) = (row_head / heads, row_head % heads);
        let last = keys - queries + i;
        let qh = &q[row_head * d..][..d];
        let kv = (h / group) * d;
        let mut scores: Vec<f32> = (0..=last)
            .map(|j| {
                let kj = &k[j * kv_width + kv..][..d];
                qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * softmax_scale
            })
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        exp_shifted(&mut scores, max);
        let total: f32 = scores.iter().sum();
        o.fill(0.0);
        for (j, s) in scores.iter().enumerate() {
            let p = dtype.round(s / total);
            let vj = &v[j * kv_width + kv..][..d];
            o.iter_mut().zip(vj).for_each(|(acc, x)| *acc += p * x);
        }
        dtype.round_slice(o);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{AttentionShape, attention_forward};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// Repeats each key/value head `group` times: the layout the full attention op takes.
    fn repeat(x: &[f32], rows: usize, kv_heads: usize, group: usize, d: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows * kv_heads * group * d);
        for r in 0..rows {
            for h in 0..kv_heads * group {
                out.extend_from_slice(&x[(r * kv_heads + h / group) * d..][..d]);
            }
        }
        out
    }

    #[test]
    fn the_last_queries_match_full_causal_attention() {
        let (seq, heads, kv_heads, d, queries) = (11, 4, 2, 8, 3);
        let q = data(seq * heads * d, 1);
        let (k, v) = (data(seq * kv_heads * d, 2), data(seq * kv_heads * d, 3));
        let shape = AttentionShape {
            batch: 1,
            seq,
            heads,
            head_dim: d,
        };
        let (kr, vr) = (repeat(&k, seq, kv_heads, 2, d), repeat(&v, seq, kv_heads, 2, d));
        let mut full = vec![0.0; seq * heads * d];
        let mut lse = vec![0.0; heads * seq];
        let scale = 1.0 / (d as f32).sqrt();
        attention_forward(&q, &kr, &vr, shape, scale, Dtype::F32, &mut full, &mut lse).unwrap();
        let mut out = vec![0.0; queries * heads * d];
        let cached = CachedAttentionShape {
            queries,
            keys: seq,
            heads,
            kv_heads,
            head_dim: d,
        };
        let first = (seq - queries) * heads * d;
        attention_cached(&q[first..], &k, &v, cached, scale, Dtype::F32, &mut out).unwrap();
        for (a, b) in out.iter().zip(&full[first..]) {
            // Same products, sums in another order: a few ulps of values below 1.
            assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
        }
        let bad = CachedAttentionShape { kv_heads: 3, ..cached };
        assert!(attention_cached(&q[first..], &k, &v, bad, scale, Dtype::F32, &mut out).is_err());
        let short = CachedAttentionShape {
            keys: seq + 1,
            ..cached
        };
        assert!(attention_cached(&q[first..], &k, &v, short, scale, Dtype::F32, &mut out).is_err());
    }
}
