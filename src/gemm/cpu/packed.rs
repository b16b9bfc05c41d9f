//! Our own packed f32 GEMM for f32 outputs (AVX-512): the crate's sums, bit for bit, without
//! its per-call repacking, our transpose of a K-major B, or a separate epilogue pass.
//!
//! The sums are the contract of `kernel.rs`: each output element is an FMA chain over K from
//! +0 in K order within each chunk, and the chunk sums are added to it in order (`dst + chunk`).
//! The crate's packed micro-kernels compute exactly that on the shapes [`super::layout_free`]
//! admits (its kernels never cut a chunk of at most 512, and every kernel it picks for such a
//! shape keeps one register accumulator per element); the caller takes this route only there.
//!
//! How it runs:
//! * B is packed once per GEMM, shared by all threads, in panels of [`NR`] = 64 of its rows
//!   (`[K][64]`, zero-padded, 64-byte aligned; a K-major B through 16 x 16 register
//!   transposes): the crate repacked B for every call (every band), and a K-major B first went
//!   through a transpose (`transpose.rs`). `4 ceil(N / 64) 64 K` bytes. One exception is read
//!   in place: a 64-byte aligned, N-contiguous B (wgrad's `X^T`) whose steps of K are at most
//!   1 KiB apart, when A is packed too ([`PackedB::for_a`]).
//! * The output is cut into bands of whole rows, one rayon task each; a band walks blocks of
//!   B panels that fit half of a 2 MiB L2 (`L2_BUDGET`), and for each block, strips of [`MR`] = 6
//!   rows of A (read in place when K-contiguous, else packed `[K][6]` once per band) against
//!   every panel of the block.
//! * A 6 x 64 micro-tile keeps 24 AVX-512 accumulators over one chunk of K (4 loads of B and 6
//!   broadcasts of A per 24 FMAs), adds the chunk to the tile's sum, and after the last chunk
//!   finishes the tile (`* factor`, `+ bias`, `+ beta * old`, amax) straight into the output.

use rayon::prelude::*;

use super::decode::{self, Unscaled};
use super::epilogue::{Epilogue, nan_max};
use super::kernel::Panel;

/// Rows of A per micro-tile.
pub(super) const MR: usize = 6;
/// Rows of B (output columns) per micro-tile: 4 AVX-512 vectors of f32.
pub(super) const NR: usize = 64;
/// Bytes of packed B panels a band works on at a time: half of a 2 MiB L2 (the per-core L2 of
/// the 2-core machine the benchmarks ran on; 512 KiB measured no faster), the A strips and
/// output tiles take the rest.
const L2_BUDGET: usize = 1 << 20;
/// Bands per thread: enough to even out a ragged last band, few enough to keep them tall.
const BANDS_PER_THREAD: usize = 2;
/// Packed elements from which B is packed on all threads (below, ~30 us of copying).
const PARALLEL_MIN: usize = 1 << 16;
/// f32 lanes per 64-byte line: the packed panels start on one.
const LINE: usize = 16;

/// Whether this CPU runs the packed kernel (AVX-512F); elsewhere the crate does all GEMMs.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has AVX-512VL too (masked 256-bit moves, [`avx512::copy_steps`]).
fn masked_ymm() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        available() && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Largest K stride (f32 values) of an N-contiguous B that [`PackedB::for_a`] reads in place:
/// 1 KiB, four steps of K per 4 KiB page.
const IN_PLACE_MAX_STRIDE: usize = 256;

/// B as the micro-kernel reads it, in panels of [`NR`] rows: panel `p` holds `B[64 p + jj, kk]`
/// at `values[start + p * panel_step + kk * k_step + jj]`: packed (`k_step` = 64), or B's own
/// values read in place (`k_step` = its K stride).
pub(super) struct PackedB<'a> {
    values: Unscaled<'a>,
    /// Index of panel 0's first value (64-byte aligned).
    start: usize,
    /// Distance between consecutive steps of K in a panel.
    k_step: usize,
    /// Distance between consecutive panels.
    panel_step: usize,
    n: usize,
    k: usize,
}

impl<'a> PackedB<'a> {
    /// `b` for a GEMM whose A is `a`: read in place where that measured faster than packing,
    /// else packed ([`PackedB::pack`]). In place: an A that the bands pack (not K-contiguous:
    /// wgrad's `dY^T`) and an N-contiguous B of whole panels whose every step of K starts on a
    /// 64-byte line, at most [`IN_PLACE_MAX_STRIDE`] apart. At 768 / 256 / 1024 x 256 x 1024
    /// that was 4-15% faster than packing (one thread); at 4 KiB per step, or off the 64-byte
    /// lines (each 64-value load then spans five lines), it was 10-20% slower, and so was an
    /// in-place B against an A read in place (dgrad), docs/benchmarks.md.
    pub(super) fn for_a(b: Panel<'a>, a: &Panel) -> Self {
        let start = b.first + b.k0 * b.k_stride;
        let on_lines = b.data.as_ptr().wrapping_add(start).align_offset(64) == 0 && b.k_stride.is_multiple_of(LINE);
        let whole_panels = b.rows.is_multiple_of(NR) && b.rows > 0 && b.k > 0;
        if a.k_stride != 1
            && b.row_stride == 1
            && b.k_stride <= IN_PLACE_MAX_STRIDE
            && on_lines
            && whole_panels
            && b.in_bounds()
        {
            PackedB {
                values: Unscaled::Borrowed(b.data),
                start,
                k_step: b.k_stride,
                panel_step: NR,
                n: b.rows,
                k: b.k,
            }
        } else {
            Self::pack(b)
        }
    }

    /// Packs every row of `b` (rows `first..first + rows`, its whole K).
    pub(super) fn pack(b: Panel) -> Self {
        let (n, k) = (b.rows, b.k);
        let panels = n.div_ceil(NR);
        let panel_len = NR * k;
        let mut values = decode::buffer(panels * panel_len + LINE);
        let start = values.as_ptr().align_offset(64).min(LINE);
        let pack_one = |(p, panel): (usize, &mut [f32])| pack_b_panel(&b, p * NR, panel);
        if panel_len > 0 {
            let dst = &mut values[start..start + panels * panel_len];
            if dst.len() >= PARALLEL_MIN {
                dst.par_chunks_mut(panel_len).enumerate().for_each(pack_one);
            } else {
                dst.chunks_mut(panel_len).enumerate().for_each(pack_one);
            }
        }
        PackedB {
            values: Unscaled::Decoded(values),
            start,
            k_step: NR,
            panel_step: panel_len,
            n,
            k,
        }
    }

    /// Panel `p`: its K steps are `k_step` apart from `start`.
    fn panel(&self, p: usize) -> BPanel<'_> {
        BPanel {
            data: &self.values,
            start: self.start + p * self.panel_step,
            k_step: self.k_step,
        }
    }
}

/// One panel of [`NR`] rows of B: step `kk` of K is `data[start + kk * k_step..][..NR]`.
struct BPanel<'a> {
    data: &'a [f32],
    start: usize,
    k_step: usize,
}

/// `panel[kk * NR + jj] = B[j0 + jj, kk]`, zero past B's last row.
fn pack_b_panel(b: &Panel, j0: usize, panel: &mut [f32]) {
    let width = NR.min(b.rows - j0);
    if width < NR {
        panel.fill(0.0);
    }
    let row0 = b.first + j0;
    if b.row_stride == 1 && available() {
        // N-contiguous (a stored transpose): 64 consecutive values per step of K.
        let last = row0 + width + (b.k0 + b.k - 1) * b.k_stride;
        assert!(
            last <= b.data.len() && panel.len() == NR * b.k,
            "packed gemm: B panel out of bounds"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F is available (checked above); the assert checked that `width` values
        // from `row0 + (k0 + kk) k_stride` lie in `b.data` for every `kk < k`, and that `panel`
        // holds `NR * k` values, the only memory `pack_n_contiguous` touches.
        unsafe {
            avx512::pack_n_contiguous(b.data, row0 + b.k0 * b.k_stride, b.k_stride, width, b.k, panel);
        }
    } else if b.k_stride == 1 && available() {
        // K-major: 16 x 16 blocks transposed in registers (a scalar gather costs ~0.8 ns a
        // value, ~6% of a 1024 x 768 x 256 GEMM).
        let last = (row0 + width - 1) * b.row_stride + b.k0 + b.k;
        assert!(
            last <= b.data.len() && panel.len() == NR * b.k,
            "packed gemm: B panel out of bounds"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F is available (checked above); the assert checked that rows
        // `row0..row0 + width`, K columns `k0..k0 + k`, lie in `b.data` and that `panel` holds
        // `NR * k` values, the only memory `pack_k_major` touches.
        unsafe {
            avx512::pack_k_major(b.data, row0 * b.row_stride + b.k0, b.row_stride, width, b.k, panel);
        }
    } else {
        // Any other layout: 16 steps of K at a time, so the 16 packed rows written (4 KiB) stay
        // in L1 while each B row gives 16 consecutive values.
        const STEP: usize = 16;
        for kb in (0..b.k).step_by(STEP) {
            let len = STEP.min(b.k - kb);
            for jj in 0..width {
                let at = (row0 + jj) * b.row_stride + (b.k0 + kb) * b.k_stride;
                for t in 0..len {
                    panel[(kb + t) * NR + jj] = b.data[at + t * b.k_stride];
                }
            }
        }
    }
}

/// `dst[..src.len()] = src` for the [`MR`]-value rows of a packed strip: a whole row as one
/// fixed-size copy (vector moves; a `memcpy` call per 24-byte row cost several % of an fp32
/// layer step in `perf`).
fn copy_row(src: &[f32], dst: &mut [f32]) {
    match (<&[f32; MR]>::try_from(src), <&mut [f32; MR]>::try_from(&mut *dst)) {
        (Ok(src), Ok(dst)) => *dst = *src,
        _ => dst[..src.len()].iter_mut().zip(src).for_each(|(d, &s)| *d = s),
    }
}

/// Strips `s0..s1` of the band `a` packed ([`MR`] rows each): strip `s` holds `A[6 s + r, kk]`
/// at `[s * 6 K + kk * 6 + r]`, zero past the band's last row.
fn pack_a_strips(a: &Panel, s0: usize, s1: usize, strips: &mut [f32]) {
    let (rows, k) = (a.rows, a.k);
    let strips = &mut strips[s0 * MR * k..s1 * MR * k];
    if s1 * MR > rows {
        let last = strips.len() - MR * k;
        strips[last..].fill(0.0);
    }
    if a.row_stride == 1 {
        // A stored transposed: each step of K holds the rows as one contiguous run. 32 steps
        // at a time, then strip by strip (a strip's 32 steps are 768 contiguous bytes). Both
        // simpler orders were slow at 1024 x 256 x 1024: a strip over all K reads 6 values from
        // a new page per step (~20% of the GEMM), and a step over all strips writes 24 bytes to
        // each of ~80 strips 24 KiB apart, which share their L1 sets (~20% too).
        const STEPS: usize = 32;
        let vector = masked_ymm();
        for k0 in (0..k).step_by(STEPS) {
            let k1 = k.min(k0 + STEPS);
            for (s, strip) in (s0..s1).zip(strips.chunks_exact_mut(MR * k)) {
                let width = MR.min(rows - s * MR);
                let at = a.first + s * MR + (a.k0 + k0) * a.k_stride;
                if vector {
                    let end = at + (k1 - 1 - k0) * a.k_stride + width;
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX-512F and VL are available (`masked_ymm`); `copy_steps` reads
                    // only inside the slice `a.data[at..end]` (indexing checks it) and writes
                    // only `strip[k0 * MR..k1 * MR]` (likewise).
                    unsafe {
                        avx512::copy_steps(&a.data[at..end], a.k_stride, width, &mut strip[k0 * MR..k1 * MR]);
                    }
                } else {
                    for kk in k0..k1 {
                        let at = at + (kk - k0) * a.k_stride;
                        copy_row(&a.data[at..at + width], &mut strip[kk * MR..][..MR]);
                    }
                }
            }
        }
    } else {
        for (s, strip) in (s0..s1).zip(strips.chunks_exact_mut(MR * k)) {
            for r in 0..MR.min(rows - s * MR) {
                let at = (a.first + s * MR + r) * a.row_stride + a.k0 * a.k_stride;
                for kk in 0..k {
                    strip[kk * MR + r] = a.data[at + kk * a.k_stride];
                }
            }
        }
    }
}

/// Rows per band for an `m`-row output on `threads` threads: [`BANDS_PER_THREAD`] bands per
/// thread, each a whole number of [`MR`]-row strips.
pub(super) fn band_rows(m: usize, threads: usize) -> usize {
    m.div_ceil(BANDS_PER_THREAD * threads.max(1))
        .next_multiple_of(MR)
        .max(MR)
}

/// `out = epilogue(A B^T)` for the f32 output `out` (`a.rows x b.n`, row-major; read only for
/// `beta != 0`), K summed in chunks of `chunk`; returns the amax. Bands of rows run as rayon
/// tasks against the shared packed B.
pub(super) fn gemm_f32(out: &mut [f32], a: Panel, b: &PackedB, chunk: usize, epilogue: &Epilogue) -> f32 {
    let (m, n) = (a.rows, b.n);
    assert!(
        a.k == b.k && out.len() == m * n && a.in_bounds() && chunk > 0 && available(),
        "packed gemm: inconsistent call (A {m}x{}, B {n}x{}, out {}, chunk {chunk})",
        a.k,
        b.k,
        out.len()
    );
    if m == 0 || n == 0 {
        return 0.0;
    }
    let band = band_rows(m, rayon::current_num_threads());
    out.par_chunks_mut(band * n)
        .enumerate()
        .map(|(t, rows_out)| {
            let a_band = Panel {
                first: a.first + t * band,
                rows: rows_out.len() / n,
                ..a
            };
            run_band(rows_out, &a_band, b, chunk, epilogue)
        })
        .reduce(|| 0.0, nan_max)
}

/// One band: blocks of B panels (L2), strips of A (L1), micro-tiles.
fn run_band(out: &mut [f32], a: &Panel, b: &PackedB, chunk: usize, epilogue: &Epilogue) -> f32 {
    let (rows, n, k) = (a.rows, b.n, a.k);
    let panels = n.div_ceil(NR);
    let block = (L2_BUDGET / (4 * NR * k).max(1)).clamp(1, panels);
    // A K-contiguous A is read in place (six row streams); any other layout is packed once per
    // band (`24 K` bytes a strip, in a kept buffer). Packing 8 strips at a time just before
    // their first use measured slower (at 1024 x 256 x 1024, 18% of the GEMM against 13%).
    let in_place = a.k_stride == 1;
    let band_strips = rows.div_ceil(MR);
    let mut strips = decode::buffer(if in_place { 0 } else { band_strips * MR * k });
    if !in_place {
        pack_a_strips(a, 0, band_strips, &mut strips);
    }
    let mut amax = Amax::default();
    for p0 in (0..panels).step_by(block) {
        for i0 in (0..rows).step_by(MR) {
            let strip_rows = MR.min(rows - i0);
            let a_rows = if in_place {
                // Rows past the band's end repeat the strip's first row: read, summed, never stored.
                let row = |r: usize| (a.first + i0 + if r < strip_rows { r } else { 0 }) * a.row_stride + a.k0;
                ARows {
                    data: a.data,
                    starts: std::array::from_fn(row),
                    k_stride: 1,
                }
            } else {
                ARows {
                    data: &strips,
                    starts: std::array::from_fn(|r| i0 * k + r),
                    k_stride: MR,
                }
            };
            for p in p0..panels.min(p0 + block) {
                let j0 = p * NR;
                let tile = TileOut {
                    out: &mut out[i0 * n..],
                    row_stride: n,
                    rows: strip_rows,
                    cols: NR.min(n - j0),
                    j0,
                };
                micro_tile(&a_rows, b.panel(p), k, chunk, tile, epilogue, &mut amax);
            }
        }
    }
    // Back to this thread's kept buffers for the next band.
    drop(strips);
    amax.value()
}

/// The [`MR`] rows of A a micro-tile reads: row `r`'s value at step `kk` of K is
/// `data[starts[r] + kk * k_stride]`.
struct ARows<'a> {
    data: &'a [f32],
    starts: [usize; MR],
    k_stride: usize,
}

/// Where a micro-tile lands: `rows x cols` from column `j0` of `out` (row stride `row_stride`).
struct TileOut<'a> {
    out: &'a mut [f32],
    row_stride: usize,
    rows: usize,
    cols: usize,
    j0: usize,
}

/// A running amax: the largest |v| seen, and whether any v was NaN ([`nan_max`]'s result).
#[derive(Default)]
struct Amax {
    max: f32,
    nan: bool,
}

impl Amax {
    fn value(&self) -> f32 {
        if self.nan { f32::NAN } else { self.max }
    }
}

/// One micro-tile over the whole K (`k` steps), finished into the output.
fn micro_tile(a: &ARows, panel: BPanel, k: usize, chunk: usize, tile: TileOut, epilogue: &Epilogue, amax: &mut Amax) {
    let last = (tile.rows - 1) * tile.row_stride + tile.j0 + tile.cols;
    let b_end = k
        .checked_sub(1)
        .and_then(|steps| steps.checked_mul(panel.k_step))
        .and_then(|at| at.checked_add(panel.start + NR));
    let bias = epilogue.bias.map(|b| &b[tile.j0..tile.j0 + tile.cols]);
    let a_last = a.starts.iter().max().map(|&s| s + k.saturating_sub(1) * a.k_stride);
    assert!(
        k > 0
            && a_last.is_some_and(|l| l < a.data.len())
            && b_end.is_some_and(|end| end <= panel.data.len())
            && (1..=MR).contains(&tile.rows)
            && (1..=NR).contains(&tile.cols)
            && last <= tile.out.len(),
        "packed gemm: micro-tile out of bounds"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` (asserted by `gemm_f32`, the only caller's entry) says the CPU has
    // AVX-512F. The assert above checked every access: the kernel reads `k` steps of each A row
    // (the last at `a_last`) and `NR` panel values at each of `k` steps (the last ending at
    // `b_end`), `cols` bias values, and reads/writes
    // `cols` values of each of `rows` output rows `row_stride` apart from column `j0`, all
    // inside `tile.out`.
    unsafe {
        let b = panel.data.as_ptr().add(panel.start);
        avx512::micro_tile(a, (b, panel.k_step), k, chunk, tile, bias, epilogue, amax);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, panel, k, chunk, tile, bias, amax);
        unreachable!("packed gemm without AVX-512");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{ARows, Amax, Epilogue, MR, NR, TileOut};

    /// Accumulators of a micro-tile: row `r`, vector `c` (columns `16 c..16 c + 16`) at `4 r + c`.
    type Acc = [__m512; MR * 4];

    /// See [`super::micro_tile`], which checks the bounds; `panel`: B's step 0 and the distance
    /// between steps.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn micro_tile(
        a: &ARows,
        panel: (*const f32, usize),
        k: usize,
        chunk: usize,
        tile: TileOut,
        bias: Option<&[f32]>,
        epilogue: &Epilogue,
        amax: &mut Amax,
    ) {
        let (b, b_step) = panel;
        let mut sum: Acc = [_mm512_setzero_ps(); MR * 4];
        let mut k0 = 0;
        while k0 < k {
            let len = chunk.min(k - k0);
            // SAFETY: `k0 + len <= k`: the chunk's A and panel values lie inside the steps the
            // caller checked.
            let part = unsafe {
                let rows = a.starts.map(|start| a.data.as_ptr().add(start + k0 * a.k_stride));
                chunk_sum(rows, a.k_stride, (b.add(k0 * b_step), b_step), len)
            };
            for (s, p) in sum.iter_mut().zip(&part) {
                // The first chunk is the sum; later ones are added to it (`dst + chunk`).
                *s = if k0 == 0 { *p } else { _mm512_add_ps(*s, *p) };
            }
            k0 += len;
        }
        let (factor, beta) = (_mm512_set1_ps(epilogue.factor), _mm512_set1_ps(epilogue.beta));
        let mut max = _mm512_setzero_ps();
        let mut nan: __mmask16 = 0;
        for r in 0..tile.rows {
            let row = &mut tile.out[r * tile.row_stride + tile.j0..][..tile.cols];
            for c in 0..4 {
                let lanes = tile.cols.saturating_sub(16 * c).min(16);
                if lanes == 0 {
                    break;
                }
                let mask: __mmask16 = ((1u32 << lanes) - 1) as u16;
                // SAFETY (loads and stores): lanes `16 c..16 c + lanes` of `row` and `bias`
                // exist (both hold `cols` values); masked-off lanes are not touched.
                let dst = unsafe { row.as_mut_ptr().add(16 * c) };
                // The epilogue's order (`epilogue.rs`): `* factor`, `+ bias`, `+ beta * old`.
                let mut v = _mm512_mul_ps(sum[4 * r + c], factor);
                if let Some(bias) = bias {
                    v = _mm512_add_ps(v, unsafe { _mm512_maskz_loadu_ps(mask, bias.as_ptr().add(16 * c)) });
                }
                if epilogue.beta != 0.0 {
                    let old = unsafe { _mm512_maskz_loadu_ps(mask, dst) };
                    v = _mm512_add_ps(v, _mm512_mul_ps(beta, old));
                }
                nan |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(mask, v, v);
                max = _mm512_mask_max_ps(max, mask, max, _mm512_abs_ps(v));
                unsafe { _mm512_mask_storeu_ps(dst, mask, v) };
            }
        }
        amax.nan |= nan != 0;
        amax.max = amax.max.max(_mm512_reduce_max_ps(max));
    }

    /// `panel[kk * NR + jj] = data[start + jj * row_stride + kk]` for `jj < width`, `kk < k`
    /// (rows past `width` are left as they are), in 16 x 16 blocks transposed in registers.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_k_major(
        data: &[f32],
        start: usize,
        row_stride: usize,
        width: usize,
        k: usize,
        panel: &mut [f32],
    ) {
        for g in 0..width.div_ceil(16) {
            let rows = (width - 16 * g).min(16);
            for kb in (0..k).step_by(16) {
                let len = (k - kb).min(16);
                let mask: __mmask16 = ((1u32 << len) - 1) as u16;
                let mut m = [_mm512_setzero_ps(); 16];
                for (r, v) in m.iter_mut().enumerate().take(rows) {
                    // SAFETY: row `16 g + r < width`, columns `kb..kb + len` (masked) lie in
                    // `data` (the caller's bounds).
                    *v = unsafe {
                        _mm512_maskz_loadu_ps(mask, data.as_ptr().add(start + (16 * g + r) * row_stride + kb))
                    };
                }
                transpose16(&mut m);
                for (t, v) in m.iter().enumerate().take(len) {
                    // SAFETY: step `kb + t < k`, lanes `16 g..16 g + 16` of a 64-wide row.
                    unsafe { _mm512_storeu_ps(panel.as_mut_ptr().add((kb + t) * NR + 16 * g), *v) };
                }
            }
        }
    }

    /// `strip[t * MR + r] = src[t * stride + r]` for `r < width`, zero for `width <= r < MR`, for
    /// every step `t < strip.len() / MR`: rows of a transposed A into a packed strip, one masked
    /// 256-bit load and store per step. Against the two moves of each 24-byte copy of `copy_row`
    /// this took ~20% off the packing, ~1-2% of a wgrad GEMM on one thread; 512-bit masked
    /// moves measured no faster than those copies (docs/benchmarks.md).
    /// `1 <= width <= MR`; `src` must hold every step's `width` values (the last step's end).
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn copy_steps(src: &[f32], stride: usize, width: usize, strip: &mut [f32]) {
        debug_assert!((1..=MR).contains(&width));
        let steps = strip.len() / MR;
        let load: __mmask8 = ((1u32 << width) - 1) as u8;
        let store: __mmask8 = (1 << MR) - 1;
        for t in 0..steps {
            // SAFETY: the caller's bounds: lanes `< width` of step `t` lie in `src` (masked-off
            // lanes are not read), and `strip` holds `MR` values from `t * MR`.
            unsafe {
                let v = _mm256_maskz_loadu_ps(load, src.as_ptr().wrapping_add(t * stride));
                _mm256_mask_storeu_ps(strip.as_mut_ptr().add(t * MR), store, v);
            }
        }
    }

    /// `panel[kk * NR + jj] = data[start + kk * k_stride + jj]` for `jj < width`, `kk < k`,
    /// zero for `width <= jj < NR`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_n_contiguous(
        data: &[f32],
        start: usize,
        k_stride: usize,
        width: usize,
        k: usize,
        panel: &mut [f32],
    ) {
        let masks: [__mmask16; 4] = std::array::from_fn(|g| {
            let lanes = width.saturating_sub(16 * g).min(16);
            ((1u32 << lanes) - 1) as u16
        });
        for kk in 0..k {
            for (g, &mask) in masks.iter().enumerate() {
                // SAFETY: the masked lanes are values `< width` of step `kk` (the caller's
                // bounds); the store is lanes `16 g..16 g + 16` of the step's 64-wide row.
                unsafe {
                    let v = _mm512_maskz_loadu_ps(mask, data.as_ptr().wrapping_add(start + kk * k_stride + 16 * g));
                    _mm512_storeu_ps(panel.as_mut_ptr().add(kk * NR + 16 * g), v);
                }
            }
        }
    }

    /// Transposes the 16 x 16 matrix `m` (row `r` = `m[r]`), one index bit at a time: the step
    /// for bit `h` swaps bit `h` of the row with bit `h` of the column, so after the four steps
    /// `(r, c)` is at `(c, r)`.
    #[target_feature(enable = "avx512f")]
    fn transpose16(m: &mut [__m512; 16]) {
        for h in [8usize, 4, 2, 1] {
            // Row i (bit h clear) keeps its columns with bit h clear and takes row i + h's
            // columns c - h for the others; row i + h takes row i's columns c + h for its
            // columns with bit h clear and keeps the others (`permutex2var`: index bit 4 picks
            // the second operand).
            let low: [i32; 16] = std::array::from_fn(|c| if c & h == 0 { c } else { 16 + c - h } as i32);
            let high: [i32; 16] = std::array::from_fn(|c| if c & h == 0 { c + h } else { 16 + c } as i32);
            // SAFETY: loads from two local 16-value arrays.
            let (low, high) = unsafe {
                (
                    _mm512_loadu_si512(low.as_ptr().cast()),
                    _mm512_loadu_si512(high.as_ptr().cast()),
                )
            };
            for i in (0..16).filter(|i| i & h == 0) {
                let (x, y) = (m[i], m[i + h]);
                m[i] = _mm512_permutex2var_ps(x, low, y);
                m[i + h] = _mm512_permutex2var_ps(x, high, y);
            }
        }
    }

    /// The FMA chains of one chunk: `acc[r][j] = fma(B[kk][j], A[r][kk], acc[r][j])` for `kk`
    /// in order from +0, on `len` steps of the A rows (`a_rows[r] + kk * a_step`) and of the
    /// panel (64 values at `b.0 + kk * b.1`).
    #[target_feature(enable = "avx512f")]
    unsafe fn chunk_sum(a_rows: [*const f32; MR], a_step: usize, b: (*const f32, usize), len: usize) -> Acc {
        let mut acc: Acc = [_mm512_setzero_ps(); MR * 4];
        let mut kk = 0;
        // Four steps per trip (in order, one at a time: the same chains).
        while kk + 4 <= len {
            for u in 0..4 {
                // SAFETY: `kk + u < len` steps of the caller's A rows and panel.
                unsafe { step(&mut acc, a_rows, a_step, b, kk + u) };
            }
            kk += 4;
        }
        while kk < len {
            // SAFETY: as above.
            unsafe { step(&mut acc, a_rows, a_step, b, kk) };
            kk += 1;
        }
        acc
    }

    /// Step `kk` of K for every accumulator of the micro-tile.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn step(acc: &mut Acc, a_rows: [*const f32; MR], a_step: usize, b: (*const f32, usize), kk: usize) {
        {
            // SAFETY: the caller's A rows and panel hold step `kk` (`b.1` apart).
            let b = unsafe { b.0.add(kk * b.1) };
            let bv = unsafe {
                [
                    _mm512_loadu_ps(b),
                    _mm512_loadu_ps(b.add(16)),
                    _mm512_loadu_ps(b.add(32)),
                    _mm512_loadu_ps(b.add(48)),
                ]
            };
            for r in 0..MR {
                let ar = _mm512_set1_ps(unsafe { *a_rows[r].add(kk * a_step) });
                for c in 0..4 {
                    acc[4 * r + c] = _mm512_fmadd_ps(bv[c], ar, acc[4 * r + c]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
