//! The packed kernel against a scalar definition of the contract, and its routing choices.

use super::*;

/// `[rows, k]` values with wide magnitudes (sums that round) and exact zeros.
fn values(rows: usize, k: usize, seed: f32) -> Vec<f32> {
    (0..rows * k)
        .map(|i| (i as f32 * seed).sin() * 2f32.powi((i % 11) as i32 - 5))
        .collect()
}

/// The contract, element by element: an FMA chain from +0 per chunk, chunks added in
/// order, then `* factor`, `+ bias`, `+ beta * old`.
fn reference(a: &Panel, b: &Panel, chunk: usize, epilogue: &Epilogue, old: &[f32]) -> Vec<f32> {
    let at = |p: &Panel, r: usize, kk: usize| p.data[(p.first + r) * p.row_stride + (p.k0 + kk) * p.k_stride];
    let (m, n, k) = (a.rows, b.rows, a.k);
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut total = 0.0f32;
            for k0 in (0..k).step_by(chunk) {
                let mut acc = 0.0f32;
                for kk in k0..k.min(k0 + chunk) {
                    acc = at(b, j, kk).mul_add(at(a, i, kk), acc);
                }
                total = if k0 == 0 { acc } else { total + acc };
            }
            let mut v = total * epilogue.factor;
            if let Some(bias) = epilogue.bias {
                v += bias[j];
            }
            if epilogue.beta != 0.0 {
                v += epilogue.beta * old[i * n + j];
            }
            out[i * n + j] = v;
        }
    }
    out
}

/// Panels of `[rows, k]` values stored K-major, or as their `[k, rows]` transpose.
fn panel(values: &[f32], rows: usize, k: usize, transposed: bool) -> Panel<'_> {
    let (row_stride, k_stride) = if transposed { (1, rows) } else { (k, 1) };
    Panel {
        data: values,
        row_stride,
        k_stride,
        first: 0,
        rows,
        k0: 0,
        k,
    }
}

fn transpose(x: &[f32], rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k).map(|i| x[(i % rows) * k + i / rows]).collect()
}

#[test]
fn packed_sums_are_the_ordered_fma_chains_of_the_contract() {
    assert!(
        available(),
        "this test needs AVX-512F (the machines of docs/benchmarks.md have it)"
    );
    // Ragged strips and panels, one row or column, chunks of 512 and 128 with short tails.
    for (m, n, k, chunk) in [
        (13, 70, 100, 100),
        (6, 64, 1030, 344),
        (1, 129, 300, 128),
        (40, 1, 257, 128),
        (14, 192, 300, 128),
    ] {
        let (a, b) = (values(m, k, 0.731), values(n, k, 0.377));
        let (at, bt) = (transpose(&a, m, k), transpose(&b, n, k));
        let bias = values(1, n, 0.219);
        let old = values(m, n, 0.113);
        for (factor, bias, beta) in [(1.0, None, 0.0), (0.375, Some(&bias[..]), 0.5)] {
            let epilogue = Epilogue { factor, bias, beta };
            let want = reference(&panel(&a, m, k, false), &panel(&b, n, k, false), chunk, &epilogue, &old);
            let want_amax = want.iter().fold(0.0f32, |x, &v| nan_max(x, v));
            for (pa, pb) in [
                (panel(&a, m, k, false), panel(&b, n, k, false)),
                (panel(&at, m, k, true), panel(&bt, n, k, true)),
            ] {
                let mut got = old.clone();
                let amax = gemm_f32(&mut got, pa, &PackedB::for_a(pb, &pa), chunk, &epilogue);
                let case = format!("{m}x{n}x{k} chunk {chunk}, factor {factor}, beta {beta}");
                assert_eq!(amax.to_bits(), want_amax.to_bits(), "amax, {case}");
                let first = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits());
                assert!(first.is_none(), "element {first:?} differs, {case}");
            }
        }
    }
}

/// A NaN (or an infinity times zero) shows in its output elements and the amax; beta = 0
/// never reads the old output, even a NaN one.
#[test]
fn nan_products_reach_the_output_and_the_amax() {
    assert!(available(), "this test needs AVX-512F");
    let (m, n, k) = (20, 100, 64);
    let mut a = values(m, k, 0.731);
    let mut b = values(n, k, 0.377);
    a[7 * k + 3] = f32::NAN;
    b[99 * k + 5] = f32::INFINITY;
    a[19 * k + 5] = 0.0;
    let epilogue = Epilogue {
        factor: 1.0,
        bias: None,
        beta: 0.0,
    };
    let mut out = vec![f32::NAN; m * n];
    let amax = gemm_f32(
        &mut out,
        panel(&a, m, k, false),
        &PackedB::pack(panel(&b, n, k, false)),
        64,
        &epilogue,
    );
    assert!(amax.is_nan());
    for i in 0..m {
        for j in 0..n {
            let nan = i == 7 || (i == 19 && j == 99);
            assert_eq!(out[i * n + j].is_nan(), nan, "({i}, {j})");
        }
    }
    // Without the NaN row the amax is the largest finite |v| or the infinity.
    let (a, m) = (&a[8 * k..19 * k], 11);
    let mut out = vec![f32::NAN; m * n];
    let amax = gemm_f32(
        &mut out,
        panel(a, m, k, false),
        &PackedB::pack(panel(&b, n, k, false)),
        64,
        &epilogue,
    );
    assert_eq!(amax, f32::INFINITY);
}

/// `x` copied into a buffer at a 64-byte aligned index (plus `shift` values): the buffer and
/// that index.
fn on_line(x: &[f32], shift: usize) -> (Vec<f32>, usize) {
    let mut buffer = vec![f32::NAN; x.len() + LINE + shift];
    let at = buffer.as_ptr().align_offset(64) + shift;
    buffer[at..at + x.len()].copy_from_slice(x);
    (buffer, at)
}

/// An in-place B (wgrad's layouts: both operands stored transposed, B on 64-byte lines)
/// gives the bits of the packed B and of the contract.
#[test]
fn b_read_in_place_gives_the_packed_bits() {
    assert!(available(), "this test needs AVX-512F");
    for (m, n, k, chunk) in [(14, 128, 300, 128), (40, 192, 1030, 344), (7, 256, 64, 64)] {
        let (a, b) = (values(m, k, 0.731), values(n, k, 0.377));
        let at = transpose(&a, m, k);
        let (bt, first) = on_line(&transpose(&b, n, k), 0);
        let old = values(m, n, 0.113);
        let epilogue = Epilogue {
            factor: 0.375,
            bias: None,
            beta: 1.0,
        };
        let want = reference(&panel(&a, m, k, false), &panel(&b, n, k, false), chunk, &epilogue, &old);
        let pa = panel(&at, m, k, true);
        let pb = Panel {
            data: &bt,
            first,
            ..panel(&bt, n, k, true)
        };
        let in_place = PackedB::for_a(pb, &pa);
        assert_eq!(in_place.k_step, n, "{m}x{n}x{k}: B not read in place");
        for b in [in_place, PackedB::pack(pb)] {
            let mut got = old.clone();
            gemm_f32(&mut got, pa, &b, chunk, &epilogue);
            let first = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits());
            assert!(
                first.is_none(),
                "element {first:?} differs, {m}x{n}x{k}, k_step {}",
                b.k_step
            );
        }
    }
}

/// B is read in place only when N-contiguous, of whole panels, on 64-byte lines, at most
/// 1 KiB per step of K, and A is packed; every other B is packed (`k_step` 64).
#[test]
fn b_is_read_in_place_only_where_that_measured_faster() {
    let (data, at) = on_line(&vec![0.5f32; 320 * 300], 0);
    let (shifted, at_shifted) = on_line(&vec![0.5f32; 128 * 300], 4);
    let b = |rows: usize, transposed: bool| Panel {
        first: at,
        ..panel(&data, rows, 300, transposed)
    };
    let k_step = |a: Panel, b: Panel| PackedB::for_a(b, &a).k_step;
    let a_values = values(30, 300, 0.5);
    let (a_t, a_k) = (panel(&a_values, 30, 300, true), panel(&a_values, 30, 300, false));
    assert_eq!(k_step(a_t, b(128, true)), 128);
    assert_eq!(k_step(a_t, b(256, true)), 256);
    assert_eq!(k_step(a_k, b(128, true)), NR, "A read in place");
    assert_eq!(k_step(a_t, b(100, true)), NR, "a ragged panel");
    assert_eq!(k_step(a_t, b(320, true)), NR, "1280 bytes per step");
    assert_eq!(k_step(a_t, b(128, false)), NR, "K-major B");
    let off_line = Panel {
        first: at_shifted,
        ..panel(&shifted, 128, 300, true)
    };
    assert_eq!(k_step(a_t, off_line), NR, "off the 64-byte lines");
}

#[test]
fn bands_are_whole_strips_for_every_thread() {
    assert_eq!(band_rows(1024, 2), 258);
    assert_eq!(band_rows(1024, 1), 516);
    assert_eq!(band_rows(5, 2), 6);
    assert_eq!(band_rows(0, 2), 6);
    for (m, threads) in [(1024, 2), (256, 2), (100, 1), (7, 4)] {
        let band = band_rows(m, threads);
        assert_eq!(band % MR, 0);
        assert!(
            m.div_ceil(band) <= BANDS_PER_THREAD * threads,
            "{m} rows on {threads} threads"
        );
    }
}
