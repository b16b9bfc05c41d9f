//! The causal scaled dot-product attention core, forward and backward, on the CPU.
//!
//! `q`, `k`, `v` and `out` are `[batch, seq, heads, head_dim]` row-major (the QKV
//! projection's output split into three `[batch * seq, hidden]` views); `lse` is
//! `[batch, heads, seq]`. Row `i` attends to keys `0..=i`.
//!
//! Forward, per (batch, head), for blocks of [`Q_BLOCK`] query rows:
//! `S = scale * Q K^T` (f32, the CPU GEMM's products and sums, keys up to the block's last row only),
//! `lse_i = log sum_{j<=i} exp(S_ij)` (max-subtracted, f32),
//! `P_ij = exp(S_ij - lse_i)` for `j <= i`, else 0, rounded to `dtype`,
//! `O = P V`, rounded to `dtype`.
//! This is what a GPU flash-attention kernel stores: probabilities in the compute dtype
//! before the P.V matmul, softmax statistics in f32.
//!
//! Backward recomputes `P` from `q`, `k` and the saved `lse` (no `[seq, seq]` tensor is kept):
//! `dV = round(P)^T dO`, `dP = dO V^T`, `D_i = sum_c dO_ic O_ic`, `dS = round(P * (dP - D))`,
//! `dQ = scale * dS K`, `dK = scale * dS^T Q`; `dq`, `dk`, `dv` are rounded to `dtype`.
//!
//! One (batch, head) per rayon task. Where `attention_product.rs` applies (AVX-512F, shapes
//! whose sums do not depend on the operands' layout) the products run there with the GEMM
//! crate's bits, reading `q`, `v`, `out` and `dout` in place (a head's rows are
//! `heads * head_dim` apart) and K^T, V^T from per-task transposes; otherwise they call the
//! crate, with K-major copies for shapes whose sums would depend on the layout
//! (`gemm::cpu::layout_free`). The softmax's `exp` is `softmax_exp::exp` (f64 inside, rounded once
//! to f32, 16 values per step where the CPU has AVX-512F).
//! Scratch per task is two `Q_BLOCK x seq` score blocks, the head's
//! `seq x head_dim` results (three in the backward) and one `seq x head_dim` transpose (two),
//! so seq = 2048 at head_dim 64 needs about 2 MiB per forward task, 3.5 MiB per backward
//! task, not `seq^2` per head.

use rayon::prelude::*;

use super::attention_product::{Causal, applies, product, simd_available, transpose_blocks};
use super::check::{elements, len};
use super::softmax_exp::exp_shifted;
use crate::error::{Error, Result};
use crate::gemm::cpu::{F32View, f32_nt_serial, layout_free};
use crate::tensor::Dtype;

/// Query rows per block: a multiple of the GPU kernels' 64-row tiles.
pub const Q_BLOCK: usize = 64;

/// `(rtol, atol)` of the attention ops' normwise contract between backends in compute dtype
/// `dtype` (`docs/numerics.md`, Op contracts): f32 the reduction's, 16-bit the dtype's. The one
/// source of these numbers for the shadow checks (`dispatch::contract`) and the tensor-core
/// kernels' self-check (`backend::cuda::attention_mma`).
pub(crate) fn contract_tolerances(dtype: Dtype) -> (f64, f64) {
    match dtype {
        Dtype::F32 => (1e-5, 1e-6),
        Dtype::Bf16 => (1.6e-2, 1e-5),
        Dtype::F16 => (1e-3, 1e-5),
    }
}

/// Sizes of the attention core's inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Features per head (hidden = heads * head_dim).
    pub head_dim: usize,
}

impl AttentionShape {
    /// `batch` sequences of `seq` tokens, `heads` heads of `head_dim` features.
    pub const fn new(batch: usize, seq: usize, heads: usize, head_dim: usize) -> Self {
        AttentionShape {
            batch,
            seq,
            heads,
            head_dim,
        }
    }

    /// Checked `(tokens, hidden)` = `(batch * seq, heads * head_dim)`.
    fn dims(&self) -> Result<(usize, usize)> {
        let tokens = elements("attention tokens (batch x seq)", self.batch, self.seq)?;
        let hidden = elements("attention hidden (heads x head_dim)", self.heads, self.head_dim)?;
        elements("attention q/k/v", tokens, hidden)?;
        elements("attention lse", tokens, self.heads)?;
        Ok((tokens, hidden))
    }
}

/// Where rows `i0..` of head `h` of sequence `b` start in a `[batch, seq, heads, head_dim]` tensor.
fn head_start(s: &AttentionShape, b: usize, h: usize, i0: usize) -> usize {
    (b * s.seq + i0) * s.heads * s.head_dim + h * s.head_dim
}

/// Writes the `[seq, head_dim]` heads (`head(b * heads + h)`) back into their places in a
/// `[batch, seq, heads, head_dim]` tensor, one sequence per rayon task.
fn scatter_heads<'a>(head: impl Fn(usize) -> &'a [f32] + Sync, s: &AttentionShape, dst: &mut [f32]) {
    let (d, hidden) = (s.head_dim, s.heads * s.head_dim);
    dst.par_chunks_mut(s.seq * hidden).enumerate().for_each(|(b, dst_b)| {
        for h in 0..s.heads {
            for (row, src) in dst_b.chunks_mut(hidden).zip(head(b * s.heads + h).chunks(d)) {
                row[h * d..(h + 1) * d].copy_from_slice(src);
            }
        }
    });
}

/// `view` itself where an `m x n` product's sums do not depend on operand layouts, else its
/// K-major copy in `copy` (the layout the products of these shapes have always read).
fn operand<'a>(view: F32View<'a>, m: usize, n: usize, copy: &'a mut Vec<f32>) -> F32View<'a> {
    if layout_free(m, n, view.k) || (view.k_stride == 1 && view.row_stride == view.k) {
        return view;
    }
    copy.clear();
    copy.reserve(view.rows * view.k);
    for r in 0..view.rows {
        let row = r * view.row_stride;
        copy.extend((0..view.k).map(|kk| view.data[row + kk * view.k_stride]));
    }
    F32View::k_major(copy, view.rows, view.k, view.k)
}

/// The per-task products: [`product`] where it gives the crate's bits (`attention_product.rs`),
/// else the crate on this task's thread, through [`operand`] copies where a shape needs them.
struct Products {
    fast: bool,
    copies: (Vec<f32>, Vec<f32>),
}

impl Products {
    fn new(fast: bool) -> Self {
        Products {
            fast,
            copies: Default::default(),
        }
    }

    /// `out [m, n] = alpha * a . b^T (+ beta * out)` in f32 (the same bits as the GEMM entry
    /// point). `causal` is what [`product`] may skip (the crate path skips nothing).
    fn matmul_nt(
        &mut self,
        a: F32View,
        b: F32View,
        alpha: f32,
        beta: f32,
        out: &mut [f32],
        causal: Causal,
    ) -> Result<()> {
        if self.fast && applies(&a, &b) {
            return product(a, b, alpha, beta, out, causal);
        }
        let (m, n) = (a.rows, b.rows);
        let a = operand(a, m, n, &mut self.copies.0);
        let b = operand(b, m, n, &mut self.copies.1);
        f32_nt_serial(a, b, alpha, beta, out)
    }
}

/// `[rows, head_dim]` rows `stride` apart, as its `[head_dim, rows]` transpose in `dst`
/// (the products' B operands want the output's columns contiguous). 16 x 16 blocks in
/// AVX-512 registers where the CPU has it, else 8 x 8 blocks through a local array (whole
/// 8-wide reads and writes); the edges value by value.
fn transpose_head(src: &[f32], rows: usize, d: usize, stride: usize, dst: &mut Vec<f32>) {
    dst.clear();
    dst.resize(rows * d, 0.0);
    let b = if transpose_blocks(src, rows, d, stride, dst) {
        16
    } else {
        transpose_blocks_8(src, rows, d, stride, dst)
    };
    let (full_rows, full_cols) = (rows / b * b, d / b * b);
    // Columns past the last full block, then rows past it.
    for j in 0..rows {
        let cs = if j < full_rows { full_cols..d } else { 0..d };
        for c in cs {
            dst[c * rows + j] = src[j * stride + c];
        }
    }
}

/// [`transpose_head`]'s whole 8 x 8 blocks without AVX-512; returns the block size.
fn transpose_blocks_8(src: &[f32], rows: usize, d: usize, stride: usize, dst: &mut [f32]) -> usize {
    const B: usize = 8;
    for j0 in (0..rows / B * B).step_by(B) {
        for c0 in (0..d / B * B).step_by(B) {
            let block: [[f32; B]; B] =
                std::array::from_fn(|jj| src[(j0 + jj) * stride + c0..][..B].try_into().expect("8 values"));
            for cc in 0..B {
                let out: &mut [f32; B] = (&mut dst[(c0 + cc) * rows + j0..][..B]).try_into().expect("8 values");
                for (o, row) in out.iter_mut().zip(&block) {
                    *o = row[cc];
                }
            }
        }
    }
    B
}

/// Whether `rows` rows of `d` values, `stride` apart, are all finite.
fn rows_finite(x: &[f32], rows: usize, d: usize, stride: usize) -> bool {
    x.chunks(stride)
        .take(rows)
        .all(|row| row[..d].iter().all(|v| v.is_finite()))
}

/// Rows whose softmax sums run side by side (independent add chains; each row still sums its
/// keys in order).
const SUM_ROWS: usize = 8;

/// Turns scaled scores of query rows `i0..i0 + rows` (row stride `keys`) into causal probabilities
/// `exp(s - lse)`, zero past the diagonal. Computes `lse` when `lse_out` is given, else reads `lse_in`.
/// `exps` is scratch for [`SUM_ROWS`] rows of `exp(s - max)`.
fn causal_softmax(scores: &mut [f32], keys: usize, i0: usize, lse: LseMode, exps: &mut Vec<f32>) {
    match lse {
        LseMode::Compute(lse_out) => {
            let groups = scores.chunks_mut(SUM_ROWS * keys).zip(lse_out.chunks_mut(SUM_ROWS));
            for (g, (rows, lse_g)) in groups.enumerate() {
                let first = i0 + g * SUM_ROWS; // row index of the group's first row
                exps.clear();
                exps.resize(SUM_ROWS * keys, 0.0);
                let mut maxes = [0.0f32; SUM_ROWS];
                for (r, (row, e)) in rows.chunks(keys).zip(exps.chunks_mut(keys)).enumerate() {
                    let valid = first + r + 1;
                    maxes[r] = max_skipping_nan(&row[..valid]);
                    e[..valid].copy_from_slice(&row[..valid]);
                    exp_shifted(&mut e[..valid], maxes[r]);
                }
                // Row r sums e[0..first + r + 1] left to right (as `Iterator::sum`); the rows'
                // chains interleave over the keys all of them have.
                let n = lse_g.len();
                let mut sums = [0.0f32; SUM_ROWS];
                for j in 0..=first {
                    for (r, sum) in sums[..n].iter_mut().enumerate() {
                        *sum += exps[r * keys + j];
                    }
                }
                for (r, sum) in sums[..n].iter_mut().enumerate() {
                    for &e in &exps[r * keys + first + 1..r * keys + first + r + 1] {
                        *sum += e;
                    }
                }
                for (r, (row, l)) in rows.chunks_mut(keys).zip(lse_g.iter_mut()).enumerate() {
                    *l = maxes[r] + sums[r].ln();
                    fill_probs(row, first + r + 1, *l);
                }
            }
        }
        LseMode::Given(lse_in) => {
            for (r, (row, &l)) in scores.chunks_mut(keys).zip(lse_in).enumerate() {
                fill_probs(row, i0 + r + 1, l);
            }
        }
    }
}

/// The largest non-NaN value (`-inf` if none), as a fold of `f32::max` gives it: the maximum
/// is exact in any order; only the sign of a zero maximum may differ, which neither
/// `exp(s - max)` nor `max + ln(sum)` (with `sum >= 1`) can see.
fn max_skipping_nan(xs: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            // A NaN x compares false and leaves m.
            *m = if x > *m { x } else { *m };
        }
    }
    let m = lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    tail.iter().fold(m, |m, &x| m.max(x))
}

fn fill_probs(row: &mut [f32], valid: usize, lse: f32) {
    let (live, masked) = row.split_at_mut(valid);
    exp_shifted(live, lse);
    masked.fill(0.0);
}

enum LseMode<'a> {
    Compute(&'a mut [f32]),
    Given(&'a [f32]),
}

/// True for an empty batch; an error for heads without features, which no kernel takes.
pub(crate) fn nothing_to_do(shape: &AttentionShape) -> Result<bool> {
    let empty = shape.batch == 0 || shape.seq == 0 || shape.heads == 0;
    if !empty && shape.head_dim == 0 {
        return Err(Error::InvalidShape {
            what: "attention",
            reason: format!("head_dim is 0 ({shape:?})"),
        });
    }
    Ok(empty)
}

fn check_inputs(shape: &AttentionShape, q: &[f32], k: &[f32], v: &[f32], lse: usize) -> Result<(usize, usize)> {
    let (tokens, hidden) = shape.dims()?;
    len("attention q [batch*seq, heads*head_dim]", tokens, hidden, q.len())?;
    len("attention k [batch*seq, heads*head_dim]", tokens, hidden, k.len())?;
    len("attention v [batch*seq, heads*head_dim]", tokens, hidden, v.len())?;
    len(
        "attention lse [batch*heads, seq]",
        shape.batch * shape.heads,
        shape.seq,
        lse,
    )?;
    Ok((tokens, hidden))
}

/// Causal attention forward; see the module docs. Writes `out` (`[batch, seq, heads, head_dim]`,
/// rounded to `dtype`) and `lse` (`[batch, heads, seq]`, f32) for the backward.
#[allow(clippy::too_many_arguments)]
pub fn attention_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    forward_with(q, k, v, shape, softmax_scale, dtype, out, lse, simd_available())
}

/// [`attention_forward`], its products through [`product`] where `fast` allows (same bits).
#[allow(clippy::too_many_arguments)]
fn forward_with(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    out: &mut [f32],
    lse: &mut [f32],
    fast: bool,
) -> Result<()> {
    let (tokens, hidden) = check_inputs(&shape, q, k, v, lse.len())?;
    len("attention out [batch*seq, heads*head_dim]", tokens, hidden, out.len())?;
    let AttentionShape {
        seq,
        heads,
        head_dim: d,
        ..
    } = shape;
    if nothing_to_do(&shape)? {
        return Ok(());
    }
    let hidden = heads * d;
    let heads_out: Vec<Vec<f32>> = lse
        .par_chunks_mut(seq)
        .enumerate()
        .map(|(bh, lse_h)| -> Result<Vec<f32>> {
            let (b, h) = (bh / heads, bh % heads);
            let at = |i0: usize| head_start(&shape, b, h, i0);
            let mut products = Products::new(fast);
            // K^T `[head_dim, seq]` for the fast products (S's columns contiguous).
            let mut k_t = Vec::new();
            if fast {
                transpose_head(&k[at(0)..], seq, d, hidden, &mut k_t);
            }
            let mut oh = vec![0.0; seq * d];
            let mut scores = Vec::with_capacity(Q_BLOCK * seq);
            let mut exps = Vec::with_capacity(SUM_ROWS * seq);
            for i0 in (0..seq).step_by(Q_BLOCK) {
                let i1 = (i0 + Q_BLOCK).min(seq);
                let (rows, keys) = (i1 - i0, i1); // causal: no key past the block's last query
                scores.clear();
                scores.resize(rows * keys, 0.0);
                let k_view = if fast {
                    F32View::transposed(&k_t, keys, d, seq)
                } else {
                    F32View::k_major(&k[at(0)..], keys, d, hidden)
                };
                // Scores past the diagonal are never read (the softmax zeroes them).
                products.matmul_nt(
                    F32View::k_major(&q[at(i0)..], rows, d, hidden),
                    k_view,
                    softmax_scale,
                    0.0,
                    &mut scores,
                    Causal::Columns(i0),
                )?;
                causal_softmax(&mut scores, keys, i0, LseMode::Compute(&mut lse_h[i0..i1]), &mut exps);
                dtype.round_slice(&mut scores);
                // O = P V: B is V^T `[head_dim, keys]`, read from V's rows. P is 0 past the
                // diagonal, so those terms are left out where V's rows there are finite.
                let finite_v = rows_finite(&v[at(i0)..], rows, d, hidden);
                products.matmul_nt(
                    F32View::k_major(&scores, rows, keys, keys),
                    F32View::transposed(&v[at(0)..], d, keys, hidden),
                    1.0,
                    0.0,
                    &mut oh[i0 * d..i1 * d],
                    if finite_v { Causal::KUpTo(i0) } else { Causal::Full },
                )?;
            }
            dtype.round_slice(&mut oh);
            Ok(oh)
        })
        .collect::<Result<_>>()?;
    scatter_heads(|bh| &heads_out[bh], &shape, out);
    Ok(())
}

/// Causal attention backward from the forward's `out` and `lse`; see the module docs.
/// Overwrites `dq`, `dk`, `dv` (`[batch, seq, heads, head_dim]`, rounded to `dtype`).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) -> Result<()> {
    let fast = simd_available();
    backward_with(
        [dout, q, k, v, out, lse],
        shape,
        softmax_scale,
        dtype,
        [dq, dk, dv],
        fast,
    )
}

/// [`attention_backward`] on `[dout, q, k, v, out, lse]`, its products through [`product`]
/// where `fast` allows (same bits).
fn backward_with(
    [dout, q, k, v, out, lse]: [&[f32]; 6],
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    [dq, dk, dv]: [&mut [f32]; 3],
    fast: bool,
) -> Result<()> {
    let (tokens, hidden) = check_inputs(&shape, q, k, v, lse.len())?;
    len("attention dout [batch*seq, heads*head_dim]", tokens, hidden, dout.len())?;
    len("attention out [batch*seq, heads*head_dim]", tokens, hidden, out.len())?;
    len("attention dq [batch*seq, heads*head_dim]", tokens, hidden, dq.len())?;
    len("attention dk [batch*seq, heads*head_dim]", tokens, hidden, dk.len())?;
    len("attention dv [batch*seq, heads*head_dim]", tokens, hidden, dv.len())?;
    let AttentionShape {
        seq,
        heads,
        head_dim: d,
        ..
    } = shape;
    if nothing_to_do(&shape)? {
        return Ok(());
    }
    let hidden = heads * d;
    let grads: Vec<[Vec<f32>; 3]> = lse
        .par_chunks(seq)
        .enumerate()
        .map(|(bh, lse_h)| -> Result<[Vec<f32>; 3]> {
            let (b, h) = (bh / heads, bh % heads);
            let at = |i0: usize| head_start(&shape, b, h, i0);
            let (mut dqh, mut dkh, mut dvh) = (vec![0.0; seq * d], vec![0.0; seq * d], vec![0.0; seq * d]);
            // Scratch reused across blocks.
            let mut products = Products::new(fast);
            // K^T and V^T `[head_dim, seq]` for the fast products (S's and dP's columns contiguous).
            let (mut k_t, mut v_t) = (Vec::new(), Vec::new());
            if fast {
                transpose_head(&k[at(0)..], seq, d, hidden, &mut k_t);
                transpose_head(&v[at(0)..], seq, d, hidden, &mut v_t);
            }
            let mut p = Vec::with_capacity(Q_BLOCK * seq);
            let mut dp = Vec::with_capacity(Q_BLOCK * seq);
            let mut exps = Vec::new();
            let mut delta = [0.0f32; Q_BLOCK];
            for i0 in (0..seq).step_by(Q_BLOCK) {
                let i1 = (i0 + Q_BLOCK).min(seq);
                let (rows, keys) = (i1 - i0, i1);
                // This block's query rows of Q and dO, and the first `keys` rows of K and V.
                let q_blk = F32View::k_major(&q[at(i0)..], rows, d, hidden);
                let do_blk = F32View::k_major(&dout[at(i0)..], rows, d, hidden);
                let (k_keys, v_keys) = (&k[at(0)..], &v[at(0)..]);
                let (k_view, v_view) = if fast {
                    (
                        F32View::transposed(&k_t, keys, d, seq),
                        F32View::transposed(&v_t, keys, d, seq),
                    )
                } else {
                    (
                        F32View::k_major(k_keys, keys, d, hidden),
                        F32View::k_major(v_keys, keys, d, hidden),
                    )
                };
                // P recomputed from the saved lse; entries past the diagonal are never read
                // before the softmax zeroes them, nor those of dP (dS is 0 where P is).
                p.clear();
                p.resize(rows * keys, 0.0);
                products.matmul_nt(q_blk, k_view, softmax_scale, 0.0, &mut p, Causal::Columns(i0))?;
                causal_softmax(&mut p, keys, i0, LseMode::Given(&lse_h[i0..i1]), &mut exps);
                // dP = dO V^T
                dp.clear();
                dp.resize(rows * keys, 0.0);
                products.matmul_nt(do_blk, v_view, 1.0, 0.0, &mut dp, Causal::Columns(i0))?;
                // D_i = rowsum(dO * O)
                for (r, dl) in delta[..rows].iter_mut().enumerate() {
                    let row = at(i0 + r);
                    let (o, g) = (&out[row..row + d], &dout[row..row + d]);
                    *dl = o.iter().zip(g).map(|(a, b)| a * b).sum();
                }
                // dS = P * (dP - D), in place of dP; masked entries have P = 0.
                for ((ds_row, p_row), &dl) in dp.chunks_mut(keys).zip(p.chunks(keys)).zip(&delta[..rows]) {
                    for (ds, &pv) in ds_row.iter_mut().zip(p_row) {
                        *ds = if pv == 0.0 { 0.0 } else { pv * (*ds - dl) };
                    }
                }
                dtype.round_slice(&mut dp);
                dtype.round_slice(&mut p);
                // P and dS are 0 past the diagonal: the products below leave those terms out
                // where the other operand's rows there are finite.
                let skip = |x: &[f32], from: bool| match (rows_finite(x, rows, d, hidden), from) {
                    (false, _) => Causal::Full,
                    (true, true) => Causal::KFrom(i0),
                    (true, false) => Causal::KUpTo(i0),
                };
                // dV[..keys] += P^T dO: A is P^T `[keys, rows]`, B is dO^T `[head_dim, rows]`.
                products.matmul_nt(
                    F32View::transposed(&p, keys, rows, keys),
                    F32View::transposed(&dout[at(i0)..], d, rows, hidden),
                    1.0,
                    1.0,
                    &mut dvh[..keys * d],
                    skip(&dout[at(i0)..], true),
                )?;
                // dK[..keys] += scale * dS^T Q
                products.matmul_nt(
                    F32View::transposed(&dp, keys, rows, keys),
                    F32View::transposed(&q[at(i0)..], d, rows, hidden),
                    softmax_scale,
                    1.0,
                    &mut dkh[..keys * d],
                    skip(&q[at(i0)..], true),
                )?;
                // dQ = scale * dS K: B is K^T `[head_dim, keys]`.
                products.matmul_nt(
                    F32View::k_major(&dp, rows, keys, keys),
                    F32View::transposed(k_keys, d, keys, hidden),
                    softmax_scale,
                    0.0,
                    &mut dqh[i0 * d..i1 * d],
                    skip(&k[at(i0)..], false),
                )?;
            }
            for g in [&mut dqh, &mut dkh, &mut dvh] {
                dtype.round_slice(g);
            }
            Ok([dqh, dkh, dvh])
        })
        .collect::<Result<_>>()?;
    for (g, dst) in [dq, dk, dv].into_iter().enumerate() {
        scatter_heads(|bh| &grads[bh][g], &shape, dst);
    }
    Ok(())
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
