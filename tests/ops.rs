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
