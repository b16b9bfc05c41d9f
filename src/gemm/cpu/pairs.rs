//! FP8 x FP8 GEMMs with per-tensor scales in the pair order, the order of Intel's AMX
//! `TDPBF16PS`, so that CPUs with AMX run them on their tile units and every other CPU gets the
//! same bits from a portable twin.
//!
//! The sums (`docs/numerics.md`, "CPU FP8 GEMM order"): K is zero-padded to a multiple of 32
//! and cut into chunks (the whole-K chunks of `kernel.rs` rounded up to a multiple of 32, or
//! the 128 of split accumulation). For each output element, within each block of 32 of K the
//! products of the even and of the odd K indices are summed in two chains from +0, in K order,
//! and the block adds `even + odd` to the chunk's sum (from +0); the chunk sums are added in
//! order to the element (from +0). Every product of two FP8 values is exact in f32 and every
//! non-zero partial sum is a multiple of 2^-25 (the smallest product, E4M3 2^-9 times E5M2
//! 2^-16), so no sum is subnormal and the tile unit's flush-to-zero never fires: the order
//! alone fixes the bits. The epilogue (`* alpha sA sB`, bias, beta, amax, cast) is the one
//! every other route uses.
//!
//! How it runs: both operands are decoded from their codes to bf16 (exact) and packed into
//! the tile layouts, zero-padded to 32 rows / columns / K: A in strips of 32 rows
//! (`[K / 32][32 rows][32 K]`), B in strips of 32 columns with K in pairs
//! (`[K / 32][2 halves][16 pairs][16 columns][2]`, the layout `TDPBF16PS` reads). A 32 x 32
//! block of the output is one kernel call per chunk ([`Kernel`]): four 16 x 16 f32 tiles.
//! The output is cut into bands of whole rows, one rayon task each.

mod amx;
mod portable;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::epilogue::{Epilogue, nan_max, out_tiles};
use crate::format::Fp8Format;
use crate::gemm::Output;
use crate::tensor::QuantizedMatrix;

/// Output rows and columns per kernel call, and K per block (one tile step).
pub(super) const EDGE: usize = 32;
/// bf16 values of one block of a packed strip: 32 rows (or columns) x 32 of K.
pub(super) const BLOCK: usize = EDGE * EDGE;

/// How a 32 x 32 block of the output gets its chunk sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    /// AMX tiles (`TDPBF16PS`), where the CPU has them, the OS grants them and the self-check
    /// passed.
    Amx,
    /// The same sums in f32 arithmetic, on every CPU.
    Portable,
}

impl Kernel {
    /// The fastest kernel that gives the portable kernel's bits on this CPU: AMX when available
    /// and its self-check passes (checked once; a failure is reported once on stderr), unless
    /// `FP8_CPU_AMX=0`.
    pub(super) fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            if std::env::var("FP8_CPU_AMX").is_ok_and(|v| v == "0") || !amx::available() {
                return Kernel::Portable;
            }
            match amx::self_check() {
                None => Kernel::Amx,
                Some(err) => {
                    eprintln!("fp8-engine: warning: AMX GEMM self-check failed ({err}); using the portable FP8 GEMM");
                    Kernel::Portable
                }
            }
        })
    }

    /// `c = ` the chunk sums of the 32 x 32 block of `blocks` K blocks whose packed A strip
    /// starts at `a` and B strip at `b` (`c` row-major 32 x 32, overwritten).
    pub(super) fn chunk(self, a: &[u16], b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
        assert!(a.len() >= blocks * BLOCK && b.len() >= blocks * BLOCK, "pairs: short strips");
        match self {
            // SAFETY: `Amx` is only chosen where `amx::available()` held (the CPU has AMX-BF16
            // and the OS granted the tile data); the lengths were checked above.
            Kernel::Amx => unsafe { amx::chunk(a.as_ptr(), b.as_ptr(), blocks, c) },
            Kernel::Portable => portable::chunk(a, b, blocks, c),
        }
    }
}

/// An FP8 operand for the pair GEMM: `rows x k` codes, K-major.
#[derive(Clone, Copy)]
pub(super) struct Codes<'a> {
    pub format: Fp8Format,
    pub codes: &'a [u8],
    pub rows: usize,
    pub k: usize,
}

impl<'a> Codes<'a> {
    pub(super) fn of(format: Fp8Format, q: &'a QuantizedMatrix) -> Self {
        Codes {
            format,
            codes: q.data(),
            rows: q.rows(),
            k: q.cols(),
        }
    }
}

/// Every FP8 code of `format` as bf16 bits (exact: at most 4 significant bits, and bf16 has
/// f32's exponent range).
fn bf16_table(format: Fp8Format) -> &'static [u16; 256] {
    static TABLES: OnceLock<[[u16; 256]; 2]> = OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        [Fp8Format::E4M3, Fp8Format::E5M2].map(|f| std::array::from_fn(|c| (f.decode(c as u8).to_bits() >> 16) as u16))
    });
    &tables[match format {
        Fp8Format::E4M3 => 0,
        Fp8Format::E5M2 => 1,
    }]
}

/// K padded to whole blocks.
fn padded_k(k: usize) -> usize {
    k.div_ceil(EDGE) * EDGE
}

/// Packs rows `first..first + 32` of `op` (rows past its end are zeros) as an A strip:
/// `[K / 32][32 rows][32 K]`, K past its end zeros.
fn pack_a_strip(op: Codes, first: usize, out: &mut [u16]) {
    let table = bf16_table(op.format);
    let kp = padded_k(op.k);
    for (kb, block) in out[..kp * EDGE].chunks_exact_mut(BLOCK).enumerate() {
        let k0 = kb * EDGE;
        let width = EDGE.min(op.k - k0);
        for (r, row) in block.chunks_exact_mut(EDGE).enumerate() {
            let i = first + r;
            if i < op.rows {
                let codes = &op.codes[i * op.k + k0..][..width];
                row[..width].iter_mut().zip(codes).for_each(|(d, &c)| *d = table[c as usize]);
                row[width..].fill(0);
            } else {
                row.fill(0);
            }
        }
    }
}

/// Packs rows `first..first + 32` of `op` as a B strip: `[K / 32][2 halves][16 pairs]
/// [16 columns][2]` (column `16 h + c`, K `32 kb + 2 p + q`), padding zeros.
fn pack_b_strip(op: Codes, first: usize, out: &mut [u16]) {
    let table = bf16_table(op.format);
    let kp = padded_k(op.k);
    for (kb, block) in out[..kp * EDGE].chunks_exact_mut(BLOCK).enumerate() {
        let k0 = kb * EDGE;
        let width = EDGE.min(op.k - k0);
        block.fill(0);
        for col in 0..EDGE.min(op.rows.saturating_sub(first)) {
            let codes = &op.codes[(first + col) * op.k + k0..][..width];
            let (h, c) = (col / 16, col % 16);
            for (kk, &code) in codes.iter().enumerate() {
                let (p, q) = (kk / 2, kk % 2);
                block[((h * 16 + p) * 16 + c) * 2 + q] = table[code as usize];
            }
        }
    }
}

thread_local! {
    /// The packed A strips of the band a thread works on, kept across calls.
    static A_STRIPS: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
    /// The f32 band accumulator of a non-f32 (or beta != 0) output, kept across calls.
    static BAND: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The packed B strips, kept by the calling thread across calls.
    static B_STRIPS: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
}

/// A vector kept in a thread-local cell: taken, resized, and given back after use.
fn with_kept<T: Copy + Default + 'static, R>(
    key: &'static std::thread::LocalKey<Cell<Vec<T>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let mut v = key.with(Cell::take);
    if v.len() < len {
        v.resize(len, T::default());
    }
    let r = f(&mut v[..len]);
    key.with(|cell| cell.set(v));
    r
}

/// Rows per band: whole strips, at least two bands per thread where the rows allow.
fn band_rows(m: usize, threads: usize) -> usize {
    let strips = m.div_ceil(EDGE);
    let per_band = strips.div_ceil(2 * threads.max(1)).clamp(1, 4);
    per_band * EDGE
}

/// `D = epilogue(A B^T)` in the pair order, chunks of `chunk` (a multiple of 32) along K;
/// returns the amax of the f32 results (the epilogue's, before the output cast).
pub(super) fn gemm(
    a: Codes,
    b: Codes,
    chunk: usize,
    epilogue: &Epilogue,
    out: Output,
    kernel: Kernel,
) -> crate::error::Result<f32> {
    assert!(a.k == b.k && chunk > 0 && chunk.is_multiple_of(EDGE), "pairs::gemm: bad shapes");
    let (m, n, k) = (a.rows, b.rows, a.k);
    if m == 0 || n == 0 {
        return Ok(0.0);
    }
    let kp = padded_k(k);
    let strip_len = kp * EDGE;
    let n_strips = n.div_ceil(EDGE);
    let band = band_rows(m, rayon::current_num_threads());
    with_kept(&B_STRIPS, n_strips * strip_len, |packed_b| {
        packed_b
            .par_chunks_mut(strip_len.max(1))
            .enumerate()
            .for_each(|(s, strip)| pack_b_strip(b, s * EDGE, strip));
        let packed_b = &*packed_b;
        // Rows `i0..i0 + rows` of the sum, into `acc` (`rows x n`).
        let sum_band = |i0: usize, acc: &mut [f32]| {
            let rows = acc.len() / n;
            with_kept(&A_STRIPS, rows.div_ceil(EDGE) * strip_len, |packed_a| {
                for (s, strip) in packed_a.chunks_exact_mut(strip_len.max(1)).enumerate() {
                    pack_a_strip(a, i0 + s * EDGE, strip);
                }
                sum_strips(packed_a, packed_b, (rows, n, kp), chunk, acc, kernel);
            });
        };
        match out {
            Output::F32(d) if epilogue.beta == 0.0 => Ok(d
                .par_chunks_mut(band * n)
                .enumerate()
                .map(|(t, rows_out)| {
                    sum_band(t * band, rows_out);
                    epilogue.finish_in_place(rows_out, n)
                })
                .reduce(|| 0.0, nan_max)),
            out => out_tiles(out, n, band, n)
                .into_par_iter()
                .map(|tile| {
                    let (i0, _, rows, _) = tile.shape();
                    with_kept(&BAND, rows * n, |acc| {
                        sum_band(i0, acc);
                        epilogue.finish(acc, tile)
                    })
                })
                .try_reduce(|| 0.0, |x, y| Ok(nan_max(x, y))),
        }
    })
}

/// `acc` (`rows x n`) = the pair-order sums of the packed A strips against the packed B strips
/// (`kp` of padded K each).
fn sum_strips(
    packed_a: &[u16],
    packed_b: &[u16],
    (rows, n, kp): (usize, usize, usize),
    chunk: usize,
    acc: &mut [f32],
    kernel: Kernel,
) {
    let strip_len = kp * EDGE;
    let (blocks, chunk_blocks) = (kp / EDGE, chunk / EDGE);
    acc.fill(0.0);
    let mut t = [0.0f32; BLOCK];
    for (s, a_strip) in packed_a.chunks_exact(strip_len.max(1)).enumerate() {
        let i0 = s * EDGE;
        let height = EDGE.min(rows - i0);
        for (js, b_strip) in packed_b.chunks_exact(strip_len.max(1)).enumerate() {
            let j0 = js * EDGE;
            let width = EDGE.min(n - j0);
            for kb in (0..blocks).step_by(chunk_blocks) {
                let count = chunk_blocks.min(blocks - kb);
                kernel.chunk(&a_strip[kb * BLOCK..], &b_strip[kb * BLOCK..], count, &mut t);
                // The chunk sums join the element's sum in order (from +0: `acc` was zeroed).
                for (r, t_row) in t.chunks_exact(EDGE).take(height).enumerate() {
                    let row = &mut acc[(i0 + r) * n + j0..][..width];
                    row.iter_mut().zip(t_row).for_each(|(x, &v)| *x += v);
                }
            }
        }
    }
}
