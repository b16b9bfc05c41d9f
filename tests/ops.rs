//! The CPU reference ops against deliberately simple f64 re-derivations:
//! forwards against the f64 formula within the f32 tolerance of numerics.md
//! section 7, every backward against f64 central finite differences of the f64
//! forward (written here, independently of the crate).

use fp8_engine::Error;
use fp8_engine::ops::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// numerics.md section 7, f32 row.
const F32_RTOL: f64 = 1.3e-6;
const F32_ATOL: f64 = 1e-5;
/// Gradients sum up to a few hundred f32 products per element (row means, dgamma over rows):
/// ~sqrt(n) ulp typical, n ulp worst case, so a looser relative bound than a single rounding.
const GRAD_RTOL: f64 = 1e-4;
const GRAD_ATOL: f64 = 1e-5;

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Uniform values in `[lo, hi)`: realistic, not all ones, with a non-zero mean where lo != -hi.
fn uniform(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

fn to64(xs: &[f32]) -> Vec<f64> {
    xs.iter().map(|&x| x as f64).collect()
}

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs())).max(1.0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= atol * scale + rtol * w.abs(),
            "{what}[{i}]: got {g:e}, want {w:e} (|err| {err:e}, rtol {rtol:e}, atol {atol:e} x {scale:e})"
        );
    }
}

/// d f / d x_i by central differences in f64, step relative to |x_i|.
fn finite_diff(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            let h = 1e-6 * x[i].abs().max(1.0);
            let x0 = xp[i];
            xp[i] = x0 + h;
            let up = f(&xp);
            xp[i] = x0 - h;
            let down = f(&xp);
            xp[i] = x0;
            (up - down) / (2.0 * h)
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[track_caller]
fn assert_shape_error<T: std::fmt::Debug>(r: fp8_engine::Result<T>, needle: &str) {
    match r {
        Err(Error::ShapeMismatch { what, .. }) => {
            assert!(what.contains(needle), "error names '{what}', want '{needle}'")
        }
        other => panic!("want a shape error naming '{needle}', got {other:?}"),
    }
}

// ---------------------------------------------------------------- norms (f64 reference)

/// LayerNorm in f64: y, mean, rstd.
fn layernorm64(x: &[f64], g: &[f64], b: &[f64], cols: usize, eps: f64, zc: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut means, mut rstds) = (vec![], vec![], vec![]);
    for row in x.chunks(cols) {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..cols {
            let w = if zc { 1.0 + g[j] } else { g[j] };
            y.push((row[j] - mean) * rstd * w + b[j]);
        }
        means.push(mean);
        rstds.push(rstd);
    }
    (y, means, rstds)
}

/// RMSNorm in f64: y, rstd.
fn rmsnorm64(x: &[f64], g: &[f64], cols: usize, eps: f64, zc: bool) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut rstds) = (vec![], vec![]);
    for row in x.chunks(cols) {
        let rstd = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / cols as f64 + eps).sqrt();
        for j in 0..cols {
            let w = if zc { 1.0 + g[j] } else { g[j] };
            y.push(row[j] * rstd * w);
        }
        rstds.push(rstd);
    }
    (y, rstds)
}

const NORM_SHAPES: [(usize, usize); 5] = [(1, 1), (1, 7), (3, 33), (6, 128), (13, 77)];
const EPS: f32 = 1e-5;

#[test]
fn layernorm_matches_f64_forward_and_finite_difference_backward() {
    for (seed, &(rows, cols)) in NORM_SHAPES.iter().enumerate() {
        for zc in [false, true] {
            let mut r = rng(seed as u64);
            let x = uniform(&mut r, rows * cols, -1.5, 2.5);
            let gamma = uniform(&mut r, cols, 0.5, 1.5);
            let beta = uniform(&mut r, cols, -0.5, 0.5);
            let dy = uniform(&mut r, rows * cols, -1.0, 1.0);
            let shape = NormShape { rows, cols };
            let (mut y, mut mean, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
            layernorm_forward(&x, &gamma, &beta, shape, EPS, zc, &mut y, &mut mean, &mut rstd).unwrap();

            let (x64, g64, b64, dy64) = (to64(&x), to64(&gamma), to64(&beta), to64(&dy));
            let eps = EPS as f64;
            let (y64, mean64, rstd64) = layernorm64(&x64, &g64, &b64, cols, eps, zc);
            let ctx = format!("layernorm {rows}x{cols} zc={zc}");
            assert_close(&format!("{ctx} y"), &y, &y64, F32_RTOL, F32_ATOL);
            assert_close(&format!("{ctx} mean"), &mean, &mean64, F32_RTOL, F32_ATOL);
            assert_close(&format!("{ctx} rstd"), &rstd, &rstd64, 1e-5, 0.0);

            // Gradients start non-zero: dgamma and dbeta must accumulate, dx must be overwritten.
            let (mut dx, mut dgamma, mut dbeta) = (vec![f32::NAN; rows * cols], vec![0.25; cols], vec![-0.5; cols]);
            layernorm_backward(
                &dy,
                &x,
                &gamma,
                &mean,
                &rstd,
                shape,
                zc,
                &mut dx,
                &mut dgamma,
                &mut dbeta,
            )
            .unwrap();
            let loss = |x: &[f64], g: &[f64], b: &[f64]| dot(&layernorm64(x, g, b, cols, eps, zc).0, &dy64);
            let dx64 = finite_diff(&x64, |x| loss(x, &g64, &b64));
            let dg64: Vec<f64> = finite_diff(&g64, |g| loss(&x64, g, &b64))
                .iter()
                .map(|d| d + 0.25)
                .collect();
            let db64: Vec<f64> = finite_diff(&b64, |b| loss(&x64, &g64, b))
                .iter()
                .map(|d| d - 0.5)
                .collect();
            assert_close(&format!("{ctx} dx"), &dx, &dx64, GRAD_RTOL, GRAD_ATOL);
            assert_close(&format!("{ctx} dgamma"), &dgamma, &dg64, GRAD_RTOL, GRAD_ATOL);
            assert_close(&format!("{ctx} dbeta"), &dbeta, &db64, GRAD_RTOL, GRAD_ATOL);
        }
    }
}

#[test]
fn rmsnorm_matches_f64_forward_and_finite_difference_backward() {
    for (seed, &(rows, cols)) in NORM_SHAPES.iter().enumerate() {
        for zc in [false, true] {
            let mut r = rng(100 + seed as u64);
            let x = uniform(&mut r, rows * cols, -1.5, 2.5);
            let gamma = uniform(&mut r, cols, 0.5, 1.5);
            let dy = uniform(&mut r, rows * cols, -1.0, 1.0);
            let shape = NormShape { rows, cols };
            let (mut y, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows]);
            rmsnorm_forward(&x, &gamma, shape, EPS, zc, &mut y, &mut rstd).unwrap();

            let (x64, g64, dy64) = (to64(&x), to64(&gamma), to64(&dy));
            let eps = EPS as f64;
            let (y64, rstd64) = rmsnorm64(&x64, &g64, cols, eps, zc);
            let ctx = format!("rmsnorm {rows}x{cols} zc={zc}");
            assert_close(&format!("{ctx} y"), &y, &y64, F32_RTOL, F32_ATOL);
            assert_close(&format!("{ctx} rstd"), &rstd, &rstd64, 1e-5, 0.0);

            let (mut dx, mut dgamma) = (vec![f32::NAN; rows * cols], vec![0.25; cols]);
            rmsnorm_backward(&dy, &x, &gamma, &rstd, shape, zc, &mut dx, &mut dgamma).unwrap();
            let loss = |x: &[f64], g: &[f64]| dot(&rmsnorm64(x, g, cols, eps, zc).0, &dy64);
            let dx64 = finite_diff(&x64, |x| loss(x, &g64));
            let dg64: Vec<f64> = finite_diff(&g64, |g| loss(&x64, g)).iter().map(|d| d + 0.25).collect();
            assert_close(&format!("{ctx} dx"), &dx, &dx64, GRAD_RTOL, GRAD_ATOL);
            assert_close(&format!("{ctx} dgamma"), &dgamma, &dg64, GRAD_RTOL, GRAD_ATOL);
        }
    }
}

#[test]
fn zero_centered_norms_equal_plain_norms_with_gamma_plus_one() {
    let (rows, cols) = (9, 300); // more rows than one parallel block holds
    let mut r = rng(7);
    let x = uniform(&mut r, rows * cols, -3.0, 1.0);
    let gamma = uniform(&mut r, cols, -0.2, 0.2);
    let beta = uniform(&mut r, cols, -0.5, 0.5);
    let dy = uniform(&mut r, rows * cols, -1.0, 1.0);
    let gamma1: Vec<f32> = gamma.iter().map(|g| 1.0 + g).collect();
    let shape = NormShape { rows, cols };
    let n = rows * cols;
    let run_ln = |g: &[f32], zc: bool| {
        let (mut y, mut m, mut s) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
        layernorm_forward(&x, g, &beta, shape, EPS, zc, &mut y, &mut m, &mut s).unwrap();
        let (mut dx, mut dg, mut db) = (vec![0.0; n], vec![0.0; cols], vec![0.0; cols]);
        layernorm_backward(&dy, &x, g, &m, &s, shape, zc, &mut dx, &mut dg, &mut db).unwrap();
        (y, dx, dg, db)
    };
    assert_eq!(run_ln(&gamma, true), run_ln(&gamma1, false));
    let run_rms = |g: &[f32], zc: bool| {
        let (mut y, mut s) = (vec![0.0; n], vec![0.0; rows]);
        rmsnorm_forward(&x, g, shape, EPS, zc, &mut y, &mut s).unwrap();
        let (mut dx, mut dg) = (vec![0.0; n], vec![0.0; cols]);
        rmsnorm_backward(&dy, &x, g, &s, shape, zc, &mut dx, &mut dg).unwrap();
        (y, dx, dg)
    };
    assert_eq!(run_rms(&gamma, true), run_rms(&gamma1, false));
}

#[test]
fn norm_gradients_of_many_rows_equal_the_sum_over_single_rows() {
    // 2000 rows span several parallel blocks: the blocked dgamma reduction must equal
    // the row-by-row sum up to f32 reassociation.
    let (rows, cols) = (2000, 48);
    let mut r = rng(8);
    let x = uniform(&mut r, rows * cols, -2.0, 2.0);
    let gamma = uniform(&mut r, cols, 0.5, 1.5);
    let beta = vec![0.0; cols];
    let dy = uniform(&mut r, rows * cols, -1.0, 1.0);
    let (mut y, mut m, mut s) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
    let shape = NormShape { rows, cols };
    layernorm_forward(&x, &gamma, &beta, shape, EPS, false, &mut y, &mut m, &mut s).unwrap();
    let (mut dx, mut dg, mut db) = (vec![0.0; rows * cols], vec![0.0; cols], vec![0.0; cols]);
    layernorm_backward(&dy, &x, &gamma, &m, &s, shape, false, &mut dx, &mut dg, &mut db).unwrap();
    let (mut dg64, mut db64) = (vec![0.0f64; cols], vec![0.0f64; cols]);
    for i in 0..rows {
        for j in 0..cols {
            let xhat = (x[i * cols + j] as f64 - m[i] as f64) * s[i] as f64;
            dg64[j] += dy[i * cols + j] as f64 * xhat;
            db64[j] += dy[i * cols + j] as f64;
        }
    }
    assert_close("dgamma over 2000 rows", &dg, &dg64, GRAD_RTOL, GRAD_ATOL);
    assert_close("dbeta over 2000 rows", &db, &db64, GRAD_RTOL, GRAD_ATOL);
}

#[test]
fn norms_reject_wrong_lengths_with_the_buffer_named() {
    let shape = NormShape { rows: 2, cols: 3 };
    let (x, g, b) = (vec![1.0; 6], vec![1.0; 3], vec![0.0; 3]);
    let (mut y, mut m, mut s) = (vec![0.0; 6], vec![0.0; 2], vec![0.0; 2]);
    assert_shape_error(
        layernorm_forward(&x[..5], &g, &b, shape, EPS, false, &mut y, &mut m, &mut s),
        "x",
    );
    assert_shape_error(
        layernorm_forward(&x, &g[..2], &b, shape, EPS, false, &mut y, &mut m, &mut s),
        "gamma",
    );
    assert_shape_error(
        layernorm_forward(&x, &g, &b, shape, EPS, false, &mut y, &mut m[..1], &mut s),
        "mean",
    );
    assert_shape_error(rmsnorm_forward(&x, &g, shape, EPS, false, &mut y[..4], &mut s), "y");
    let (mut dx, mut dg, mut db) = (vec![0.0; 6], vec![0.0; 3], vec![0.0; 4]);
    assert_shape_error(
        layernorm_backward(&x, &x, &g, &m, &s, shape, false, &mut dx, &mut dg, &mut db),
        "dbeta",
    );
    assert_shape_error(
        rmsnorm_backward(&x, &x, &g, &s[..1], shape, false, &mut dx, &mut dg),
        "rstd",
    );
}

#[test]
fn norms_propagate_nan_to_its_row_only() {
    let (rows, cols) = (3, 5);
    let mut x = uniform(&mut rng(9), rows * cols, -1.0, 1.0);
    x[cols + 2] = f32::NAN; // row 1
    x[2 * cols] = f32::INFINITY; // row 2
    let g = vec![1.0; cols];
    let shape = NormShape { rows, cols };
    let (mut y, mut m, mut s) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
    layernorm_forward(&x, &g, &vec![0.0; cols], shape, EPS, false, &mut y, &mut m, &mut s).unwrap();
    assert!(y[..cols].iter().all(|v| v.is_finite()));
    assert!(y[cols..2 * cols].iter().all(|v| v.is_nan()));
    let mut dx = vec![0.0; rows * cols];
    let mut dg = vec![0.0; cols];
    layernorm_backward(&y, &x, &g, &m, &s, shape, false, &mut dx, &mut dg, &mut vec![0.0; cols]).unwrap();
    assert!(dx[cols..2 * cols].iter().all(|v| v.is_nan()));
    rmsnorm_forward(&x, &g, shape, EPS, false, &mut y, &mut s).unwrap();
    assert!(y[..cols].iter().all(|v| v.is_finite()) && y[cols..2 * cols].iter().all(|v| v.is_nan()));
}

// ---------------------------------------------------------------- activations

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Sizes around the parallel chunk (16 K) and odd ones.
const ACT_SIZES: [usize; 4] = [1, 7, 1000, 40_003];

#[test]
fn gelu_is_the_tanh_approximation_with_a_finite_difference_gradient() {
    for (seed, &n) in ACT_SIZES.iter().enumerate() {
        let mut r = rng(200 + seed as u64);
        let x = uniform(&mut r, n, -6.0, 6.0);
        let dy = uniform(&mut r, n, -1.0, 1.0);
        let mut y = vec![0.0; n];
        gelu_forward(&x, &mut y).unwrap();
        let y64: Vec<f64> = x.iter().map(|&v| gelu64(v as f64)).collect();
        assert_close(&format!("gelu y n={n}"), &y, &y64, F32_RTOL, F32_ATOL);
        let mut dx = vec![f32::NAN; n];
        gelu_backward(&dy, &x, &mut dx).unwrap();
        let dx64: Vec<f64> = x
            .iter()
            .zip(&dy)
            .map(|(&v, &d)| d as f64 * finite_diff(&[v as f64], |p| gelu64(p[0]))[0])
            .collect();
        assert_close(&format!("gelu dx n={n}"), &dx, &dx64, GRAD_RTOL, GRAD_ATOL);
    }
    // The erf GELU differs by ~1.5e-4 at x = 1: far outside the f32 tolerance checked above.
    let mut y = [0.0];
    gelu_forward(&[1.0], &mut y).unwrap();
    assert!((y[0] as f64 - 0.841_344_746).abs() > 1e-4);
}

/// The tanh-GELU and its derivative in f64 through the logistic form (`0.5 (1 + tanh u) =
/// 1 / (1 + e^-2u)`), which keeps full precision in the negative tail where `1 + tanh u` cancels.
fn gelu64_logistic(x: f64) -> (f64, f64) {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let e = (-2.0 * c * (x + 0.044715 * x * x * x)).exp();
    let s = 1.0 / (1.0 + e);
    (x * s, s + 2.0 * x * s * (e * s) * c * (1.0 + 3.0 * 0.044715 * x * x))
}

/// The accuracy bound of `docs/numerics.md`, Activations: `|error| <= 2 eps max(|exact|, 1)`
/// (eps = 2^-23) for the GELU and its derivative, on every 61st f32 in [-10, 10], both signs.
#[test]
fn gelu_is_within_two_eps_of_f64_on_a_dense_sample() {
    let positive: Vec<f32> = (0..=10.0f32.to_bits()).step_by(61).map(f32::from_bits).collect();
    let eps = f32::EPSILON as f64;
    for chunk in positive.chunks(1 << 20) {
        let x: Vec<f32> = chunk.iter().flat_map(|&v| [v, -v]).collect();
        let mut y = vec![0.0; x.len()];
        let mut dx = vec![0.0; x.len()];
        gelu_forward(&x, &mut y).unwrap();
        gelu_backward(&vec![1.0; x.len()], &x, &mut dx).unwrap();
        for ((&v, &y), &d) in x.iter().zip(&y).zip(&dx) {
            let (y64, d64) = gelu64_logistic(v as f64);
            let (ey, ed) = ((y as f64 - y64).abs(), (d as f64 - d64).abs());
            assert!(ey <= 2.0 * eps * y64.abs().max(1.0), "gelu({v}) = {y}, f64 {y64}");
            assert!(ed <= 2.0 * eps * d64.abs().max(1.0), "gelu'({v}) = {d}, f64 {d64}");
        }
    }
}

#[test]
fn swiglu_matches_f64_forward_and_finite_difference_backward() {
    for (seed, &(rows, cols)) in [(1, 1), (1, 5), (3, 33), (40, 1000)].iter().enumerate() {
        let mut r = rng(300 + seed as u64);
        let x = uniform(&mut r, rows * 2 * cols, -8.0, 8.0);
        let dy = uniform(&mut r, rows * cols, -1.0, 1.0);
        let mut y = vec![0.0; rows * cols];
        swiglu_forward(&x, rows, cols, &mut y).unwrap();
        let fwd = |x: &[f64], i: usize, j: usize| silu64(x[i * 2 * cols + j]) * x[i * 2 * cols + cols + j];
        let x64 = to64(&x);
        let y64: Vec<f64> = (0..rows * cols).map(|e| fwd(&x64, e / cols, e % cols)).collect();
        assert_close(&format!("swiglu y {rows}x{cols}"), &y, &y64, F32_RTOL, F32_ATOL);
        let mut dx = vec![f32::NAN; rows * 2 * cols];
        swiglu_backward(&dy, &x, rows, cols, &mut dx).unwrap();
        // Each output depends on one gate and one up value: differentiate through that pair.
        let mut dx64 = vec![0.0; rows * 2 * cols];
        for i in 0..rows {
            for j in 0..cols {
                let (g, u) = (i * 2 * cols + j, i * 2 * cols + cols + j);
                let pair = [x64[g], x64[u]];
                let grad = finite_diff(&pair, |p| silu64(p[0]) * p[1]);
                dx64[g] = dy[i * cols + j] as f64 * grad[0];
                dx64[u] = dy[i * cols + j] as f64 * grad[1];
            }
        }
        assert_close(&format!("swiglu dx {rows}x{cols}"), &dx, &dx64, GRAD_RTOL, GRAD_ATOL);
    }
}

#[test]
fn activations_reject_wrong_lengths_and_survive_nan() {
    let x = [0.5f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    let mut y = [0.0; 4];
    gelu_forward(&x, &mut y).unwrap();
    assert!(y[0].is_finite() && y[1].is_nan());
    assert_eq!(y[2], f32::INFINITY);
    let mut dx = [0.0; 4];
    gelu_backward(&[1.0; 4], &x, &mut dx).unwrap();
    assert!(dx[1].is_nan());
    assert_shape_error(gelu_forward(&x, &mut [0.0; 3]), "y");
    assert_shape_error(gelu_backward(&[1.0; 3], &x, &mut dx), "dy");

    let mut ys = [0.0; 2];
    swiglu_forward(&x, 1, 2, &mut ys).unwrap();
    assert!(ys[1].is_nan());
    swiglu_backward(&[1.0; 2], &x, 1, 2, &mut dx).unwrap();
    assert!(dx[1].is_nan());
    assert_shape_error(swiglu_forward(&x, 2, 2, &mut [0.0; 4]), "x");
    assert_shape_error(swiglu_forward(&x, 1, 2, &mut [0.0; 3]), "y");
    assert_shape_error(swiglu_backward(&[1.0; 2], &x, 1, 2, &mut [0.0; 3]), "dx");
}

// ---------------------------------------------------------------- attention

/// Naive causal attention in f64, layout [batch, seq, heads, head_dim]: (out, lse [batch, heads, seq]).
fn attention64(q: &[f64], k: &[f64], v: &[f64], s: AttentionShape, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let hidden = s.heads * s.head_dim;
    let at = |b: usize, i: usize, h: usize| (b * s.seq + i) * hidden + h * s.head_dim;
    let mut out = vec![0.0; q.len()];
    let mut lse = vec![0.0; s.batch * s.heads * s.seq];
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.seq {
                let scores: Vec<f64> = (0..=i)
                    .map(|j| scale * dot(&q[at(b, i, h)..][..s.head_dim], &k[at(b, j, h)..][..s.head_dim]))
                    .collect();
                let l = scores.iter().map(|x| x.exp()).sum::<f64>().ln();
                lse[(b * s.heads + h) * s.seq + i] = l;
                for (j, sc) in scores.iter().enumerate() {
                    let p = (sc - l).exp();
                    for c in 0..s.head_dim {
                        out[at(b, i, h) + c] += p * v[at(b, j, h) + c];
                    }
                }
            }
        }
    }
    (out, lse)
}

struct AttnData {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
}

fn attn_data(seed: u64, s: AttentionShape) -> AttnData {
    let n = s.batch * s.seq * s.heads * s.head_dim;
    let mut r = rng(seed);
    AttnData {
        q: uniform(&mut r, n, -1.5, 1.5),
        k: uniform(&mut r, n, -1.5, 1.5),
        v: uniform(&mut r, n, -1.0, 2.0),
        dout: uniform(&mut r, n, -1.0, 1.0),
    }
}

fn shape(batch: usize, seq: usize, heads: usize, head_dim: usize) -> AttentionShape {
    AttentionShape::new(batch, seq, heads, head_dim)
}

fn run_attention(a: &AttnData, s: AttentionShape, scale: f32, dtype: Dtype) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![f32::NAN; a.q.len()];
    let mut lse = vec![f32::NAN; s.batch * s.heads * s.seq];
    attention_forward(&a.q, &a.k, &a.v, s, scale, dtype, &mut out, &mut lse).unwrap();
    (out, lse)
}

/// Shapes: one token, odd sizes, and sequences that cross the 64-row query blocks.
const ATTN_SHAPES: [(usize, usize, usize, usize); 4] = [(1, 1, 1, 1), (2, 5, 3, 4), (1, 70, 2, 3), (1, 130, 1, 5)];

#[test]
fn attention_forward_matches_naive_f64_attention_and_its_lse() {
    for (seed, &(b, t, h, d)) in ATTN_SHAPES.iter().chain(&[(2, 200, 2, 64)]).enumerate() {
        let s = shape(b, t, h, d);
        let a = attn_data(400 + seed as u64, s);
        let scale = 1.0 / (d as f32).sqrt();
        let (out, lse) = run_attention(&a, s, scale, Dtype::F32);
        let (out64, lse64) = attention64(&to64(&a.q), &to64(&a.k), &to64(&a.v), s, scale as f64);
        let ctx = format!("attention {s:?}");
        // Scores sum head_dim f32 products and out sums up to seq of them: a few ulp of the
        // largest term, so the f32 tolerance relative to the largest |out|.
        assert_close(&format!("{ctx} out"), &out, &out64, F32_RTOL, F32_ATOL);
        assert_close(&format!("{ctx} lse"), &lse, &lse64, F32_RTOL, F32_ATOL);
    }
}

#[test]
fn attention_in_bf16_and_f16_stores_rounded_outputs_within_their_tolerance() {
    let s = shape(2, 70, 2, 16);
    let a = attn_data(410, s);
    let scale = 0.25;
    let (out64, lse64) = attention64(&to64(&a.q), &to64(&a.k), &to64(&a.v), s, scale as f64);
    for (dtype, rtol, atol) in [(Dtype::Bf16, 1.6e-2, 1e-5), (Dtype::F16, 1e-3, 1e-5)] {
        let (out, lse) = run_attention(&a, s, scale, dtype);
        assert!(
            out.iter().all(|&x| dtype.round(x) == x),
            "{dtype}: out must hold {dtype} values"
        );
        // P is rounded before P.V: an error of up to one rounding per term, relative to sum |P v|.
        assert_close(&format!("attention {dtype} out"), &out, &out64, rtol, atol + rtol);
        assert_close(&format!("attention {dtype} lse"), &lse, &lse64, F32_RTOL, F32_ATOL);
    }
}

#[test]
fn attention_backward_matches_finite_differences_of_f64_attention() {
    for (seed, &(b, t, h, d)) in ATTN_SHAPES.iter().enumerate() {
        let s = shape(b, t, h, d);
        let a = attn_data(500 + seed as u64, s);
        let scale = 1.0 / (d as f32).sqrt();
        let (out, lse) = run_attention(&a, s, scale, Dtype::F32);
        let n = a.q.len();
        let (mut dq, mut dk, mut dv) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; n]);
        attention_backward(
            &a.dout,
            &a.q,
            &a.k,
            &a.v,
            &out,
            &lse,
            s,
            scale,
            Dtype::F32,
            &mut dq,
            &mut dk,
            &mut dv,
        )
        .unwrap();
        let (q64, k64, v64, do64) = (to64(&a.q), to64(&a.k), to64(&a.v), to64(&a.dout));
        let sc = scale as f64;
        let loss = |q: &[f64], k: &[f64], v: &[f64]| dot(&attention64(q, k, v, s, sc).0, &do64);
        let ctx = format!("attention backward {s:?}");
        assert_close(
            &format!("{ctx} dq"),
            &dq,
            &finite_diff(&q64, |q| loss(q, &k64, &v64)),
            GRAD_RTOL,
            GRAD_ATOL,
        );
        assert_close(
            &format!("{ctx} dk"),
            &dk,
            &finite_diff(&k64, |k| loss(&q64, k, &v64)),
            GRAD_RTOL,
            GRAD_ATOL,
        );
        assert_close(
            &format!("{ctx} dv"),
            &dv,
            &finite_diff(&v64, |v| loss(&q64, &k64, v)),
            GRAD_RTOL,
            GRAD_ATOL,
        );
    }
}

#[test]
fn attention_is_causal_a_future_key_or_value_changes_no_earlier_row() {
    let s = shape(2, 100, 3, 8);
    let a = attn_data(600, s);
    let (out, lse) = run_attention(&a, s, 0.3, Dtype::Bf16);
    let hidden = s.heads * s.head_dim;
    let t = 70; // inside the second 64-row block
    // Fresh random keys and values at position t of every sequence.
    let fresh = attn_data(601, s);
    let mut changed = attn_data(600, s);
    for bi in 0..s.batch {
        let at = (bi * s.seq + t) * hidden;
        changed.k[at..at + hidden].copy_from_slice(&fresh.k[at..at + hidden]);
        changed.v[at..at + hidden].copy_from_slice(&fresh.v[at..at + hidden]);
    }
    let (out2, lse2) = run_attention(&changed, s, 0.3, Dtype::Bf16);
    for bi in 0..s.batch {
        for i in 0..s.seq {
            let row = (bi * s.seq + i) * hidden;
            let same = out[row..row + hidden] == out2[row..row + hidden];
            assert_eq!(
                same,
                i < t,
                "batch {bi} row {i}: earlier rows unchanged, later rows changed"
            );
            for h in 0..s.heads {
                let l = (bi * s.heads + h) * s.seq + i;
                assert_eq!(lse[l] == lse2[l], i < t, "lse batch {bi} head {h} row {i}");
            }
        }
    }
}

#[test]
fn attention_rejects_bad_shapes_and_survives_nan() {
    let s = shape(1, 6, 2, 4);
    let mut a = attn_data(700, s);
    let n = a.q.len();
    let (mut out, mut lse) = (vec![0.0; n], vec![0.0; 12]);
    assert_shape_error(
        attention_forward(&a.q[1..], &a.k, &a.v, s, 1.0, Dtype::F32, &mut out, &mut lse),
        "q",
    );
    assert_shape_error(
        attention_forward(&a.q, &a.k, &a.v, s, 1.0, Dtype::F32, &mut out, &mut lse[1..]),
        "lse",
    );
    assert_shape_error(
        attention_forward(&a.q, &a.k, &a.v[1..], s, 1.0, Dtype::F32, &mut out, &mut lse),
        "v",
    );
    let zero_dim = shape(1, 6, 2, 0);
    assert!(matches!(
        attention_forward(&[], &[], &[], zero_dim, 1.0, Dtype::F32, &mut [], &mut lse),
        Err(Error::InvalidShape { .. })
    ));
    let mut g = vec![0.0; n];
    let (mut g2, mut g3) = (g.clone(), g.clone());
    assert_shape_error(
        attention_backward(
            &a.dout,
            &a.q,
            &a.k,
            &a.v,
            &out[1..],
            &lse,
            s,
            1.0,
            Dtype::F32,
            &mut g,
            &mut g2,
            &mut g3,
        ),
        "out",
    );

    // A NaN query at row 3 of head 0 poisons that row only; a NaN key at row 4 poisons rows >= 4 of head 0.
    let hidden = 8;
    a.q[3 * hidden] = f32::NAN;
    a.k[4 * hidden + 1] = f32::NAN;
    attention_forward(&a.q, &a.k, &a.v, s, 1.0, Dtype::Bf16, &mut out, &mut lse).unwrap();
    for i in 0..6 {
        let head0 = &out[i * hidden..i * hidden + 4];
        assert_eq!(head0.iter().all(|x| x.is_nan()), i >= 3, "row {i}");
        assert!(
            out[i * hidden + 4..(i + 1) * hidden].iter().all(|x| x.is_finite()),
            "head 1 row {i}"
        );
    }
    attention_backward(
        &a.dout,
        &a.q,
        &a.k,
        &a.v,
        &out,
        &lse,
        s,
        1.0,
        Dtype::Bf16,
        &mut g,
        &mut g2,
        &mut g3,
    )
    .unwrap();
    assert!(g.iter().any(|x| x.is_nan()));
}

// ---------------------------------------------------------------- cross-entropy

/// (mean loss, per-row lse) in f64.
fn cross_entropy64(logits: &[f64], targets: &[u32], vocab: usize, ignore: u32) -> (f64, Vec<f64>) {
    let mut sum = 0.0;
    let mut count = 0;
    let mut lses = vec![];
    for (row, &t) in logits.chunks(vocab).zip(targets) {
        let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
        lses.push(lse);
        if t != ignore {
            sum += lse - row[t as usize];
            count += 1;
        }
    }
    (if count == 0 { 0.0 } else { sum / count as f64 }, lses)
}

#[test]
fn cross_entropy_matches_f64_and_finite_differences_with_an_ignore_index() {
    // (rows, vocab, ignore): no ignore, an ignore index inside the vocab, many blocks of rows.
    for (seed, &(rows, vocab, ignore)) in [(1, 1, u32::MAX), (1, 7, u32::MAX), (6, 33, 3), (300, 1000, 999)]
        .iter()
        .enumerate()
    {
        let mut r = rng(800 + seed as u64);
        let logits = uniform(&mut r, rows * vocab, -4.0, 6.0);
        let mut targets: Vec<u32> = (0..rows).map(|_| r.random_range(0..vocab as u32)).collect();
        if ignore != u32::MAX {
            // Every third row ignored.
            targets.iter_mut().step_by(3).for_each(|t| *t = ignore);
        }
        let mut lse = vec![0.0; rows];
        let loss = cross_entropy_forward(&logits, &targets, vocab, ignore, &mut lse).unwrap();
        let l64 = to64(&logits);
        let (loss64, lse64) = cross_entropy64(&l64, &targets, vocab, ignore);
        let ctx = format!("cross-entropy {rows}x{vocab} ignore {ignore}");
        assert_close(&format!("{ctx} loss"), &[loss], &[loss64], F32_RTOL, F32_ATOL);
        assert_close(&format!("{ctx} lse"), &lse, &lse64, F32_RTOL, F32_ATOL);

        let dloss = 0.7;
        let mut dl = vec![f32::NAN; rows * vocab];
        cross_entropy_backward(&logits, &targets, vocab, ignore, &lse, dloss, &mut dl).unwrap();
        // Finite differences on at most 400 sampled logits (all of them for the small shapes).
        let picks: Vec<usize> = if rows * vocab <= 400 {
            (0..rows * vocab).collect()
        } else {
            (0..400).map(|_| r.random_range(0..rows * vocab)).collect()
        };
        let mut x = l64.clone();
        for &i in &picks {
            let h = 1e-6 * x[i].abs().max(1.0);
            let x0 = x[i];
            x[i] = x0 + h;
            let up = cross_entropy64(&x, &targets, vocab, ignore).0;
            x[i] = x0 - h;
            let down = cross_entropy64(&x, &targets, vocab, ignore).0;
            x[i] = x0;
            let want = dloss as f64 * (up - down) / (2.0 * h);
            assert_close(&format!("{ctx} dlogits[{i}]"), &dl[i..i + 1], &[want], GRAD_RTOL, 1e-7);
        }
        for (row, &t) in dl.chunks(vocab).zip(&targets) {
            if t == ignore {
                assert!(row.iter().all(|&g| g == 0.0), "{ctx}: ignored rows get no gradient");
            } else {
                let sum: f64 = row.iter().map(|&g| g as f64).sum();
                assert!(sum.abs() < 1e-6, "{ctx}: gradient of a row sums to {sum:e}, not 0");
            }
        }
    }
}

#[test]
fn cross_entropy_mean_counts_only_rows_that_are_not_ignored() {
    let vocab = 5;
    let logits = uniform(&mut rng(810), 4 * vocab, -2.0, 2.0);
    let mut lse = vec![0.0; 4];
    let all = cross_entropy_forward(&logits, &[1, 2, 3, 4], vocab, u32::MAX, &mut lse).unwrap();
    let first_two = cross_entropy_forward(&logits[..2 * vocab], &[1, 2], vocab, u32::MAX, &mut lse[..2]).unwrap();
    let ignored = cross_entropy_forward(&logits, &[1, 2, 7, 7], vocab, 7, &mut lse).unwrap();
    assert_eq!(ignored, first_two, "ignored rows must leave the mean of the others");
    assert_ne!(all, first_two);
    // Every row ignored: zero loss and zero gradient, no 0/0.
    assert_eq!(
        cross_entropy_forward(&logits, &[7; 4], vocab, 7, &mut lse).unwrap(),
        0.0
    );
    let mut dl = vec![1.0; 4 * vocab];
    cross_entropy_backward(&logits, &[7; 4], vocab, 7, &lse, 1.0, &mut dl).unwrap();
    assert!(dl.iter().all(|&g| g == 0.0));
}

#[test]
fn cross_entropy_rejects_bad_targets_and_lengths_and_survives_nan() {
    let logits = vec![0.5; 6];
    let mut lse = vec![0.0; 2];
    match cross_entropy_forward(&logits, &[1, 3], 3, u32::MAX, &mut lse) {
        Err(Error::IndexOutOfRange {
            index: 3,
            position: 1,
            len: 3,
            ..
        }) => {}
        other => panic!("want target 3 at position 1 out of range, got {other:?}"),
    }
    assert_shape_error(
        cross_entropy_forward(&logits, &[1, 2, 0], 3, u32::MAX, &mut lse),
        "logits",
    );
    assert_shape_error(
        cross_entropy_forward(&logits, &[1, 2], 3, u32::MAX, &mut lse[..1]),
        "lse",
    );
    assert_shape_error(
        cross_entropy_backward(&logits, &[1, 2], 3, u32::MAX, &lse, 1.0, &mut [0.0; 5]),
        "dlogits",
    );
    let nan_logits = [0.5, f32::NAN, 0.1, 0.2, 0.3, 0.4];
    let loss = cross_entropy_forward(&nan_logits, &[0, 2], 3, u32::MAX, &mut lse).unwrap();
    assert!(loss.is_nan() && lse[0].is_nan() && lse[1].is_finite());
    let mut dl = [0.0; 6];
    cross_entropy_backward(&nan_logits, &[0, 2], 3, u32::MAX, &lse, 1.0, &mut dl).unwrap();
    assert!(dl[..3].iter().all(|g| g.is_nan()) && dl[3..].iter().all(|g| g.is_finite()));
}

// ---------------------------------------------------------------- embedding

#[test]
fn embedding_gathers_rows_and_its_backward_accumulates_repeated_ids() {
    let (vocab, dim) = (6, 5);
    let mut r = rng(900);
    let table = uniform(&mut r, vocab * dim, -1.0, 1.0);
    let ids = [2u32, 0, 2, 5, 2, 3];
    let mut out = vec![0.0; ids.len() * dim];
    embedding_forward(&ids, &table, dim, &mut out).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(
            out[i * dim..(i + 1) * dim],
            table[id as usize * dim..(id as usize + 1) * dim]
        );
    }
    let dout = uniform(&mut r, ids.len() * dim, -1.0, 1.0);
    let start = uniform(&mut r, vocab * dim, -0.1, 0.1);
    let mut dtable = start.clone();
    embedding_backward(&ids, &dout, dim, &mut dtable).unwrap();
    // f64 forward written out, differentiated by finite differences, plus the starting gradient.
    let fwd = |t: &[f64]| -> f64 {
        let mut s = 0.0;
        for (i, &id) in ids.iter().enumerate() {
            for c in 0..dim {
                s += t[id as usize * dim + c] * dout[i * dim + c] as f64;
            }
        }
        s
    };
    let want: Vec<f64> = finite_diff(&to64(&table), fwd)
        .iter()
        .zip(&start)
        .map(|(g, &s)| g + s as f64)
        .collect();
    assert_close("dtable", &dtable, &want, GRAD_RTOL, 1e-7);
    // Rows 1 and 4 are never looked up: their gradient is untouched.
    assert_eq!(dtable[dim..2 * dim], start[dim..2 * dim]);
    assert_eq!(dtable[4 * dim..5 * dim], start[4 * dim..5 * dim]);
}

#[test]
fn embedding_rejects_out_of_range_ids_and_ragged_tables() {
    let table = vec![0.0; 12];
    let mut out = [0.0; 8];
    match embedding_forward(&[0, 1, 3, 2], &table, 4, &mut out[..]) {
        Err(Error::IndexOutOfRange {
            index: 3,
            position: 2,
            len: 3,
            ..
        }) => {}
        other => panic!("want id 3 at position 2 out of range, got {other:?}"),
    }
    assert!(matches!(
        embedding_forward(&[0], &table, 5, &mut out[..5]),
        Err(Error::InvalidShape { .. })
    ));
    assert!(matches!(
        embedding_forward(&[0], &table, 0, &mut []),
        Err(Error::InvalidShape { .. })
    ));
    assert_shape_error(embedding_forward(&[0, 1], &table, 4, &mut out[..7]), "output");
    let mut dtable = vec![0.0; 12];
    assert!(matches!(
        embedding_backward(&[9], &[1.0; 4], 4, &mut dtable),
        Err(Error::IndexOutOfRange { .. })
    ));
    assert_shape_error(embedding_backward(&[1], &[1.0; 3], 4, &mut dtable), "gradient");
}
