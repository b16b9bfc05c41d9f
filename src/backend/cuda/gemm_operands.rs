//! The device-side arguments of a GEMM, shared by both GPU paths (portable
//! mma.sync and Hopper wgmma): operands with their scales, the output, and the
//! scalars and switches.

use half::{bf16, f16};

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::gemm_dispatch::{GemmInputs, GemmKernel, InputDtype, OperandDesc, OutputDtype};
use crate::format::Fp8Format;
use crate::tensor::ScaleKind;

/// The `scale_inv` of an FP8 operand on the device, in the layouts of [`Scales`]: f32 values,
/// or MXFP8's E8M0 exponents.
///
/// [`Scales`]: crate::tensor::Scales
#[derive(Clone, Copy, Debug)]
pub enum DeviceScales<'a> {
    /// One value.
    PerTensor(&'a DeviceBuffer<f32>),
    /// `[rows, ceil(K/128)]`.
    Block1x128(&'a DeviceBuffer<f32>),
    /// `[ceil(rows/128), ceil(K/128)]`.
    Block128x128(&'a DeviceBuffer<f32>),
    /// `[rows, ceil(K/32)]` E8M0 codes (`2^(e-127)`, 0xFF NaN).
    Mxfp8(&'a DeviceBuffer<u8>),
}

impl DeviceScales<'_> {
    /// The layout.
    pub(crate) fn kind(&self) -> ScaleKind {
        match self {
            DeviceScales::PerTensor(_) => ScaleKind::PerTensor,
            DeviceScales::Block1x128(_) => ScaleKind::Block1x128,
            DeviceScales::Block128x128(_) => ScaleKind::Block128x128,
            DeviceScales::Mxfp8(_) => ScaleKind::Mxfp8,
        }
    }

    /// Scales the buffer holds.
    pub(crate) fn len(&self) -> usize {
        match self {
            DeviceScales::PerTensor(s) | DeviceScales::Block1x128(s) | DeviceScales::Block128x128(s) => s.len(),
            DeviceScales::Mxfp8(e) => e.len(),
        }
    }

    /// The buffer's device address.
    pub(crate) fn address(&self, device: &CudaDevice) -> u64 {
        match self {
            DeviceScales::PerTensor(s) | DeviceScales::Block1x128(s) | DeviceScales::Block128x128(s) => {
                s.address(device)
            }
            DeviceScales::Mxfp8(e) => e.address(device),
        }
    }
}

/// One GEMM input on the device, `rows x K` K-major.
#[derive(Clone, Copy, Debug)]
pub enum DeviceOperand<'a> {
    /// FP8 codes with their scales.
    Fp8 {
        /// Format of the codes.
        format: Fp8Format,
        /// `rows * cols` codes.
        codes: &'a DeviceBuffer<u8>,
        /// Rows (M or N).
        rows: usize,
        /// K.
        cols: usize,
        /// The scale_inv buffer.
        scales: DeviceScales<'a>,
    },
    /// bf16 values.
    Bf16 {
        /// `rows * cols` values.
        data: &'a DeviceBuffer<bf16>,
        /// Rows (M or N).
        rows: usize,
        /// K.
        cols: usize,
    },
    /// fp16 values.
    F16 {
        /// `rows * cols` values.
        data: &'a DeviceBuffer<f16>,
        /// Rows (M or N).
        rows: usize,
        /// K.
        cols: usize,
    },
}

impl DeviceOperand<'_> {
    /// What the dispatch checks: dtype, shape, lengths, scale layout.
    pub(crate) fn desc(&self) -> OperandDesc {
        match self {
            DeviceOperand::Fp8 {
                format,
                codes,
                rows,
                cols,
                scales,
            } => OperandDesc {
                dtype: InputDtype::Fp8(*format),
                rows: *rows,
                cols: *cols,
                len: codes.len(),
                scales: Some((scales.kind(), scales.len())),
            },
            DeviceOperand::Bf16 { data, rows, cols } => OperandDesc {
                dtype: InputDtype::Bf16,
                rows: *rows,
                cols: *cols,
                len: data.len(),
                scales: None,
            },
            DeviceOperand::F16 { data, rows, cols } => OperandDesc {
                dtype: InputDtype::F16,
                rows: *rows,
                cols: *cols,
                len: data.len(),
                scales: None,
            },
        }
    }

    /// (data address, scale_inv address or 0).
    pub(crate) fn addresses(&self, device: &CudaDevice) -> (u64, u64) {
        match self {
            DeviceOperand::Fp8 { codes, scales, .. } => (codes.address(device), scales.address(device)),
            DeviceOperand::Bf16 { data, .. } => (data.address(device), 0),
            DeviceOperand::F16 { data, .. } => (data.address(device), 0),
        }
    }
}

/// The kernel family of `a . b^T`: FP8 pairs (MXFP8 when both carry E8M0 scales), bf16, fp16;
/// `None` for a mix the dispatch refuses ([`check_launch`](super::gemm_dispatch::check_launch)
/// names it).
pub fn gemm_inputs(a: &DeviceOperand, b: &DeviceOperand) -> Option<GemmInputs> {
    match (a, b) {
        (
            DeviceOperand::Fp8 {
                format: fa, scales: sa, ..
            },
            DeviceOperand::Fp8 {
                format: fb, scales: sb, ..
            },
        ) => Some(match (sa, sb) {
            (DeviceScales::Mxfp8(_), DeviceScales::Mxfp8(_)) => GemmInputs::Mxfp8(*fa, *fb),
            _ => GemmInputs::Fp8(*fa, *fb),
        }),
        (DeviceOperand::Bf16 { .. }, DeviceOperand::Bf16 { .. }) => Some(GemmInputs::Bf16),
        (DeviceOperand::F16 { .. }, DeviceOperand::F16 { .. }) => Some(GemmInputs::F16),
        _ => None,
    }
}

/// Where the result goes on the device: `M x N` row-major.
#[derive(Debug)]
pub enum DeviceOutput<'a> {
    /// f32; also read when `beta != 0`.
    F32(&'a mut DeviceBuffer<f32>),
    /// bf16, rounded to nearest even.
    Bf16(&'a mut DeviceBuffer<bf16>),
    /// fp16, rounded to nearest even.
    F16(&'a mut DeviceBuffer<f16>),
    /// FP8 codes `cast_sat(D * scale)`; the scale stays on the device (delayed scaling), unchecked here.
    Fp8 {
        /// `M * N` codes.
        codes: &'a mut DeviceBuffer<u8>,
        /// Output format.
        format: Fp8Format,
        /// Device f32 output scale (element 0).
        scale: &'a DeviceBuffer<f32>,
    },
}

impl DeviceOutput<'_> {
    /// Output dtype and element count.
    pub(crate) fn dtype_and_len(&self) -> (OutputDtype, usize) {
        match self {
            DeviceOutput::F32(d) => (OutputDtype::F32, d.len()),
            DeviceOutput::Bf16(d) => (OutputDtype::Bf16, d.len()),
            DeviceOutput::F16(d) => (OutputDtype::F16, d.len()),
            DeviceOutput::Fp8 { codes, format, .. } => (OutputDtype::Fp8(*format), codes.len()),
        }
    }
}

/// Scalars and switches of a device GEMM (the device twin of [`GemmParams`]); the default is
/// alpha = 1, beta = 0, no bias, split accumulation, no amax, the dispatch's kernel.
#[derive(Debug)]
pub struct DeviceGemmParams<'a> {
    /// Multiplies the product after the input scale_invs.
    pub alpha: f32,
    /// Multiplies the f32 output's previous content; 0 ignores it.
    pub beta: f32,
    /// Per-column f32 bias, length N.
    pub bias: Option<&'a DeviceBuffer<f32>>,
    /// Promote the FP8 partial sum every 128 of K (forced on for block scales).
    pub split_accumulator: bool,
    /// `amax[0] = max(amax[0], max|D|)` before the output cast, NaN sticking; zero it first for this GEMM's
    /// amax alone. It must hold a non-negative value or +NaN (the kernel max-es float bits as integers).
    pub amax: Option<&'a mut DeviceBuffer<f32>>,
    /// Overrides the dispatch (tests: the sm_75 kernel on a newer GPU); checked by
    /// [`check_override`](super::gemm_dispatch::check_override).
    pub kernel: Option<GemmKernel>,
}

impl Default for DeviceGemmParams<'_> {
    fn default() -> Self {
        DeviceGemmParams {
            alpha: 1.0,
            beta: 0.0,
            bias: None,
            split_accumulator: true,
            amax: None,
            kernel: None,
        }
    }
}
