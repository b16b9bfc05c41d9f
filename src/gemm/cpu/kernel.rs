//! The one place that calls the f32 GEMM crate (`gemm`): a checked, safe
//! wrapper for `dst (+)= A[rows, k] . B[cols, k]^T` on strided row-major panels.
//!
//! Summation order: K is cut into `ceil(K / 512)` chunks of equal length (the
//! last one shorter), the crate's micro-kernel sums each chunk with FMA in its
//! registers, and the chunks are added to `dst` in order. The crate itself
//! cuts K by the CPU's L1 geometry and its kernel's vector width (one block of
//! 1024 with its AVX2 kernels, two of 512 with its AVX-512 ones on the machine
//! of docs/benchmarks.md, so the two gave different bits), but never cuts a K
//! of 512 or less, and within one block its AVX2 and AVX-512 kernels gave the
//! same bits on every shape measured (docs/benchmarks.md): chunking here first
//! keeps the sums independent of the CPU's caches and vector width. One
//! exception is the crate's: products of at most 256 outputs with both
//! operands K-contiguous are summed as dot products across the vector's lanes,
//! so their bits follow the width (8 lanes with AVX2, 16 with AVX-512). Steering
//! them to the other kernels would change every result of the default model
//! (its 8 x 8 attention blocks); that is left for a change that re-measures it.

use gemm::Parallelism;

/// Longest K the crate sums as one block on every CPU (its K blocks are never shorter).
const K_CHUNK: usize = 512;

/// Length of each of the `ceil(k / K_CHUNK)` chunks of `k` (the last one may be shorter).
pub(super) fn k_chunk(k: usize) -> usize {
    k.div_ceil(k.div_ceil(K_CHUNK).max(1)).max(1)
}

/// Rows `first..first + rows` and K columns `k0..k0 + k` of a matrix whose element `(r, kk)`
/// is `data[r * row_stride + kk * k_stride]` (K-major: `(K, 1)`; its stored transpose: `(1, rows)`).
#[derive(Clone, Copy)]
pub(super) struct Panel<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub k_stride: usize,
    pub first: usize,
    pub rows: usize,
    pub k0: usize,
    pub k: usize,
}

impl<'a> Panel<'a> {
    /// Rows `first..first + rows` of `data` (strides `(row_stride, k_stride)`), all `k` of K.
    pub(super) fn whole_k(
        data: &'a [f32],
        (row_stride, k_stride): (usize, usize),
        first: usize,
        rows: usize,
        k: usize,
    ) -> Self {
        Panel {
            data,
            row_stride,
            k_stride,
            first,
            rows,
            k0: 0,
            k,
        }
    }

    /// The panel's last element lies inside `data` (an empty panel reads nothing; the
    /// strides are non-negative, so every other element lies before it).
    pub(super) fn in_bounds(&self) -> bool {
        if self.rows == 0 || self.k == 0 {
            return true;
        }
        let last = (self.first + self.rows - 1)
            .checked_mul(self.row_stride)
            .zip((self.k0 + self.k - 1).checked_mul(self.k_stride))
            .and_then(|(r, k)| r.checked_add(k));
        last.is_some_and(|last| last < self.data.len() && last <= isize::MAX as usize)
    }

    fn start(&self) -> *const f32 {
        self.data[self.first * self.row_stride + self.k0 * self.k_stride..].as_ptr()
    }
}

/// `dst = A . B^T` (or `dst += A . B^T` with `accumulate`), `dst` row-major
/// `a.rows x b.rows`. Products and sums in f32 (FMA), K in chunks (module
/// docs); `threads` uses the crate's rayon parallelism, else one thread.
pub(super) fn matmul_nt(dst: &mut [f32], accumulate: bool, a: Panel, b: Panel, threads: bool) {
    let (m, n, k) = (a.rows, b.rows, a.k);
    assert!(
        a.k == b.k && dst.len() == m * n && a.in_bounds() && b.in_bounds(),
        "matmul_nt: inconsistent panels (a {m}x{}, b {n}x{}, dst {})",
        a.k,
        b.k,
        dst.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    let parallelism = if threads {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    let chunk = k_chunk(k);
    for k0 in (0..k).step_by(chunk) {
        let len = chunk.min(k - k0);
        let (a, b) = (
            Panel {
                k0: a.k0 + k0,
                k: len,
                ..a
            },
            Panel {
                k0: b.k0 + k0,
                k: len,
                ..b
            },
        );
        // SAFETY: the assert above checked that every element of the whole K range the
        // calls read lies in `a.data` / `b.data` (rows first..first+rows, columns
        // k0..k0+k at the given non-negative strides, which fit in isize; each chunk lies
        // inside that range) and that `dst`
        // holds exactly m x n elements written at row stride n. `dst` is borrowed mutably,
        // so nothing aliases it; the inputs are shared borrows that outlive the call. `f32`
        // is a type the crate supports (it panics on others, never reads out of bounds).
        unsafe {
            gemm::gemm(
                m,
                n,
                len,
                dst.as_mut_ptr(),
                1,
                n as isize,
                accumulate || k0 > 0,
                // Left-hand side (i, kk) = A[i, kk]: column stride along K.
                a.start(),
                a.k_stride as isize,
                a.row_stride as isize,
                // B^T: element (kk, j) of the right-hand side is B[j, kk].
                b.start(),
                b.row_stride as isize,
                b.k_stride as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_chunks_cover_k_and_stay_within_one_crate_block() {
        for k in [1, 16, 511, 512, 513, 768, 1000, 1024, 1025, 4096, 5000] {
            let chunk = k_chunk(k);
            assert!(chunk <= K_CHUNK, "k {k}: chunk {chunk}");
            assert_eq!(k.div_ceil(chunk), k.div_ceil(K_CHUNK), "k {k}: chunk {chunk}");
        }
        assert_eq!(k_chunk(768), 384);
        assert_eq!(k_chunk(1024), 512);
    }

    /// Reading an operand from its stored transpose gives the bits of reading a K-major copy.
    #[test]
    fn transposed_panels_match_k_major_copies() {
        let (m, n, k) = (37, 29, 700);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.731).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.377).cos()).collect();
        let transpose = |x: &[f32], rows: usize| {
            let mut t = vec![0.0; x.len()];
            for r in 0..rows {
                for kk in 0..k {
                    t[kk * rows + r] = x[r * k + kk];
                }
            }
            t
        };
        let (at, bt) = (transpose(&a, m), transpose(&b, n));
        let k_major = |data, rows| Panel {
            data,
            row_stride: k,
            k_stride: 1,
            first: 0,
            rows,
            k0: 0,
            k,
        };
        let minor = |data, rows| Panel {
            row_stride: 1,
            k_stride: rows,
            ..k_major(data, rows)
        };
        let mut want = vec![0.0f32; m * n];
        matmul_nt(&mut want, false, k_major(&a, m), k_major(&b, n), false);
        for threads in [false, true] {
            for (pa, pb) in [
                (minor(&at, m), k_major(&b, n)),
                (k_major(&a, m), minor(&bt, n)),
                (minor(&at, m), minor(&bt, n)),
            ] {
                let mut got = vec![0.0f32; m * n];
                matmul_nt(&mut got, false, pa, pb, threads);
                assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()));
            }
        }
    }

    /// Chunked sums: the output of a K of 1024 is the sum of its two 512 halves, each
    /// one crate call, added in order (the documented order, bit for bit).
    #[test]
    fn long_k_is_the_ordered_sum_of_its_chunks() {
        let (m, n, k) = (5, 7, 1024);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.731).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.377).cos()).collect();
        let panel = |data, rows, k0, k| Panel {
            data,
            row_stride: 1024,
            k_stride: 1,
            first: 0,
            rows,
            k0,
            k,
        };
        let mut whole = vec![0.0f32; m * n];
        matmul_nt(&mut whole, false, panel(&a, m, 0, k), panel(&b, n, 0, k), false);
        let mut halves = [vec![0.0f32; m * n], vec![0.0f32; m * n]];
        for (h, half) in halves.iter_mut().enumerate() {
            let k0 = h * 512;
            matmul_nt(half, false, panel(&a, m, k0, 512), panel(&b, n, k0, 512), false);
        }
        for (i, w) in whole.iter().enumerate() {
            assert_eq!(w.to_bits(), (halves[0][i] + halves[1][i]).to_bits(), "element {i}");
        }
    }
}
