//! Device GEMMs: [`CudaDevice::gemm`] routes each call to the portable
//! tensor-core kernels ([`gemm_portable`](super::gemm_portable)) or the Hopper
//! fast path ([`gemm_path`](super::gemm_path)), the GPU twins of
//! [`crate::gemm::cpu::gemm`]: the same `D = alpha * A B^T * sA * sB (+ bias)
//! (+ beta D)` on device buffers.
//!
//! [`gemm_host`] takes the CPU API's host types (upload, run, download) for tests, benches
//! and the staged op arm. FP8 operands with MXFP8 (E8M0) scales run on their own portable
//! kernels (`cuda/gemm_mma_mxfp8.cu`); the Hopper path does not take them.

use std::borrow::Cow;
use std::sync::Arc;

use half::{bf16, f16};

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::gemm_dispatch::{GemmKernel, HALF_K_MULTIPLE, LaunchPlan};
use super::gemm_path::{hopper_scales, path_for};
use super::gemm_portable;
use super::hopper::{self, GemmPath, HopperScales};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::gemm::{GemmParams, GemmReport, Mat, Operand, Output, plan};
use crate::memory::MemoryCategory;
use crate::tensor::{DeviceMirror, QuantizedMatrix, ScaleKind, Scales};

pub use super::gemm_operands::{DeviceGemmParams, DeviceOperand, DeviceOutput, DeviceScales, gemm_inputs};

impl CudaDevice {
    /// `out = alpha * a . b^T * sA * sB (+ bias) (+ beta * out)` on the device's stream, by the
    /// kernel [`cached_kernel`](super::gemm_dispatch::cached_kernel) picks for this GPU and the
    /// dtypes, or, for FP8 inputs without a kernel override, on the Hopper fast path when
    /// [`path_for`] chooses it (`FP8_GEMM_PATH`). Checks the arguments like [`crate::gemm::plan`]
    /// plus the kernels' alignment needs; returns the checked plan (the portable kernels' view of
    /// the launch, whichever path ran).
    pub fn gemm(
        &self,
        a: &DeviceOperand,
        b: &DeviceOperand,
        out: DeviceOutput,
        params: DeviceGemmParams,
    ) -> Result<LaunchPlan> {
        let plan = gemm_portable::check(a, b, &out, &params)?;
        // FP8 without an override may take the Hopper fast path (FP8_GEMM_PATH, self-checked).
        if params.kernel.is_none()
            && path_for(self, a, b)? == GemmPath::Hopper
            && let Some(scales) = hopper_scales(a, b)
        {
            self.gemm_hopper(a, b, scales, out, params)?;
            return Ok(plan);
        }
        gemm_portable::launch(self, &plan, a, b, out, params)?;
        Ok(plan)
    }
}

impl CudaDevice {
    /// `a . b^T` on the Hopper fast path ([`hopper::launch`]), whatever `FP8_GEMM_PATH` says; both
    /// operands FP8, `scales` from [`hopper_scales`]; returns the plan it ran (its kernel's name).
    /// Benches use it to time the path directly. Kernel-side errors surface at the next sync.
    pub fn gemm_hopper(
        &self,
        a: &DeviceOperand,
        b: &DeviceOperand,
        scales: HopperScales,
        out: DeviceOutput,
        params: DeviceGemmParams,
    ) -> Result<hopper::LaunchPlan> {
        let (
            DeviceOperand::Fp8 {
                format: a_format,
                codes: a_codes,
                rows: m,
                cols: k,
                ..
            },
            DeviceOperand::Fp8 {
                format: b_format,
                codes: b_codes,
                rows: n,
                ..
            },
        ) = (a, b)
        else {
            return Err(Error::KernelArgs {
                kernel: "gemm_wgmma",
                detail: "the fast path takes FP8 x FP8 only".into(),
            });
        };
        let gemm = hopper::HopperGemm {
            m: *m,
            n: *n,
            k: *k,
            a: a_codes,
            a_format: *a_format,
            b: b_codes,
            b_format: *b_format,
            scales,
            bias: params.bias,
            alpha: params.alpha,
            beta: params.beta,
            split_accumulator: params.split_accumulator,
            amax: params.amax,
            error_flag: None,
        };
        hopper::launch(self, gemm, out)
    }
}

/// The CPU API's [`crate::gemm::cpu::gemm`] on the GPU: uploads the operands, runs
/// [`CudaDevice::gemm`], downloads the result into `out`. For tests and benches.
pub fn gemm_host(
    device: &CudaDevice,
    a: &Operand,
    b: &Operand,
    out: Output,
    params: &GemmParams,
) -> Result<GemmReport> {
    gemm_host_with(device, None, a, b, out, params)
}

/// [`gemm_host`] with a kernel override (see [`DeviceGemmParams::kernel`]). The bias, if any,
/// must be host values (uploaded here); one on a device is `DeviceMismatch` (the op arm reads
/// those in place: [`gemm_host_biased`]).
pub fn gemm_host_with(
    device: &CudaDevice,
    kernel: Option<GemmKernel>,
    a: &Operand,
    b: &Operand,
    out: Output,
    params: &GemmParams,
) -> Result<GemmReport> {
    plan(a, b, &out, params)?;
    let bias = crate::gemm::host_bias(params, "gemm")?
        .map(|b| device.upload(b, MemoryCategory::Workspace))
        .transpose()?;
    let dest = Destination::Host(out);
    let amax = gemm_to(device, kernel, a, b, dest, params, bias.as_ref(), None)?;
    host_report(device, amax)
}

/// [`gemm_host`] with `params.bias` already on the device in `bias` (a layer's bias kept there,
/// read in place, or host values the caller uploaded): the staged op arm's GEMM.
pub(crate) fn gemm_host_biased(
    device: &CudaDevice,
    a: &Operand,
    b: &Operand,
    out: Output,
    params: &GemmParams,
    bias: Option<&DeviceBuffer<f32>>,
) -> Result<GemmReport> {
    plan(a, b, &out, params)?;
    let amax = gemm_to(device, None, a, b, Destination::Host(out), params, bias, None)?;
    host_report(device, amax)
}

/// The report of a GEMM into host memory: its amax read back, if it made one.
fn host_report(device: &CudaDevice, amax: Option<DeviceBuffer<f32>>) -> Result<GemmReport> {
    Ok(GemmReport {
        amax: match &amax {
            Some(amax) => device.download(amax)?[0],
            None => 0.0,
        },
    })
}

/// [`gemm_host`] into an f32 buffer of the device, written in place (`beta` reads what it
/// holds): the output of an op whose result stays on the device. Operands as [`gemm_host`];
/// `params.bias` already on the device in `bias`, as [`gemm_host_biased`].
/// Its amax (with `params.report_amax`) stays on the device, unread, in `amax` (one zeroed
/// value; a new buffer if `None`): the caller folds it into a slot bank there or reads it when
/// it needs it.
pub(crate) fn gemm_into_device(
    device: &CudaDevice,
    a: &Operand,
    b: &Operand,
    out: &mut DeviceBuffer<f32>,
    params: &GemmParams,
    bias: Option<&DeviceBuffer<f32>>,
    amax: Option<DeviceBuffer<f32>>,
) -> Result<Option<DeviceBuffer<f32>>> {
    crate::gemm::plan_f32(a, b, out.len(), params)?;
    gemm_to(device, None, a, b, Destination::Device(out), params, bias, amax)
}

/// Where [`gemm_to`] writes.
enum Destination<'a> {
    /// The caller's host memory: a device buffer, then a download.
    Host(Output<'a>),
    /// An f32 buffer of the device.
    Device(&'a mut DeviceBuffer<f32>),
}

/// The GEMM of checked arguments (the caller ran [`plan`]): operands uploaded (or their
/// mirrors read), the bias read from `bias` (`params.bias`'s values on the device), the result
/// written to `dest`; the device buffer of its amax where `params.report_amax` asks for one.
#[allow(clippy::too_many_arguments)] // the GEMM's own arguments, and where its bias is
fn gemm_to(
    device: &CudaDevice,
    kernel: Option<GemmKernel>,
    a: &Operand,
    b: &Operand,
    dest: Destination,
    params: &GemmParams,
    bias: Option<&DeviceBuffer<f32>>,
    amax_buffer: Option<DeviceBuffer<f32>>,
) -> Result<Option<DeviceBuffer<f32>>> {
    // A bias asked for and none given (or the other way round) would change the result silently.
    if params.bias.map(|b| b.len()) != bias.map(|b| b.len()) {
        return Err(Error::KernelArgs {
            kernel: "gemm",
            detail: format!(
                "the bias has {:?} values and its device copy {:?}",
                params.bias.map(|b| b.len()),
                bias.map(|b| b.len())
            ),
        });
    }
    let a_dev = HostUpload::new(device, a)?;
    let b_dev = HostUpload::new(device, b)?;
    // Only a reported amax is reduced (reading it back is a stream sync: the caller decides).
    let mut amax = match (params.report_amax, amax_buffer) {
        (true, Some(given)) if given.len() == 1 => Some(given),
        (true, _) => Some(device.alloc_zeros::<f32>(1, MemoryCategory::Workspace)?),
        (false, _) => None,
    };
    let a_op = a_dev.operand();
    let b_op = b_dev.operand();
    let mut launch = |device_out: DeviceOutput| {
        device.gemm(
            &a_op,
            &b_op,
            device_out,
            DeviceGemmParams {
                alpha: params.alpha,
                beta: params.beta,
                bias,
                split_accumulator: params.split_accumulator,
                amax: amax.as_mut(),
                kernel,
            },
        )
    };
    match dest {
        Destination::Device(d) => {
            launch(DeviceOutput::F32(d))?;
        }
        Destination::Host(out) => into_host(device, out, params.beta, &mut launch)?,
    }
    Ok(amax)
}

/// Runs `launch` into a device buffer for `out` (holding `out`'s values when `beta` reads
/// them) and downloads the result into `out`.
fn into_host(
    device: &CudaDevice,
    out: Output,
    beta: f32,
    launch: &mut impl FnMut(DeviceOutput) -> Result<LaunchPlan>,
) -> Result<()> {
    let n_out = out.len();
    match out {
        Output::F32(host) => {
            let mut d = if beta != 0.0 {
                device.upload(host, MemoryCategory::Activations)?
            } else {
                device.alloc_zeros(n_out, MemoryCategory::Activations)?
            };
            launch(DeviceOutput::F32(&mut d))?;
            device.read_at(&d, 0, host)?;
        }
        Output::Bf16(host) => {
            let mut d = device.alloc_zeros(n_out, MemoryCategory::Activations)?;
            launch(DeviceOutput::Bf16(&mut d))?;
            device.read_at(&d, 0, host)?;
        }
        Output::F16(host) => {
            let mut d = device.alloc_zeros(n_out, MemoryCategory::Activations)?;
            launch(DeviceOutput::F16(&mut d))?;
            device.read_at(&d, 0, host)?;
        }
        Output::Fp8 { codes, format, scale } => {
            let mut d = device.alloc_zeros(n_out, MemoryCategory::Activations)?;
            let s = device.upload(&[scale], MemoryCategory::Workspace)?;
            launch(DeviceOutput::Fp8 {
                codes: &mut d,
                format,
                scale: &s,
            })?;
            device.read_at(&d, 0, codes)?;
        }
    }
    Ok(())
}

/// `rows x k` row-major values with each row zero-padded to a multiple of `multiple`, and
/// the padded K. The 16-bit kernels read 16-byte rows (K % 8 == 0); a model's small K (a
/// 12-token vocabulary's head dgrad, the first GPU run) is padded rather than refused.
pub(crate) fn pad_k<T: Copy + Default>(
    values: Cow<'_, [T]>,
    rows: usize,
    k: usize,
    multiple: usize,
) -> (Cow<'_, [T]>, usize) {
    let padded = k.next_multiple_of(multiple);
    if padded == k {
        // Aligned (K = 0 included): nothing to copy.
        return (values, k);
    }
    let mut out = vec![T::default(); rows * padded];
    for (row, src) in out.chunks_exact_mut(padded).zip(values.chunks_exact(k)) {
        row[..k].copy_from_slice(src);
    }
    (Cow::Owned(out), padded)
}

/// A 16-bit operand on the device, K-major with K padded to [`HALF_K_MULTIPLE`]: a transposed
/// one whose K needs no padding is uploaded as stored and transposed there (`transpose_16`);
/// others are copied K-major (and padded) on the host first. Same values either way.
fn upload_half<T: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync>(
    device: &CudaDevice,
    m: &Mat<'_, T>,
    category: MemoryCategory,
) -> Result<(DeviceBuffer<T>, usize)> {
    if transposes_on_device(m) {
        let stored = device.upload(m.data, category)?;
        return Ok((k_major_on_device(device, &stored, m, category)?, m.cols));
    }
    let (values, k) = pad_k(m.k_major(), m.rows, m.cols, HALF_K_MULTIPLE);
    Ok((device.upload(&values, category)?, k))
}

/// Whether a transposed 16-bit operand is made K-major on the device (`transpose_16`): a real
/// transpose (more than one row and column) whose K needs no padding.
fn transposes_on_device<T>(m: &Mat<'_, T>) -> bool {
    m.transposed && m.rows > 1 && m.cols > 1 && m.cols.is_multiple_of(HALF_K_MULTIPLE)
}

/// `stored`, `m`'s values as stored on the device (`[K, rows]` row-major), transposed there into
/// the `[rows, K]` the GEMM reads.
fn k_major_on_device<T: DeviceRepr + ValidAsZeroBits>(
    device: &CudaDevice,
    stored: &DeviceBuffer<T>,
    m: &Mat<'_, T>,
    category: MemoryCategory,
) -> Result<DeviceBuffer<T>> {
    let mut k_major = device.alloc_zeros::<T>(m.rows * m.cols, category)?;
    device.transpose_16(stored, m.cols, m.rows, &mut k_major)?;
    Ok(k_major)
}

/// A 16-bit operand's device copy: its mirror read in place or transposed on the device, else
/// its host values uploaded (K-major, padded); `copy` makes the variant of a new buffer.
fn half_upload<T: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static>(
    device: &CudaDevice,
    m: &Mat<'_, T>,
    category: MemoryCategory,
    copy: fn(DeviceBuffer<T>, usize, usize) -> HostUpload,
) -> Result<HostUpload> {
    Ok(match from_mirror(device, m, category)? {
        Some(FromMirror::InPlace(mirror)) => HostUpload::MirroredHalf {
            mirror,
            rows: m.rows,
            cols: m.cols,
        },
        Some(FromMirror::KMajor(data)) => copy(data, m.rows, m.cols),
        // Held only in a mirror this GPU cannot read in place (K needs padding, or another
        // GPU holds it): read back, then uploaded as host values are.
        None if m.device_only() => {
            let values = crate::gemm::read_back(m)?;
            let (data, k) = upload_half(device, &Mat { data: &values, ..*m }, category)?;
            copy(data, m.rows, k)
        }
        None => {
            let (data, k) = upload_half(device, m, category)?;
            copy(data, m.rows, k)
        }
    })
}

/// A host operand's device copy (FP8 codes with their scales, or 16-bit values).
#[derive(Debug)]
pub enum HostUpload {
    /// FP8 codes.
    Fp8 {
        /// Format of the codes.
        format: Fp8Format,
        /// `rows * cols` codes.
        codes: DeviceBuffer<u8>,
        /// The scales in their layout.
        scales: UploadedScales,
        /// Rows (M or N).
        rows: usize,
        /// K.
        cols: usize,
    },
    /// FP8 codes and scales already on the device: the mirror a device cast left with the
    /// host operand (`tensor::DeviceMirror`), read in place.
    Mirrored {
        /// Format of the codes.
        format: Fp8Format,
        /// The codes and scales (an [`Fp8Mirror`] of the operand's size, checked when made).
        mirror: Arc<DeviceMirror>,
        /// Rows (M or N).
        rows: usize,
        /// K.
        cols: usize,
    },
    /// bf16 values, rows, K.
    Bf16(DeviceBuffer<bf16>, usize, usize),
    /// fp16 values, rows, K.
    F16(DeviceBuffer<f16>, usize, usize),
    /// 16-bit values already on the device, K-major as stored: the mirror a device conversion
    /// left with the host operand ([`half_mirror`]), read in place.
    MirroredHalf {
        /// A `DeviceBuffer<bf16>` or `DeviceBuffer<f16>` mirror (checked when made).
        mirror: Arc<DeviceMirror>,
        /// Rows (M or N).
        rows: usize,
        /// K.
        cols: usize,
    },
}

/// A 16-bit matrix's values kept on `device` as its mirror (the payload is the buffer itself).
pub(crate) fn half_mirror<T: DeviceRepr + Send + Sync + 'static>(
    device: &CudaDevice,
    values: DeviceBuffer<T>,
) -> DeviceMirror {
    DeviceMirror {
        ordinal: device.info().ordinal,
        payload: Box::new(values),
        read_back: None,
        read_scales: None,
    }
}

/// The mirror of `m`'s stored values on `device`, if a conversion there left one of its size.
fn half_mirror_on<'a, T: DeviceRepr + 'static>(
    device: &CudaDevice,
    m: &Mat<'a, T>,
) -> Option<(&'a Arc<DeviceMirror>, &'a DeviceBuffer<T>)> {
    let mirror = m.mirror.filter(|x| x.ordinal == device.info().ordinal)?;
    let values = mirror.payload.downcast_ref::<DeviceBuffer<T>>()?;
    (values.len() == m.rows * m.cols).then_some((mirror, values))
}

/// How a 16-bit operand with a device mirror reaches the GEMM without an upload: as stored when
/// it is K-major with an aligned K, transposed on the device when it is stored transposed;
/// `None` (upload the host values) when K needs padding or the mirror is elsewhere.
enum FromMirror<T> {
    InPlace(Arc<DeviceMirror>),
    KMajor(DeviceBuffer<T>),
}

fn from_mirror<T: DeviceRepr + ValidAsZeroBits + 'static>(
    device: &CudaDevice,
    m: &Mat<'_, T>,
    category: MemoryCategory,
) -> Result<Option<FromMirror<T>>> {
    let Some((mirror, stored)) = half_mirror_on(device, m) else {
        return Ok(None);
    };
    if !m.cols.is_multiple_of(HALF_K_MULTIPLE) {
        return Ok(None);
    }
    super::transfer_times::saved_upload(m.rows * m.cols * std::mem::size_of::<T>(), false);
    Ok(Some(match transposes_on_device(m) {
        true => FromMirror::KMajor(k_major_on_device(device, stored, m, category)?),
        // K-major as stored (a 1-row or 1-column transpose is the same sequence of values).
        false => FromMirror::InPlace(mirror.clone()),
    }))
}

/// The device copy of one FP8 copy (codes and scales, the layout of its `QuantizedMatrix`) that a
/// device cast keeps with the host copy it downloaded (`tensor::DeviceMirror`'s payload).
#[derive(Debug)]
pub struct Fp8Mirror {
    /// `rows * cols` codes.
    pub codes: DeviceBuffer<u8>,
    /// The scales in their layout.
    pub scales: UploadedScales,
}

impl Fp8Mirror {
    /// `mirror` as a tensor's device mirror on `device`.
    pub(crate) fn into_tensor_mirror(self, device: &CudaDevice) -> DeviceMirror {
        DeviceMirror {
            ordinal: device.info().ordinal,
            payload: Box::new(self),
            read_back: None,
            read_scales: None,
        }
    }
}

/// An FP8 operand's scales on the device.
#[derive(Debug)]
pub enum UploadedScales {
    /// f32 scale_inv values in the layout of the kind (per tensor, 1x128, 128x128).
    F32(DeviceBuffer<f32>, ScaleKind),
    /// MXFP8 E8M0 exponents `[rows, ceil(K/32)]`.
    E8m0(DeviceBuffer<u8>),
}

impl HostUpload {
    /// Uploads `op`; f32 inputs have no portable CUDA GEMM (their path is `gemm_f32`) and are refused.
    pub fn new(device: &CudaDevice, op: &Operand) -> Result<Self> {
        let category = MemoryCategory::Activations;
        if let Operand::Fp8(format, q) = op
            && let Some(mirror) = mirror_on(device, q)
        {
            // Held weights' copies are booked under FP8 copies (`resident_mirror`), casts' under
            // workspace.
            let held = fp8_mirror(&mirror).is_some_and(|m| m.codes.category() == MemoryCategory::Fp8Copies);
            super::transfer_times::saved_upload(q.bytes(), held);
            return Ok(HostUpload::Mirrored {
                format: *format,
                mirror,
                rows: q.rows(),
                cols: q.cols(),
            });
        }
        Ok(match op {
            Operand::Fp8(format, q) => HostUpload::Fp8 {
                format: *format,
                codes: device.upload(q.data(), category)?,
                scales: upload_scales(device, q.scales(), category)?,
                rows: q.rows(),
                cols: q.cols(),
            },
            // The CUDA GEMM reads K-major operands: a transposed one is copied K-major first,
            // its rows zero-padded to the kernels' K multiple (zeros add nothing to any sum).
            Operand::Bf16(m) => half_upload(device, m, category, HostUpload::Bf16)?,
            Operand::F16(m) => half_upload(device, m, category, HostUpload::F16)?,
            Operand::F32(m) => {
                return Err(Error::KernelArgs {
                    kernel: "gemm_mma",
                    detail: format!(
                        "f32 x f32 {}x{}: there is no f32 CUDA GEMM; use bf16/fp16 inputs or the CPU backend",
                        m.rows, m.cols
                    ),
                });
            }
        })
    }

    /// The copy as a GEMM operand.
    pub fn operand(&self) -> DeviceOperand<'_> {
        match self {
            HostUpload::Fp8 {
                format,
                codes,
                scales,
                rows,
                cols,
            } => DeviceOperand::Fp8 {
                format: *format,
                codes,
                rows: *rows,
                cols: *cols,
                scales: device_scales(scales),
            },
            HostUpload::Mirrored {
                format,
                mirror,
                rows,
                cols,
            } => {
                let mirror = fp8_mirror(mirror).expect("checked to be an Fp8Mirror when the upload was made");
                DeviceOperand::Fp8 {
                    format: *format,
                    codes: &mirror.codes,
                    rows: *rows,
                    cols: *cols,
                    scales: device_scales(&mirror.scales),
                }
            }
            HostUpload::Bf16(data, rows, cols) => DeviceOperand::Bf16 {
                data,
                rows: *rows,
                cols: *cols,
            },
            HostUpload::F16(data, rows, cols) => DeviceOperand::F16 {
                data,
                rows: *rows,
                cols: *cols,
            },
            HostUpload::MirroredHalf { mirror, rows, cols } => {
                let (rows, cols) = (*rows, *cols);
                match mirror.payload.downcast_ref::<DeviceBuffer<bf16>>() {
                    Some(data) => DeviceOperand::Bf16 { data, rows, cols },
                    None => DeviceOperand::F16 {
                        data: mirror
                            .payload
                            .downcast_ref::<DeviceBuffer<f16>>()
                            .expect("checked to be a 16-bit mirror when the upload was made"),
                        rows,
                        cols,
                    },
                }
            }
        }
    }
}

/// `scales` on the device, in their layout.
fn upload_scales(device: &CudaDevice, scales: &Scales, category: MemoryCategory) -> Result<UploadedScales> {
    let f32_scales = |values: &[f32], kind| -> Result<UploadedScales> {
        Ok(UploadedScales::F32(device.upload(values, category)?, kind))
    };
    match scales {
        Scales::PerTensor(s) => f32_scales(&[*s], ScaleKind::PerTensor),
        Scales::Block1x128(s) => f32_scales(s, ScaleKind::Block1x128),
        Scales::Block128x128(s) => f32_scales(s, ScaleKind::Block128x128),
        Scales::Mxfp8(e) => Ok(UploadedScales::E8m0(device.upload(e, category)?)),
    }
}

/// A device mirror of `q` on `device` in `category`: its codes and scales uploaded once, for a
/// matrix that stays (a frozen FP8 weight), so every GEMM reads it in place. `q`'s own mirror
/// when it already has one there.
pub(crate) fn resident_mirror(
    device: &CudaDevice,
    q: &QuantizedMatrix,
    category: MemoryCategory,
) -> Result<Arc<DeviceMirror>> {
    if let Some(mirror) = mirror_on(device, q) {
        return Ok(mirror);
    }
    let mirror = Fp8Mirror {
        codes: device.upload(q.data(), category)?,
        scales: upload_scales(device, q.scales(), category)?,
    };
    Ok(Arc::new(mirror.into_tensor_mirror(device)))
}

/// `q`'s device mirror, if a device cast on `device`'s GPU left one of the matrix's size.
fn mirror_on(device: &CudaDevice, q: &QuantizedMatrix) -> Option<Arc<DeviceMirror>> {
    held_codes(device, q)?;
    q.mirror().cloned()
}

/// The codes of `q`'s device mirror on `device`'s GPU, if it has one of the matrix's size.
pub(crate) fn held_codes<'a>(device: &CudaDevice, q: &'a QuantizedMatrix) -> Option<&'a DeviceBuffer<u8>> {
    let m = q.mirror().filter(|m| m.ordinal == device.info().ordinal)?;
    fp8_mirror(m).map(|f| &f.codes).filter(|codes| codes.len() == q.len())
}

/// The FP8 copy a device mirror holds, if it holds one.
pub(crate) fn fp8_mirror(m: &DeviceMirror) -> Option<&Fp8Mirror> {
    m.payload.downcast_ref::<Fp8Mirror>()
}

/// A view of scales on the device, in the layout their kind names.
pub(crate) fn device_scales(scales: &UploadedScales) -> DeviceScales<'_> {
    match scales {
        UploadedScales::F32(s, ScaleKind::Block1x128) => DeviceScales::Block1x128(s),
        UploadedScales::F32(s, ScaleKind::Block128x128) => DeviceScales::Block128x128(s),
        UploadedScales::F32(s, _) => DeviceScales::PerTensor(s),
        UploadedScales::E8m0(e) => DeviceScales::Mxfp8(e),
    }
}

#[cfg(test)]
mod tests {
    use super::pad_k;
    use std::borrow::Cow;

    #[test]
    fn rows_are_zero_padded_to_the_k_multiple_and_aligned_ones_are_kept() {
        let (v, k) = pad_k(Cow::Owned(vec![1u16, 2, 3, 4, 5, 6]), 2, 3, 8);
        assert_eq!(k, 8);
        assert_eq!(*v, [1, 2, 3, 0, 0, 0, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0]);
        let kept = [7u16; 16];
        let (v, k) = pad_k(Cow::Borrowed(&kept[..]), 2, 8, 8);
        assert!(matches!(v, Cow::Borrowed(_)) && k == 8);
        let (v, k) = pad_k(Cow::<[u16]>::Owned(Vec::new()), 0, 12, 8);
        assert_eq!((v.len(), k), (0, 16));
    }
}
