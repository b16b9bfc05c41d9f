//! The attention core's per-head products (`64 x 64 x head_dim` and the like) without the
//! GEMM crate's packing and dispatch, with the crate's bits.
//!
//! Why the bits match: for a layout-free shape ([`layout_free`]) the crate runs its packed
//! micro-kernels, which keep one f32 register lane per output and add the K products into
//! it in order with FMA, starting from zero; the CPU GEMM cuts K into `ceil(K / 512)` equal
//! chunks first and adds the chunk sums in order (`gemm/cpu/kernel.rs`), then scales by
//! `alpha` and adds `beta * old` (`f32_nt_serial`). [`product`] does exactly that per output,
//! vectorized across the output's columns (each lane its own output), so the width of the
//! vectors never enters a sum. It runs on x86-64 with AVX-512F (where the crate sums with
//! FMA too); everywhere else, and for shapes that are not layout-free, the caller takes the
//! crate path.
//!
//! Why a kernel of its own: on 64 x 64 x 32 blocks the crate path spent about as many cycles
//! packing operands, dispatching and copying its accumulator tile as in its micro-kernels
//! (`perf`, docs/benchmarks.md round 6). Here an 8 x 32 register tile loads one B row
//! (2 vectors) and 8 broadcasts per 16 vector FMAs, straight from the operands.

use crate::error::{Error, Result};
use crate::gemm::cpu::{F32View, layout_free};

/// K per crate call, as the CPU GEMM cuts it (`gemm/cpu/kernel.rs`): `ceil(K / 512)` equal chunks.
const K_CHUNK: usize = 512;

/// Output rows per register tile: 8 rows x 2 vectors are 16 accumulators, enough
/// independent FMA chains to hide the FMA latency (4 cycles x 2 ports).
const ROWS: usize = 8;

fn k_chunk(k: usize) -> usize {
    k.div_ceil(k.div_ceil(K_CHUNK).max(1)).max(1)
}

/// Whether this CPU runs [`product`]: AVX-512F (its 16-lane FMA is what the crate uses there).
pub(super) fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`product`] gives the crate's bits for `a . b^T`: a layout-free shape and B's
/// rows (the output's columns) contiguous.
pub(super) fn applies(a: &F32View, b: &F32View) -> bool {
    layout_free(a.rows, b.rows, a.k) && b.row_stride == 1 && a.k == b.k
}

/// Index of the last element of a `rows x k` view, `None` if it overflows.
fn last_index(v: &F32View) -> Option<usize> {
    if v.rows == 0 || v.k == 0 {
        return Some(0);
    }
    (v.rows - 1)
        .checked_mul(v.row_stride)
        .zip((v.k - 1).checked_mul(v.k_stride))
        .and_then(|(r, k)| r.checked_add(k))
}

/// What the causal mask of a query block starting at row `i0` lets a product skip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Causal {
    /// Nothing.
    Full,
    /// Output row `r` needs only columns `0..=i0 + r` (scores): the others, rounded up to the
    /// register tile, are left unwritten.
    Columns(usize),
    /// A is zero at `(r, t)` for `t > i0 + r` (`P V`, `dS K`): those terms are left out.
    KUpTo(usize),
    /// A is zero at `(r, t)` for `t < r - i0` (`P^T dO`, `dS^T Q`): those terms are left out.
    KFrom(usize),
}

/// `out [m, n] = alpha * a . b^T (+ beta * out)`, the bits of `f32_nt_serial` where
/// [`applies`] holds (module docs). `causal` skips work the mask makes moot; with
/// [`Causal::KUpTo`] and [`Causal::KFrom`] the caller guarantees that A is exactly zero
/// there and that B is finite in the rows left out, so every term left out is `+-0`. Leading
/// `+-0` terms keep a sum at its starting `+0`; trailing ones leave a nonzero sum as it is,
/// and a zero sum (which could be `-0`) is summed again with every term.
pub(super) fn product(a: F32View, b: F32View, alpha: f32, beta: f32, out: &mut [f32], causal: Causal) -> Result<()> {
    let (m, n) = (a.rows, b.rows);
    let fits = |v: &F32View| last_index(v).is_some_and(|l| v.rows == 0 || v.k == 0 || l < v.data.len());
    if !applies(&a, &b) || !fits(&a) || !fits(&b) || out.len() != m * n || !simd_available() {
        return Err(Error::KernelArgs {
            kernel: "attention product",
            detail: format!(
                "A is {m}x{} (strides {}, {}), B is {n}x{} (strides {}, {}), out {}: need a \
                 layout-free shape, B rows contiguous, views inside their data, FMA",
                a.k,
                a.row_stride,
                a.k_stride,
                b.k,
                b.row_stride,
                b.k_stride,
                out.len()
            ),
        });
    }
    let job = Job {
        a,
        b,
        alpha,
        beta,
        causal,
    };
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the CPU has AVX-512F (`simd_available`, checked above), all `run` requires.
        unsafe { avx512::run(&job, out) };
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("simd_available is false off x86-64: {}", job.alpha)
    }
}

/// `dst[c * rows + j] = src[j * stride + c]` for the rows and columns of whole 16 x 16 blocks
/// (`j < rows / 16 * 16`, `c < d / 16 * 16`), each block transposed in registers; the others
/// are left to the caller. Returns false, writing nothing, where the CPU lacks AVX-512F.
pub(super) fn transpose_blocks(src: &[f32], rows: usize, d: usize, stride: usize, dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: the CPU has AVX-512F (`simd_available`), all `transpose_blocks` requires.
        unsafe { avx512::transpose_blocks(src, rows, d, stride, dst) };
        return true;
    }
    let _ = (src, rows, d, stride, dst);
    false
}

struct Job<'a> {
    a: F32View<'a>,
    b: F32View<'a>,
    alpha: f32,
    beta: f32,
    causal: Causal,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Causal, Job, ROWS, k_chunk};

    /// Lanes per vector.
    const L: usize = 16;

    /// Row tiles of [`ROWS`] (then 4, then single rows), column tiles of two vectors (the last one
    /// masked to the columns left).
    #[target_feature(enable = "avx512f")]
    pub(super) fn run(job: &Job, out: &mut [f32]) {
        let (m, n) = (job.a.rows, job.b.rows);
        let mut r0 = 0;
        while r0 < m {
            let rows = match m - r0 {
                ROWS.. => ROWS,
                4.. => 4,
                _ => 1,
            };
            let k = job.a.k;
            let (cols, ks) = match job.causal {
                Causal::Full => (n, 0..k),
                Causal::Columns(i0) => (n.min(i0 + r0 + rows), 0..k),
                Causal::KUpTo(i0) => (n, 0..k.min(i0 + r0 + rows)),
                Causal::KFrom(i0) => (n, r0.saturating_sub(i0).min(k)..k),
            };
            let mut c0 = 0;
            while c0 < cols {
                let w = (cols - c0).min(2 * L);
                match (rows, w > L) {
                    (ROWS, true) => tile::<ROWS, 2>(job, r0, c0, w, ks.clone(), out),
                    (ROWS, false) => tile::<ROWS, 1>(job, r0, c0, w, ks.clone(), out),
                    (4, true) => tile::<4, 2>(job, r0, c0, w, ks.clone(), out),
                    (4, false) => tile::<4, 1>(job, r0, c0, w, ks.clone(), out),
                    (_, true) => tile::<1, 2>(job, r0, c0, w, ks.clone(), out),
                    (_, false) => tile::<1, 1>(job, r0, c0, w, ks.clone(), out),
                }
                c0 += w;
            }
            r0 += rows;
        }
    }

    /// [`super::transpose_blocks`]: 16 rows loaded, pairs interleaved (32-bit, then 64-bit
    /// elements: each 128-bit lane then holds one column of 4 rows), then the 4 x 4 grid of
    /// 128-bit lanes transposed with two lane shuffles per output vector.
    #[target_feature(enable = "avx512f")]
    pub(super) fn transpose_blocks(src: &[f32], rows: usize, d: usize, stride: usize, dst: &mut [f32]) {
        const ALL: (usize, __mmask16) = (L, !0);
        for j0 in (0..rows / L * L).step_by(L) {
            for c0 in (0..d / L * L).step_by(L) {
                let r: [__m512; L] = std::array::from_fn(|j| load(&src[(j0 + j) * stride + c0..], ALL));
                // t[2p] = rows 2p, 2p + 1 interleaved from columns 0, 1 of each lane; t[2p + 1] from 2, 3.
                let t: [__m512d; L] = std::array::from_fn(|i| {
                    let (a, b) = (r[i & !1], r[i | 1]);
                    _mm512_castps_pd(if i % 2 == 0 {
                        _mm512_unpacklo_ps(a, b)
                    } else {
                        _mm512_unpackhi_ps(a, b)
                    })
                });
                // u[g][m], lane l: column 4 l + m of rows 4 g .. 4 g + 4.
                let u: [[__m512; 4]; 4] = std::array::from_fn(|g| {
                    let (lo, hi) = ((t[4 * g], t[4 * g + 2]), (t[4 * g + 1], t[4 * g + 3]));
                    [
                        _mm512_castpd_ps(_mm512_unpacklo_pd(lo.0, lo.1)),
                        _mm512_castpd_ps(_mm512_unpackhi_pd(lo.0, lo.1)),
                        _mm512_castpd_ps(_mm512_unpacklo_pd(hi.0, hi.1)),
                        _mm512_castpd_ps(_mm512_unpackhi_pd(hi.0, hi.1)),
                    ]
                });
                for m in 0..4 {
                    // x0 = lanes 0, 1 of groups 0, 1; x1 = lanes 2, 3 of them; x2, x3 of groups 2, 3.
                    let x0 = _mm512_shuffle_f32x4::<0x44>(u[0][m], u[1][m]);
                    let x1 = _mm512_shuffle_f32x4::<0xEE>(u[0][m], u[1][m]);
                    let x2 = _mm512_shuffle_f32x4::<0x44>(u[2][m], u[3][m]);
                    let x3 = _mm512_shuffle_f32x4::<0xEE>(u[2][m], u[3][m]);
                    let cols = [
                        _mm512_shuffle_f32x4::<0x88>(x0, x2),
                        _mm512_shuffle_f32x4::<0xDD>(x0, x2),
                        _mm512_shuffle_f32x4::<0x88>(x1, x3),
                        _mm512_shuffle_f32x4::<0xDD>(x1, x3),
                    ];
                    for (l, col) in cols.into_iter().enumerate() {
                        store(&mut dst[(c0 + 4 * l + m) * rows + j0..], ALL, col);
                    }
                }
            }
        }
    }

    /// Lanes of vector `v` of a `w`-column tile, and their mask.
    #[inline(always)]
    fn lanes(w: usize, v: usize) -> (usize, __mmask16) {
        let n = (w - v * L).min(L);
        (n, if n == L { !0 } else { (1u16 << n) - 1 })
    }

    /// The first `n` values of `s` (`n <= 16`, masked lanes read as 0).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load(s: &[f32], (n, mask): (usize, __mmask16)) -> __m512 {
        let s = &s[..n];
        // SAFETY: `s` holds the `n` values the mask selects; masked-off lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(mask, s.as_ptr()) }
    }

    /// Writes the first `n` lanes of `x` to `s` (`n <= 16`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store(s: &mut [f32], (n, mask): (usize, __mmask16), x: __m512) {
        let s = &mut s[..n];
        // SAFETY: `s` holds the `n` values the mask selects; masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(s.as_mut_ptr(), mask, x) }
    }

    /// Outputs `r0..r0 + R` x `c0..c0 + w` (`w <= 16 V`): per output, FMA over the K terms
    /// in `ks` in order from zero, chunk sums added in order, then `* alpha (+ beta * old)`
    /// (module docs).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn tile<const R: usize, const V: usize>(
        job: &Job,
        r0: usize,
        c0: usize,
        w: usize,
        ks: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let Job { a, b, alpha, beta, .. } = *job;
        let (n, k) = (b.rows, a.k);
        let chunk = k_chunk(k);
        let mask: [(usize, __mmask16); V] = std::array::from_fn(|v| lanes(w, v));
        let mut total = [[_mm512_setzero_ps(); V]; R];
        let mut t0 = 0;
        while t0 < k {
            let t1 = (t0 + chunk).min(k);
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            // The chunk's terms inside `ks` (the others are +-0: `product`).
            let (lo, hi) = (t0.max(ks.start), t1.min(ks.end));
            if lo < hi {
                // Both first elements lie inside the views (`product` checked the last ones).
                let mut a_at = a.data[lo * a.k_stride + r0 * a.row_stride..].as_ptr();
                let mut b_at = b.data[lo * b.k_stride + c0..].as_ptr();
                for _ in lo..hi {
                    // SAFETY: `product` checked that the views' last elements lie inside their
                    // data; rows r0..r0 + R, columns c0..c0 + w (mask) and K positions lo..hi
                    // are inside the views, so every read below is in bounds. The pointers step
                    // past the data only after the last iteration (wrapping, never read).
                    unsafe {
                        let y: [__m512; V] = std::array::from_fn(|v| _mm512_maskz_loadu_ps(mask[v].1, b_at.add(v * L)));
                        for (r, acc_r) in acc.iter_mut().enumerate() {
                            let x = _mm512_set1_ps(*a_at.add(r * a.row_stride));
                            for (s, &yv) in acc_r.iter_mut().zip(&y) {
                                *s = _mm512_fmadd_ps(x, yv, *s);
                            }
                        }
                    }
                    a_at = a_at.wrapping_add(a.k_stride);
                    b_at = b_at.wrapping_add(b.k_stride);
                }
            }
            if t0 == 0 {
                total = acc;
            } else {
                for (tr, ar) in total.iter_mut().zip(&acc) {
                    tr.iter_mut().zip(ar).for_each(|(t, &a)| *t = _mm512_add_ps(*t, a));
                }
            }
            t0 = t1;
        }
        // Trailing terms left out: a running sum of -0 (an underflowed negative product) would
        // have become +0 with a +0 term, so a zero sum is summed again with every term.
        if ks.end < k {
            let zero = _mm512_setzero_ps();
            let any_zero = total.iter().any(|tr| {
                tr.iter()
                    .zip(&mask)
                    .any(|(&t, m)| _mm512_mask_cmp_ps_mask::<_CMP_EQ_OQ>(m.1, t, zero) != 0)
            });
            if any_zero {
                return tile::<R, V>(job, r0, c0, w, ks.start..k, out);
            }
        }
        let (alpha, beta) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
        for (r, tr) in total.iter().enumerate() {
            let row = &mut out[(r0 + r) * n + c0..];
            for (v, &s) in tr.iter().enumerate() {
                let mut x = _mm512_mul_ps(s, alpha);
                if job.beta != 0.0 {
                    x = _mm512_add_ps(x, _mm512_mul_ps(beta, load(&row[v * L..], mask[v])));
                }
                store(&mut row[v * L..], mask[v], x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::cpu::f32_nt_serial;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        // Mixed magnitudes and signs so reordered sums would show.
        (0..n)
            .map(|i| ((i as f32 * seed).sin() * 3.0).powi(3) + (i % 7) as f32 * 1e-3)
            .collect()
    }

    #[test]
    fn products_match_the_crate_bit_for_bit() {
        if !simd_available() {
            eprintln!("no AVX-512F: the product is never used here");
            return;
        }
        // (m, n, k): attention blocks, odd sizes, tails of every tile, K past one 512 chunk.
        let shapes = [
            (64, 64, 32),
            (64, 32, 64),
            (17, 64, 16),
            (64, 80, 37),
            (33, 128, 64),
            (5, 61, 80),
            (64, 16, 1100),
            (130, 48, 640),
            (3, 129, 3),
        ];
        for (m, n, k) in shapes {
            // A with both strides (a transposed read as in P^T), B from its stored transpose.
            let (a, bt) = (values(m * k + 9, 0.731), values((n + 5) * k, 0.377));
            let a_views = [F32View::k_major(&a, m, k, k), F32View::transposed(&a, m, k, m)];
            let b = F32View::transposed(&bt, n, k, n + 5);
            for av in a_views {
                for (alpha, beta) in [(1.0, 0.0), (0.125, 1.0), (0.3, 0.7)] {
                    let old = values(m * n, 0.113);
                    let (mut want, mut got) = (old.clone(), old.clone());
                    f32_nt_serial(av, b, alpha, beta, &mut want).unwrap();
                    product(av, b, alpha, beta, &mut got, Causal::Full).unwrap();
                    let same = got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits());
                    assert!(same, "{m}x{n}x{k} alpha {alpha} beta {beta} A strides {}", av.k_stride);
                    // Causal rows stop at their diagonal: the columns they need are the same bits.
                    let mut part = old.clone();
                    product(av, b, alpha, beta, &mut part, Causal::Columns(2)).unwrap();
                    for i in 0..m {
                        let need = n.min(i + 3);
                        let same = (0..need).all(|j| part[i * n + j].to_bits() == want[i * n + j].to_bits());
                        assert!(same, "{m}x{n}x{k} causal row {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn terms_left_out_past_the_diagonal_keep_the_crates_bits() {
        if !simd_available() {
            return;
        }
        // A lower triangular (zero past the diagonal, as P and dS), 16 x 32 x 40: row 0's one
        // term underflows to -0, which the left-out +0 terms turn into +0 on the crate path.
        let (m, n, k) = (16, 32, 40);
        let mut a = values(m * k, 0.731);
        for r in 0..m {
            a[r * k + r + 1..(r + 1) * k].fill(0.0);
        }
        a[0] = 1e-30;
        let mut bt = values(k * n, 0.377);
        bt[..n].fill(-1e-30);
        let (av, bv) = (F32View::k_major(&a, m, k, k), F32View::transposed(&bt, n, k, n));
        let mut want = vec![0.0; m * n];
        f32_nt_serial(av, bv, 1.0, 0.0, &mut want).unwrap();
        assert!(
            want[..n].iter().all(|w| w.to_bits() == 0),
            "the crate path gives +0 in row 0"
        );
        let mut got = vec![0.0; m * n];
        product(av, bv, 1.0, 0.0, &mut got, Causal::KUpTo(0)).unwrap();
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()));
        // The transpose (A upper triangular past `r - i0`), leading terms left out.
        let (mut at, mut b2) = (vec![0.0; m * k], values(n * k, 0.2));
        for r in 0..m {
            for t in r..k {
                at[r * k + t] = a[(t % m) * k + r % k] + 0.5;
            }
        }
        b2[5] = f32::MAX; // finite: a huge B row times a left-out zero is still +-0
        let (av, bv) = (F32View::k_major(&at, m, k, k), F32View::k_major(&b2, n, k, k));
        let bt2: Vec<f32> = (0..k * n).map(|i| b2[(i % n) * k + i / n]).collect();
        let bv_t = F32View::transposed(&bt2, n, k, n);
        f32_nt_serial(av, bv, 1.0, 0.0, &mut want).unwrap();
        product(av, bv_t, 1.0, 0.0, &mut got, Causal::KFrom(0)).unwrap();
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()));
    }

    #[test]
    fn shapes_it_cannot_sum_the_crate_way_are_errors() {
        let a = vec![1.0; 64 * 64];
        let mut out = vec![0.0; 64 * 64];
        // 8 x 8 outputs are summed by the crate's dot-product kernels: not layout-free.
        let small = F32View::k_major(&a, 8, 8, 8);
        assert!(product(small, small, 1.0, 0.0, &mut out[..64], Causal::Full).is_err());
        // B with strided rows, and a view past its data.
        let strided = F32View::k_major(&a, 64, 32, 64);
        assert!(product(strided, strided, 1.0, 0.0, &mut out, Causal::Full).is_err());
        let (q, past) = (F32View::k_major(&a, 64, 32, 32), F32View::transposed(&a, 64, 32, 200));
        assert!(product(q, past, 1.0, 0.0, &mut out, Causal::Full).is_err());
    }
}
