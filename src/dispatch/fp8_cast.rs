//! The FP8 casts of a linear layer per recipe, and the statistics of each cast.
//!
//! Every cast makes both copies a GEMM pair needs: the row-wise one (K-major for
//! the forward or dgrad GEMM) and the column-wise one, stored transposed (K-major
//! for dgrad or wgrad), from one read of the high-precision source (fused
//! cast + transpose for per-tensor scales, both block copies from the source).

use rayon::prelude::*;

use crate::amp::Fp8Recipe;
use crate::error::Result;
use crate::format::{Fp8Format, decode_e8m0};
use crate::quantize::{
    ScaleRule, amax, cast_transpose_visit, check_len, quantize_1x128, quantize_block_128x128, quantize_mxfp8,
};
use crate::scaling::{BlockDims, Fp8TensorStats, TensorRole};
use crate::tensor::device_values::Deferred;
use crate::tensor::{QuantizedMatrix, QuantizedTensor, Scales};

/// One cast: both copies, the amax of the source and the scale it multiplied by.
pub(crate) struct Cast {
    pub tensor: QuantizedTensor,
    /// A GPU cast's amax stays on the device until read (a delayed slot on the device folds
    /// it there: `Kernels::record_amax`).
    pub amax: Deferred<f32>,
    /// The per-tensor scale itself (delayed: the slot's; current: the one computed from the
    /// amax), never derived back from `scale_inv`, whose reciprocal may be one ulp off.
    /// Block recipes: the largest block scale, `1 / smallest scale_inv`. A GPU's current
    /// scale is computed there and stays there until read, like the amax.
    pub scale: Deferred<f32>,
    /// `[saturated, underflow, nonzero, nonfinite]` counted during the cast (CPU per-tensor
    /// casts, GPU per-tensor casts of device sources: left there), so [`cast_stats`] need not
    /// read the source again; `None`: counted there.
    pub counts: Option<Deferred<[u64; 4]>>,
}

/// Casts `[rows, cols]` in `role`; `delayed_scale` is the slot's scale under delayed scaling.
pub(crate) fn cast(
    recipe: &Fp8Recipe,
    role: TensorRole,
    src: &[f32],
    rows: usize,
    cols: usize,
    delayed_scale: f32,
) -> Result<Cast> {
    let (tensor, amax, scale, counts) = match recipe {
        Fp8Recipe::Delayed(r) => {
            let (tensor, amax, counts) = per_tensor_counted(src, rows, cols, r.format.for_role(role), delayed_scale)?;
            (tensor, amax, delayed_scale.into(), Some(counts.into()))
        }
        Fp8Recipe::Current(r) => {
            // `quantize_current`, with the scale kept for the statistics.
            let rule = ScaleRule::current(r, role);
            rule.validate()?;
            let scale = rule.scale(amax(src));
            let (tensor, amax, counts) = per_tensor_counted(src, rows, cols, rule.format, scale)?;
            (tensor, amax, scale.into(), Some(counts.into()))
        }
        Fp8Recipe::Block(r) => {
            let rule = ScaleRule::block(r, role);
            let tensor = match r.block_for(role) {
                BlockDims::Rows1x128 => quantize_1x128(src, rows, cols, &rule, true)?,
                BlockDims::Tiles128x128 => quantize_block_128x128(src, rows, cols, &rule, true)?,
            };
            return Ok(block_cast(tensor, amax(src).into(), None, None));
        }
        Fp8Recipe::Mxfp8(r) => {
            let format = crate::scaling::RecipeFormat::from(r.format).for_role(role);
            let tensor = quantize_mxfp8(src, rows, cols, format, true)?;
            return Ok(block_cast(tensor, amax(src).into(), None, None));
        }
    };
    Ok(Cast {
        tensor,
        amax: amax.into(),
        scale,
        counts,
    })
}

/// [`quantize_per_tensor`] with both copies, counting the statistics of each band of rows as it
/// is cast (the counts [`cast_stats`] would make, without reading the source a second time).
fn per_tensor_counted(
    src: &[f32],
    rows: usize,
    cols: usize,
    format: Fp8Format,
    scale: f32,
) -> Result<(QuantizedTensor, f32, [u64; 4])> {
    check_len("per-tensor source", src.len(), rows, cols)?;
    let (mut data, mut transposed) = (vec![0u8; src.len()], vec![0u8; src.len()]);
    let scale_inv = 1.0 / scale;
    // The limit of `cast_stats` for a per-tensor copy: `max * scale_inv` of the stored scale_inv.
    let limit = format.max_finite() * scale_inv;
    let count = |xs: &[f32], codes: &[u8]| per_tensor_run(xs, codes, limit);
    let (amax, counts) = cast_transpose_visit(
        src,
        rows,
        cols,
        format,
        scale,
        &mut data,
        &mut transposed,
        count,
        Counts::sum,
    )?;
    let rowwise = QuantizedMatrix::new(data, rows, cols, Scales::PerTensor(scale_inv))?;
    let columnwise = QuantizedMatrix::new(transposed, cols, rows, Scales::PerTensor(scale_inv))?;
    let tensor = QuantizedTensor::new(format, rowwise, Some(columnwise))?;
    Ok((tensor, amax, counts.array()))
}

/// The cast of a block-scaled `tensor` (1x128, 128x128, MXFP8) of a source with `amax`: its
/// scale is the largest block scale (`scale`: already found, on a GPU that holds the scales;
/// else from the host scales). `counts`: made during the cast (a GPU's), or `None`.
pub(crate) fn block_cast(
    tensor: QuantizedTensor,
    amax: Deferred<f32>,
    counts: Option<Deferred<[u64; 4]>>,
    scale: Option<Deferred<f32>>,
) -> Cast {
    let scale = scale.unwrap_or_else(|| largest_scale(tensor.rowwise().scales()).into());
    Cast {
        tensor,
        amax,
        scale,
        counts,
    }
}

/// The transposed copy of a cast (always made by [`cast`]).
pub(crate) fn columnwise(tensor: &QuantizedTensor) -> &QuantizedMatrix {
    tensor
        .columnwise()
        .expect("fp8_cast::cast always makes the column-wise copy")
}

/// `scale_inv` of element `(r, c)` of a copy with `cols` columns.
fn element_scale_inv(scales: &Scales, r: usize, c: usize, cols: usize) -> f32 {
    match scales {
        Scales::PerTensor(s) => *s,
        Scales::Block1x128(s) => s[r * cols.div_ceil(128) + c / 128],
        Scales::Block128x128(s) => s[(r / 128) * cols.div_ceil(128) + c / 128],
        Scales::Mxfp8(e) => decode_e8m0(e[r * cols.div_ceil(32) + c / 32]),
    }
}

/// The largest scale a copy used (the per-tensor one, or the largest block scale).
pub(crate) fn largest_scale(scales: &Scales) -> f32 {
    let smallest_inv = match scales {
        Scales::PerTensor(s) => *s,
        Scales::Block1x128(s) | Scales::Block128x128(s) => s.iter().copied().fold(f32::INFINITY, f32::min),
        Scales::Mxfp8(e) => e.iter().map(|&e| decode_e8m0(e)).fold(f32::INFINITY, f32::min),
    };
    1.0 / smallest_inv
}

/// Counts that make up the statistics of one tensor.
#[derive(Default, Debug, PartialEq)]
struct Counts {
    saturated: u64,
    underflow: u64,
    nonzero: u64,
    nonfinite: u64,
}

/// Elements per parallel task of the statistics (~ 64 KiB of f32).
const STATS_CHUNK: usize = 1 << 14;

impl Counts {
    /// `[saturated, underflow, nonzero, nonfinite]`.
    fn array(&self) -> [u64; 4] {
        [self.saturated, self.underflow, self.nonzero, self.nonfinite]
    }

    fn sum(self, o: Counts) -> Counts {
        Counts {
            saturated: self.saturated + o.saturated,
            underflow: self.underflow + o.underflow,
            nonzero: self.nonzero + o.nonzero,
            nonfinite: self.nonfinite + o.nonfinite,
        }
    }

    /// Adds one run of elements and their companions (`aux`, e.g. their codes):
    /// `verdict(x, a)` says whether finite `x` is flushed (counted when non-zero) and whether it
    /// saturates. Branch-free per element (counts add 0 or 1), so the loop vectorizes; it runs
    /// compiled for the widest vectors the CPU has (integer counts: the same in any width).
    #[inline(always)]
    fn add<A: Copy, V: Fn(f32, A) -> (bool, bool)>(&mut self, xs: &[f32], aux: &[A], verdict: V) {
        let [saturated, underflow, nonzero, nonfinite] = widest::count(xs, aux, &verdict);
        self.saturated += saturated;
        self.underflow += underflow;
        self.nonzero += nonzero;
        self.nonfinite += nonfinite;
    }

    fn finish(self, name: String, format: Fp8Format, amax: f32, scale: f32, total: usize) -> Fp8TensorStats {
        Fp8TensorStats {
            name,
            format: format.name().to_string(),
            amax,
            scale,
            saturated: self.saturated as f64 / total.max(1) as f64,
            underflow: self.underflow as f64 / self.nonzero.max(1) as f64,
            nonfinite: self.nonfinite,
        }
    }
}

/// Elements counted in 32-bit lanes before the counts are widened: below `u32::MAX`, and
/// 32-bit lanes hold 16 counts per AVX-512 vector where 64-bit ones hold 8.
const NARROW_RUN: usize = 1 << 16;

/// `[saturated, underflow, nonzero, nonfinite]` of one run (see [`Counts::add`]).
#[inline(always)]
fn count_run<A: Copy, V: Fn(f32, A) -> (bool, bool)>(xs: &[f32], aux: &[A], verdict: &V) -> [u64; 4] {
    let mut total = [0u64; 4];
    for (xs, aux) in xs.chunks(NARROW_RUN).zip(aux.chunks(NARROW_RUN)) {
        let (mut saturated, mut underflow, mut nonzero, mut nonfinite) = (0u32, 0u32, 0u32, 0u32);
        for (&x, &a) in xs.iter().zip(aux) {
            let finite = x.abs() < f32::INFINITY; // false for NaN too
            let live = finite & (x != 0.0);
            let (flushed, saturates) = verdict(x, a);
            nonfinite += u32::from(!finite);
            nonzero += u32::from(live);
            underflow += u32::from(live & flushed);
            saturated += u32::from(finite & saturates);
        }
        for (t, c) in total.iter_mut().zip([saturated, underflow, nonzero, nonfinite]) {
            *t += u64::from(c);
        }
    }
    total
}

/// [`count_run`] compiled for AVX-512F or AVX2 where the CPU has them (the default x86-64
/// target vectorizes it 4 lanes wide); integer counts, so every width counts the same.
mod widest {
    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use super::super::count_run;

        #[target_feature(enable = "avx512f")]
        pub(super) fn count_avx512<A: Copy, V: Fn(f32, A) -> (bool, bool)>(
            xs: &[f32],
            aux: &[A],
            verdict: &V,
        ) -> [u64; 4] {
            count_run(xs, aux, verdict)
        }

        #[target_feature(enable = "avx2")]
        pub(super) fn count_avx2<A: Copy, V: Fn(f32, A) -> (bool, bool)>(
            xs: &[f32],
            aux: &[A],
            verdict: &V,
        ) -> [u64; 4] {
            count_run(xs, aux, verdict)
        }
    }

    #[inline(always)]
    pub(super) fn count<A: Copy, V: Fn(f32, A) -> (bool, bool)>(xs: &[f32], aux: &[A], verdict: &V) -> [u64; 4] {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above), all the function requires.
                return unsafe { x86::count_avx512(xs, aux, verdict) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above), all the function requires.
                return unsafe { x86::count_avx2(xs, aux, verdict) };
            }
        }
        super::count_run(xs, aux, verdict)
    }
}

/// Columns that share one scale within a row.
fn scale_block_width(scales: &Scales, cols: usize) -> usize {
    match scales {
        Scales::PerTensor(_) => cols,
        Scales::Block1x128(_) | Scales::Block128x128(_) => 128,
        Scales::Mxfp8(_) => 32,
    }
    .max(1)
}

/// Statistics of a cast: an element is saturated when its scaled magnitude exceeds the
/// format's max finite value, flushed when it is non-zero but its code decodes to zero.
/// Counted over row bands in parallel (integer counts: the same result in any order).
pub(crate) fn cast_stats(name: String, src: &[f32], cast: &Cast) -> Result<Fp8Stats> {
    // Counts made on the host during the cast are these; counts a GPU left are what this twin
    // checks (shadow mode hands it the GPU's cast), so the source is counted again.
    if matches!(cast.counts, Some(Deferred::Host(_)))
        && let Some(stats) = counted_stats(&name, src.len(), cast)
    {
        return Ok(stats);
    }
    let q = cast.tensor.rowwise();
    let format = cast.tensor.format();
    let (cols, max) = (q.cols().max(1), format.max_finite());
    let total = src.len();
    let len = total.min(q.data().len());
    let (src, codes) = (&src[..len], &q.data()[..len]);
    let width = scale_block_width(q.scales(), cols);
    let rows_per_task = (STATS_CHUNK / cols).max(1);
    let counts = src
        .par_chunks(rows_per_task * cols)
        .zip(codes.par_chunks(rows_per_task * cols))
        .enumerate()
        .map(|(task, (xs, cs))| {
            let mut counts = Counts::default();
            for (rr, (xrow, crow)) in xs.chunks(cols).zip(cs.chunks(cols)).enumerate() {
                let r = task * rows_per_task + rr;
                for (b, (xb, cb)) in xrow.chunks(width).zip(crow.chunks(width)).enumerate() {
                    // |x| * scale > max  <=>  |x| > max * scale_inv (a power of two or 1/scale).
                    let limit = max * element_scale_inv(q.scales(), r, b * width, cols);
                    // E4M3 and E5M2 codes decode to zero exactly when their magnitude bits are 0.
                    counts.add(xb, cb, |x, code| (code & 0x7F == 0, x.abs() > limit));
                }
            }
            counts
        })
        .reduce(Counts::default, Counts::sum);
    let (amax, scale) = (cast.amax.get()?, cast.scale.get()?);
    Ok(Fp8Stats::Ready(counts.finish(name, format, amax, scale, total)))
}

/// The statistics of a cast of a `len`-element source from the counts made during the cast,
/// if it made them (and they are of a source that long): finished now from host counts, or
/// when read from counts left on a GPU.
pub(crate) fn counted_stats(name: &str, len: usize, cast: &Cast) -> Option<Fp8Stats> {
    let counts = cast.counts.clone().filter(|_| len == cast.tensor.rowwise().len())?;
    Some(Fp8Stats::counted(Counted {
        name: name.to_string(),
        format: cast.tensor.format(),
        amax: cast.amax.clone(),
        scale: cast.scale.clone(),
        total: len,
        counts,
    }))
}

/// The statistics of one cast or high-precision GEMM output: finished, or still counts and an
/// amax on a GPU, finished when the step's statistics are collected (reading them per op
/// would wait for the stream each time).
#[derive(Clone, Debug)]
pub(crate) enum Fp8Stats {
    Ready(Fp8TensorStats),
    Counted(Counted),
}

/// What [`stats_from_counts`] finishes, some of it possibly on a GPU.
#[derive(Clone, Debug)]
pub(crate) struct Counted {
    pub name: String,
    pub format: Fp8Format,
    pub amax: Deferred<f32>,
    pub scale: Deferred<f32>,
    pub total: usize,
    pub counts: Deferred<[u64; 4]>,
}

impl Fp8Stats {
    /// `c` finished at once if its amax, scale and counts are host values.
    pub(crate) fn counted(c: Counted) -> Self {
        match (&c.amax, &c.scale, &c.counts) {
            (Deferred::Host(_), Deferred::Host(_), Deferred::Host(_)) => {
                Fp8Stats::Ready(c.finish().expect("host values read"))
            }
            _ => Fp8Stats::Counted(c),
        }
    }

    /// The finished statistics (reading what a GPU holds).
    pub(crate) fn finish(&self) -> Result<Fp8TensorStats> {
        match self {
            Fp8Stats::Ready(stats) => Ok(stats.clone()),
            Fp8Stats::Counted(c) => c.finish(),
        }
    }
}

impl Counted {
    fn finish(&self) -> Result<Fp8TensorStats> {
        let (amax, scale, counts) = (self.amax.get()?, self.scale.get()?, self.counts.get()?);
        Ok(stats_from_counts(
            self.name.clone(),
            self.format,
            amax,
            scale,
            self.total,
            counts,
        ))
    }
}

/// `[saturated, underflow, nonzero, nonfinite]` of a per-tensor cast of `src` into `codes` with
/// `scale`: the counts [`cast_stats`] makes of the same elements, so counts of slices add up to
/// those of the whole tensor ([`stats_from_counts`] finishes them).
pub(crate) fn per_tensor_counts(src: &[f32], codes: &[u8], format: Fp8Format, scale: f32) -> [u64; 4] {
    let limit = format.max_finite() * (1.0 / scale);
    src.par_chunks(STATS_CHUNK)
        .zip(codes.par_chunks(STATS_CHUNK))
        .map(|(xs, cs)| per_tensor_run(xs, cs, limit))
        .reduce(Counts::default, Counts::sum)
        .array()
}

/// The counts of one run of a per-tensor cast into `codes` whose saturation limit is `limit`
/// (`max * scale_inv`, as [`cast_stats`] computes it).
fn per_tensor_run(xs: &[f32], codes: &[u8], limit: f32) -> Counts {
    let mut counts = Counts::default();
    // E4M3 and E5M2 codes decode to zero exactly when their magnitude bits are 0.
    counts.add(xs, codes, |x, code| (code & 0x7F == 0, x.abs() > limit));
    counts
}

/// The statistics of a cast of `total` elements from its [`per_tensor_counts`].
pub(crate) fn stats_from_counts(
    name: String,
    format: Fp8Format,
    amax: f32,
    scale: f32,
    total: usize,
    counts: [u64; 4],
) -> Fp8TensorStats {
    let [saturated, underflow, nonzero, nonfinite] = counts;
    let counts = Counts {
        saturated,
        underflow,
        nonzero,
        nonfinite,
    };
    counts.finish(name, format, amax, scale, total)
}

/// Statistics of a tensor that stays in high precision (a GEMM output): what a
/// per-tensor cast with `scale` would do to it.
pub(crate) fn uncast_stats(name: String, values: &[f32], format: Fp8Format, amax: f32, scale: f32) -> Fp8TensorStats {
    let (max, half_min) = (format.max_finite(), format.decode(1) * 0.5);
    let counts = values
        .par_chunks(STATS_CHUNK)
        .map(|xs| {
            let mut counts = Counts::default();
            counts.add(xs, xs, |x, _| {
                let scaled = (x * scale).abs();
                (scaled <= half_min, scaled > max)
            });
            counts
        })
        .reduce(Counts::default, Counts::sum);
    counts.finish(name, format, amax, scale, values.len())
}

/// Bytes of a quantized tensor: both copies.
pub(crate) fn tensor_bytes(tensor: &QuantizedTensor) -> usize {
    tensor.rowwise().bytes() + tensor.columnwise().map_or(0, QuantizedMatrix::bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amp::Precision;
    use crate::tensor::device_values::HostResult;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    #[test]
    fn statistics_of_results_left_on_a_device_are_read_only_when_finished() {
        let Ok(Precision::Fp8(recipe)) = "fp8-delayed".parse::<Precision>() else {
            panic!("fp8-delayed is an FP8 precision");
        };
        let src: Vec<f32> = (0..16 * 32).map(|i| (i as f32 * 0.37).sin() * 600.0).collect();
        let cpu = cast(&recipe, TensorRole::Input, &src, 16, 32, 2.0).unwrap();
        let want = cast_stats("x".into(), &src, &cpu).unwrap();
        assert!(matches!(want, Fp8Stats::Ready(_)), "host counts finish at once");
        let want = want.finish().unwrap();
        assert!(want.saturated > 0.0, "the probe saturates: {want:?}");
        // The same cast with its amax and counts left on a stand-in GPU.
        let counts = cpu.counts.as_ref().unwrap().get().unwrap();
        let amax = Arc::new(HostResult {
            ordinal: 0,
            value: cpu.amax.get().unwrap(),
            reads: 0.into(),
        });
        let count_reads = Arc::new(HostResult {
            ordinal: 0,
            value: counts,
            reads: 0.into(),
        });
        // (A current scale computed on the GPU stays there too.)
        let scale = Arc::new(HostResult {
            ordinal: 0,
            value: cpu.scale.get().unwrap(),
            reads: 0.into(),
        });
        let on_device = Cast {
            amax: Deferred::Device(amax.clone()),
            scale: Deferred::Device(scale.clone()),
            counts: Some(Deferred::Device(count_reads.clone())),
            ..cpu
        };
        // (The GPU's `cast_stats` takes them as they are; the CPU twin counts again.)
        let deferred = counted_stats("x", src.len(), &on_device).unwrap();
        assert!(matches!(deferred, Fp8Stats::Counted(_)));
        let reads = || [&amax, &scale].map(|r| r.reads.load(Ordering::Relaxed));
        assert_eq!(reads(), [0, 0], "nothing read per op");
        assert_eq!(count_reads.reads.load(Ordering::Relaxed), 0);
        assert_eq!(deferred.finish().unwrap(), want, "the same statistics when read");
        assert_eq!(reads(), [1, 1]);
        assert_eq!(count_reads.reads.load(Ordering::Relaxed), 1);
        let recounted = cast_stats("x".into(), &src, &on_device).unwrap();
        assert_eq!(
            count_reads.reads.load(Ordering::Relaxed),
            1,
            "the twin counts the source itself"
        );
        assert_eq!(recounted.finish().unwrap(), want);
        // Uncast statistics with a device amax: the CPU reads it to finish at once.
        let amax_d = HostResult::deferred(0, 3.5f32);
        let stats = crate::dispatch::Kernels::uncast_stats(
            &crate::dispatch::CpuKernels,
            "y".into(),
            crate::dispatch::Values::Host(&src),
            Fp8Format::E4M3,
            amax_d,
            2.0.into(),
        )
        .unwrap()
        .finish()
        .unwrap();
        assert_eq!(stats, uncast_stats("y".into(), &src, Fp8Format::E4M3, 3.5, 2.0));
    }

    #[test]
    fn the_current_scale_op_is_the_recipes_rule_of_the_amax() {
        use crate::dispatch::{CpuKernels, Kernels};
        use crate::quantize::ScaleRule;
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for (power_2_scale, amax_epsilon) in [(false, 0.0), (true, 0.0), (false, 1.0), (true, 1e-12)] {
                let rule = ScaleRule {
                    format,
                    power_2_scale,
                    amax_epsilon,
                };
                for amax in [0.0, f32::NAN, f32::INFINITY, 1e-40, 0.3, 3.0, 1e30, f32::MAX] {
                    // A device amax (a stand-in here) is read by the CPU arm.
                    let on_device = HostResult::deferred(1, amax);
                    for a in [amax.into(), on_device] {
                        let got = CpuKernels
                            .current_scale(a, format, power_2_scale, amax_epsilon)
                            .unwrap();
                        assert_eq!(
                            got.get().unwrap().to_bits(),
                            rule.scale(amax).to_bits(),
                            "{rule:?} {amax}"
                        );
                    }
                }
            }
        }
        for bad in [-1.0, f32::NAN, f32::INFINITY] {
            let err = CpuKernels
                .current_scale(1.0.into(), Fp8Format::E4M3, false, bad)
                .unwrap_err();
            assert!(matches!(err, crate::error::Error::InvalidRecipe { .. }), "{err}");
        }
    }

    /// `m` as a copy a stand-in GPU holds, codes and scales (read back from the mirror).
    fn held_on_a_stand_in(m: &QuantizedMatrix) -> QuantizedMatrix {
        use crate::tensor::DeviceMirror;
        type Held = (Vec<u8>, Scales);
        let mirror = DeviceMirror {
            ordinal: 1,
            payload: Box::new((m.data().to_vec(), m.scales().clone())),
            read_back: Some(|d| Ok(Box::new(d.payload.downcast_ref::<Held>().unwrap().0.clone()))),
            read_scales: Some(|d| Ok(d.payload.downcast_ref::<Held>().unwrap().1.clone())),
        };
        QuantizedMatrix::held_with_device_scales(m.rows(), m.cols(), m.scale_kind(), mirror).unwrap()
    }

    #[test]
    fn a_block_cast_held_on_a_device_reads_its_scales_only_for_its_statistics() {
        for name in ["fp8-block", "mxfp8"] {
            let Ok(Precision::Fp8(recipe)) = name.parse::<Precision>() else {
                panic!("{name} is an FP8 precision");
            };
            let src: Vec<f32> = (0..16 * 256)
                .map(|i| (i as f32 * 0.37).sin() * 10f32.powi(i % 7 - 3))
                .collect();
            let cpu = cast(&recipe, TensorRole::Input, &src, 16, 256, 1.0).unwrap();
            let (row, col) = (
                held_on_a_stand_in(cpu.tensor.rowwise()),
                held_on_a_stand_in(columnwise(&cpu.tensor)),
            );
            let tensor = QuantizedTensor::new(cpu.tensor.format(), row, Some(col)).unwrap();
            // The largest scale as a GPU finds it (a stand-in holding the host's).
            let found = HostResult::deferred(1, cpu.scale.get().unwrap());
            let held = block_cast(tensor, cpu.amax.clone(), None, Some(found));
            assert!(
                !held.tensor.rowwise().scales_on_host(),
                "{name}: nothing read at the cast"
            );
            assert_eq!(
                held.scale.get().unwrap().to_bits(),
                cpu.scale.get().unwrap().to_bits(),
                "{name}"
            );
            // Uncounted: the statistics read the codes and scales back and count them.
            let want = cast_stats("x".into(), &src, &cpu).unwrap().finish().unwrap();
            let got = cast_stats("x".into(), &src, &held).unwrap().finish().unwrap();
            assert_eq!(got, want, "{name}: the statistics of the host cast");
            assert!(held.tensor.rowwise().scales_on_host(), "{name}");
        }
    }

    /// The element-by-element definition the parallel counts must reproduce.
    fn counts_by_definition(src: &[f32], cast: &Cast) -> Counts {
        let q = cast.tensor.rowwise();
        let (cols, max) = (q.cols().max(1), cast.tensor.format().max_finite());
        let table = cast.tensor.format().decode_table();
        let mut c = Counts::default();
        for (i, (&x, &code)) in src.iter().zip(q.data()).enumerate() {
            if !x.is_finite() {
                c.nonfinite += 1;
                continue;
            }
            if x != 0.0 {
                c.nonzero += 1;
                c.underflow += u64::from(table[code as usize] == 0.0);
            }
            c.saturated += u64::from(x.abs() > max * element_scale_inv(q.scales(), i / cols, i % cols, cols));
        }
        c
    }

    #[test]
    fn parallel_cast_counts_match_the_definition_for_every_recipe() {
        let (rows, cols) = (288, 256);
        // Wide magnitudes (some flush, some saturate under a fixed delayed scale), zeros and specials.
        let mut src: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                let u = h as f32 / (1u64 << 24) as f32 - 0.5;
                u * 2f32.powi((i % 41) as i32 - 24)
            })
            .collect();
        for (i, v) in [
            (3, 0.0),
            (500, -0.0),
            (9000, f32::NAN),
            (20_000, f32::INFINITY),
            (70_000, -1e30),
        ] {
            src[i] = v;
        }
        for name in ["fp8-delayed", "fp8-current", "fp8-block", "mxfp8"] {
            let Ok(Precision::Fp8(recipe)) = name.parse::<Precision>() else {
                panic!("{name} is an FP8 precision");
            };
            for role in [TensorRole::Input, TensorRole::OutputGrad] {
                let cast = cast(&recipe, role, &src, rows, cols, 0.5).expect("cast");
                let want = counts_by_definition(&src, &cast);
                // Block scales follow the amax, so only the fixed delayed scale must saturate.
                let saturates = want.saturated > 0 || name != "fp8-delayed";
                assert!(
                    saturates && want.underflow > 0 && want.nonfinite == 2,
                    "{name}: {want:?}"
                );
                // Per-tensor casts count while casting; block casts leave it to `cast_stats`.
                let fused = [want.saturated, want.underflow, want.nonzero, want.nonfinite];
                let per_tensor = matches!(name, "fp8-delayed" | "fp8-current");
                assert_eq!(
                    cast.counts.as_ref().map(|c| c.get().unwrap()),
                    per_tensor.then_some(fused),
                    "{name} {role:?}: counts of the cast"
                );
                let stats = cast_stats("t".into(), &src, &cast).and_then(|s| s.finish()).unwrap();
                assert_eq!(
                    stats.saturated,
                    want.saturated as f64 / src.len() as f64,
                    "{name} {role:?}"
                );
                assert_eq!(
                    stats.underflow,
                    want.underflow as f64 / want.nonzero as f64,
                    "{name} {role:?}"
                );
                assert_eq!(stats.nonfinite, want.nonfinite, "{name} {role:?}");
            }
        }
    }

    #[test]
    fn counts_of_runs_longer_than_the_narrow_lanes_add_up() {
        // One run of three and a bit 32-bit chunks, every element non-zero, every third flushed,
        // every fifth saturating, every seventh infinite.
        let n = 3 * NARROW_RUN + 5;
        let xs: Vec<f32> = (0..n)
            .map(|i| {
                if i.is_multiple_of(7) {
                    f32::INFINITY
                } else {
                    1.0 + i as f32
                }
            })
            .collect();
        let aux: Vec<u32> = (0..n as u32).collect();
        let verdict = |_: f32, i: u32| (i.is_multiple_of(3), i.is_multiple_of(5));
        let mut want = [0u64; 4];
        for (i, &x) in xs.iter().enumerate() {
            let finite = x.is_finite();
            want[0] += u64::from(finite && i.is_multiple_of(5));
            want[1] += u64::from(finite && i.is_multiple_of(3));
            want[2] += u64::from(finite);
            want[3] += u64::from(!finite);
        }
        assert!(want[2] > NARROW_RUN as u64 * 2, "the run spans several narrow chunks");
        assert_eq!(widest::count(&xs, &aux, &verdict), want);
        assert_eq!(count_run(&xs, &aux, &verdict), want);
    }

    #[test]
    fn parallel_uncast_counts_match_the_definition() {
        let values: Vec<f32> = (0..100_003)
            .map(|i| ((i as f32) * 0.618).sin() * 2f32.powi(i % 30 - 20))
            .collect();
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let (max, half_min, scale) = (format.max_finite(), format.decode(1) * 0.5, 3.0e3);
            let scaled = |x: f32| (x * scale).abs();
            let saturated = values.iter().filter(|&&x| scaled(x) > max).count();
            let flushed = values.iter().filter(|&&x| x != 0.0 && scaled(x) <= half_min).count();
            let nonzero = values.iter().filter(|&&x| x != 0.0).count();
            assert!(saturated > 0 && flushed > 0);
            let stats = uncast_stats("t".into(), &values, format, 1.0, scale);
            assert_eq!(stats.saturated, saturated as f64 / values.len() as f64);
            assert_eq!(stats.underflow, flushed as f64 / nonzero as f64);
        }
    }
}
