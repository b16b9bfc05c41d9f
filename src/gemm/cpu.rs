//! The CPU reference GEMM: exact products (FP8 x FP8, bf16 x bf16 and f16 x
//! f16 products are exact in f32), f32 accumulation, block scales applied per
//! block of K at promotion.
//!
//! FP8 x FP8 GEMMs with per-tensor scales and bf16 x bf16 GEMMs sum in the pair order of AMX
//! `TDPBF16PS` instead (`pairs.rs`: AMX tiles where the CPU has them, a portable twin
//! elsewhere); split accumulation only sets their chunk (128). Everything below describes the
//! other GEMMs (f32, f16, block-scaled and MXFP8).
//!
//! How it runs: both operands are decoded to f32 without their scales (exact;
//! a plain operand stored transposed stays so and is read with swapped strides),
//! the output is cut into tiles (rayon tasks), and each task multiplies its
//! panels with the f32 GEMM crate (`gemm`, one thread per tile):
//!
//! * plain inputs, or per-tensor scales without split accumulation: one
//!   product over the whole K (in chunks of at most 512, `kernel.rs`), then
//!   `* alpha * sA * sB`;
//! * per-tensor scales with `split_accumulator`: the crate's 128-wide partial
//!   sums are added to the tile's f32 accumulator one K block at a time (the
//!   GPU's promotion), then `* alpha * sA * sB`;
//! * block scales (1x128 x 128x128, 1x128 x 1x128; MXFP8 in blocks of 32):
//!   per K block, `acc += partial * (sA[i, kb] * sB[j, kb])`, then `* alpha`.
//!
//! Then the epilogue: `+ bias[j]`, `+ beta * D_old` (f32 output only; beta = 0
//! never reads it), the amax of that f32 result, and the cast to the output.
//!
//! Shortcuts, taken only when every crate call has a layout-free shape
//! ([`layout_free`], so the sums cannot change):
//!
//! * on CPUs with AVX-512F, an f32 output of plain or per-tensor operands (the
//!   whole-K and split modes) runs our own packed kernel (`packed.rs`): B packed
//!   once and shared by the threads, the crate's FMA chains in the same order,
//!   the epilogue applied as each micro-tile is stored;
//! * elsewhere, a K-major B is read from an N-contiguous copy (`transpose.rs`),
//!   and an f32 output with beta = 0 is cut into bands of whole rows that the
//!   crate sums into directly, finished there by the epilogue (no accumulator
//!   tile to copy back).
//!
//! `route_tests.rs` holds both to the plain tile route bit for bit.
//!
//! On the CPU both accumulation modes are f32 (the crate keeps its partial
//! sums in f32 registers with FMA); split accumulation only changes where the
//! partial sums meet the accumulator, so the two differ by f32 rounding, not
//! by the GPU's ~13-bit fast accumulator.
//!
//! Memory: the decoded operands (`4 (M + N) K` bytes; B also as its packed copy,
//! `4 ceil(N / 64) 64 K` bytes, unless `packed.rs` reads it in place, or a K-major B as
//! its `4 N K`-byte transpose,
//! `transpose.rs`) plus two f32 tiles per running task (packed route: its band
//! of an A that is not K-contiguous, `4 K` bytes a row); nothing of size
//! `M x N x K/128`.

mod decode;
mod epilogue;
mod kernel;
mod magnitude;
mod packed;
mod pairs;
#[cfg(test)]
mod route_tests;
mod scales;
mod tiles;
mod transpose;

use std::cell::Cell;

use rayon::prelude::*;

use super::operand::{GemmParams, GemmPlan, GemmReport, Mat, Operand, Output, ScalePair, host_bias, plan};
use crate::error::{Error, Result};
use epilogue::{Epilogue, OutTile, nan_max, out_tiles};
use kernel::{Panel, matmul_nt};
use scales::{RowScales, tensor_scale};
pub(crate) use transpose::transpose_tiles;

pub(crate) use magnitude::{abs_product_sum, abs_product_sum_max};

/// K elements per promotion of per-tensor FP8 GEMMs with `split_accumulator` (`docs/numerics.md`, GEMM).
pub const SPLIT_K: usize = 128;

/// `D = alpha * A B^T * sA * sB (+ bias) (+ beta D)`; see the module docs of [`crate::gemm`].
pub fn gemm(a: &Operand, b: &Operand, out: Output, params: &GemmParams) -> Result<GemmReport> {
    gemm_routed(a, b, out, params, Route::Fast)
}

/// Which ways of running a GEMM [`gemm_routed`] may take; all give the same bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    /// Where the calls are layout-free: f32 outputs of unscaled chunks through our packed
    /// kernel (`packed.rs`, on AVX-512), else [`Route::FastCrate`]'s shortcuts.
    Fast,
    /// The fast route without our packed kernel: a K-major B through its transpose, f32
    /// outputs finished in place (what CPUs without AVX-512 run).
    #[cfg(test)]
    FastCrate,
    /// Every operand read as stored and every output through accumulator tiles (the
    /// reference the tests hold the fast routes to).
    #[cfg(test)]
    Tiles,
}

impl Route {
    /// Whether the route takes shortcuts where the calls are layout-free.
    fn fast(self) -> bool {
        match self {
            Route::Fast => true,
            #[cfg(test)]
            Route::FastCrate => true,
            #[cfg(test)]
            Route::Tiles => false,
        }
    }
}

/// [`gemm`] on the given route; 16-bit operands held only on a device are read back first.
fn gemm_routed(a: &Operand, b: &Operand, out: Output, params: &GemmParams, route: Route) -> Result<GemmReport> {
    let report = on_host(a, |a| on_host(b, |b| gemm_on_host(a, b, out, params, route)))?;
    Ok(unreported(report, params))
}

/// `report` as the caller asked for it: without its amax when [`GemmParams::report_amax`] is
/// off (the same 0 on every backend).
pub(crate) fn unreported(report: GemmReport, params: &GemmParams) -> GemmReport {
    match params.report_amax {
        true => report,
        false => GemmReport { amax: 0.0 },
    }
}

/// Calls `f` with `op`, read back into host memory if it is a 16-bit matrix held only on a
/// device ([`Mat::on_device`]), as it is otherwise.
fn on_host<R>(op: &Operand, f: impl FnOnce(&Operand) -> Result<R>) -> Result<R> {
    match op {
        Operand::Bf16(m) if m.device_only() => {
            let values = crate::gemm::read_back(m)?;
            f(&Operand::Bf16(Mat { data: &values, ..*m }))
        }
        Operand::F16(m) if m.device_only() => {
            let values = crate::gemm::read_back(m)?;
            f(&Operand::F16(Mat { data: &values, ..*m }))
        }
        _ => f(op),
    }
}

/// [`gemm_routed`] of host operands.
fn gemm_on_host(a: &Operand, b: &Operand, out: Output, params: &GemmParams, route: Route) -> Result<GemmReport> {
    let plan = plan(a, b, &out, params)?;
    let steps = Steps::of(&plan, params);
    let epilogue = Epilogue {
        factor: match plan.scales {
            // alpha first, then A's and B's scale_inv (the reference's order).
            ScalePair::PerTensor => params.alpha * tensor_scale(a) * tensor_scale(b),
            _ => params.alpha,
        },
        // Host values only: a bias on a GPU is `DeviceMismatch` (modules move whole).
        bias: host_bias(params, "gemm")?,
        beta: params.beta,
    };
    // FP8 x FP8 with per-tensor scales, bf16 x bf16: the pair order on every route (AMX tiles
    // where the CPU has them and no sum can be subnormal, `pairs.rs`), chunks rounded up to
    // whole blocks of 32.
    if let (Some(pa), Some(pb)) = (pairs::Source::of(a), pairs::Source::of(b))
        && matches!(
            (a, b, plan.scales),
            (Operand::Fp8(..), Operand::Fp8(..), ScalePair::PerTensor)
                | (Operand::Bf16(_), Operand::Bf16(_), ScalePair::None)
        )
        && let Some(chunk) = steps.chunk(plan.k)
    {
        let chunk = chunk.div_ceil(pairs::EDGE) * pairs::EDGE;
        let kernel = match pairs::sums_stay_normal(&pa, &pb) {
            true => pairs::Kernel::best(),
            false => pairs::Kernel::Portable,
        };
        let amax = pairs::gemm(pa, pb, chunk, &epilogue, out, kernel)?;
        return Ok(GemmReport { amax });
    }
    let av = decode::unscaled(a)?;
    let bv = decode::unscaled(b)?;
    let threads = rayon::current_num_threads();
    let (tm, tn) = tiles::tile_shape(plan.m, plan.n, threads);
    let band = tiles::band_rows(plan.m, threads);
    // Layout-free calls sum the same whatever the operands' layout and the tiling
    // (`layout_free`): only then may B be transposed or the output cut differently.
    let free = route.fast() && calls_layout_free(&plan, steps, tm, tn);
    let in_place =
        free && params.beta == 0.0 && matches!(out, Output::F32(_)) && calls_layout_free(&plan, steps, band, plan.n);
    let ((a_rows, a_k), (mut b_rows, mut b_k)) = (a.strides(), b.strides());
    // f32 outputs of unscaled chunks: our packed kernel, B packed once for all threads in
    // place of the transpose and the crate's per-call packing (`packed.rs`; the same sums).
    if free
        && route == Route::Fast
        && packed::available()
        && let Some(chunk) = steps.chunk(plan.k)
        && let Output::F32(d) = out
    {
        let a_panel = Panel::whole_k(&av, (a_rows, a_k), 0, plan.m, plan.k);
        let b_panel = Panel::whole_k(&bv, (b_rows, b_k), 0, plan.n, plan.k);
        let packed_b = packed::PackedB::for_a(b_panel, &a_panel);
        let amax = packed::gemm_f32(d, a_panel, &packed_b, chunk, &epilogue);
        return Ok(GemmReport { amax });
    }
    // A K-major B is read from an N-contiguous copy (`transpose.rs`).
    let bv = if b_k == 1 && bv.len() == plan.n * plan.k && free {
        (b_rows, b_k) = (1, plan.n);
        decode::transposed(&bv, plan.n, plan.k)
    } else {
        bv
    };
    let (sa, sb) = (RowScales::of(a), RowScales::of(b));
    // Rows `i0..i0 + rows` of A against rows `j0..j0 + cols` of B.
    let panels = |i0: usize, rows: usize, j0: usize, cols: usize| {
        (
            Panel::whole_k(&av, (a_rows, a_k), i0, rows, plan.k),
            Panel::whole_k(&bv, (b_rows, b_k), j0, cols, plan.k),
        )
    };
    if in_place && let Output::F32(d) = out {
        // Bands of whole rows are contiguous in `d`: the crate sums straight into them and the
        // epilogue finishes them there, with no accumulator tile to copy back (~4% of an fp32
        // layer step, docs/benchmarks.md).
        if plan.m == 0 || plan.n == 0 {
            return Ok(GemmReport { amax: 0.0 });
        }
        let one_band = band >= plan.m;
        let amax = d
            .par_chunks_mut(band * plan.n)
            .enumerate()
            .map(|(t, rows_out)| {
                let (a_panel, b_panel) = panels(t * band, rows_out.len() / plan.n, 0, plan.n);
                let mut scratch = Scratch::take();
                let partial = match steps {
                    Steps::Scaled { .. } => scratch.tiles(rows_out.len()).1,
                    _ => &mut [],
                };
                accumulate(rows_out, partial, a_panel, b_panel, steps, (sa, sb), one_band);
                let amax = epilogue.finish_in_place(rows_out, plan.n);
                scratch.give_back();
                Ok(amax)
            })
            .try_reduce(|| 0.0, |x, y| Ok(nan_max(x, y)))?;
        return Ok(GemmReport { amax });
    }
    let tiles = out_tiles(out, plan.n, tm, tn);
    // One tile: let the crate spread it over the threads instead.
    let threads_per_tile = tiles.len() == 1;
    let amax = tiles
        .into_par_iter()
        .map(|tile: OutTile| {
            let (i0, j0, rows, cols) = tile.shape();
            let (a_panel, b_panel) = panels(i0, rows, j0, cols);
            let mut scratch = Scratch::take();
            let (acc, partial) = scratch.tiles(rows * cols);
            accumulate(acc, partial, a_panel, b_panel, steps, (sa, sb), threads_per_tile);
            let amax = epilogue.finish(acc, tile);
            scratch.give_back();
            amax
        })
        .try_reduce(|| 0.0, |x, y| Ok(nan_max(x, y)))?;
    Ok(GemmReport { amax })
}

/// The epilogue alone, on a finished f32 product `p = A B^T` (`[m, n]` row-major, overwritten
/// with the result): `* alpha (+ bias[j]) (+ beta * old)`, the amax, the cast into `out`,
/// exactly as [`gemm`] finishes its tiles. For a product formed elsewhere (the CUDA f32 path's
/// cuBLASLt product): the same code, so the same bits for the same product.
pub(crate) fn epilogue_of_product(p: &mut [f32], n: usize, params: &GemmParams, out: Output) -> Result<GemmReport> {
    let epilogue = Epilogue {
        factor: params.alpha,
        bias: host_bias(params, "gemm")?,
        beta: params.beta,
    };
    let m = p.len().checked_div(n).unwrap_or(0);
    // One tile spanning the output: its accumulator is `p` itself.
    let mut amax = 0.0f32;
    for tile in out_tiles(out, n, m.max(1), n.max(1)) {
        amax = nan_max(amax, epilogue.finish(p, tile)?);
    }
    Ok(unreported(GemmReport { amax }, params))
}

/// Whether every crate call of the GEMM has a layout-free shape ([`layout_free`]): the
/// smallest tile (the ragged edges) against the shortest K the calls get.
fn calls_layout_free(plan: &GemmPlan, steps: Steps, tm: usize, tn: usize) -> bool {
    let smallest = |len: usize, tile: usize| match len % tile {
        0 => tile,
        rest => rest,
    };
    let k = plan.k;
    if k == 0 || tm == 0 || tn == 0 {
        return false;
    }
    let shortest_k = match steps {
        // Equal chunks of at most 512, the last one shorter by less than their count.
        Steps::Whole => k - (k.div_ceil(kernel::k_chunk(k)) - 1) * kernel::k_chunk(k),
        Steps::Split { k_block } | Steps::Scaled { k_block } => smallest(k, k_block.max(1)),
    };
    layout_free(smallest(plan.m, tm), smallest(plan.n, tn), shortest_k)
}

/// How K is walked.
#[derive(Clone, Copy)]
enum Steps {
    /// One product over the whole K.
    Whole,
    /// Unscaled partial sums of `k_block` added to the accumulator.
    Split { k_block: usize },
    /// Partial sums of `k_block` scaled by their block scales at promotion.
    Scaled { k_block: usize },
}

impl Steps {
    /// The length of the chunks whose sums are added in order, for the unscaled steps.
    fn chunk(self, k: usize) -> Option<usize> {
        match self {
            Steps::Whole => Some(kernel::k_chunk(k)),
            Steps::Split { k_block } => Some(k_block),
            Steps::Scaled { .. } => None,
        }
    }

    fn of(plan: &GemmPlan, params: &GemmParams) -> Self {
        match plan.scales.k_block() {
            Some(k_block) => Steps::Scaled { k_block },
            None if params.split_accumulator && plan.scales == ScalePair::PerTensor => {
                Steps::Split { k_block: SPLIT_K }
            }
            None => Steps::Whole,
        }
    }
}

/// `acc = sum over K` of the tile's products, per `steps` (the epilogue comes after).
fn accumulate(
    acc: &mut [f32],
    partial: &mut [f32],
    a: Panel,
    b: Panel,
    steps: Steps,
    scales: (RowScales, RowScales),
    threads: bool,
) {
    let k = a.k;
    let block = |kb: usize, k_block: usize| {
        let k0 = kb * k_block;
        let len = k_block.min(k - k0);
        (Panel { k0, k: len, ..a }, Panel { k0, k: len, ..b })
    };
    match steps {
        Steps::Whole => matmul_nt(acc, false, a, b, threads),
        Steps::Split { k_block } => {
            if k == 0 {
                acc.fill(0.0);
            }
            // The crate sums each block in registers, then adds it to `acc`
            // once: exactly `acc += partial`.
            for kb in 0..k.div_ceil(k_block) {
                let (ab, bb) = block(kb, k_block);
                matmul_nt(acc, kb > 0, ab, bb, threads);
            }
        }
        Steps::Scaled { k_block } => {
            let k_blocks = k.div_ceil(k_block);
            let mut sa = vec![0.0f32; a.rows];
            let mut sb = vec![0.0f32; b.rows];
            let cols = b.rows.max(1);
            acc.fill(0.0);
            for kb in 0..k_blocks {
                let (ab, bb) = block(kb, k_block);
                matmul_nt(partial, false, ab, bb, threads);
                scales.0.fill(a.first, kb, k_blocks, &mut sa);
                scales.1.fill(b.first, kb, k_blocks, &mut sb);
                for ((acc, p), &sa) in acc.chunks_mut(cols).zip(partial.chunks(cols)).zip(&sa) {
                    // Not fused: the product of scales, then partial * scales, then the add.
                    for ((x, &p), &sb) in acc.iter_mut().zip(p).zip(&sb) {
                        *x += p * (sa * sb);
                    }
                }
            }
        }
    }
}

/// The two f32 tiles (accumulator, block partial) of a task, kept per thread
/// across tiles and calls: fresh megabyte buffers cost a page fault per 4 KiB
/// on every use (~2 ms per 4 MiB measured), reused ones cost nothing.
struct Scratch(Vec<f32>);

thread_local! {
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

impl Scratch {
    /// Takes this thread's buffer (a task nested on the same thread, e.g. one
    /// stolen while the crate waits, finds it empty and allocates its own).
    fn take() -> Self {
        Scratch(SCRATCH.with(Cell::take))
    }

    /// Two slices of `len` (contents unspecified: both are written before read).
    fn tiles(&mut self, len: usize) -> (&mut [f32], &mut [f32]) {
        if self.0.len() < 2 * len {
            self.0.resize(2 * len, 0.0);
        }
        let (acc, rest) = self.0.split_at_mut(len);
        (acc, &mut rest[..len])
    }

    fn give_back(self) {
        SCRATCH.with(|cell| cell.set(self.0));
    }
}

/// A strided f32 matrix view for [`f32_nt_serial`]: element `(r, kk)` (row `r < rows`, `kk < k`)
/// is `data[r * row_stride + kk * k_stride]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct F32View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub k: usize,
    pub row_stride: usize,
    pub k_stride: usize,
}

impl<'a> F32View<'a> {
    /// `rows x k`, K contiguous, rows `row_stride` apart (a head's rows inside a wider matrix).
    pub(crate) fn k_major(data: &'a [f32], rows: usize, k: usize, row_stride: usize) -> Self {
        F32View {
            data,
            rows,
            k,
            row_stride,
            k_stride: 1,
        }
    }

    /// `rows x k` read from its `k x rows` transpose whose rows are `stride` apart.
    pub(crate) fn transposed(data: &'a [f32], rows: usize, k: usize, stride: usize) -> Self {
        F32View {
            data,
            rows,
            k,
            row_stride: 1,
            k_stride: stride,
        }
    }

    fn panel(self) -> Panel<'a> {
        Panel {
            data: self.data,
            row_stride: self.row_stride,
            k_stride: self.k_stride,
            first: 0,
            rows: self.rows,
            k0: 0,
            k: self.k,
        }
    }
}

/// Whether the crate's sums for an `m x n x k` product (K of at most 512) are the same for
/// every operand layout: its dot-product kernels (at most 256 outputs, both operands
/// K-contiguous), its matrix-vector kernels (`m` or `n` of 1) and its `k <= 2` path are
/// picked by the operands' strides and sum in their own orders; every other shape runs the
/// packed micro-kernels, whose sums do not depend on where the operands come from
/// (`kernel.rs` tests). Callers read operands in place where this holds and copy them to
/// K-major panels (the layout of the shapes' reference) where it does not.
pub(crate) fn layout_free(m: usize, n: usize, k: usize) -> bool {
    m > 1 && n > 1 && k > 2 && m * n > 256
}

/// `out = alpha * A B^T (+ beta * out)` for small plain f32 operands on the calling thread:
/// the same products, sums and epilogue order as [`gemm`] with plain f32 inputs, an f32
/// output and no bias (same bits), without its planning, tiling and thread hand-off, which
/// cost more than the math for the attention core's per-head blocks (64 x 64 x head_dim)
/// that already run one per rayon task. `a` is `m x k`, `b` is `n x k` (any strides),
/// `out` is `[m, n]` row-major.
pub(crate) fn f32_nt_serial(a: F32View, b: F32View, alpha: f32, beta: f32, out: &mut [f32]) -> Result<()> {
    let (m, n, k) = (a.rows, b.rows, a.k);
    let (pa, pb) = (a.panel(), b.panel());
    if b.k != k || !pa.in_bounds() || !pb.in_bounds() {
        return Err(Error::KernelArgs {
            kernel: "f32 serial gemm",
            detail: format!(
                "A is {m}x{k} (strides {}, {}), B is {n}x{} (strides {}, {}), {} and {} values: \
                 need the same K and views inside their data",
                a.row_stride,
                a.k_stride,
                b.k,
                b.row_stride,
                b.k_stride,
                a.data.len(),
                b.data.len()
            ),
        });
    }
    if out.len() != m * n {
        return Err(Error::ShapeMismatch {
            what: "f32 GEMM output",
            rows: m,
            cols: n,
            expected: m * n,
            got: out.len(),
        });
    }
    let mut scratch = Scratch::take();
    let (acc, _) = scratch.tiles(m * n);
    matmul_nt(acc, false, pa, pb, false);
    // The epilogue of `gemm`: `* alpha`, then `+ beta * old` (beta = 0 never reads `out`).
    for (x, o) in acc.iter_mut().zip(out.iter_mut()) {
        *x *= alpha;
        if beta != 0.0 {
            *x += beta * *o;
        }
        *o = *x;
    }
    scratch.give_back();
    Ok(())
}

/// `D = A B^T` for plain f32 operands with the f32 GEMM crate on all threads,
/// overwriting `d` (`M x N`): the baseline the benchmarks compare against.
pub fn f32_crate_gemm(a: Mat<f32>, b: Mat<f32>, d: &mut [f32]) -> Result<()> {
    let (m, n, k) = (a.rows, b.rows, a.cols);
    if b.cols != k || a.data.len() != m * k || b.data.len() != n * k {
        return Err(Error::KernelArgs {
            kernel: "f32 crate gemm",
            detail: format!(
                "A is {m}x{k} ({} values), B is {n}x{} ({} values): need K-major operands with the same K",
                a.data.len(),
                b.cols,
                b.data.len()
            ),
        });
    }
    if d.len() != m * n {
        return Err(Error::ShapeMismatch {
            what: "f32 crate GEMM output",
            rows: m,
            cols: n,
            expected: m * n,
            got: d.len(),
        });
    }
    let panel = |data, rows| Panel {
        data,
        row_stride: k,
        k_stride: 1,
        first: 0,
        rows,
        k0: 0,
        k,
    };
    matmul_nt(d, false, panel(a.data, m), panel(b.data, n), true);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[rows, k]` row-major values with a few zeros and wide magnitudes (sums that round).
    fn values(rows: usize, k: usize, seed: f32) -> Vec<f32> {
        (0..rows * k)
            .map(|i| (i as f32 * seed).sin() * 2f32.powi((i % 13) as i32 - 6))
            .collect()
    }

    /// `x` (`[rows, k]`) stored as `[k, rows]` and as rows `pad` wider than `k`.
    fn layouts(x: &[f32], rows: usize, k: usize, pad: usize) -> (Vec<f32>, Vec<f32>) {
        let mut t = vec![0.0; rows * k];
        let mut wide = vec![f32::NAN; rows * (k + pad)];
        for r in 0..rows {
            for kk in 0..k {
                t[kk * rows + r] = x[r * k + kk];
                wide[r * (k + pad) + kk] = x[r * k + kk];
            }
        }
        (t, wide)
    }

    /// A GEMM asked not to report its amax writes the same bits and reports 0; asked to, it
    /// reports max |D| (here, a product of known size), also through the product-only epilogue.
    #[test]
    fn an_unreported_amax_is_zero_and_changes_no_output() {
        let (m, n, k) = (9, 7, 33);
        let (a, b) = (values(m, k, 0.731), values(n, k, 0.377));
        let (ma, mb) = (Mat::new(&a, m, k).unwrap(), Mat::new(&b, n, k).unwrap());
        let run = |report_amax| {
            let mut d = vec![0.0f32; m * n];
            let params = GemmParams {
                report_amax,
                ..GemmParams::default()
            };
            let r = gemm(&Operand::F32(ma), &Operand::F32(mb), Output::F32(&mut d), &params).unwrap();
            let mut p = d.clone();
            let e = epilogue_of_product(&mut p, n, &params, Output::F32(&mut vec![0.0; m * n])).unwrap();
            (d, r.amax, e.amax)
        };
        let ((on, amax, epilogue_amax), (off, zero, epilogue_zero)) = (run(true), run(false));
        assert_eq!(on, off, "same output");
        let max = on.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
        assert!(
            max > 0.0 && amax == max && epilogue_amax == max,
            "{amax} {epilogue_amax} vs {max}"
        );
        assert_eq!((zero, epilogue_zero), (0.0, 0.0));
    }

    /// Where `layout_free` holds, reading operands transposed or from wider rows gives the bits
    /// of K-major copies (the attention core relies on it), with both epilogues.
    #[test]
    fn layout_free_shapes_give_the_same_bits_in_every_layout() {
        let shapes = [
            (64, 64, 32),
            (17, 64, 64),
            (64, 32, 64),
            (2, 129, 3),
            (129, 2, 40),
            (33, 9, 512),
            (64, 64, 640),
        ];
        for (m, n, k) in shapes {
            assert!(layout_free(m, n, k), "{m}x{n}x{k}");
            let (a, b) = (values(m, k, 0.731), values(n, k, 0.377));
            let ((at, aw), (bt, bw)) = (layouts(&a, m, k, 5), layouts(&b, n, k, 3));
            let old = values(m, n, 0.113);
            for (alpha, beta) in [(1.0, 0.0), (0.125, 1.0)] {
                let mut want = old.clone();
                let (ka, kb) = (F32View::k_major(&a, m, k, k), F32View::k_major(&b, n, k, k));
                f32_nt_serial(ka, kb, alpha, beta, &mut want).unwrap();
                let a_views = [
                    ka,
                    F32View::transposed(&at, m, k, m),
                    F32View::k_major(&aw, m, k, k + 5),
                ];
                let b_views = [
                    kb,
                    F32View::transposed(&bt, n, k, n),
                    F32View::k_major(&bw, n, k, k + 3),
                ];
                for av in a_views {
                    for bv in b_views {
                        let mut got = old.clone();
                        f32_nt_serial(av, bv, alpha, beta, &mut got).unwrap();
                        assert!(
                            got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                            "{m}x{n}x{k}: A strides ({}, {}), B strides ({}, {})",
                            av.row_stride,
                            av.k_stride,
                            bv.row_stride,
                            bv.k_stride
                        );
                    }
                }
            }
        }
        // The crate's own paths: a single row or column, K of at most 2, at most 256 outputs.
        for (m, n, k) in [(1, 64, 64), (64, 1, 64), (64, 64, 2), (16, 16, 64), (8, 8, 8)] {
            assert!(!layout_free(m, n, k), "{m}x{n}x{k}");
        }
    }

    /// A K-major B read from its transposed copy gives the bits of the crate reading it
    /// K-major (one call on the whole matrix), ragged tiles and chunked K included. Shapes
    /// whose calls are not all layout-free keep B K-major (the route they always took).
    #[test]
    fn k_major_b_through_its_transpose_gives_the_k_major_bits() {
        let plan_of = |m, n, k| GemmPlan {
            m,
            n,
            k,
            scales: ScalePair::None,
        };
        let tiles = |m, n| tiles::tile_shape(m, n, rayon::current_num_threads());
        for (m, n, k) in [
            (1024, 768, 256),
            (1000, 700, 100),
            (300, 130, 1030),
            (64, 640, 64),
            (192, 200, 33),
        ] {
            let (tm, tn) = tiles(m, n);
            assert!(
                calls_layout_free(&plan_of(m, n, k), Steps::Whole, tm, tn),
                "{m}x{n}x{k}"
            );
            let (a, b) = (values(m, k, 0.731), values(n, k, 0.377));
            let (am, bm) = (Mat::new(&a, m, k).unwrap(), Mat::new(&b, n, k).unwrap());
            let mut want = vec![0.0f32; m * n];
            f32_crate_gemm(am, bm, &mut want).unwrap();
            let mut got = vec![f32::NAN; m * n];
            let params = GemmParams::default();
            gemm(&Operand::F32(am), &Operand::F32(bm), Output::F32(&mut got), &params).unwrap();
            let same = got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "{m}x{n}x{k}");
        }
        for (m, n, k) in [(16, 16, 64), (1, 64, 64), (64, 2, 3), (129, 257, 33), (64, 64, 2)] {
            let (tm, tn) = tiles(m, n);
            assert!(
                !calls_layout_free(&plan_of(m, n, k), Steps::Whole, tm, tn),
                "{m}x{n}x{k}"
            );
        }
        // Split accumulation: a last block of 2 keeps B K-major.
        let (tm, tn) = tiles(512, 512);
        let split = Steps::Split { k_block: SPLIT_K };
        assert!(calls_layout_free(&plan_of(512, 512, 256), split, tm, tn));
        assert!(!calls_layout_free(&plan_of(512, 512, 258), split, tm, tn));
    }

    #[test]
    fn serial_gemm_rejects_views_outside_their_data() {
        let a = vec![1.0f32; 64];
        let mut out = vec![0.0f32; 64];
        let too_long = F32View::k_major(&a, 8, 8, 9);
        let fine = F32View::k_major(&a, 8, 8, 8);
        assert!(f32_nt_serial(too_long, fine, 1.0, 0.0, &mut out).is_err());
        assert!(f32_nt_serial(fine, F32View::transposed(&a, 8, 9, 8), 1.0, 0.0, &mut out).is_err());
        assert!(f32_nt_serial(fine, fine, 1.0, 0.0, &mut out[..63]).is_err());
        assert!(f32_nt_serial(fine, fine, 1.0, 0.0, &mut out).is_ok());
    }
}
