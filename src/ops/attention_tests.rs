//! The attention core's fast products against the crate path, bit for bit.

use super::*;

fn values(n: usize, seed: f32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * seed).sin() + 0.3 * (i as f32 * 0.017).cos()) * scale)
        .collect()
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
    ];
    for (batch, seq, heads, d) in shapes {
        let shape = AttentionShape {
            batch,
            seq,
            heads,
            head_dim: d,
        };
        let n = batch * seq * heads * d;
        let (q, k, v, dout) = (
            values(n, 0.37, 1.5),
            values(n, 0.71, 1.5),
            values(n, 0.13, 1.0),
            values(n, 0.53, 0.1),
        );
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

/// Timing of both paths on the shape and a long sequence (not a check: run with
/// `cargo test --release --lib ops::attention::tests::timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing() {
    for (batch, seq, heads, d, reps) in [(16, 64, 8, 32, 50), (1, 512, 8, 32, 10), (1, 2048, 4, 64, 2)] {
        let shape = AttentionShape {
            batch,
            seq,
            heads,
            head_dim: d,
        };
        let n = batch * seq * heads * d;
        let (q, k, v, dout) = (
            values(n, 0.37, 1.5),
            values(n, 0.71, 1.5),
            values(n, 0.13, 1.0),
            values(n, 0.53, 0.1),
        );
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
