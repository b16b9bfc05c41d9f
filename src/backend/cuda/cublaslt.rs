//! cuBLASLt through `cudarc::cublaslt::result`: baselines (FP8 with per-tensor
//! scale pointers, and bf16) for benches and cross-check tests, and the
//! engine's f32 reference GEMM (f32 inputs, `CUBLAS_COMPUTE_32F`: no TF32;
//! `super::gemm_f32`). The engine's other GEMMs are the hand-written kernels of `cuda/`.
//!
//! Layout. cuBLASLt is column-major; our matrices are row-major. A row-major
//! `X [r, c]` is the column-major `X^T (c x r)` with the same bytes and ld = c.
//! We want row-major `D = A B^T` (`A [M, K]`, `B [N, K]`), i.e. column-major
//! `D^T (N x M) = B A^T`. So cuBLASLt's first operand is our B buffer, seen as
//! column-major `K x N` and transposed (`op = T`, giving `N x K`); its second
//! operand is our A buffer, seen as column-major `K x M`, not transposed; its
//! output is `N x M` column-major with ld = N, which is our row-major D. That is
//! the "TN" layout, the only one FP8 tensor cores take. The scale pointers follow
//! the operands: cuBLASLt's A scale is our B's scale_inv, and vice versa.

use std::ffi::c_void;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use half::bf16;

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::memory::MemoryCategory;

/// `cublasOperation_t` values (cuBLAS ABI; cudarc declares the enum only with its `cublas` feature).
const CUBLAS_OP_N: i32 = 0;
const CUBLAS_OP_T: i32 = 1;

/// The workspace cuBLASLt may use (Hopper kernels want up to 32 MiB).
pub const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_error(call: &str, e: lt::CublasError) -> Error {
    Error::Cuda {
        call: call.to_string(),
        name: format!("{:?}", e.0),
        message: "cuBLASLt call failed".to_string(),
    }
}

/// Whether libcublasLt can be loaded (cudarc panics on its first call without it).
pub fn cublaslt_present() -> bool {
    // SAFETY: only tries to dlopen the library; no function is called.
    unsafe { sys::is_culib_present() }
}

/// A cuBLASLt handle and its caller-owned 32 MiB workspace on one device.
pub struct CublasLt {
    handle: sys::cublasLtHandle_t,
    workspace: DeviceBuffer<u8>,
}

impl std::fmt::Debug for CublasLt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CublasLt").finish_non_exhaustive()
    }
}

// SAFETY: a cuBLASLt handle is not bound to the thread that created it (cuBLASLt allows a
// handle on any host thread whose current context is the handle's; every user binds the
// device's context first), and the workspace is a plain device allocation. Shared use goes
// through a Mutex (`dispatch::cuda_ops`), so no two threads call with it at once.
unsafe impl Send for CublasLt {}

impl Drop for CublasLt {
    fn drop(&mut self) {
        // SAFETY: the handle came from cublasLtCreate and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// The inputs of one baseline GEMM (row-major, K-major on both sides).
#[derive(Clone, Copy, Debug)]
pub enum LtInputs<'a> {
    /// FP8 codes with per-tensor scale_inv (device f32, one each).
    Fp8 {
        /// `[m, k]` codes and format.
        a: (&'a DeviceBuffer<u8>, Fp8Format),
        /// `[n, k]` codes and format.
        b: (&'a DeviceBuffer<u8>, Fp8Format),
        /// A's scale_inv.
        a_scale_inv: &'a DeviceBuffer<f32>,
        /// B's scale_inv.
        b_scale_inv: &'a DeviceBuffer<f32>,
        /// cuBLASLt's fast accumulation (no promotion of the tensor-core sum).
        fast_accum: bool,
    },
    /// bf16.
    Bf16 {
        /// `[m, k]`.
        a: &'a DeviceBuffer<bf16>,
        /// `[n, k]`.
        b: &'a DeviceBuffer<bf16>,
    },
    /// f32, multiplied in f32 (`CUBLAS_COMPUTE_32F` never rounds inputs to TF32).
    F32 {
        /// `[m, k]`.
        a: &'a DeviceBuffer<f32>,
        /// `[n, k]`.
        b: &'a DeviceBuffer<f32>,
    },
}

/// The baseline's output, `[m, n]` row-major.
#[derive(Debug)]
pub enum LtOutput<'a> {
    /// f32.
    F32(&'a mut DeviceBuffer<f32>),
    /// bf16.
    Bf16(&'a mut DeviceBuffer<bf16>),
}

fn fp8_type(f: Fp8Format) -> sys::cudaDataType {
    match f {
        Fp8Format::E4M3 => sys::cudaDataType::CUDA_R_8F_E4M3,
        Fp8Format::E5M2 => sys::cudaDataType::CUDA_R_8F_E5M2,
    }
}

/// Owns cuBLASLt descriptors and destroys them on every path out.
struct Descriptors {
    matmul: sys::cublasLtMatmulDesc_t,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
    pref: Option<sys::cublasLtMatmulPreference_t>,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created once by cuBLASLt and is destroyed once, here.
        unsafe {
            for l in &self.layouts {
                let _ = lt::destroy_matrix_layout(*l);
            }
            if let Some(p) = self.pref {
                let _ = lt::destroy_matmul_pref(p);
            }
            let _ = lt::destroy_matmul_desc(self.matmul);
        }
    }
}

fn set_desc<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, value: &T) -> Result<()> {
    // SAFETY: `desc` is live; `value` points to a T of the size cuBLASLt expects for `attr`
    // (the callers pass i32 for transposes and FAST_ACCUM, u64 device pointers for scales).
    unsafe { lt::set_matmul_desc_attribute(desc, attr, value as *const T as *const c_void, size_of::<T>()) }
        .map_err(|e| lt_error("cublasLtMatmulDescSetAttribute", e))
}

impl CublasLt {
    /// A handle on `device` and a 32 MiB workspace; `NoGpu` if libcublasLt is missing.
    pub fn new(device: &CudaDevice) -> Result<Self> {
        if !cublaslt_present() {
            return Err(Error::NoGpu {
                reason: "libcublasLt is not installed (needed only for the cuBLASLt baseline)".into(),
            });
        }
        device
            .context()
            .bind_to_thread()
            .map_err(|e| super::error::cuda_error("cuCtxSetCurrent", e))?;
        let handle = lt::create_handle().map_err(|e| lt_error("cublasLtCreate", e))?;
        let workspace = device.alloc_zeros::<u8>(WORKSPACE_BYTES, MemoryCategory::Workspace)?;
        Ok(CublasLt { handle, workspace })
    }

    /// `D = alpha * A B^T` (times both scale_invs for FP8) on the device's stream; see the module docs
    /// for the layout. `m x n x k` with A `[m, k]`, B `[n, k]`, D `[m, n]`.
    pub fn matmul(
        &mut self,
        device: &CudaDevice,
        (m, n, k): (usize, usize, usize),
        inputs: LtInputs,
        out: LtOutput,
        alpha: f32,
    ) -> Result<()> {
        let check = |what: &str, len: usize, want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(Error::KernelArgs {
                    kernel: "cublaslt",
                    detail: format!("{what} has {len} elements, {m}x{n}x{k} needs {want}"),
                })
            }
        };
        let (a_type, b_type, a_len, b_len) = match &inputs {
            LtInputs::Fp8 { a, b, .. } => (fp8_type(a.1), fp8_type(b.1), a.0.len(), b.0.len()),
            LtInputs::Bf16 { a, b } => (
                sys::cudaDataType::CUDA_R_16BF,
                sys::cudaDataType::CUDA_R_16BF,
                a.len(),
                b.len(),
            ),
            LtInputs::F32 { a, b } => (
                sys::cudaDataType::CUDA_R_32F,
                sys::cudaDataType::CUDA_R_32F,
                a.len(),
                b.len(),
            ),
        };
        check("A", a_len, m * k)?;
        check("B", b_len, n * k)?;
        let (d_type, d_len) = match &out {
            LtOutput::F32(d) => (sys::cudaDataType::CUDA_R_32F, d.len()),
            LtOutput::Bf16(d) => (sys::cudaDataType::CUDA_R_16BF, d.len()),
        };
        check("D", d_len, m * n)?;
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| lt_error("cublasLtMatmulDescCreate", e))?;
        let mut d = Descriptors {
            matmul: desc,
            layouts: Vec::new(),
            pref: None,
        };
        set_desc(
            desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &CUBLAS_OP_T,
        )?;
        set_desc(
            desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &CUBLAS_OP_N,
        )?;
        let stream = device.stream();
        if let LtInputs::Fp8 {
            a_scale_inv,
            b_scale_inv,
            fast_accum,
            ..
        } = &inputs
        {
            // Everything runs on the device's one stream, so plain addresses suffice (as in the launchers).
            let (pa, pb) = (a_scale_inv.address(device), b_scale_inv.address(device));
            // cuBLASLt's A is our B, its B our A.
            set_desc(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &pb,
            )?;
            set_desc(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &pa,
            )?;
            set_desc(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                &(*fast_accum as i8),
            )?;
        }
        let layout = |t: sys::cudaDataType, rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(t, rows as u64, cols as u64, ld as i64)
                .map_err(|e| lt_error("cublasLtMatrixLayoutCreate", e))
        };
        // Column-major views (module docs): our B as K x N, our A as K x M, D as N x M.
        let lt_a = layout(b_type, k, n, k)?;
        d.layouts.push(lt_a);
        let lt_b = layout(a_type, k, m, k)?;
        d.layouts.push(lt_b);
        let lt_d = layout(d_type, n, m, n)?;
        d.layouts.push(lt_d);
        let pref = lt::create_matmul_pref().map_err(|e| lt_error("cublasLtMatmulPreferenceCreate", e))?;
        d.pref = Some(pref);
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: `pref` is live; the attribute takes a u64 byte count.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                size_of::<u64>(),
            )
        }
        .map_err(|e| lt_error("cublasLtMatmulPreferenceSetAttribute", e))?;
        // SAFETY: every descriptor is live (owned by `d`); C = D's layout.
        let heuristic = unsafe { lt::get_matmul_algo_heuristic(self.handle, desc, lt_a, lt_b, lt_d, lt_d, pref) }
            .map_err(|e| lt_error("cublasLtMatmulAlgoGetHeuristic", e))?;
        let (a_ptr, b_ptr) = match &inputs {
            LtInputs::Fp8 { a, b, .. } => (a.0.address(device), b.0.address(device)),
            LtInputs::Bf16 { a, b } => (a.address(device), b.address(device)),
            LtInputs::F32 { a, b } => (a.address(device), b.address(device)),
        };
        let ws_ptr = self.workspace.address_mut(device);
        let beta = 0.0f32;
        let run = |d_ptr: u64| {
            // SAFETY: descriptors live in `d`; A, B, D and the workspace are live device buffers
            // whose lengths were checked against the layouts; beta = 0 so C (= D) is not read;
            // the call is ordered on the device's stream.
            unsafe {
                lt::matmul(
                    self.handle,
                    desc,
                    &alpha as *const f32 as *const c_void,
                    &beta as *const f32 as *const c_void,
                    b_ptr as *const c_void,
                    lt_a,
                    a_ptr as *const c_void,
                    lt_b,
                    d_ptr as *const c_void,
                    lt_d,
                    d_ptr as *mut c_void,
                    lt_d,
                    &heuristic.algo,
                    ws_ptr as *mut c_void,
                    WORKSPACE_BYTES,
                    stream.cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(|e| lt_error("cublasLtMatmul", e))
        };
        match out {
            LtOutput::F32(o) => run(o.address_mut(device)),
            LtOutput::Bf16(o) => run(o.address_mut(device)),
        }
    }
}
