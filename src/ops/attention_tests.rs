//! The attention core's fast products against the crate path, bit for bit.

use super::*;

fn values(n: usize, seed: f32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * seed).sin() + 0.3 * (i as f32 * 0.017).cos()) * scale)
        .collect()
}

/// The shape, its element count and Q, K, V, dO of one case.
fn inputs(batch: usize, seq: usize, heads: usize, head_dim: usize) -> (AttentionShape, usize, [Vec<f32>; 4]) {
    let shape = AttentionShape::new(batch, seq, heads, head_dim);
    let n = batch * seq * heads * head_dim;
    let qkvd = [
        values(n, 0.37, 1.5),
        values(n, 0.71, 1.5),
        values(n, 0.13, 1.0),
        values(n, 0.53, 0.1),
    ];
    (shape, n, qkvd)
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    let bad = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
    assert!(bad.is_none(), "{what}: first difference at {bad:?} of {}", got.len());
}

#[test]
fn fast_products_give_the_crate_paths_bits() {
    if !simd_available() {
        eprintln!("no AVX-512F: only the crate path runs here");
        return;
    }
    // (batch, seq, heads, head_dim): the head, odd and non-multiple-of-64 seqs,
    // long enough for P V's K to cross one 512 chunk, every head_dim the models use.
    let shapes = [
        (2, 64, 2, 32),
        (1, 1, 1, 16),
        (1, 7, 3, 16),
        (2, 100, 2, 64),
        (1, 130, 1, 80),
        (1, 65, 2, 128),
        (1, 600, 1, 32),
        (3, 8, 2, 32),
        (1, 37, 2, 20),
    ];
    for (batch, seq, heads, d) in shapes {
        let (shape, n, [q, k, v, dout]) = inputs(batch, seq, heads, d);
        let scale = 1.0 / (d as f32).sqrt();
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let what = format!("{shape:?} {dtype}");
            let run = |fast: bool| {
                let (mut out, mut lse) = (vec![0.0; n], vec![0.0; batch * heads * seq]);
                forward_with(&q, &k, &v, shape, scale, dtype, &mut out, &mut lse, fast).unwrap();
                let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
                let ins = [&dout[..], &q, &k, &v, &out, &lse];
                backward_with(ins, shape, scale, dtype, [&mut dq, &mut dk, &mut dv], fast).unwrap();
                [out, lse, dq, dk, dv]
            };
            let (want, got) = (run(false), run(true));
            for (name, (g, w)) in ["out", "lse", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                same_bits(&format!("{what} {name}"), g, w);
            }
        }
    }
}

#[test]
fn head_transposes_match_the_definition() {
    // (rows, head_dim, stride): the head, edges past whole 16 and 8 blocks, one value.
    for (rows, d, stride) in [
        (64, 32, 256),
        (16, 16, 16),
        (37, 20, 40),
        (100, 80, 83),
        (8, 24, 24),
        (1, 1, 1),
    ] {
        let src = values(rows * stride, 0.291, 2.0);
        let mut dst = vec![f32::NAN; 3];
        transpose_head(&src, rows, d, stride, &mut dst);
        assert_eq!(dst.len(), rows * d);
        for j in 0..rows {
            for c in 0..d {
                let (got, want) = (dst[c * rows + j], src[j * stride + c]);
                assert_eq!(got.to_bits(), want.to_bits(), "{rows}x{d} stride {stride}: ({j}, {c})");
            }
        }
        // The fallback's 8 x 8 blocks give the same (edges left to `transpose_head`).
        let mut small = vec![0.0; rows * d];
        let b = transpose_blocks_8(&src, rows, d, stride, &mut small);
        for j in 0..rows / b * b {
            for c in 0..d / b * b {
                assert_eq!(small[c * rows + j].to_bits(), src[j * stride + c].to_bits());
            }
        }
    }
}

/// Timing of both paths on the shape and a long sequence (not a check: run with
/// `cargo test --release --lib ops::attention::tests::timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing() {
    for (batch, seq, heads, d, reps) in [(16, 64, 8, 32, 50), (1, 512, 8, 32, 10), (1, 2048, 4, 64, 2)] {
        let (shape, n, [q, k, v, dout]) = inputs(batch, seq, heads, d);
        let scale = 1.0 / (d as f32).sqrt();
        for dtype in [Dtype::F32, Dtype::Bf16] {
            for fast in [false, true, false, true] {
                let (mut out, mut lse) = (vec![0.0; n], vec![0.0; batch * heads * seq]);
                let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
                let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    let t = std::time::Instant::now();
                    forward_with(&q, &k, &v, shape, scale, dtype, &mut out, &mut lse, fast).unwrap();
                    fwd.push(t.elapsed().as_secs_f64() * 1e3);
                    let t = std::time::Instant::now();
                    let ins = [&dout[..], &q, &k, &v, &out, &lse];
                    backward_with(ins, shape, scale, dtype, [&mut dq, &mut dk, &mut dv], fast).unwrap();
                    bwd.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let median = |x: &mut Vec<f64>| {
                    x.sort_by(f64::total_cmp);
                    x[x.len() / 2]
                };
                println!(
                    "{batch}x{seq}x{heads}x{d} {dtype} fast={fast}: fwd {:.3} ms, bwd {:.3} ms",
                    median(&mut fwd),
                    median(&mut bwd)
                );
            }
        }
    }
}

/// The softmax as it was written before its sums went side by side and its exps 16 lanes wide
/// (with the softmax's own scalar `exp`, which the loops must reproduce).
fn softmax_reference(scores: &mut [f32], keys: usize, i0: usize, lse_out: &mut [f32]) {
    use crate::ops::softmax_exp::exp;
    for (r, (row, l)) in scores.chunks_mut(keys).zip(lse_out.iter_mut()).enumerate() {
        let valid = i0 + r + 1;
        let m = row[..valid].iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let sum: f32 = row[..valid].iter().map(|&s| exp(s - m)).sum();
        *l = m + sum.ln();
        let (live, masked) = row.split_at_mut(valid);
        live.iter_mut().for_each(|s| *s = exp(*s - *l));
        masked.fill(0.0);
    }
}

#[test]
fn the_softmax_gives_the_scalar_loops_bits() {
    // Block shapes (rows, i0): whole, partial and single-row groups; wide and huge score
    // ranges (exp arguments past -87 give subnormals and zeros); zeros, NaN and -inf rows.
    for (rows, i0, spread) in [(64, 0, 4.0), (64, 64, 30.0), (13, 0, 200.0), (1, 5, 1.0), (36, 64, 1e3)] {
        let keys = i0 + rows;
        let mut scores = values(rows * keys, 0.61, spread);
        if rows > 3 {
            scores[keys..2 * keys].fill(0.0);
            scores[2 * keys + 1] = f32::NAN;
            scores[3 * keys..4 * keys].fill(f32::NEG_INFINITY);
        }
        let (mut want, mut got) = (scores.clone(), scores.clone());
        let (mut lse_want, mut lse_got) = (vec![0.0; rows], vec![0.0; rows]);
        softmax_reference(&mut want, keys, i0, &mut lse_want);
        causal_softmax(&mut got, keys, i0, LseMode::Compute(&mut lse_got), &mut Vec::new());
        let same = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
        };
        assert!(same(&lse_got, &lse_want), "lse, rows {rows} i0 {i0}");
        assert!(same(&got, &want), "P, rows {rows} i0 {i0}");
        let mut given = scores.clone();
        causal_softmax(&mut given, keys, i0, LseMode::Given(&lse_want), &mut Vec::new());
        assert!(same(&given, &want), "P from a given lse, rows {rows} i0 {i0}");
    }
}

#[test]
fn non_finite_inputs_past_the_diagonal_keep_the_crate_paths_bits() {
    if !simd_available() {
        return;
    }
    // 0 * inf = NaN: a non-finite V, K, Q or dO row reaches earlier rows through the masked
    // zeros of P and dS on the crate path, so the fast path must not leave those terms out.
    let (batch, seq, heads, d) = (1, 70, 1, 32);
    let shape = AttentionShape {
        batch,
        seq,
        heads,
        head_dim: d,
    };
    let n = batch * seq * heads * d;
    for (which, row) in [(0, 40), (1, 66), (2, 3), (3, 50)] {
        let mut ins = [
            values(n, 0.37, 1.5),
            values(n, 0.71, 1.5),
            values(n, 0.13, 1.0),
            values(n, 0.53, 0.1),
        ];
        ins[which][row * d + 5] = f32::INFINITY;
        let [q, k, v, dout] = &ins;
        let run = |fast: bool| {
            let (mut out, mut lse) = (vec![0.0; n], vec![0.0; seq]);
            forward_with(q, k, v, shape, 0.2, Dtype::F32, &mut out, &mut lse, fast).unwrap();
            let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            let ins = [&dout[..], q, k, v, &out, &lse];
            backward_with(ins, shape, 0.2, Dtype::F32, [&mut dq, &mut dk, &mut dv], fast).unwrap();
            [out, lse, dq, dk, dv]
        };
        let (want, got) = (run(false), run(true));
        for (name, (g, w)) in ["out", "lse", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            let same = g
                .iter()
                .zip(w)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
            assert!(same, "input {which} row {row}: {name}");
        }
    }
}
