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
    /// FP8 x FP8 (A's format, B's format).
    Fp8(Fp8Format, Fp8Format),
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
    /// `ceil(k / 128)`.
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
/// the kernels' own needs (FP8 K % 16, 16-bit K % 8, no MXFP8, no f32 inputs,
/// dimensions below 2^31, scale buffers of the layout's length).
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
                (ScaleKind::Mxfp8, ScaleKind::Mxfp8) => {
                    return Err(args(format!(
                        "MXFP8 x MXFP8 {m}x{n}x{k}: the portable CUDA GEMM has no E8M0 block scales; \
                         use the CPU backend"
                    )));
                }
                (sa, sb) => {
                    return Err(args(format!(
                        "scales {sa:?} (A) x {sb:?} (B) are not a supported pair \
                         (per-tensor x per-tensor, 1x128 x 128x128, 1x128 x 1x128)"
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
            (GemmInputs::Fp8(fa, fb), mode)
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
        k_blocks: k.div_ceil(K_BLOCK) as u32,
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
/// when that GPU has no such tensor-core path (FP8 needs 8.9, bf16 8.0, fp16 7.5).
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
mod tests {
    use super::*;

    const E4: Fp8Format = Fp8Format::E4M3;
    const E5: Fp8Format = Fp8Format::E5M2;

    fn fp8(format: Fp8Format, rows: usize, k: usize, kind: ScaleKind) -> OperandDesc {
        let (r, c) = kind.scale_shape(rows, k);
        OperandDesc {
            dtype: InputDtype::Fp8(format),
            rows,
            cols: k,
            len: rows * k,
            scales: Some((kind, r * c)),
        }
    }

    fn plain(dtype: InputDtype, rows: usize, k: usize) -> OperandDesc {
        OperandDesc {
            dtype,
            rows,
            cols: k,
            len: rows * k,
            scales: None,
        }
    }

    fn detail(e: Error) -> String {
        match e {
            Error::KernelArgs { detail, .. } => detail,
            other => panic!("expected KernelArgs, got {other:?}"),
        }
    }

    #[test]
    fn dispatch_table_by_compute_capability() {
        let fp8_pairs = [
            GemmInputs::Fp8(E4, E4),
            GemmInputs::Fp8(E4, E5),
            GemmInputs::Fp8(E5, E4),
        ];
        for cc in [(8, 9), (9, 0), (10, 0), (12, 0)] {
            for inputs in fp8_pairs {
                let k = select_kernel(cc, inputs).unwrap();
                assert_eq!(k.module, "gemm_mma_fp8");
                assert!(k.mma.starts_with("m16n8k32"));
            }
            assert_eq!(select_kernel(cc, GemmInputs::F16).unwrap().function, "fp8_gemm_mma_f16");
        }
        let names: Vec<_> = fp8_pairs
            .iter()
            .map(|&i| select_kernel((9, 0), i).unwrap().function)
            .collect();
        assert_eq!(
            names,
            [
                "fp8_gemm_mma_e4m3_e4m3",
                "fp8_gemm_mma_e4m3_e5m2",
                "fp8_gemm_mma_e5m2_e4m3"
            ]
        );
        for cc in [(7, 5), (8, 0), (8, 6), (8, 7)] {
            let e = detail(select_kernel(cc, GemmInputs::Fp8(E4, E4)).unwrap_err());
            assert!(e.contains("8.9") && e.contains(&format!("{}.{}", cc.0, cc.1)), "{e}");
        }
        assert_eq!(
            select_kernel((8, 0), GemmInputs::Bf16).unwrap().function,
            "fp8_gemm_mma_bf16"
        );
        assert_eq!(
            select_kernel((8, 6), GemmInputs::F16).unwrap().function,
            "fp8_gemm_mma_f16"
        );
        assert_eq!(
            select_kernel((7, 5), GemmInputs::F16).unwrap().function,
            "fp8_gemm_mma_f16_k8"
        );
        assert!(detail(select_kernel((7, 5), GemmInputs::Bf16).unwrap_err()).contains("8.0"));
        assert!(select_kernel((7, 0), GemmInputs::F16).is_err());
        assert!(select_kernel((9, 0), GemmInputs::Fp8(E5, E5)).is_err());
    }

    #[test]
    fn cached_dispatch_agrees_with_the_table() {
        for cc in [(7, 5), (8, 0), (8, 9), (9, 0)] {
            for inputs in [GemmInputs::Fp8(E4, E4), GemmInputs::Bf16, GemmInputs::F16] {
                for _ in 0..2 {
                    assert_eq!(
                        cached_kernel(cc, inputs).ok(),
                        select_kernel(cc, inputs).ok(),
                        "{cc:?} {inputs:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn kernel_overrides_must_fit_inputs_and_gpu() {
        let k8 = select_kernel((7, 5), GemmInputs::F16).unwrap();
        let bf = select_kernel((8, 0), GemmInputs::Bf16).unwrap();
        let e4 = select_kernel((9, 0), GemmInputs::Fp8(E4, E4)).unwrap();
        assert!(check_override(k8, GemmInputs::F16, (9, 0)).is_ok());
        assert!(check_override(k8, GemmInputs::F16, (7, 5)).is_ok());
        assert!(check_override(bf, GemmInputs::F16, (9, 0)).is_err());
        assert!(check_override(bf, GemmInputs::Bf16, (7, 5)).is_err());
        assert!(check_override(e4, GemmInputs::Fp8(E4, E4), (8, 6)).is_err());
        assert!(check_override(e4, GemmInputs::Fp8(E4, E5), (9, 0)).is_err());
        assert!(check_override(e4, GemmInputs::Fp8(E4, E4), (12, 0)).is_ok());
    }

    #[test]
    fn grid_covers_every_tile_once() {
        for (m, n) in [
            (1, 1),
            (128, 128),
            (129, 1),
            (1000, 300),
            (128 * 17, 128 * 3 + 5),
            (4096, 8192),
        ] {
            let blocks = grid_blocks(m, n).unwrap();
            let (tm, tn) = (m.div_ceil(TILE_M) as u32, n.div_ceil(TILE_N) as u32);
            assert_eq!(blocks, tm * tn);
            let mut seen = vec![false; blocks as usize];
            for pid in 0..blocks {
                let (i, j) = tile_of_block(pid, tm, tn);
                assert!(i < tm && j < tn, "{m}x{n}: block {pid} -> ({i}, {j})");
                let at = (i * tn + j) as usize;
                assert!(!seen[at], "{m}x{n}: tile ({i}, {j}) twice");
                seen[at] = true;
            }
        }
        // Within a full group, consecutive blocks walk down GROUP_M rows of tiles first.
        assert_eq!(tile_of_block(0, 64, 64), (0, 0));
        assert_eq!(tile_of_block(1, 64, 64), (1, 0));
        assert_eq!(tile_of_block(GROUP_M, 64, 64), (0, 1));
        assert!(grid_blocks(usize::MAX / 2, 1 << 20).is_err());
        assert_eq!(SMEM_BYTES, 65536);
    }

    #[test]
    fn valid_launches_plan_the_kernel() {
        let a = fp8(E4, 300, 4096 + 64, ScaleKind::Block1x128);
        let b = fp8(E4, 200, 4096 + 64, ScaleKind::Block128x128);
        let p = check_launch(&a, &b, OutputDtype::Bf16, 300 * 200, Some(200), 0.0).unwrap();
        assert_eq!((p.m, p.n, p.k, p.k_blocks), (300, 200, 4160, 33));
        assert_eq!(p.scale_mode, FP8_GEMM_SCALES_1X128_BY_128X128);
        assert_eq!(p.blocks, 3 * 2);
        assert_eq!(p.inputs, GemmInputs::Fp8(E4, E4));
        let a = fp8(E5, 3, 16, ScaleKind::Block1x128);
        let b = fp8(E4, 5, 16, ScaleKind::Block1x128);
        let p = check_launch(&a, &b, OutputDtype::F32, 15, None, 1.0).unwrap();
        assert_eq!(p.scale_mode, FP8_GEMM_SCALES_1X128_BY_1X128);
        let a = fp8(E4, 3, 32, ScaleKind::PerTensor);
        let p = check_launch(
            &a,
            &fp8(E5, 5, 32, ScaleKind::PerTensor),
            OutputDtype::Fp8(E4),
            15,
            None,
            0.0,
        )
        .unwrap();
        assert_eq!(
            (p.scale_mode, p.out.code()),
            (FP8_GEMM_SCALES_PER_TENSOR, FP8_GEMM_OUT_E4M3)
        );
        let p = check_launch(
            &plain(InputDtype::Bf16, 7, 24),
            &plain(InputDtype::Bf16, 9, 24),
            OutputDtype::F16,
            63,
            None,
            0.0,
        )
        .unwrap();
        assert_eq!((p.inputs, p.scale_mode), (GemmInputs::Bf16, FP8_GEMM_SCALES_NONE));
        // An empty output launches nothing.
        let p = check_launch(
            &plain(InputDtype::F16, 0, 8),
            &plain(InputDtype::F16, 4, 8),
            OutputDtype::F32,
            0,
            None,
            0.0,
        )
        .unwrap();
        assert_eq!(p.blocks, 0);
    }

    #[test]
    fn invalid_launches_name_the_problem() {
        let pt = ScaleKind::PerTensor;
        type Case = (
            OperandDesc,
            OperandDesc,
            OutputDtype,
            usize,
            Option<usize>,
            f32,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            (
                fp8(E4, 4, 32, pt),
                fp8(E4, 4, 48, pt),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "same K",
            ),
            (
                fp8(E5, 4, 32, pt),
                fp8(E5, 4, 32, pt),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "E5M2 x E5M2",
            ),
            (
                fp8(E4, 4, 40, pt),
                fp8(E4, 4, 40, pt),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "multiple of 16",
            ),
            (
                plain(InputDtype::Bf16, 4, 12),
                plain(InputDtype::Bf16, 4, 12),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "bf16 GEMM 4x4x12: K must be a multiple of 8",
            ),
            (
                fp8(E4, 4, 32, ScaleKind::Mxfp8),
                fp8(E4, 4, 32, ScaleKind::Mxfp8),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "MXFP8",
            ),
            (
                fp8(E4, 4, 32, ScaleKind::Block128x128),
                fp8(E4, 4, 32, ScaleKind::Block1x128),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "not a supported pair",
            ),
            (
                plain(InputDtype::F32, 4, 8),
                plain(InputDtype::F32, 4, 8),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "no f32 CUDA GEMM",
            ),
            (
                plain(InputDtype::Bf16, 4, 8),
                plain(InputDtype::F16, 4, 8),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "A is bf16 and B is f16",
            ),
            (
                fp8(E4, 4, 32, pt),
                plain(InputDtype::Bf16, 4, 32),
                OutputDtype::F32,
                16,
                None,
                0.0,
                "FP8 goes",
            ),
            (
                fp8(E4, 4, 32, pt),
                fp8(E4, 4, 32, pt),
                OutputDtype::F32,
                16,
                Some(5),
                0.0,
                "bias has 5",
            ),
            (
                fp8(E4, 4, 32, pt),
                fp8(E4, 4, 32, pt),
                OutputDtype::Bf16,
                16,
                None,
                0.5,
                "beta = 0.5",
            ),
        ];
        for (a, b, out, len, bias, beta, needle) in cases {
            let e = detail(check_launch(&a, &b, out, len, bias, beta).unwrap_err());
            assert!(e.contains(needle), "expected '{needle}' in '{e}'");
        }
        let mut short = fp8(E4, 300, 256, ScaleKind::Block1x128);
        short.scales = Some((ScaleKind::Block1x128, 300));
        let e = detail(
            check_launch(
                &short,
                &fp8(E4, 4, 256, ScaleKind::Block1x128),
                OutputDtype::F32,
                1200,
                None,
                0.0,
            )
            .unwrap_err(),
        );
        assert!(
            e.contains("A's Block1x128 scale_inv buffer has 300 values, 300x256 needs 600"),
            "{e}"
        );
        let a = fp8(E4, 4, 32, pt);
        assert!(matches!(
            check_launch(&a, &a, OutputDtype::F32, 15, None, 0.0),
            Err(Error::ShapeMismatch {
                expected: 16,
                got: 15,
                ..
            })
        ));
        let mut bad = a;
        bad.len = 3;
        assert!(matches!(
            check_launch(&bad, &a, OutputDtype::F32, 16, None, 0.0),
            Err(Error::ShapeMismatch { .. })
        ));
        let huge = plain(InputDtype::Bf16, 1 << 31, 8);
        let e = detail(
            check_launch(
                &huge,
                &plain(InputDtype::Bf16, 1, 8),
                OutputDtype::F32,
                1 << 31,
                None,
                0.0,
            )
            .unwrap_err(),
        );
        assert!(e.contains("M = 2147483648"), "{e}");
    }
}
