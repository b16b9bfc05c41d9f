//! FP8 x FP8 GEMMs with per-tensor scales (and bf16 x bf16 GEMMs) in the pair order, the order
//! of Intel's AMX `TDPBF16PS`, so that CPUs with AMX run them on their tile units, CPUs with
//! AVX512-BF16 on `VDPBF16PS` (`dot.rs`), and every other CPU gets the same bits from a
//! portable twin.
//!
//! The sums (`docs/numerics.md`, "CPU order of FP8 x FP8 ... GEMMs: the pair order"): K is
//! zero-padded to a multiple of 32
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
//! (`[K / 32][2 halves][16 pairs][16 columns][2]`, the layout `TDPBF16PS` reads; `VDPBF16PS`
//! reads the same layouts with K reordered within each group of 4, [`KOrder`]). A 32 x 32
//! block of the output is one kernel call per chunk ([`Kernel`]): four 16 x 16 f32 tiles.
//! The output is cut into bands of whole rows, one rayon task each.

mod amx;
mod dot;
mod portable;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::epilogue::{Epilogue, nan_max, out_tiles};
use half::bf16;
use half::slice::HalfFloatSliceExt;

use crate::format::Fp8Format;
use crate::gemm::{Operand, Output};

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
    /// AVX512-BF16 `VDPBF16PS` on reordered strips (`dot.rs`), where the CPU has it, AMX is
    /// not chosen (absent, failed its self-check, or ruled out by `FP8_CPU_PAIRS=dot`), and
    /// its own self-check passed.
    Dot,
    /// The same sums in f32 arithmetic, on every CPU.
    Portable,
}

impl Kernel {
    /// The fastest kernel that gives the portable kernel's bits on this CPU: AMX, else
    /// `VDPBF16PS`, each only where available and its self-check passes (checked once; a
    /// failure is reported once on stderr). `FP8_CPU_PAIRS=portable` (or the older
    /// `FP8_CPU_AMX=0`) forces the portable kernel, `FP8_CPU_PAIRS=dot` rules out AMX.
    pub(super) fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            let wanted = std::env::var("FP8_CPU_PAIRS").unwrap_or_default();
            if !["", "portable", "dot"].contains(&wanted.as_str()) {
                eprintln!(
                    "fp8-engine: warning: FP8_CPU_PAIRS={wanted} is not one of portable, dot; choosing the fastest kernel"
                );
            }
            if wanted == "portable" || std::env::var("FP8_CPU_AMX").is_ok_and(|v| v == "0") {
                return Kernel::Portable;
            }
            if wanted == "dot" && !dot::available() {
                eprintln!("fp8-engine: warning: FP8_CPU_PAIRS=dot, but this CPU has no AVX512-BF16; using the portable kernel");
                return Kernel::Portable;
            }
            let checked = |kernel: Kernel, check: fn() -> Option<String>| match check() {
                None => Some(kernel),
                Some(err) => {
                    eprintln!("fp8-engine: warning: {kernel:?} GEMM self-check failed ({err}); not using it");
                    None
                }
            };
            (wanted != "dot" && amx::available())
                .then(|| checked(Kernel::Amx, amx::self_check))
                .flatten()
                .or_else(|| {
                    dot::available()
                        .then(|| checked(Kernel::Dot, dot::self_check))
                        .flatten()
                })
                .unwrap_or(Kernel::Portable)
        })
    }

    /// Runs `f` with this kernel ready on the calling thread (AMX: tiles configured for the
    /// duration). `f` must not start other work on this thread (no rayon calls).
    fn run<R>(self, f: impl FnOnce(&mut Ready) -> R) -> R {
        match self {
            // SAFETY: `Amx` is only chosen where `amx::available()` held; `f` runs no other
            // task on this thread, so no other `Tiles` is alive on it.
            Kernel::Amx => f(&mut Ready::Amx(unsafe { amx::Tiles::load() })),
            Kernel::Dot => f(&mut Ready::Dot),
            Kernel::Portable => f(&mut Ready::Portable),
        }
    }
}

/// A kernel ready to run on this thread ([`Kernel::run`]).
enum Ready {
    Amx(amx::Tiles),
    Dot,
    Portable,
}

/// Packed A strips as a kernel reads them: the bf16 bits for AMX and `VDPBF16PS` (reordered
/// for the latter), widened to f32 for the portable kernel (once per band, since each strip
/// meets every B strip).
#[derive(Clone, Copy)]
enum StripsA<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
}

impl<'a> StripsA<'a> {
    /// Strip `s` of `len` values.
    fn strip(self, s: usize, len: usize) -> StripsA<'a> {
        match self {
            StripsA::Bf16(a) => StripsA::Bf16(&a[s * len..][..len]),
            StripsA::F32(a) => StripsA::F32(&a[s * len..][..len]),
        }
    }
}

impl Ready {
    /// `c = ` the chunk sums of the 32 x 32 block of `blocks` K blocks whose packed A strip
    /// starts at block `kb` of `a` and B strip at `b` (`c` row-major 32 x 32, overwritten).
    fn chunk<'a>(&mut self, a: StripsA<'a>, kb: usize, b: &[u16], blocks: usize, c: &mut [f32; BLOCK]) {
        // The bf16 strips from block `kb`, checked to hold `blocks` blocks.
        let checked = |a: &'a [u16]| {
            let a = &a[kb * BLOCK..];
            assert!(
                a.len() >= blocks * BLOCK && b.len() >= blocks * BLOCK,
                "pairs: short strips"
            );
            a
        };
        match (self, a) {
            // SAFETY: the lengths were checked.
            (Ready::Amx(tiles), StripsA::Bf16(a)) => unsafe { tiles.chunk(checked(a).as_ptr(), b.as_ptr(), blocks, c) },
            // SAFETY: the lengths were checked; `Dot` is only chosen where `dot::available()` held.
            (Ready::Dot, StripsA::Bf16(a)) => unsafe { dot::chunk(checked(a), b, blocks, c) },
            (Ready::Portable, StripsA::F32(a)) => portable::chunk(&a[kb * BLOCK..], b, blocks, c),
            _ => unreachable!("pairs: A strips packed for another kernel"),
        }
    }
}

/// The values of a pair-GEMM operand.
#[derive(Clone, Copy)]
pub(super) enum Values<'a> {
    /// FP8 codes.
    Fp8(Fp8Format, &'a [u8]),
    /// bf16 values.
    Bf16(&'a [bf16]),
}

/// A pair-GEMM operand: `rows x k`, element `(r, kk)` at `r * row_stride + kk * k_stride`.
#[derive(Clone, Copy)]
pub(super) struct Source<'a> {
    pub values: Values<'a>,
    pub rows: usize,
    pub k: usize,
    pub row_stride: usize,
    pub k_stride: usize,
}

impl<'a> Source<'a> {
    /// The operand, if the pair GEMM takes it (FP8 codes or bf16 values).
    pub(super) fn of(op: &Operand<'a>) -> Option<Self> {
        let (rows, k) = op.shape();
        let (row_stride, k_stride) = op.strides();
        let values = match op {
            Operand::Fp8(format, q) => Values::Fp8(*format, q.data()),
            Operand::Bf16(m) => Values::Bf16(m.data),
            _ => return None,
        };
        Some(Source {
            values,
            rows,
            k,
            row_stride,
            k_stride,
        })
    }

    /// `row` (whole blocks of K) = row `r` as bf16 in `order`, zeros past K; all zeros for a
    /// row past the end (the padding of a strip).
    fn padded_row(&self, r: usize, row: &mut [bf16], order: KOrder) {
        if r >= self.rows {
            row.fill(bf16::ZERO);
            return;
        }
        self.row_to_bf16(r, row);
        row[self.k..].fill(bf16::ZERO);
        order.apply(row);
    }

    /// The smallest biased exponent of a non-zero value (0 for a subnormal; 255 if all are
    /// zero). FP8 values are at least 2^-16 (E5M2) or 2^-9 (E4M3).
    fn min_exponent(&self) -> u32 {
        match self.values {
            Values::Fp8(Fp8Format::E4M3, _) => 127 - 9,
            Values::Fp8(Fp8Format::E5M2, _) => 127 - 16,
            Values::Bf16(v) => {
                let key = min_exponent_bits(v);
                if key == i16::MAX { 255 } else { (key >> 7) as u32 }
            }
        }
    }

    /// For bf16 stored transposed (rows contiguous at each K): the values of rows
    /// `first..first + len` at one K.
    #[allow(clippy::type_complexity)]
    fn columns(&self) -> Option<impl Fn(usize, usize, usize) -> &'a [bf16] + use<'a>> {
        match self.values {
            Values::Bf16(v) if self.row_stride == 1 && self.k_stride != 1 => {
                let ks = self.k_stride;
                Some(move |k: usize, first: usize, len: usize| &v[k * ks + first..][..len])
            }
            _ => None,
        }
    }

    /// Writes row `r` (all of K) as bf16 into `out[..k]`: FP8 codes through
    /// [`crate::convert::fp8_to_bf16`] (exact: at most 4 significant bits, f32's exponent range). Only
    /// K-contiguous rows come here: FP8 operands are always K-major, and a bf16 operand stored
    /// transposed is read by [`Source::columns`].
    #[inline]
    fn row_to_bf16(&self, r: usize, out: &mut [bf16]) {
        assert_eq!(self.k_stride, 1, "pairs: a strided row is read by columns");
        let out = &mut out[..self.k];
        let start = r * self.row_stride;
        match self.values {
            Values::Fp8(format, codes) => crate::convert::fp8_to_bf16(&codes[start..][..self.k], out, format),
            Values::Bf16(v) => out.copy_from_slice(&v[start..][..self.k]),
        }
    }
}

/// The smallest exponent field (`bits & 0x7F80`) of a non-zero value, `i16::MAX` if none:
/// a branch-free min the compiler vectorizes (AVX-512BW where the CPU has it).
fn min_exponent_bits(values: &[bf16]) -> i16 {
    #[inline(always)]
    fn key(x: &bf16) -> i16 {
        let b = x.to_bits();
        // Zeros (either sign) map to 0x7FFF, above every exponent field.
        let zero = (((b & 0x7FFF) == 0) as u16).wrapping_neg();
        ((b & 0x7F80) | (zero & 0x7FFF)) as i16
    }
    #[inline(always)]
    fn scan(values: &[bf16]) -> i16 {
        // 32 lanes of running minimums: a loop the compiler turns into vector mins.
        let mut lanes = [i16::MAX; 32];
        let mut chunks = values.chunks_exact(32);
        for chunk in &mut chunks {
            lanes.iter_mut().zip(chunk).for_each(|(m, x)| *m = (*m).min(key(x)));
        }
        let tail = chunks.remainder().iter().map(key).min().unwrap_or(i16::MAX);
        lanes.into_iter().min().unwrap_or(i16::MAX).min(tail)
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512bw")]
        fn wide(values: &[bf16]) -> i16 {
            scan(values)
        }
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU has AVX-512BW (checked just above).
            return unsafe { wide(values) };
        }
    }
    scan(values)
}

/// Whether no sum of the GEMM can be subnormal, so that the tile unit's flushing never fires:
/// every value is normal or zero and the products' common grain, `2^(ea - 127 - 7) 2^(eb -
/// 127 - 7)` for the smallest exponents `ea`, `eb`, is at least 2^-126 (always for FP8).
pub(super) fn sums_stay_normal(a: &Source, b: &Source) -> bool {
    let (ea, eb) = (a.min_exponent(), b.min_exponent());
    ea > 0 && eb > 0 && ea + eb >= 268 - 126
}

/// A xorshift64 stream: the random blocks of the kernels' self-checks and of the tests.
pub(super) struct XorShift(pub u64);

impl XorShift {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The first difference between `kernel` (`chunk(a, b, blocks, c)` on strips packed in its
/// [`KOrder`] by the GEMM's own packers) and the portable one (on strips packed in K order), on
/// random blocks: FP8 values (every finite code of both formats, cancelling sums) and bf16
/// values whose sums stay normal, 1 to 6 blocks per chunk; `None` if none. The run-time
/// self-check of the faster kernels.
fn check_against_portable(kernel: Kernel, chunk: impl Fn(&[u16], &[u16], usize, &mut [f32; BLOCK])) -> Option<String> {
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let finite: Vec<u16> = [Fp8Format::E4M3, Fp8Format::E5M2]
        .iter()
        .flat_map(|&f| {
            // Finite FP8 values are exact in bf16.
            (0..=255u8)
                .map(move |c| f.decode(c))
                .filter(|v| v.is_finite())
                .map(|v| bf16::from_f32(v).to_bits())
        })
        .collect();
    for blocks in 1..=6 {
        for fp8 in [true, false] {
            let mut value = || -> bf16 {
                let r = rng.next();
                if fp8 {
                    return bf16::from_bits(finite[r as usize % finite.len()]);
                }
                // bf16 of every sign and mantissa, exponents 2^-27..2^12: products of at least
                // 2^-54, far from subnormal.
                bf16::from_bits(
                    ((r as u16 & 1) << 15) | (((100 + (r >> 8) % 40) as u16) << 7) | ((r >> 32) as u16 & 0x7F),
                )
            };
            let k = blocks * EDGE;
            let a: Vec<bf16> = (0..EDGE * k).map(|_| value()).collect();
            let b: Vec<bf16> = (0..EDGE * k).map(|_| value()).collect();
            let (want, got) = (
                packed_chunk_sums(&a, &b, k, Kernel::Portable, |a, b, blocks, c| {
                    let mut a_wide = vec![0.0f32; a.len()];
                    portable::widen(a, &mut a_wide);
                    portable::chunk(&a_wide, b, blocks, c)
                }),
                packed_chunk_sums(&a, &b, k, kernel, &chunk),
            );
            if let Some(i) = (0..BLOCK).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                let kind = if fp8 { "FP8" } else { "bf16" };
                return Some(format!(
                    "{kind}, {blocks} blocks, element {i}: {kernel:?} {:e}, portable {:e}",
                    got[i], want[i]
                ));
            }
        }
    }
    None
}

/// The chunk sums of the 32 x 32 block of `a` and `b` (32 rows x `k` each, K-major), packed by
/// [`pack_a_strip`] and [`pack_b_strip`] in `kernel`'s K order and summed by `chunk`.
fn packed_chunk_sums(
    a: &[bf16],
    b: &[bf16],
    k: usize,
    kernel: Kernel,
    chunk: impl Fn(&[u16], &[u16], usize, &mut [f32; BLOCK]),
) -> [f32; BLOCK] {
    let source = |values| Source {
        values: Values::Bf16(values),
        rows: EDGE,
        k,
        row_stride: k,
        k_stride: 1,
    };
    let kp = padded_k(k);
    let (mut pa, mut pb, mut row) = (vec![0u16; kp * EDGE], vec![0u16; kp * EDGE], vec![bf16::ZERO; kp]);
    pack_a_strip(source(a), 0, &mut pa, &mut row, KOrder::of(kernel));
    pack_b_strip(source(b), 0, &mut pb, &mut row, KOrder::of(kernel));
    let mut c = [f32::NAN; BLOCK];
    chunk(&pa, &pb, kp / EDGE, &mut c);
    c
}

/// K padded to whole blocks.
fn padded_k(k: usize) -> usize {
    k.div_ceil(EDGE) * EDGE
}

/// How a kernel wants K ordered within each block of 32 (`dot.rs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum KOrder {
    /// In K order (the AMX layouts; the portable kernel reads them too).
    Natural,
    /// Each group of 4 K as `[K 2, K 0, K 3, K 1]`: the 32-bit words of `VDPBF16PS` read
    /// `(K 4s + 2, K 4s)` and `(K 4s + 3, K 4s + 1)`, low half first.
    Dot,
}

impl KOrder {
    fn of(kernel: Kernel) -> KOrder {
        match kernel {
            Kernel::Dot => KOrder::Dot,
            Kernel::Amx | Kernel::Portable => KOrder::Natural,
        }
    }

    /// The position within its block of K offset `kk` (0..32).
    #[inline(always)]
    fn position(self, kk: usize) -> usize {
        match self {
            KOrder::Natural => kk,
            KOrder::Dot => kk / 4 * 4 + [1, 3, 0, 2][kk % 4],
        }
    }

    /// The K offsets (low half, high half) of pair row `p` (0..16) of a B block.
    #[inline(always)]
    fn pair(self, p: usize) -> (usize, usize) {
        match self {
            KOrder::Natural => (2 * p, 2 * p + 1),
            KOrder::Dot => (p / 2 * 4 + 2 + p % 2, p / 2 * 4 + p % 2),
        }
    }

    /// Reorders a K-contiguous row (whole blocks) in place: K `kk` goes to [`KOrder::position`].
    fn apply(self, row: &mut [bf16]) {
        if self == KOrder::Natural {
            return;
        }
        for group in row.chunks_exact_mut(4) {
            let values = [group[0], group[1], group[2], group[3]];
            for (kk, x) in values.into_iter().enumerate() {
                group[self.position(kk)] = x;
            }
        }
    }
}

/// Packs rows `first..first + 32` of `op` (rows past its end are zeros) as an A strip:
/// `[K / 32][32 rows][32 K]` (K within a block in `order`), K past its end zeros. `row` holds
/// `padded_k(op.k)` values.
fn pack_a_strip(op: Source, first: usize, out: &mut [u16], row: &mut [bf16], order: KOrder) {
    let kp = padded_k(op.k);
    if let Some(column) = op.columns() {
        // Stored transposed: the strip's rows are contiguous at each K.
        let height = EDGE.min(op.rows.saturating_sub(first));
        for (kb, block) in out[..kp * EDGE].chunks_exact_mut(BLOCK).enumerate() {
            block.fill(0);
            for kk in 0..EDGE.min(op.k - kb * EDGE) {
                let at = order.position(kk);
                for (r, x) in column(kb * EDGE + kk, first, height).iter().enumerate() {
                    block[r * EDGE + at] = x.to_bits();
                }
            }
        }
        return;
    }
    for r in 0..EDGE {
        op.padded_row(first + r, &mut row[..kp], order);
        for (block, values) in out[..kp * EDGE].chunks_exact_mut(BLOCK).zip(row.chunks_exact(EDGE)) {
            block[r * EDGE..][..EDGE].copy_from_slice(values.reinterpret_cast());
        }
    }
}

/// Packs rows `first..first + 32` of `op` as a B strip: `[K / 32][2 halves][16 pairs]
/// [16 columns][2]` (column `16 h + c`; pair `p` holds K `order.pair(p)` of its block, low
/// half first), padding zeros. `row` holds `padded_k(op.k)` values.
fn pack_b_strip(op: Source, first: usize, out: &mut [u16], row: &mut [bf16], order: KOrder) {
    let kp = padded_k(op.k);
    if let Some(column) = op.columns() {
        // Stored transposed: the strip's columns are contiguous at each K.
        let width = EDGE.min(op.rows.saturating_sub(first));
        let zeros = [bf16::ZERO; EDGE];
        // K past its end reads zeros (K is even for FP8, not always for bf16).
        let at_k = |k: usize| {
            if k < op.k {
                column(k, first, width)
            } else {
                &zeros[..width]
            }
        };
        for (kb, block) in out[..kp * EDGE].chunks_exact_mut(BLOCK).enumerate() {
            block.fill(0);
            let k0 = kb * EDGE;
            for p in 0..EDGE / 2 {
                let (lo, hi) = order.pair(p);
                if k0 + lo.min(hi) >= op.k {
                    continue;
                }
                let (lo, hi) = (at_k(k0 + lo), at_k(k0 + hi));
                for (col, (l, h)) in lo.iter().zip(hi).enumerate() {
                    let at = ((col / 16 * 16 + p) * 16 + col % 16) * 2;
                    block[at] = l.to_bits();
                    block[at + 1] = h.to_bits();
                }
            }
        }
        return;
    }
    for col in 0..EDGE {
        op.padded_row(first + col, &mut row[..kp], order);
        let (h, c) = (col / 16, col % 16);
        for (block, values) in out[..kp * EDGE].chunks_exact_mut(BLOCK).zip(row.chunks_exact(EDGE)) {
            // One 32-bit word (a pair of K) per pair row: the column's 16 words go 16 words apart.
            let half = &mut block[h * BLOCK / 2..][..BLOCK / 2];
            let words: &[u16] = values.reinterpret_cast();
            for (p, pair) in words.chunks_exact(2).enumerate() {
                let at = (p * 16 + c) * 2;
                half[at..at + 2].copy_from_slice(pair);
            }
        }
    }
}

thread_local! {
    /// The packed A strips of the band a thread works on, kept across calls.
    static A_STRIPS: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
    /// The same strips widened to f32 for the portable kernel, kept across calls.
    static A_WIDE: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// One row of A as bf16 while it is packed.
    static A_ROW: Cell<Vec<bf16>> = const { Cell::new(Vec::new()) };
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
    a: Source,
    b: Source,
    chunk: usize,
    epilogue: &Epilogue,
    out: Output,
    kernel: Kernel,
) -> crate::error::Result<f32> {
    assert!(
        a.k == b.k && chunk > 0 && chunk.is_multiple_of(EDGE),
        "pairs::gemm: bad shapes"
    );
    let (m, n, k) = (a.rows, b.rows, a.k);
    if m == 0 || n == 0 {
        return Ok(0.0);
    }
    let kp = padded_k(k);
    let strip_len = kp * EDGE;
    let n_strips = n.div_ceil(EDGE);
    let band = band_rows(m, rayon::current_num_threads());
    with_kept(&B_STRIPS, n_strips * strip_len, |packed_b| {
        packed_b.par_chunks_mut(strip_len.max(1)).enumerate().for_each_init(
            || vec![bf16::ZERO; kp],
            |row, (s, strip)| pack_b_strip(b, s * EDGE, strip, row, KOrder::of(kernel)),
        );
        let packed_b = &*packed_b;
        // Rows `i0..i0 + rows` of the sum, into `acc` (`rows x n`).
        let sum_band = |i0: usize, acc: &mut [f32]| {
            let rows = acc.len() / n;
            with_kept(&A_STRIPS, rows.div_ceil(EDGE) * strip_len, |packed_a| {
                with_kept(&A_ROW, kp, |row| {
                    for (s, strip) in packed_a.chunks_exact_mut(strip_len.max(1)).enumerate() {
                        pack_a_strip(a, i0 + s * EDGE, strip, row, KOrder::of(kernel));
                    }
                });
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
    shape: (usize, usize, usize),
    chunk: usize,
    acc: &mut [f32],
    kernel: Kernel,
) {
    let mut run = |a: StripsA| {
        kernel.run(|ready| {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn wide(
                    a: StripsA,
                    b: &[u16],
                    shape: (usize, usize, usize),
                    chunk: usize,
                    acc: &mut [f32],
                    k: &mut Ready,
                ) {
                    sum_strips_ready(a, b, shape, chunk, acc, k)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked just above).
                    return unsafe { wide(a, packed_b, shape, chunk, acc, ready) };
                }
            }
            sum_strips_ready(a, packed_b, shape, chunk, acc, ready)
        })
    };
    match kernel {
        Kernel::Amx | Kernel::Dot => run(StripsA::Bf16(packed_a)),
        Kernel::Portable => with_kept(&A_WIDE, packed_a.len(), |wide| {
            portable::widen(packed_a, wide);
            run(StripsA::F32(wide))
        }),
    }
}

#[inline(always)]
fn sum_strips_ready(
    packed_a: StripsA,
    packed_b: &[u16],
    (rows, n, kp): (usize, usize, usize),
    chunk: usize,
    acc: &mut [f32],
    kernel: &mut Ready,
) {
    let strip_len = kp * EDGE;
    let (blocks, chunk_blocks) = (kp / EDGE, chunk / EDGE);
    let mut t = [0.0f32; BLOCK];
    for s in 0..rows.div_ceil(EDGE) {
        let a_strip = packed_a.strip(s, strip_len);
        let i0 = s * EDGE;
        let height = EDGE.min(rows - i0);
        for (js, b_strip) in packed_b.chunks_exact(strip_len.max(1)).enumerate() {
            let j0 = js * EDGE;
            let width = EDGE.min(n - j0);
            for kb in (0..blocks).step_by(chunk_blocks) {
                let count = chunk_blocks.min(blocks - kb);
                kernel.chunk(a_strip, kb, &b_strip[kb * BLOCK..], count, &mut t);
                // The chunk sums join the element's sum in order, from +0: the first one is
                // copied (`+0 + t` is `t`: a chunk sum starts at +0 and is never -0).
                for (r, t_row) in t.chunks_exact(EDGE).take(height).enumerate() {
                    let row = &mut acc[(i0 + r) * n + j0..][..width];
                    if kb == 0 {
                        row.copy_from_slice(&t_row[..width]);
                    } else {
                        row.iter_mut().zip(t_row).for_each(|(x, &v)| *x += v);
                    }
                }
            }
        }
    }
    if kp == 0 {
        acc.fill(0.0);
    }
}
