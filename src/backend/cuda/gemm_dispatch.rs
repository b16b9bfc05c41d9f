//! Host-side decisions of the portable CUDA GEMMs, free of any driver call so
//! they are unit-tested on machines without a GPU: argument checks (the rules of
//! [`crate::gemm::plan`] plus the kernels' alignment needs), the kernel chosen by
//! compute capability and dtypes (cached), and the grid and tile-order math.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::params::*;
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::tensor::ScaleKind;

/// CTA tile rows (`BM` in `cuda/include/gemm_mma.cuh`).
pub const TILE_M: usize = 128;
/// CTA tile columns (`BN`).
pub const TILE_N: usize = 128;
/// Threads per CTA: 8 warps.
pub const THREADS: u32 = 256;
/// Dynamic shared memory per CTA: 4 stages x (A + B) x 128 rows x 64 bytes.
pub const SMEM_BYTES: u32 = 4 * 2 * 128 * 64;
/// M tiles that walk N together in the CTA raster (`GROUP_M`).
pub const GROUP_M: u32 = 8;
/// 16-bit inputs are loaded 16 bytes (8 elements) at a time, rows must stay 16-byte aligned.
pub const HALF_K_MULTIPLE: usize = 8;
/// FP8 K granularity, the same as `gemm::plan` asks of every backend (16-byte loads).
pub const FP8_K_MULTIPLE: usize = 16;
/// Block scales and split accumulation work in blocks of 128 of K.
pub const K_BLOCK: usize = 128;
/// MXFP8 scales (and the kernel's promotions) come in blocks of 32 of K: one k32 mma each.
pub const MXFP8_K_BLOCK: usize = 32;

const KERNEL: &str = "gemm_mma";

fn args(detail: String) -> Error {
    Error::KernelArgs { kernel: KERNEL, detail }
}

/// The dtype of one GEMM input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputDtype {
    /// FP8 codes of this format.
    Fp8(Fp8Format),
    /// bf16.
    Bf16,
    /// fp16.
    F16,
    /// f32 (no CUDA kernel: the CPU backend's policy).
    F32,
}

impl InputDtype {
    fn name(self) -> &'static str {
        match self {
            InputDtype::Fp8(Fp8Format::E4M3) => "e4m3",
            InputDtype::Fp8(Fp8Format::E5M2) => "e5m2",
            InputDtype::Bf16 => "bf16",
            InputDtype::F16 => "f16",
            InputDtype::F32 => "f32",
        }
    }
}

/// The output dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputDtype {
    /// f32.
    F32,
    /// bf16.
    Bf16,
    /// fp16.
    F16,
    /// FP8 codes of this format (with an output scale).
    Fp8(Fp8Format),
}

impl OutputDtype {
    /// The kernel's `FP8_GEMM_OUT_*` code.
    pub fn code(self) -> u32 {
        match self {
            OutputDtype::F32 => FP8_GEMM_OUT_F32,
            OutputDtype::Bf16 => FP8_GEMM_OUT_BF16,
            OutputDtype::F16 => FP8_GEMM_OUT_F16,
            OutputDtype::Fp8(Fp8Format::E4M3) => FP8_GEMM_OUT_E4M3,
            OutputDtype::Fp8(Fp8Format::E5M2) => FP8_GEMM_OUT_E5M2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            OutputDtype::F32 => "f32",
            OutputDtype::Bf16 => "bf16",
            OutputDtype::F16 => "f16",
            OutputDtype::Fp8(Fp8Format::E4M3) => "e4m3",
            OutputDtype::Fp8(Fp8Format::E5M2) => "e5m2",
        }
    }
}

/// What the launcher knows of one input: dtype, `rows x cols` (cols = K), elements
/// held, and for FP8 the scale layout and how many scales its buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperandDesc {
    /// Element type.
    pub dtype: InputDtype,
    /// Rows (M for A, N for B).
    pub rows: usize,
    /// K.
    pub cols: usize,
    /// Elements in the data buffer.
    pub len: usize,
    /// FP8 only: scale layout and the number of scales in its buffer.
    pub scales: Option<(ScaleKind, usize)>,
}

/// Which kernel family the inputs need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmInputs {
    /// FP8 x FP8 (A's format, B's format), per-tensor or 1x128/128x128 scales.
    Fp8(Fp8Format, Fp8Format),
    /// MXFP8 x MXFP8: FP8 codes with E8M0 scales per 32 of K (A's format, B's format).
    Mxfp8(Fp8Format, Fp8Format),
    /// bf16 x bf16.
    Bf16,
    /// fp16 x fp16.
    F16,
}

/// A checked launch: everything the kernel parameters need besides addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    /// Rows of A and D.
    pub m: u32,
    /// Rows of B, columns of D.
    pub n: u32,
    /// The reduction dimension.
    pub k: u32,
    /// Scale blocks per row: `ceil(k / 128)`, MXFP8 `ceil(k / 32)`.
    pub k_blocks: u32,
    /// Kernel family.
    pub inputs: GemmInputs,
    /// `FP8_GEMM_SCALES_*`.
    pub scale_mode: u32,
    /// Output dtype.
    pub out: OutputDtype,
    /// CTAs to launch (0: nothing to compute).
    pub blocks: u32,
}

fn expected_scales(kind: ScaleKind, rows: usize, cols: usize) -> usize {
    let (r, c) = kind.scale_shape(rows, cols);
    r * c
}

fn dim(what: &str, value: usize) -> Result<u32> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v <= i32::MAX as u32)
        .ok_or_else(|| args(format!("{what} = {value} exceeds the kernel's 2^31-1 limit")))
}

/// Checks a GEMM for the CUDA kernels: the rules of [`crate::gemm::plan`] (shapes,
/// format pairs, scale pairs, output length, bias length, beta only into f32) and
/// the kernels' own needs (FP8 K % 16, 16-bit K % 8, no f32 inputs, dimensions
/// below 2^31, scale buffers of the layout's length: MXFP8 `[rows, ceil(K/32)]`).
pub fn check_launch(
    a: &OperandDesc,
    b: &OperandDesc,
    out: OutputDtype,
    out_len: usize,
    bias_len: Option<usize>,
    beta: f32,
) -> Result<LaunchPlan> {
    let (m, k) = (a.rows, a.cols);
    let (n, kb) = (b.rows, b.cols);
    if k != kb {
        return Err(args(format!(
            "A is {m}x{k} and B is {n}x{kb}: both must be K-major with the same K"
        )));
    }
    for (name, op) in [("A", a), ("B", b)] {
        let expected = op
            .rows
            .checked_mul(op.cols)
            .ok_or_else(|| args(format!("{name} {}x{} overflows usize", op.rows, op.cols)))?;
        if op.len != expected {
            return Err(Error::ShapeMismatch {
                what: "GEMM operand",
                rows: op.rows,
                cols: op.cols,
                expected,
                got: op.len,
            });
        }
    }
    let (inputs, scale_mode) = match (a.dtype, b.dtype) {
        (InputDtype::Fp8(fa), InputDtype::Fp8(fb)) => {
            if fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2 {
                return Err(args(
                    "E5M2 x E5M2 is not a supported FP8 GEMM (one side must be E4M3)".into(),
                ));
            }
            if k % FP8_K_MULTIPLE != 0 {
                return Err(args(format!(
                    "FP8 GEMM {m}x{n}x{k}: K must be a multiple of {FP8_K_MULTIPLE}"
                )));
            }
            let (Some((sa, la)), Some((sb, lb))) = (a.scales, b.scales) else {
                return Err(args("FP8 operands need their scale_inv buffers".into()));
            };
            let mode = match (sa, sb) {
                (ScaleKind::PerTensor, ScaleKind::PerTensor) => FP8_GEMM_SCALES_PER_TENSOR,
                (ScaleKind::Block1x128, ScaleKind::Block128x128) => FP8_GEMM_SCALES_1X128_BY_128X128,
                (ScaleKind::Block1x128, ScaleKind::Block1x128) => FP8_GEMM_SCALES_1X128_BY_1X128,
                (ScaleKind::Mxfp8, ScaleKind::Mxfp8) => FP8_GEMM_SCALES_MXFP8,
                (sa, sb) => {
                    return Err(args(format!(
                        "scales {sa:?} (A) x {sb:?} (B) are not a supported pair \
                         (per-tensor x per-tensor, 1x128 x 128x128, 1x128 x 1x128, MXFP8 x MXFP8)"
                    )));
                }
            };
            for (name, kind, len, rows) in [("A", sa, la, m), ("B", sb, lb, n)] {
                let expected = expected_scales(kind, rows, k);
                if len != expected {
                    return Err(args(format!(
                        "{name}'s {kind:?} scale_inv buffer has {len} values, {rows}x{k} needs {expected}"
                    )));
                }
            }
            let inputs = if mode == FP8_GEMM_SCALES_MXFP8 {
                GemmInputs::Mxfp8(fa, fb)
            } else {
                GemmInputs::Fp8(fa, fb)
            };
            (inputs, mode)
        }
        (InputDtype::Bf16, InputDtype::Bf16) | (InputDtype::F16, InputDtype::F16) => {
            if k % HALF_K_MULTIPLE != 0 {
                return Err(args(format!(
                    "{} GEMM {m}x{n}x{k}: K must be a multiple of {HALF_K_MULTIPLE} (16-byte rows)",
                    a.dtype.name()
                )));
            }
            let inputs = if a.dtype == InputDtype::Bf16 {
                GemmInputs::Bf16
            } else {
                GemmInputs::F16
            };
            (inputs, FP8_GEMM_SCALES_NONE)
        }
        (InputDtype::F32, InputDtype::F32) => {
            return Err(args(format!(
                "f32 x f32 {m}x{n}x{k}: there is no f32 CUDA GEMM; use bf16/fp16 inputs or the CPU backend"
            )));
        }
        (da, db) => {
            return Err(args(format!(
                "A is {} and B is {}: plain inputs must have the same dtype, FP8 goes with FP8",
                da.name(),
                db.name()
            )));
        }
    };
    let expected = m
        .checked_mul(n)
        .ok_or_else(|| args(format!("{m} x {n} outputs overflow usize")))?;
    if out_len != expected {
        return Err(Error::ShapeMismatch {
            what: "GEMM output",
            rows: m,
            cols: n,
            expected,
            got: out_len,
        });
    }
    if let Some(len) = bias_len
        && len != n
    {
        return Err(args(format!("bias has {len} elements, N is {n}")));
    }
    if beta != 0.0 && out != OutputDtype::F32 {
        return Err(args(format!(
            "beta = {beta} needs an f32 output to accumulate into, not {}",
            out.name()
        )));
    }
    let (m32, n32, k32) = (dim("M", m)?, dim("N", n)?, dim("K", k)?);
    Ok(LaunchPlan {
        m: m32,
        n: n32,
        k: k32,
        k_blocks: k.div_ceil(if scale_mode == FP8_GEMM_SCALES_MXFP8 {
            MXFP8_K_BLOCK
        } else {
            K_BLOCK
        }) as u32,
        inputs,
        scale_mode,
        out,
        blocks: grid_blocks(m, n)?,
    })
}

/// CTAs for an `m x n` output: one per 128 x 128 tile, within the 2^31-1 grid limit.
pub fn grid_blocks(m: usize, n: usize) -> Result<u32> {
    // u128: two usize tile counts cannot overflow it.
    let tiles = (m.div_ceil(TILE_M) as u128) * (n.div_ceil(TILE_N) as u128);
    u32::try_from(tiles)
        .ok()
        .filter(|&t| t <= i32::MAX as u32)
        .ok_or_else(|| {
            args(format!(
                "{m}x{n} needs {tiles} tiles, over the grid limit of 2^31-1 blocks"
            ))
        })
}

/// The kernel's CTA raster (`tile_of_block` in `gemm_mma.cuh`): block id -> (M tile, N tile).
/// `GROUP_M` consecutive M tiles sweep all N tiles together, so they share B in L2.
pub fn tile_of_block(pid: u32, tiles_m: u32, tiles_n: u32) -> (u32, u32) {
    let group_size = GROUP_M * tiles_n;
    let first_m = (pid / group_size) * GROUP_M;
    let group_m = (tiles_m - first_m).min(GROUP_M);
    let in_group = pid % group_size;
    (first_m + in_group % group_m, in_group / group_m)
}

/// One compiled GEMM kernel: `cuda/<module>.cu`, its function, and the instruction it is built on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmKernel {
    /// Kernel file stem.
    pub module: &'static str,
    /// Function name.
    pub function: &'static str,
    /// The tensor-core instruction, for reports.
    pub mma: &'static str,
}

/// The kernel for `inputs` on a GPU of compute capability `cc`, or a typed error
/// when that GPU has no such tensor-core path (FP8 and MXFP8 need 8.9, bf16 8.0, fp16 7.5).
pub fn select_kernel(cc: (u32, u32), inputs: GemmInputs) -> Result<GemmKernel> {
    let (major, minor) = cc;
    let missing = |what: &str, need: &str| {
        args(format!(
            "{what} GEMM needs compute capability {need} or newer; this GPU is {major}.{minor}"
        ))
    };
    if cc < (7, 5) {
        return Err(missing("every", "7.5"));
    }
    const FP8: &str = "gemm_mma_fp8";
    const HALF: &str = "gemm_mma_half";
    const MX: &str = "gemm_mma_mxfp8";
    let kernel = |module, function, mma| GemmKernel { module, function, mma };
    match inputs {
        GemmInputs::Fp8(a, b) if cc >= (8, 9) => Ok(match (a, b) {
            (Fp8Format::E4M3, Fp8Format::E4M3) => kernel(FP8, "fp8_gemm_mma_e4m3_e4m3", "m16n8k32.e4m3.e4m3"),
            (Fp8Format::E4M3, Fp8Format::E5M2) => kernel(FP8, "fp8_gemm_mma_e4m3_e5m2", "m16n8k32.e4m3.e5m2"),
            (Fp8Format::E5M2, Fp8Format::E4M3) => kernel(FP8, "fp8_gemm_mma_e5m2_e4m3", "m16n8k32.e5m2.e4m3"),
            (Fp8Format::E5M2, Fp8Format::E5M2) => {
                return Err(args("E5M2 x E5M2 is not a supported FP8 GEMM".into()));
            }
        }),
        GemmInputs::Fp8(..) => Err(missing("FP8", "8.9 (Ada/Hopper FP8 tensor cores)")),
        GemmInputs::Mxfp8(a, b) if cc >= (8, 9) => Ok(match (a, b) {
            (Fp8Format::E4M3, Fp8Format::E4M3) => kernel(MX, "fp8_gemm_mma_mxfp8_e4m3_e4m3", "m16n8k32.e4m3.e4m3"),
            (Fp8Format::E4M3, Fp8Format::E5M2) => kernel(MX, "fp8_gemm_mma_mxfp8_e4m3_e5m2", "m16n8k32.e4m3.e5m2"),
            (Fp8Format::E5M2, Fp8Format::E4M3) => kernel(MX, "fp8_gemm_mma_mxfp8_e5m2_e4m3", "m16n8k32.e5m2.e4m3"),
            (Fp8Format::E5M2, Fp8Format::E5M2) => {
                return Err(args("E5M2 x E5M2 is not a supported FP8 GEMM".into()));
            }
        }),
        GemmInputs::Mxfp8(..) => Err(missing("MXFP8", "8.9 (Ada/Hopper FP8 tensor cores)")),
        GemmInputs::Bf16 if cc >= (8, 0) => Ok(kernel(HALF, "fp8_gemm_mma_bf16", "m16n8k16.bf16")),
        GemmInputs::Bf16 => Err(missing("bf16", "8.0")),
        GemmInputs::F16 if cc >= (8, 0) => Ok(kernel(HALF, "fp8_gemm_mma_f16", "m16n8k16.f16")),
        GemmInputs::F16 => Ok(kernel(HALF, "fp8_gemm_mma_f16_k8", "2 x m16n8k8.f16")),
    }
}

/// [`select_kernel`], decided once per (compute capability, inputs) for the process.
pub fn cached_kernel(cc: (u32, u32), inputs: GemmInputs) -> Result<GemmKernel> {
    type Table = Mutex<HashMap<((u32, u32), GemmInputs), GemmKernel>>;
    static TABLE: OnceLock<Table> = OnceLock::new();
    let table = TABLE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(k) = table.lock().unwrap_or_else(|p| p.into_inner()).get(&(cc, inputs)) {
        return Ok(*k);
    }
    // Errors are not cached: they are cheap to rebuild and carry the caller's values.
    let kernel = select_kernel(cc, inputs)?;
    table
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((cc, inputs), kernel);
    Ok(kernel)
}

/// Checks a caller's kernel choice (tests run the sm_75 kernel on newer GPUs): it must be the
/// kernel the dispatch picks for `inputs` on this GPU or on an older generation it can run.
pub fn check_override(kernel: GemmKernel, inputs: GemmInputs, cc: (u32, u32)) -> Result<()> {
    const GENERATIONS: [(u32, u32); 3] = [(7, 5), (8, 0), (8, 9)];
    let ok = GENERATIONS
        .iter()
        .chain(std::iter::once(&cc))
        .filter(|&&g| g <= cc)
        .any(|&g| select_kernel(g, inputs).ok() == Some(kernel));
    if ok {
        Ok(())
    } else {
        Err(args(format!(
            "kernel {} cannot run {inputs:?} on compute capability {}.{}",
            kernel.function, cc.0, cc.1
        )))
    }
}

#[cfg(test)]
mod tests;
