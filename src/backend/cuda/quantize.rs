//! Launchers of the memory-bound FP8 kernels, each the GPU twin of a CPU quantizer:
//! same inputs, same layouts, same bits.

use super::buffer::{DeviceBuffer, DeviceElement};
use super::context::CudaDevice;
use super::gemm_operands::DeviceScales;
use super::launch::{THREADS, grid_stride_blocks, launch, tile_blocks};
use super::params::*;
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::quantize::ScaleRule;
use crate::scaling::AmaxComputeAlgo;
use crate::tensor::ScaleKind;

/// Where dequantize finds each element's `scale_inv`.
#[derive(Clone, Copy, Debug)]
pub enum DequantScales<'a> {
    /// One f32 for the tensor (element 0).
    PerTensor(&'a DeviceBuffer<f32>),
    /// f32 grid `[ceil(rows/block.0), ceil(cols/block.1)]`.
    Blocks(&'a DeviceBuffer<f32>, (usize, usize)),
    /// MXFP8 E8M0 codes `[rows, ceil(cols/32)]`.
    Mxfp8(&'a DeviceBuffer<u8>),
}

/// A scale the statistics judge by: a host value, or one a kernel left on the device (current
/// scaling's, read there by address).
#[derive(Clone, Copy, Debug)]
pub enum ScaleAt<'a> {
    Host(f32),
    Device(&'a DeviceBuffer<f32>),
}

/// What [`CudaDevice::count_stats`] judges each element against.
#[derive(Clone, Copy, Debug)]
pub enum StatsVerdict<'a> {
    /// A per-tensor cast to `format` with `scale`: its codes, saturated above `max_finite *
    /// (1 / scale)` (the stored `scale_inv`, as the CPU statistics).
    Cast {
        codes: &'a DeviceBuffer<u8>,
        format: Fp8Format,
        scale: ScaleAt<'a>,
    },
    /// A block-scaled cast to `format` (1x128, 128x128, MXFP8): the row-wise copy's codes,
    /// `cols` wide, each saturated above `max_finite * scale_inv` of its block in `scales`.
    BlockCast {
        codes: &'a DeviceBuffer<u8>,
        format: Fp8Format,
        cols: usize,
        scales: DeviceScales<'a>,
    },
    /// A value kept in high precision, judged as if cast to `format` with `scale`.
    Uncast { format: Fp8Format, scale: ScaleAt<'a> },
}

/// The thresholds of `Fp8StatsParams` for a verdict (a device scale's own are made by the
/// kernel from `max`).
#[derive(Debug, PartialEq)]
struct StatsFields {
    limit: f32,
    scale: f32,
    max: f32,
    half_min: f32,
}

impl StatsFields {
    fn of(verdict: StatsVerdict<'_>) -> Self {
        let host = |scale: ScaleAt<'_>| match scale {
            ScaleAt::Host(s) => Some(s),
            ScaleAt::Device(_) => None,
        };
        match verdict {
            // `fp8_cast::cast_stats`'s limit: max * the stored scale_inv (`1 / scale`).
            StatsVerdict::Cast { format, scale, .. } => StatsFields {
                limit: host(scale).map_or(0.0, |s| format.max_finite() * (1.0 / s)),
                scale: 1.0,
                max: format.max_finite(),
                half_min: 0.0,
            },
            // The kernel multiplies each block's scale_inv by `max`.
            StatsVerdict::BlockCast { format, .. } => StatsFields {
                limit: 0.0,
                scale: 1.0,
                max: format.max_finite(),
                half_min: 0.0,
            },
            // `uncast_stats`'s thresholds: the largest finite value and half the smallest
            // subnormal (code 1), below which a value rounds to zero.
            StatsVerdict::Uncast { format, scale } => StatsFields {
                limit: 0.0,
                scale: host(scale).unwrap_or(1.0),
                max: format.max_finite(),
                half_min: format.decode(1) * 0.5,
            },
        }
    }
}

/// The block layout `fp8_count_stats` reads a block cast's scales in.
#[derive(Debug, PartialEq)]
struct StatsGrid {
    cols: usize,
    block: (usize, usize),
    /// `FP8_SCALES_*`.
    kind: u32,
}

impl StatsGrid {
    /// No grid: a per-tensor scale.
    const PER_TENSOR: StatsGrid = StatsGrid {
        cols: 0,
        block: (1, 1),
        kind: FP8_SCALES_PER_TENSOR,
    };

    /// The grid of `len` codes in rows of `cols` scaled in `kind` blocks by `scales` values: the
    /// layout's count of scales for that shape, or an error.
    fn of(len: usize, cols: usize, kind: ScaleKind, scales: usize) -> Result<Self> {
        const K: &str = "count_stats";
        let Some(block) = kind.block_shape().filter(|_| cols > 0 && len.is_multiple_of(cols)) else {
            return Err(Error::KernelArgs {
                kernel: K,
                detail: format!("{len} codes are not rows of {cols} in {kind:?} blocks"),
            });
        };
        let (grid_rows, grid_cols) = kind.scale_shape(len / cols, cols);
        check(K, "block scales", scales, grid_rows * grid_cols)?;
        let kind = match kind {
            ScaleKind::Mxfp8 => FP8_SCALES_E8M0_GRID,
            _ => FP8_SCALES_F32_GRID,
        };
        Ok(StatsGrid { cols, block, kind })
    }
}

impl<'a> StatsVerdict<'a> {
    /// The per-tensor scale (a block cast's grid is [`Self::codes_and_grid`]'s).
    fn scale(&self) -> ScaleAt<'a> {
        match *self {
            StatsVerdict::Cast { scale, .. } | StatsVerdict::Uncast { scale, .. } => scale,
            StatsVerdict::BlockCast { .. } => ScaleAt::Host(1.0),
        }
    }

    /// The codes judged, and a block cast's columns and scale grid.
    fn codes_and_grid(&self) -> (Option<&'a DeviceBuffer<u8>>, Option<(usize, DeviceScales<'a>)>) {
        match *self {
            StatsVerdict::Cast { codes, .. } => (Some(codes), None),
            StatsVerdict::BlockCast {
                codes, cols, scales, ..
            } => (Some(codes), Some((cols, scales))),
            StatsVerdict::Uncast { .. } => (None, None),
        }
    }
}

const CAST: &str = "cast";
const BLOCK: &str = "block";

fn format_code(format: Fp8Format) -> u32 {
    match format {
        Fp8Format::E4M3 => FP8_FORMAT_E4M3,
        Fp8Format::E5M2 => FP8_FORMAT_E5M2,
    }
}

fn check(kernel: &'static str, what: &str, len: usize, expected: usize) -> Result<()> {
    if len == expected {
        Ok(())
    } else {
        Err(Error::KernelArgs {
            kernel,
            detail: format!("{what} has {len} elements, the shape needs {expected}"),
        })
    }
}

fn elements(kernel: &'static str, rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or_else(|| Error::KernelArgs {
        kernel,
        detail: format!("{rows} x {cols} elements overflow usize"),
    })
}

fn address_at<T: cudarc::driver::DeviceRepr>(
    device: &CudaDevice,
    kernel: &'static str,
    buffer: &DeviceBuffer<T>,
    index: usize,
) -> Result<u64> {
    if index >= buffer.len() {
        return Err(Error::KernelArgs {
            kernel,
            detail: format!("index {index} is outside a buffer of {} elements", buffer.len()),
        });
    }
    Ok(buffer.address(device) + (index * size_of::<T>()) as u64)
}

impl CudaDevice {
    /// `dst = cast_sat(src * scale[scale_at])` (`[rows, cols]`), `amax[amax_at] = fmaxf(amax[amax_at], max|src|)`
    /// (what `DelayedSlot::record_amax` does), and, if given, `dst_t = dst^T` (`[cols, rows]`) from the same
    /// read. Twin of the CPU `cast_amax` / `cast_transpose_amax`. Also writes the correctly rounded `1/scale`
    /// to `scale_inv[0]` if given. The scale lives on the device, so unlike the CPU twin it is not checked
    /// (finite, > 0) here; an empty tensor launches nothing (amax and `scale_inv` untouched).
    #[allow(clippy::too_many_arguments)]
    pub fn cast_amax<T: DeviceElement>(
        &self,
        src: &DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        format: Fp8Format,
        (scale, scale_at): (&DeviceBuffer<f32>, usize),
        dst: &mut DeviceBuffer<u8>,
        dst_t: Option<&mut DeviceBuffer<u8>>,
        (amax, amax_at): (&mut DeviceBuffer<f32>, usize),
        scale_inv: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<()> {
        const K: &str = "cast_amax";
        let n = elements(K, rows, cols)?;
        check(K, "source", src.len(), n)?;
        check(K, "codes", dst.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let transpose = dst_t.is_some();
        let params = Fp8CastParams {
            src: src.address(self),
            dst_rowwise: dst.address_mut(self),
            dst_columnwise: match dst_t {
                Some(t) => {
                    check(K, "transposed codes", t.len(), n)?;
                    t.address_mut(self)
                }
                None => 0,
            },
            scale: address_at(self, K, scale, scale_at)?,
            scale_inv_out: match scale_inv {
                Some(s) => address_at(self, K, s, 0)?,
                None => 0,
            },
            amax: address_at(self, K, amax, amax_at)?,
            rows: rows as u64,
            cols: cols as u64,
            format: format_code(format),
            pad0: 0,
        };
        if transpose {
            let blocks = tile_blocks(K, (rows.div_ceil(64) * cols.div_ceil(64)) as u64)?;
            launch(
                self,
                CAST,
                &format!("fp8_cast_transpose_amax_{}", T::SUFFIX),
                blocks,
                params,
            )
        } else {
            let blocks = grid_stride_blocks(self, (n as u64).div_ceil(16), THREADS as u64);
            launch(self, CAST, &format!("fp8_cast_amax_{}", T::SUFFIX), blocks, params)
        }
    }

    /// `counts[0..4] += [saturated, underflow, nonzero, nonfinite]` of `src` judged by `verdict`:
    /// the FP8 statistics counted where the values live. Twin of `dispatch::fp8_cast::cast_stats`
    /// (a per-tensor cast) and `uncast_stats`: the same integer counts.
    pub fn count_stats(
        &self,
        src: &DeviceBuffer<f32>,
        verdict: StatsVerdict<'_>,
        counts: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        const K: &str = "count_stats";
        let fields = StatsFields::of(verdict);
        let (codes, grid) = verdict.codes_and_grid();
        if let Some(codes) = codes {
            check(K, "codes", codes.len(), src.len())?;
        }
        check(K, "counts", counts.len(), 4)?;
        // Nothing to count (a `[rows, 0]` block cast has no grid to check either).
        if src.is_empty() {
            return Ok(());
        }
        let (grid, block_scales) = match grid {
            Some((cols, scales)) => (
                StatsGrid::of(src.len(), cols, scales.kind(), scales.len())?,
                scales.address(self),
            ),
            None => (StatsGrid::PER_TENSOR, 0),
        };
        // 32-bit counters per thread and in `counts`.
        if u32::try_from(src.len()).is_err() {
            return Err(Error::KernelArgs {
                kernel: K,
                detail: format!("{} elements: 32-bit counts take fewer than 2^32", src.len()),
            });
        }
        let params = Fp8StatsParams {
            src: src.address(self),
            codes: codes.map_or(0, |c| c.address(self)),
            counts: counts.address_mut(self),
            len: src.len() as u64,
            limit: fields.limit,
            scale: fields.scale,
            max: fields.max,
            half_min: fields.half_min,
            scale_at: match verdict.scale() {
                ScaleAt::Host(_) => 0,
                ScaleAt::Device(scale) => {
                    check(K, "scale", scale.len(), 1)?;
                    scale.address(self)
                }
            },
            block_scales,
            cols: grid.cols as u64,
            block_rows: grid.block.0 as u32,
            block_cols: grid.block.1 as u32,
            scale_kind: grid.kind,
            pad0: 0,
        };
        let blocks = grid_stride_blocks(self, src.len() as u64, THREADS as u64);
        launch(self, CAST, "fp8_count_stats", blocks, params)
    }

    /// `amax[0] = fmaxf(amax[0], max|src|)`; zero `amax` first for the amax of `src` alone. Twin of CPU `amax`.
    pub fn amax<T: DeviceElement>(&self, src: &DeviceBuffer<T>, amax: &mut DeviceBuffer<f32>) -> Result<()> {
        self.amax_at(src, amax, 0)
    }

    /// [`Self::amax`] max-ed into `amax[at]` (a delayed-scaling slot's `history[0]` in a bank
    /// on the device: the fold of a cast's amax, `fmaxf`, which drops a NaN as `f32::max`).
    pub fn amax_at<T: DeviceElement>(
        &self,
        src: &DeviceBuffer<T>,
        amax: &mut DeviceBuffer<f32>,
        at: usize,
    ) -> Result<()> {
        const K: &str = "amax";
        if src.is_empty() {
            return Ok(());
        }
        let params = Fp8AmaxParams {
            src: src.address(self),
            len: src.len() as u64,
            amax: address_at(self, K, amax, at)?,
        };
        let blocks = grid_stride_blocks(self, (src.len() as u64).div_ceil(16), THREADS as u64);
        launch(self, CAST, &format!("fp8_amax_{}", T::SUFFIX), blocks, params)
    }

    /// `scale[0] = rule.scale(amax[0])`: current scaling's scale of an amax on the device,
    /// computed there (twin: [`ScaleRule::scale`], the same bits), so the cast that follows
    /// reads it by address and nothing waits for the host.
    pub fn current_scale(
        &self,
        amax: &DeviceBuffer<f32>,
        rule: &ScaleRule,
        scale: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "current_scale";
        rule.validate()?;
        check(K, "amax", amax.len(), 1)?;
        check(K, "scale", scale.len(), 1)?;
        let params = Fp8CurrentScaleParams {
            amax: amax.address(self),
            scale: scale.address_mut(self),
            format: format_code(rule.format),
            power_2_scale: u32::from(rule.power_2_scale),
            amax_epsilon: rule.amax_epsilon,
            pad0: 0,
        };
        launch(self, CAST, "fp8_current_scale", 1, params)
    }

    /// `scale[0] = 1 / min(scale_inv)` of a block cast's scale grid (NaN dropped; `1 / inf = 0`
    /// for none): the largest block scale, found on the device. `key` is a work value (one u32,
    /// overwritten). Twin: `dispatch::fp8_cast::largest_scale`, the same bits.
    pub fn largest_scale(
        &self,
        scale_inv: DeviceScales<'_>,
        key: &mut DeviceBuffer<u32>,
        scale: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "largest_scale";
        check(K, "key", key.len(), 1)?;
        check(K, "scale", scale.len(), 1)?;
        if scale_inv.kind() == ScaleKind::PerTensor {
            return Err(Error::KernelArgs {
                kernel: K,
                detail: "a per-tensor scale is not a block grid".into(),
            });
        }
        // The fold starts from the zero key, which stands above every value.
        self.zero(key)?;
        let params = Fp8LargestScaleParams {
            scale_inv: scale_inv.address(self),
            len: scale_inv.len() as u64,
            key: key.address_mut(self),
            scale: scale.address_mut(self),
            e8m0: u32::from(scale_inv.kind() == ScaleKind::Mxfp8),
            pad0: 0,
        };
        if scale_inv.len() > 0 {
            let blocks = grid_stride_blocks(self, scale_inv.len() as u64, THREADS as u64);
            launch(self, CAST, "fp8_scale_inv_min", blocks, params)?;
        }
        launch(self, CAST, "fp8_largest_scale", 1, params)
    }

    /// 1x128 blocks: row-wise copy (`[rows, cols]` codes, `[rows, ceil(cols/128)]` scale_inv) and/or
    /// column-wise copy (`[cols, rows]` codes, `[cols, ceil(rows/128)]` scale_inv), both from `src`.
    /// Twin of CPU `quantize_1x128_rowwise` / `quantize_1x128_columnwise` with the same [`ScaleRule`].
    pub fn quantize_1x128<T: DeviceElement>(
        &self,
        src: &DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        rule: &ScaleRule,
        rowwise: Option<(&mut DeviceBuffer<u8>, &mut DeviceBuffer<f32>)>,
        columnwise: Option<(&mut DeviceBuffer<u8>, &mut DeviceBuffer<f32>)>,
    ) -> Result<()> {
        self.block_copies(src, rows, cols, 128, "1x128", rule, rowwise, columnwise)
    }

    /// MXFP8: row-wise copy (`[rows, ceil(cols/32)]` E8M0) and/or column-wise copy (`[cols, ceil(rows/32)]`).
    /// Twin of CPU `quantize_mxfp8_rowwise` / `quantize_mxfp8_columnwise`.
    pub fn quantize_mxfp8<T: DeviceElement>(
        &self,
        src: &DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        format: Fp8Format,
        rowwise: Option<(&mut DeviceBuffer<u8>, &mut DeviceBuffer<u8>)>,
        columnwise: Option<(&mut DeviceBuffer<u8>, &mut DeviceBuffer<u8>)>,
    ) -> Result<()> {
        // E8M0 scales ignore the f32 rule's power-of-two and epsilon settings.
        let rule = ScaleRule {
            format,
            power_2_scale: false,
            amax_epsilon: 0.0,
        };
        self.block_copies(src, rows, cols, 32, "mxfp8", &rule, rowwise, columnwise)
    }

    #[allow(clippy::too_many_arguments)]
    fn block_copies<T: DeviceElement, S: cudarc::driver::DeviceRepr>(
        &self,
        src: &DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        block: usize,
        name: &'static str,
        rule: &ScaleRule,
        rowwise: Option<(&mut DeviceBuffer<u8>, &mut DeviceBuffer<S>)>,
        columnwise: Option<(&mut DeviceBuffer<u8>, &mut DeviceBuffer<S>)>,
    ) -> Result<()> {
        // The CPU twin's check and error (`Error::InvalidRecipe`).
        rule.validate()?;
        let n = elements(name, rows, cols)?;
        check(name, "source", src.len(), n)?;
        let prefix = if block == 128 { "fp8_block_1x128" } else { "fp8_mxfp8" };
        let mut params = Fp8BlockParams {
            src: src.address(self),
            rows: rows as u64,
            cols: cols as u64,
            format: format_code(rule.format),
            power_2_scale: rule.power_2_scale as u32,
            amax_epsilon: rule.amax_epsilon,
            ..Default::default()
        };
        if let Some((codes, scales)) = rowwise {
            check(name, "row-wise codes", codes.len(), n)?;
            check(name, "row-wise scales", scales.len(), rows * cols.div_ceil(block))?;
            if n > 0 {
                params.dst_rowwise = codes.address_mut(self);
                params.scales_rowwise = scales.address_mut(self);
                let groups_per_cta = (THREADS as u64 / 32) * (32 / (block as u64 / 16));
                let total = (rows * cols.div_ceil(block)) as u64;
                let blocks = grid_stride_blocks(self, total, groups_per_cta);
                launch(self, BLOCK, &format!("{prefix}_rowwise_{}", T::SUFFIX), blocks, params)?;
            }
        }
        if let Some((codes, scales)) = columnwise {
            check(name, "column-wise codes", codes.len(), n)?;
            check(name, "column-wise scales", scales.len(), cols * rows.div_ceil(block))?;
            if n > 0 {
                params.dst_rowwise = 0;
                params.scales_rowwise = 0;
                params.dst_columnwise = codes.address_mut(self);
                params.scales_columnwise = scales.address_mut(self);
                let width = (THREADS as usize * 16) / block; // tile columns of the column-wise kernel
                let blocks = tile_blocks(name, (rows.div_ceil(block) * cols.div_ceil(width)) as u64)?;
                launch(
                    self,
                    BLOCK,
                    &format!("{prefix}_columnwise_{}", T::SUFFIX),
                    blocks,
                    params,
                )?;
            }
        }
        Ok(())
    }

    /// 128x128 tiles: `[rows, cols]` codes and `[ceil(rows/128), ceil(cols/128)]` scale_inv, plus, if
    /// given, the column-wise copy (`[cols, rows]` codes, transposed scale grid). Twin of CPU `quantize_128x128`
    /// (and of `quantize_block_128x128` with its column-wise copy).
    pub fn quantize_128x128<T: DeviceElement>(
        &self,
        src: &DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        rule: &ScaleRule,
        (codes, scale_inv): (&mut DeviceBuffer<u8>, &mut DeviceBuffer<f32>),
        columnwise: Option<(&mut DeviceBuffer<u8>, &mut DeviceBuffer<f32>)>,
    ) -> Result<()> {
        const K: &str = "128x128";
        // A negative or NaN epsilon would silently be ignored by the kernel; the CPU twin rejects it.
        rule.validate()?;
        let n = elements(K, rows, cols)?;
        let grid = rows.div_ceil(128) * cols.div_ceil(128);
        check(K, "source", src.len(), n)?;
        check(K, "codes", codes.len(), n)?;
        check(K, "scale_inv", scale_inv.len(), grid)?;
        if n == 0 {
            return Ok(());
        }
        let mut params = Fp8BlockParams {
            src: src.address(self),
            dst_rowwise: codes.address_mut(self),
            scales_rowwise: scale_inv.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            format: format_code(rule.format),
            power_2_scale: rule.power_2_scale as u32,
            amax_epsilon: rule.amax_epsilon,
            ..Default::default()
        };
        if let Some((codes_t, scale_inv_t)) = columnwise {
            check(K, "column-wise codes", codes_t.len(), n)?;
            check(K, "column-wise scale_inv", scale_inv_t.len(), grid)?;
            params.dst_columnwise = codes_t.address_mut(self);
            params.scales_columnwise = scale_inv_t.address_mut(self);
        }
        let blocks = tile_blocks(K, grid as u64)?;
        launch(self, BLOCK, &format!("fp8_block_128x128_{}", T::SUFFIX), blocks, params)
    }

    /// `dst = T(decode(src) * scale_inv)` for `[rows, cols]` codes. Twin of the CPU dequantizers.
    pub fn dequantize<T: DeviceElement>(
        &self,
        src: &DeviceBuffer<u8>,
        rows: usize,
        cols: usize,
        format: Fp8Format,
        scales: DequantScales<'_>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        const K: &str = "dequantize";
        let n = elements(K, rows, cols)?;
        check(K, "codes", src.len(), n)?;
        check(K, "destination", dst.len(), n)?;
        let (scale_inv, (block_rows, block_cols), kind) = match scales {
            DequantScales::PerTensor(s) => (address_at(self, K, s, 0)?, (1, 1), FP8_SCALES_PER_TENSOR),
            DequantScales::Blocks(s, (br, bc)) => {
                if br == 0 || bc == 0 || br > u32::MAX as usize || bc > u32::MAX as usize {
                    return Err(Error::KernelArgs {
                        kernel: K,
                        detail: format!("block shape {br} x {bc} is not usable"),
                    });
                }
                check(K, "scale_inv grid", s.len(), rows.div_ceil(br) * cols.div_ceil(bc))?;
                (s.address(self), (br, bc), FP8_SCALES_F32_GRID)
            }
            DequantScales::Mxfp8(e) => {
                check(K, "E8M0 scales", e.len(), rows * cols.div_ceil(32))?;
                (e.address(self), (1, 32), FP8_SCALES_E8M0_GRID)
            }
        };
        if n == 0 {
            return Ok(());
        }
        let params = Fp8DequantParams {
            src: src.address(self),
            dst: dst.address_mut(self),
            scale_inv,
            rows: rows as u64,
            cols: cols as u64,
            block_rows: block_rows as u32,
            block_cols: block_cols as u32,
            scale_kind: kind,
            format: format_code(format),
        };
        let blocks = grid_stride_blocks(self, (n as u64).div_ceil(16), THREADS as u64);
        launch(
            self,
            "dequantize",
            &format!("fp8_dequantize_{}", T::SUFFIX),
            blocks,
            params,
        )
    }

    /// The delayed-scaling update (spec 4.1) of all `scale.len()` slots in one launch:
    /// `history` is `[slots, history_len]` with this step's amax in column 0, `scaled_max[s]`
    /// is `DelayedScaling::scaled_max` of slot `s`'s format. Twin of the CPU `DelayedSlot::update`.
    pub fn delayed_update(
        &self,
        history: &mut DeviceBuffer<f32>,
        history_len: usize,
        scale: &mut DeviceBuffer<f32>,
        scaled_max: &DeviceBuffer<f32>,
        algo: AmaxComputeAlgo,
    ) -> Result<()> {
        const K: &str = "delayed_update";
        let slots = scale.len();
        if history_len == 0 {
            return Err(Error::KernelArgs {
                kernel: K,
                detail: "history_len must be at least 1".to_string(),
            });
        }
        check(K, "scaled_max", scaled_max.len(), slots)?;
        check(K, "history", history.len(), slots * history_len)?;
        if slots == 0 {
            return Ok(());
        }
        let (history, scale) = (history.address_mut(self), scale.address_mut(self));
        self.launch_delayed_update(history, scale, scaled_max, (slots, history_len), algo)
    }

    /// [`Self::delayed_update`] of slots `first..first + scaled_max.len()` of a bank kept whole on
    /// the device, `scale[slots] | history[slots, history_len]` (`dispatch::cuda_ops::slot_bank`),
    /// in place: no copy in or out.
    pub fn delayed_update_in_bank(
        &self,
        bank: &mut DeviceBuffer<f32>,
        (slots, history_len): (usize, usize),
        first: usize,
        scaled_max: &DeviceBuffer<f32>,
        algo: AmaxComputeAlgo,
    ) -> Result<()> {
        const K: &str = "delayed_update";
        let count = scaled_max.len();
        let bad = |detail: String| Error::KernelArgs { kernel: K, detail };
        if history_len == 0 {
            return Err(bad("history_len must be at least 1".to_string()));
        }
        check(K, "bank", bank.len(), slots * (1 + history_len))?;
        if first.checked_add(count).is_none_or(|end| end > slots) {
            return Err(bad(format!("slots {first}..{first}+{count} outside a bank of {slots}")));
        }
        if count == 0 {
            return Ok(());
        }
        let base = bank.address_mut(self);
        let scale = base + (first * size_of::<f32>()) as u64;
        let history = base + ((slots + first * history_len) * size_of::<f32>()) as u64;
        self.launch_delayed_update(history, scale, scaled_max, (count, history_len), algo)
    }

    /// `fp8_delayed_update` over `slots` slots whose histories start at device address
    /// `history` and scales at `scale`.
    fn launch_delayed_update(
        &self,
        history: u64,
        scale: u64,
        scaled_max: &DeviceBuffer<f32>,
        (slots, history_len): (usize, usize),
        algo: AmaxComputeAlgo,
    ) -> Result<()> {
        const K: &str = "delayed_update";
        let too_big = |what: &str, v: usize| Error::KernelArgs {
            kernel: K,
            detail: format!("{what} {v} exceeds 2^32-1"),
        };
        let params = Fp8DelayedUpdateParams {
            history,
            scale,
            scaled_max: scaled_max.address(self),
            slots: u32::try_from(slots).map_err(|_| too_big("slots", slots))?,
            history_len: u32::try_from(history_len).map_err(|_| too_big("history_len", history_len))?,
            algo: match algo {
                AmaxComputeAlgo::Max => FP8_AMAX_ALGO_MAX,
                AmaxComputeAlgo::MostRecent => FP8_AMAX_ALGO_MOST_RECENT,
            },
            pad0: 0,
        };
        let blocks = tile_blocks(K, (slots as u64).div_ceil(THREADS as u64 / 32))?;
        launch(self, "delayed", "fp8_delayed_update", blocks, params)
    }
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    #[test]
    fn block_casts_are_counted_in_their_own_scale_grid() {
        // 3 rows of 300: 1x128 -> 3 x 3 scales, 128x128 -> 1 x 3, MXFP8 -> 3 x 10 exponents.
        for (kind, scales, block, code) in [
            (ScaleKind::Block1x128, 9, (1, 128), FP8_SCALES_F32_GRID),
            (ScaleKind::Block128x128, 3, (128, 128), FP8_SCALES_F32_GRID),
            (ScaleKind::Mxfp8, 30, (1, 32), FP8_SCALES_E8M0_GRID),
        ] {
            let grid = StatsGrid::of(900, 300, kind, scales).unwrap();
            assert_eq!(
                grid,
                StatsGrid {
                    cols: 300,
                    block,
                    kind: code
                },
                "{kind:?}"
            );
            assert!(
                StatsGrid::of(900, 300, kind, scales + 1).is_err(),
                "{kind:?}: a scale too many"
            );
        }
        assert!(
            StatsGrid::of(900, 7, ScaleKind::Block1x128, 129).is_err(),
            "not whole rows"
        );
        assert!(StatsGrid::of(900, 0, ScaleKind::Block1x128, 0).is_err(), "no columns");
        assert!(StatsGrid::of(900, 300, ScaleKind::PerTensor, 1).is_err(), "not a grid");
    }

    #[test]
    fn uncast_thresholds_are_the_formats_largest_value_and_half_its_smallest_subnormal() {
        // E4M3: max 448, smallest subnormal 2^-9; E5M2: max 57344, smallest subnormal 2^-16.
        for (format, max, half_min) in [
            (Fp8Format::E4M3, 448.0, 2f32.powi(-10)),
            (Fp8Format::E5M2, 57344.0, 2f32.powi(-17)),
        ] {
            let fields = StatsFields::of(StatsVerdict::Uncast {
                format,
                scale: ScaleAt::Host(3.0),
            });
            assert_eq!(
                fields,
                StatsFields {
                    limit: 0.0,
                    scale: 3.0,
                    max,
                    half_min
                },
                "{format:?}"
            );
        }
    }
}
