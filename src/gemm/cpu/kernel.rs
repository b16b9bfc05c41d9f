//! The one place that calls the f32 GEMM crate (`gemm`): a checked, safe
//! wrapper for `dst (+)= A[rows, k] . B[cols, k]^T` on strided row-major panels.

use gemm::Parallelism;

/// Rows `first..first + rows` and K columns `k0..k0 + k` of a row-major matrix with `stride` columns.
#[derive(Clone, Copy)]
pub(super) struct Panel<'a> {
    pub data: &'a [f32],
    pub stride: usize,
    pub first: usize,
    pub rows: usize,
    pub k0: usize,
    pub k: usize,
}

impl Panel<'_> {
    /// The panel's last element lies inside `data` (an empty panel reads nothing).
    fn in_bounds(&self) -> bool {
        if self.rows == 0 || self.k == 0 {
            return true;
        }
        let last = (self.first + self.rows - 1) * self.stride + self.k0 + self.k - 1;
        self.k0 + self.k <= self.stride && last < self.data.len()
    }

    fn start(&self) -> *const f32 {
        self.data[self.first * self.stride + self.k0..].as_ptr()
    }
}

/// `dst = A . B^T` (or `dst += A . B^T` with `accumulate`), `dst` row-major
/// `a.rows x b.rows`. Products and sums in f32 (FMA); `threads` uses the
/// crate's rayon parallelism, else one thread.
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
    // SAFETY: the assert above checked that every element the call reads lies
    // in `a.data` / `b.data` (rows first..first+rows, columns k0..k0+k at the
    // given strides) and that `dst` holds exactly m x n elements written at
    // row stride n. `dst` is borrowed mutably, so nothing aliases it; the
    // inputs are shared borrows that outlive the call. `f32` is a type the
    // crate supports (it panics on others, never reads out of bounds).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.start(),
            1,
            a.stride as isize,
            // B^T: element (kk, j) of the right-hand side is B[j, kk].
            b.start(),
            b.stride as isize,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}
