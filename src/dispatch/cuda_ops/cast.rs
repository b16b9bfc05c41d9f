//! Staged arms of the FP8 casts, the GEMM, the delayed-scaling update and the
//! FP8 statistics (launchers in `backend::cuda::{quantize, gemm}`).

use super::deferred::{DeviceCounts, DeviceScalar, device_scalar};
use super::resident::staged_for;
use super::{Lease, Staged, slot_bank, staged};
use crate::amp::Fp8Recipe;
use crate::backend::cuda::gemm::{
    Fp8Mirror, UploadedScales, device_scales, fp8_mirror, gemm_host_biased, gemm_into_device, resident_mirror,
};
use crate::backend::cuda::gemm_f32::gemm_f32_host;
use crate::backend::cuda::{DeviceBuffer, ScaleAt, StatsVerdict};
use crate::dispatch::{Cast, CudaKernels, Deferred, Fp8Stats, Values, ValuesMut, fp8_cast};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::gemm::{Bias, GemmParams, GemmReport, Operand, Output};
use crate::memory::MemoryCategory;
use crate::quantize::ScaleRule;
use crate::scaling::{BlockDims, DelayedScaling, RecipeFormat, SlotBank, TensorRole};
use crate::tensor::{DeviceMirror, QuantizedMatrix, QuantizedTensor, ScaleKind, Scales};
use std::sync::Arc;

/// Both copies of a per-tensor cast with `scale` of `x` (the source on the device), and its amax.
/// `scale`: a host value (delayed scaling's slot), or one left on the device (current
/// scaling's, made there from the amax), which the cast reads by address and nothing reads
/// back: the copies' `scale_inv` then stays there too until a host reader asks for it.
/// `count`: the cast's statistics are counted on the device too (a source that lives there,
/// which [`cast_stats`] would otherwise download to count).
fn per_tensor(
    s: &Arc<Staged>,
    x: &DeviceBuffer<f32>,
    (rows, cols): (usize, usize),
    format: Fp8Format,
    scale: Deferred<f32>,
    count: bool,
) -> Result<Cast> {
    let n = x.len();
    let at = scale_at(&scale, "quantize")?;
    let host_scale = match at {
        // Checked as the CPU twin checks it (the kernel reads it on the device and checks
        // nothing); a scale made on the device by the recipe's rule is always finite and > 0.
        ScaleAt::Host(v) => Some(crate::quantize::check_scale(v).map(|()| v)?),
        ScaleAt::Device(_) => None,
    };
    let uploaded = host_scale.map(|v| s.up(&[v])).transpose()?;
    let scale_d: &DeviceBuffer<f32> = match (&uploaded, at) {
        (Some(up), _) => up,
        (None, ScaleAt::Device(on_device)) => on_device,
        (None, ScaleAt::Host(_)) => unreachable!("a host scale was uploaded"),
    };
    let (mut codes, mut codes_t) = (s.scratch::<u8>(n)?, s.scratch::<u8>(n)?);
    let (mut amax, mut scale_inv) = (s.zeros::<f32>(1)?, s.scratch::<f32>(1)?);
    s.device().cast_amax(
        x,
        rows,
        cols,
        format,
        (scale_d, 0),
        &mut codes,
        Some(&mut codes_t),
        (&mut amax, 0),
        Some(&mut scale_inv),
    )?;
    // The kernel writes `__fdiv_rn(1, scale)` for the GEMMs, which is the twin's `1 / scale`
    // (both IEEE division, round to nearest, of a finite positive scale): a host scale's is
    // those bits without reading them back, a stream sync per cast (`docs/cuda-backend.md`).
    // A device scale's stays there, in the copies' mirrors, until a host reader asks; where
    // the codes come back now (no mirrors, the staged path, or an empty cast, which launches
    // no kernel to write it) the host's `1 / scale` is read once for both copies.
    let mirrored = n > 0 && room_for_mirrors(s);
    let scales = match (
        host_scale,
        mirrored && crate::backend::cuda::env_switch::resident_layers(),
    ) {
        (Some(v), _) => HostScales::Known(Scales::PerTensor(1.0 / v)),
        (None, true) => HostScales::OnDevice(ScaleKind::PerTensor),
        (None, false) => HostScales::Known(Scales::PerTensor(1.0 / scale.get()?)),
    };
    // The limit of `fp8_cast::cast_stats` for a per-tensor copy: max * the stored scale_inv.
    let counts = match count {
        true => Some(device_counts(
            s,
            x,
            StatsVerdict::Cast {
                codes: &codes,
                format,
                scale: at,
            },
        )?),
        false => None,
    };
    // The amax stays on the device until read (a bank there folds it in place).
    let amax = DeviceScalar::deferred(s, amax.into_buffer());
    let (rowwise, columnwise) = match mirrored {
        // Both copies stay on the device, for the GEMMs that read them.
        true => {
            let scale_inv_t = match host_scale {
                Some(v) => s.up(&[1.0 / v])?,
                None => device_copy(s, &scale_inv)?,
            };
            let row_scales = UploadedScales::F32(scale_inv.into_buffer(), ScaleKind::PerTensor);
            let col_scales = UploadedScales::F32(scale_inv_t.into_buffer(), ScaleKind::PerTensor);
            (
                kept(s, codes, (rows, cols), scales.clone(), row_scales)?,
                kept(s, codes_t, (cols, rows), scales, col_scales)?,
            )
        }
        false => {
            let HostScales::Known(scales) = scales else {
                unreachable!("a cast without mirrors knows its scale on the host")
            };
            (
                QuantizedMatrix::new(s.down_vec(&codes)?, rows, cols, scales.clone())?,
                QuantizedMatrix::new(s.down_vec(&codes_t)?, cols, rows, scales)?,
            )
        }
    };
    Ok(Cast {
        tensor: QuantizedTensor::new(format, rowwise, Some(columnwise))?,
        amax,
        scale,
        counts,
    })
}

/// `scale` as a kernel reads it: the buffer of a scale left on this GPU, or the host's value.
fn scale_at<'d>(scale: &'d Deferred<f32>, op: &'static str) -> Result<ScaleAt<'d>> {
    Ok(match device_scalar(scale, op)? {
        Some(on_device) => ScaleAt::Device(on_device.buffer()),
        None => ScaleAt::Host(scale.get()?),
    })
}

/// A device-to-device copy of `src` into a buffer from the pool.
fn device_copy<'s, T: super::Pooled>(s: &'s Staged, src: &DeviceBuffer<T>) -> Result<Lease<'s, T>> {
    let mut copy = s.scratch::<T>(src.len())?;
    s.device().copy_at(src, &mut copy, 0)?;
    Ok(copy)
}

/// `[saturated, underflow, nonzero, nonfinite]` of `x` counted on the device, left there until
/// read (4 counts come back instead of the values, when the statistics are collected).
fn device_counts(s: &Arc<Staged>, x: &DeviceBuffer<f32>, verdict: StatsVerdict<'_>) -> Result<Deferred<[u64; 4]>> {
    let mut counts = s.zeros::<u32>(4)?;
    s.device().count_stats(x, verdict, &mut counts)?;
    Ok(DeviceCounts::deferred(s, counts.into_buffer()))
}

/// Free device memory kept for staging when casts keep mirrors: an eighth of the GPU.
const MIRROR_RESERVE_FRACTION: u64 = 8;

/// Whether a cast may keep its device copies as mirrors: while more than
/// [`MIRROR_RESERVE_FRACTION`] of the GPU is free, so mirrors (as long-lived as the host casts:
/// weight caches, inputs saved for backward) never take the memory later staged ops need. A
/// cast that does not keep them costs its GEMMs an upload, as before.
pub(super) fn room_for_mirrors(s: &Staged) -> bool {
    super::switches::mirrors_enabled()
        && s.device()
            .memory_info()
            .is_ok_and(|(free, total)| free > total / MIRROR_RESERVE_FRACTION)
}

/// The host side of a kept copy's scales: known, or only in its mirror (read when a host
/// reader asks: `QuantizedMatrix::held_with_device_scales`).
#[derive(Clone)]
enum HostScales {
    Known(Scales),
    OnDevice(ScaleKind),
}

/// One copy of a cast, `[rows, cols]` `codes` with `scales` (their device copy `device_scales`),
/// keeping its device buffers as its mirror. Where layers keep their activations on the device
/// (the default; not with `FP8_CUDA_RESIDENT=0`) the codes stay there only: the GEMMs read the mirror, and a host
/// reader (a CPU twin, block statistics) reads them back then. Otherwise (the staged path) the
/// host copy is downloaded now, as the staged layers' host code expects.
fn kept(
    s: &Staged,
    codes: Lease<'_, u8>,
    (rows, cols): (usize, usize),
    scales: HostScales,
    device_scales: UploadedScales,
) -> Result<QuantizedMatrix> {
    let host = match crate::backend::cuda::env_switch::resident_layers() {
        true => None,
        false => Some(s.down_vec(&codes)?),
    };
    let mirror = Fp8Mirror {
        codes: codes.into_buffer(),
        scales: device_scales,
    }
    .into_tensor_mirror(s.device());
    let held = DeviceMirror {
        read_back: Some(read_fp8_codes),
        read_scales: Some(read_fp8_scales),
        ..mirror
    };
    match (host, scales) {
        (Some(host), HostScales::Known(scales)) => {
            Ok(QuantizedMatrix::new(host, rows, cols, scales)?.with_mirror(held))
        }
        // (The staged path reads the codes back now anyway: the scales come with them.)
        (Some(host), HostScales::OnDevice(_)) => {
            let scales = read_fp8_scales(&held)?;
            Ok(QuantizedMatrix::new(host, rows, cols, scales)?.with_mirror(held))
        }
        (None, HostScales::Known(scales)) => QuantizedMatrix::held_on_device(rows, cols, scales, held),
        (None, HostScales::OnDevice(kind)) => QuantizedMatrix::held_with_device_scales(rows, cols, kind, held),
    }
}

/// The FP8 copy in `mirror`, and its GPU's staging (`what`: the read-back, for the error).
fn mirrored_copy<'m>(mirror: &'m DeviceMirror, what: &'static str) -> Result<(&'m Fp8Mirror, Arc<Staged>)> {
    let fp8 = fp8_mirror(mirror).ok_or_else(|| Error::KernelArgs {
        kernel: what,
        detail: "the mirror holds no FP8 copy".into(),
    })?;
    let s = staged(&CudaKernels {
        ordinal: mirror.ordinal,
    })?;
    Ok((fp8, s))
}

/// The codes of a cast's mirror, downloaded ([`kept`]'s read-back): a `Vec<u8>`.
pub(super) fn read_fp8_codes(mirror: &DeviceMirror) -> Result<Box<dyn std::any::Any>> {
    let (fp8, s) = mirrored_copy(mirror, "fp8 codes read-back")?;
    Ok(Box::new(s.down_vec(&fp8.codes)?))
}

/// The scales of a cast's mirror, downloaded ([`kept`]'s read-back of scales left there).
pub(super) fn read_fp8_scales(mirror: &DeviceMirror) -> Result<Scales> {
    let (fp8, s) = mirrored_copy(mirror, "fp8 scales read-back")?;
    downloaded(&s, &fp8.scales)
}

/// A device copy of `q`, a matrix that stays (a frozen FP8 weight), booked under FP8 copies;
/// `None` with `FP8_CUDA_MIRRORS=0` (its GEMMs then upload it each time).
pub(crate) fn resident(k: &CudaKernels, q: &QuantizedMatrix) -> Result<Option<std::sync::Arc<DeviceMirror>>> {
    // The device first: a model cannot move to a GPU that is not there, copies or not.
    let s = staged(k)?;
    if !super::switches::mirrors_enabled() {
        return Ok(None);
    }
    resident_mirror(s.device(), q, MemoryCategory::Fp8Copies).map(Some)
}

/// The scale count of a `[rows, cols]` copy in `kind`.
fn scale_count(kind: ScaleKind, rows: usize, cols: usize) -> usize {
    let (r, c) = kind.scale_shape(rows, cols);
    r * c
}

/// The block-scaled cast (1x128, 128x128 or MXFP8) of `x` (the source on the device): both
/// copies, the amax (left on the device), and, with `count`, the cast's statistics counted on the device by each block's scale (left there
/// until read, as a per-tensor cast's); where the scales stay on the device, the cast's scale
/// (the largest block scale) is found there too.
fn block_cast(
    s: &Arc<Staged>,
    x: &DeviceBuffer<f32>,
    (rows, cols): (usize, usize),
    rule: &ScaleRule,
    kind: ScaleKind,
    count: bool,
) -> Result<Cast> {
    // The launchers check the source's length against the shape.
    let n = x.len();
    let (mut q, mut qt) = (s.scratch::<u8>(n)?, s.scratch::<u8>(n)?);
    let (n_row, n_col) = (scale_count(kind, rows, cols), scale_count(kind, cols, rows));
    // The device scales, kept as the copies' mirrors.
    let (row_dev, col_dev) = match kind {
        ScaleKind::Mxfp8 => {
            let (mut e, mut et) = (s.scratch::<u8>(n_row)?, s.scratch::<u8>(n_col)?);
            s.device().quantize_mxfp8(
                x,
                rows,
                cols,
                rule.format,
                Some((&mut q, &mut e)),
                Some((&mut qt, &mut et)),
            )?;
            (
                UploadedScales::E8m0(e.into_buffer()),
                UploadedScales::E8m0(et.into_buffer()),
            )
        }
        ScaleKind::Block1x128 | ScaleKind::Block128x128 => {
            let (mut d, mut dt) = (s.scratch::<f32>(n_row)?, s.scratch::<f32>(n_col)?);
            if kind == ScaleKind::Block1x128 {
                s.device()
                    .quantize_1x128(x, rows, cols, rule, Some((&mut q, &mut d)), Some((&mut qt, &mut dt)))?;
            } else {
                s.device()
                    .quantize_128x128(x, rows, cols, rule, (&mut q, &mut d), Some((&mut qt, &mut dt)))?;
            }
            (
                UploadedScales::F32(d.into_buffer(), kind),
                UploadedScales::F32(dt.into_buffer(), kind),
            )
        }
        ScaleKind::PerTensor => {
            return Err(Error::KernelArgs {
                kernel: "quantize",
                detail: "per-tensor scales are not a block layout".into(),
            });
        }
    };
    // The statistics of the row-wise copy, judged by its own scales.
    let verdict = StatsVerdict::BlockCast {
        codes: &q,
        format: rule.format,
        cols,
        scales: device_scales(&row_dev),
    };
    let counts = count.then(|| device_counts(s, x, verdict)).transpose()?;
    let mirrored = n > 0 && room_for_mirrors(s);
    // With the scales on the device, the largest block scale is found there (4 bytes, read
    // with the step's statistics) instead of from host scales.
    let largest = match mirrored {
        true => Some(largest_scale(s, &row_dev)?),
        false => None,
    };
    let (rowwise, columnwise) = match mirrored {
        // Both copies stay on the device, for the GEMMs that read them; so do their scales,
        // until a host reader asks (the statistics need none: counted above).
        true => (
            kept(s, q, (rows, cols), HostScales::OnDevice(kind), row_dev)?,
            kept(s, qt, (cols, rows), HostScales::OnDevice(kind), col_dev)?,
        ),
        false => (
            QuantizedMatrix::new(s.down_vec(&q)?, rows, cols, downloaded(s, &row_dev)?)?,
            QuantizedMatrix::new(s.down_vec(&qt)?, cols, rows, downloaded(s, &col_dev)?)?,
        ),
    };
    let tensor = QuantizedTensor::new(rule.format, rowwise, Some(columnwise))?;
    Ok(fp8_cast::block_cast(tensor, amax_on_device(s, x)?, counts, largest))
}

/// The largest block scale of the block scales `scales` (`1 / min(scale_inv)`), found on the
/// device and left there until read.
fn largest_scale(s: &Arc<Staged>, scales: &UploadedScales) -> Result<Deferred<f32>> {
    let (mut key, mut scale) = (s.scratch::<u32>(1)?, s.scratch::<f32>(1)?);
    s.device().largest_scale(device_scales(scales), &mut key, &mut scale)?;
    Ok(DeviceScalar::deferred(s, scale.into_buffer()))
}

/// Scales on the device, downloaded in their layout.
fn downloaded(s: &Staged, scales: &UploadedScales) -> Result<Scales> {
    let f32s = match scales {
        UploadedScales::E8m0(e) => return Ok(Scales::Mxfp8(s.down_vec(e)?)),
        UploadedScales::F32(d, kind) => (s.down_vec(d)?, *kind),
    };
    Ok(match f32s {
        (v, ScaleKind::PerTensor) if v.len() == 1 => Scales::PerTensor(v[0]),
        (v, ScaleKind::Block1x128) => Scales::Block1x128(v),
        (v, ScaleKind::Block128x128) => Scales::Block128x128(v),
        (v, kind) => {
            return Err(Error::KernelArgs {
                kernel: "fp8 scales read-back",
                detail: format!("{} f32 values are not {kind:?} scales", v.len()),
            });
        }
    })
}

/// The amax of `x`, reduced on the device and left there until read.
fn amax_on_device(s: &Arc<Staged>, x: &DeviceBuffer<f32>) -> Result<Deferred<f32>> {
    let mut amax = s.zeros::<f32>(1)?;
    s.device().amax(x, &mut amax)?;
    Ok(DeviceScalar::deferred(s, amax.into_buffer()))
}

/// [`fp8_cast::cast`] on the device: the same copies, amax and scale per recipe.
pub(crate) fn quantize(
    k: &CudaKernels,
    recipe: &Fp8Recipe,
    role: TensorRole,
    src: Values<'_>,
    rows: usize,
    cols: usize,
    delayed_scale: f32,
) -> Result<Cast> {
    let s = staged_for(k, "quantize", [src.ordinal()])?;
    let shape = (rows, cols);
    // A device source's statistics are counted where it lives (a host one is read in place by
    // `cast_stats`: uploading it only to count would move more bytes than the count reads).
    // Where codes stay on the device (resident layers), every cast counts there, so the
    // statistics read no codes back.
    // (The device counters are 32-bit: a source of 2^32 values or more counts on the host.)
    let count = src.len() < u32::MAX as usize
        && (src.ordinal().is_some() || crate::backend::cuda::env_switch::resident_layers());
    // One upload of a host source (none of a device one) serves the amax and both copies.
    let x = s.input("quantize", src)?;
    match recipe {
        Fp8Recipe::Delayed(r) => per_tensor(&s, &x, shape, r.format.for_role(role), delayed_scale.into(), count),
        Fp8Recipe::Current(r) => {
            // The amax and the recipe's scale of it are made on the device, and the cast reads
            // the scale there: nothing comes back between them (the twin's order of operations).
            let rule = ScaleRule::current(r, role);
            let amax = amax_on_device(&s, &x)?;
            let scale = current_scale(k, amax, rule.format, rule.power_2_scale, rule.amax_epsilon)?;
            per_tensor(&s, &x, shape, rule.format, scale, count)
        }
        Fp8Recipe::Block(r) => {
            let rule = ScaleRule::block(r, role);
            let kind = match r.block_for(role) {
                BlockDims::Rows1x128 => ScaleKind::Block1x128,
                BlockDims::Tiles128x128 => ScaleKind::Block128x128,
            };
            block_cast(&s, &x, shape, &rule, kind, count)
        }
        Fp8Recipe::Mxfp8(r) => {
            let rule = ScaleRule {
                format: RecipeFormat::from(r.format).for_role(role),
                power_2_scale: false,
                amax_epsilon: 0.0,
            };
            block_cast(&s, &x, shape, &rule, ScaleKind::Mxfp8, count)
        }
    }
}

/// [`crate::dispatch::Kernels::current_scale`] on a GPU: an amax left there gives a scale
/// made and left there (kernel `fp8_current_scale`, the twin's bits); a host amax, the host's.
pub(crate) fn current_scale(
    k: &CudaKernels,
    amax: Deferred<f32>,
    format: Fp8Format,
    power_2: bool,
    epsilon: f32,
) -> Result<Deferred<f32>> {
    const OP: &str = "current_scale";
    let rule = crate::dispatch::current_rule(format, power_2, epsilon)?;
    let s = staged_for(k, OP, [amax.ordinal()])?;
    let Some(on_device) = device_scalar(&amax, OP)? else {
        return Ok(rule.scale(amax.get()?).into());
    };
    let mut scale = s.scratch::<f32>(1)?;
    s.device().current_scale(on_device.buffer(), &rule, &mut scale)?;
    Ok(DeviceScalar::deferred(&s, scale.into_buffer()))
}

/// The GEMM through the CUDA GEMM dispatch (portable mma.sync kernels, MXFP8 operands on
/// their E8M0 variant, or the Hopper path where `gemm_path` picks it, with its self-check);
/// f32 operands on the cuBLASLt reference path (`docs/cuda-backend.md`, GEMM operands). The
/// arguments are checked like the CPU GEMM's before the device is opened. A bias on the device
/// is read in place; a host one is uploaded.
pub(crate) fn gemm(k: &CudaKernels, a: &Operand, b: &Operand, out: Output, params: GemmParams) -> Result<GemmReport> {
    const OP: &str = "gemm";
    crate::gemm::plan(a, b, &out, &params)?;
    let s = staged_for(k, OP, [bias_ordinal(&params)])?;
    if let (Operand::F32(a), Operand::F32(b)) = (a, b) {
        // The f32 reference path (cuBLASLt, f32 compute, TF32 off).
        let bias = host_bias(&params)?;
        let params = GemmParams {
            bias: bias.as_deref().map(Bias::host),
            ..params
        };
        return s.with_cublaslt(|lt| gemm_f32_host(s.device(), lt, (a, b), out, &params));
    }
    let bias = params.bias.map(|b| s.input(OP, b.values())).transpose()?;
    gemm_host_biased(s.device(), a, b, out, &params, bias.as_deref())
}

/// [`gemm`] into f32 values wherever they live: host values take [`gemm`]'s staged path; a
/// device output is written in place (f32 operands: the cuBLASLt reference path's result,
/// whose epilogue runs on the host, goes up into it). A reported amax of a device output stays
/// on the device until read (a slot bank there folds it in place: `slot_bank`); callers that
/// drop it turn it off (`GemmParams::report_amax`).
pub(crate) fn gemm_into(
    k: &CudaKernels,
    a: &Operand,
    b: &Operand,
    out: ValuesMut<'_>,
    params: GemmParams,
) -> Result<Deferred<f32>> {
    const OP: &str = "gemm_into";
    let device_out = match out {
        // `gemm` checks the arguments itself.
        ValuesMut::Host(host) => return Ok(gemm(k, a, b, Output::F32(host), params)?.amax.into()),
        device => device,
    };
    crate::gemm::plan_f32(a, b, device_out.len(), &params)?;
    let s = staged_for(k, OP, [device_out.ordinal(), bias_ordinal(&params)])?;
    // With beta = 0 nothing reads the old values: a shared output is replaced, not copied.
    let mut d = match params.beta != 0.0 {
        true => s.in_place(OP, device_out)?,
        false => s.output(OP, device_out)?,
    };
    let report = match (a, b) {
        (Operand::F32(fa), Operand::F32(fb)) => {
            let mut host = match params.beta != 0.0 {
                true => s.down_vec(&d)?,
                false => vec![0.0; d.len()],
            };
            let bias = host_bias(&params)?;
            let params = GemmParams {
                bias: bias.as_deref().map(Bias::host),
                ..params
            };
            let report =
                s.with_cublaslt(|lt| gemm_f32_host(s.device(), lt, (fa, fb), Output::F32(&mut host), &params))?;
            if !host.is_empty() {
                s.device().write(&host, &mut d)?;
            }
            report.amax.into()
        }
        // The amax stays on the device until read (a bank there folds it in place).
        // A zeroed amax from the pool (given back there when the result is dropped).
        _ => {
            let bias = params.bias.map(|b| s.input(OP, b.values())).transpose()?;
            let amax = leased_amax(&s, &params)?;
            match gemm_into_device(s.device(), a, b, &mut d, &params, bias.as_deref(), amax)? {
                Some(amax) => DeviceScalar::deferred(&s, amax),
                None => 0.0.into(),
            }
        }
    };
    // A device output is written in place: nothing to bring back.
    Ok(report)
}

/// The GPU of a GEMM's bias, if it lives on one (checked against the op's before any work).
fn bias_ordinal(params: &GemmParams) -> Option<usize> {
    params.bias.and_then(|b| b.values().ordinal())
}

/// A GEMM's bias in host memory (a download of one on the device) for the f32 reference path,
/// whose epilogue runs on the host. fp32 layers keep their biases there, so nothing is
/// downloaded on their path.
fn host_bias<'a>(params: &GemmParams<'a>) -> Result<Option<std::borrow::Cow<'a, [f32]>>> {
    params.bias.map(|b| b.values().to_host()).transpose()
}

/// One zeroed value from the pool for a GEMM's amax, if it reports one.
fn leased_amax(s: &Staged, params: &GemmParams) -> Result<Option<DeviceBuffer<f32>>> {
    match params.report_amax {
        true => Ok(Some(s.zeros::<f32>(1)?.into_buffer())),
        false => Ok(None),
    }
}

/// The delayed-scaling update of `slots` in one launch: on a bank kept on the device, in
/// place there (`slot_bank`); otherwise the chosen slots' histories and scales go up as one
/// compact bank, come back and are stored in their slots.
pub(crate) fn delayed_update(
    k: &CudaKernels,
    bank: &mut SlotBank,
    slots: &[usize],
    formats: &[Fp8Format],
    recipe: &DelayedScaling,
) -> Result<()> {
    crate::dispatch::check_delayed_update(bank, slots, formats)?;
    if slot_bank::update_in_bank(k, bank, slots, formats, recipe)? {
        return Ok(());
    }
    let s = staged(k)?;
    if slots.is_empty() {
        return Ok(());
    }
    let compact = Compact::gather(bank, slots);
    let scaled_max: Vec<f32> = formats.iter().map(|&f| recipe.scaled_max(f)).collect();
    let (mut history_d, mut scale_d) = (s.up(&compact.history)?, s.up(&compact.scale)?);
    let max_d = s.up(&scaled_max)?;
    s.device().delayed_update(
        &mut history_d,
        compact.len,
        &mut scale_d,
        &max_d,
        recipe.amax_compute_algo,
    )?;
    let updated = Compact {
        history: s.down_vec(&history_d)?,
        scale: s.down_vec(&scale_d)?,
        len: compact.len,
    };
    updated.scatter(bank, slots);
    Ok(())
}

/// Some slots of a bank as one bank of their own, in the kernel's layout: histories
/// `[slots, len]` (this step's amax in column 0) and scales.
#[derive(Debug, PartialEq)]
struct Compact {
    history: Vec<f32>,
    scale: Vec<f32>,
    len: usize,
}

impl Compact {
    fn gather(bank: &SlotBank, slots: &[usize]) -> Self {
        let views: Vec<_> = slots.iter().map(|&i| bank.view(i)).collect();
        Compact {
            history: views.iter().flat_map(|v| v.history.iter().copied()).collect(),
            scale: views.iter().map(|v| v.scale).collect(),
            len: views.first().map_or(1, |v| v.history.len()),
        }
    }

    /// Stores each compact slot's scale and history back into its slot of `bank`.
    fn scatter(&self, bank: &mut SlotBank, slots: &[usize]) {
        for (j, &i) in slots.iter().enumerate() {
            bank.with_slot(i, |slot| {
                slot.scale = self.scale[j];
                slot.history
                    .copy_from_slice(&self.history[j * self.len..(j + 1) * self.len]);
            });
        }
    }
}

/// The statistics of a cast. Counted during a device source's per-tensor cast (`Cast::counts`,
/// [`per_tensor`]): nothing to read. Otherwise counted by the reference code on the host: the
/// codes are host copies already and a host source is read in place; a device source of a
/// block or MXFP8 cast is downloaded to count (`docs/cuda-backend.md`, Device-resident tensors).
pub(crate) fn cast_stats(k: &CudaKernels, name: String, src: Values<'_>, cast: &Cast) -> Result<Fp8Stats> {
    staged_for(k, "cast_stats", [src.ordinal()])?;
    if let Some(stats) = fp8_cast::counted_stats(&name, src.len(), cast) {
        return Ok(stats);
    }
    fp8_cast::cast_stats(name, &src.to_host()?, cast)
}

/// The statistics of a high-precision tensor as if cast per tensor: counted where the values
/// live (a device tensor on the device, 4 counts coming back; host values by the reference
/// code, as [`cast_stats`]).
pub(crate) fn uncast_stats(
    k: &CudaKernels,
    name: String,
    values: Values<'_>,
    format: Fp8Format,
    amax: Deferred<f32>,
    scale: Deferred<f32>,
) -> Result<Fp8Stats> {
    const OP: &str = "uncast_stats";
    let s = staged_for(k, OP, [values.ordinal(), amax.ordinal(), scale.ordinal()])?;
    let on_host = |host: &[f32]| -> Result<Fp8Stats> {
        let stats = fp8_cast::uncast_stats(name.clone(), host, format, amax.get()?, scale.get()?);
        Ok(Fp8Stats::Ready(stats))
    };
    match values {
        Values::Host(host) => on_host(host),
        // The device counters are 32-bit: 2^32 values or more are counted on the host.
        Values::Device(_) if values.len() >= u32::MAX as usize => on_host(&values.to_host()?),
        Values::Device(_) => {
            let x = s.input(OP, values)?;
            // A scale made on the device (current scaling's) is read there.
            let at = scale_at(&scale, OP)?;
            let counts = device_counts(&s, &x, StatsVerdict::Uncast { format, scale: at })?;
            Ok(Fp8Stats::counted(fp8_cast::Counted {
                name,
                format,
                amax,
                scale,
                total: values.len(),
                counts,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bank whose slots hold distinct scales and histories (this step's amax in column 0).
    fn bank() -> SlotBank {
        let mut bank = SlotBank::new(5, 3);
        for i in 0..5 {
            bank.with_slot(i, |slot| {
                slot.scale = 1.5 + i as f32;
                slot.history = vec![0.25 * (i + 1) as f32, 3.0 - i as f32, 0.5];
            });
        }
        bank
    }

    #[test]
    fn updating_the_gathered_slots_as_one_bank_then_scattering_is_the_banks_own_update() {
        let recipe = DelayedScaling::default();
        let (slots, formats) = ([3, 0, 4], [Fp8Format::E4M3, Fp8Format::E5M2, Fp8Format::E4M3]);
        let mut expected = bank();
        expected.update(&slots, &formats, &recipe);
        // What the kernel sees: the chosen slots as a bank of their own, slot k in formats[k].
        let mut got = bank();
        let compact = Compact::gather(&got, &slots);
        assert_eq!((compact.len, compact.scale.clone()), (3, vec![4.5, 1.5, 5.5]));
        let mut alone = SlotBank::new(slots.len(), compact.len);
        for k in 0..slots.len() {
            alone.with_slot(k, |slot| {
                slot.scale = compact.scale[k];
                slot.history = compact.history[k * 3..(k + 1) * 3].to_vec();
            });
        }
        alone.update(&[0, 1, 2], &formats, &recipe);
        Compact::gather(&alone, &[0, 1, 2]).scatter(&mut got, &slots);
        assert_eq!(got.values(), expected.values());
        assert_ne!(got.values(), bank().values(), "the update changed something");
    }
}
