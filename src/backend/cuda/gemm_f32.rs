//! The f32 reference GEMM on the GPU: cuBLASLt with f32 inputs and
//! `CUBLAS_COMPUTE_32F` (TF32 off), computing the plain product `P = A B^T`;
//! the epilogue (`alpha`, bias, `beta * old`, the amax and the output cast)
//! runs on the host in the CPU GEMM's order, on the downloaded `P`. It is the
//! staged backend's path for `Operand::F32` (fp32 training on a GPU).
//!
//! Contract against the CPU f32 GEMM: a bound, not bits. Both sum the same
//! exact-in-f64 products in f32 in different orders (cuBLASLt's is its own
//! and may change with the algorithm it picks), so each is within
//! `gamma_K (|A| |B|^T)_ij` of the exact product, `gamma_K = K u / (1 - K u)`,
//! `u = 2^-24`, and the two differ by at most `2 gamma_K (|A| |B|^T)_ij`
//! before the epilogue (`docs/cuda-backend.md`, GEMM operands).

use std::borrow::Cow;

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::cublaslt::{CublasLt, LtInputs, LtOutput};
use crate::error::Result;
use crate::gemm::{GemmParams, GemmReport, Mat, Operand, Output, plan};
use crate::memory::MemoryCategory;

const WORKSPACE: MemoryCategory = MemoryCategory::Workspace;

/// The elementwise bound between two f32 sums of the same `k` products in any orders:
/// `2 gamma_k |A| |B|^T` (module docs), for one output whose `sum |a_i b_i|` is `abs_dot`.
pub fn f32_order_bound(k: usize, abs_dot: f64) -> f64 {
    let ku = k as f64 * f64::from(f32::EPSILON) / 2.0;
    2.0 * ku / (1.0 - ku).max(f64::MIN_POSITIVE) * abs_dot
}

impl CudaDevice {
    /// `p = a b^T` in f32 (`a [m, k]`, `b [n, k]`, `p [m, n]`, all row-major) by cuBLASLt with
    /// f32 compute, on the device's stream.
    pub fn gemm_f32(
        &self,
        lt: &mut CublasLt,
        a: &DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        (m, n, k): (usize, usize, usize),
        p: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        // The handle may have been made on another thread: this one needs the context current.
        self.context()
            .bind_to_thread()
            .map_err(|e| super::error::cuda_error("cuCtxSetCurrent", e))?;
        lt.matmul(self, (m, n, k), LtInputs::F32 { a, b }, LtOutput::F32(p), 1.0)
    }
}

/// `D = alpha P (+ bias[j]) (+ beta old)` in that order, written to `out` in its format;
/// returns max |D| before the output cast (NaN if any is NaN). `p` is `[m, n]` row-major and is
/// overwritten with D. It is the CPU GEMM's own epilogue ([`crate::gemm::cpu`]), so a product
/// equal to the CPU's gives the CPU's bits.
pub fn host_epilogue(p: &mut [f32], n: usize, params: &GemmParams, out: Output) -> Result<GemmReport> {
    crate::gemm::cpu::epilogue_of_product(p, n, params, out)
}

/// A plain f32 operand's K-major values (a transposed view is copied).
fn k_major<'a>(op: &Mat<'a, f32>) -> Cow<'a, [f32]> {
    op.k_major()
}

/// The host-side GEMM of two f32 operands on `device`: the arguments are checked like the
/// CPU GEMM's ([`plan`]), the operands go up K-major, cuBLASLt forms the product, which comes
/// back for [`host_epilogue`]. Its buffers are allocated per call (as [`super::gemm::gemm_host`]),
/// counted in the ledger as workspace.
pub fn gemm_f32_host(
    device: &CudaDevice,
    lt: &mut CublasLt,
    (a, b): (&Mat<f32>, &Mat<f32>),
    out: Output,
    params: &GemmParams,
) -> Result<GemmReport> {
    let (fa, fb) = (Operand::F32(*a), Operand::F32(*b));
    let shape = plan(&fa, &fb, &out, params)?;
    let (m, n, k) = (shape.m, shape.n, shape.k);
    let mut product = if m == 0 || n == 0 || k == 0 {
        vec![0.0f32; m * n]
    } else {
        let (a_d, b_d) = (
            device.upload(&k_major(a), WORKSPACE)?,
            device.upload(&k_major(b), WORKSPACE)?,
        );
        let mut p_d = device.alloc_zeros::<f32>(m * n, WORKSPACE)?;
        device.gemm_f32(lt, &a_d, &b_d, (m, n, k), &mut p_d)?;
        device.download(&p_d)?
    };
    host_epilogue(&mut product, n, params, out)
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;
    use crate::format::Fp8Format;
    use crate::gemm::cpu::gemm;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The host epilogue on the CPU GEMM's own plain product gives the CPU GEMM's bits for
    /// every output and epilogue: only the product differs between the backends.
    #[test]
    fn the_host_epilogue_on_the_cpu_product_is_the_cpu_gemm() {
        let (m, n, k) = (7, 9, 40);
        let (a, b) = (values(m * k, 1), values(n * k, 2));
        let (am, bm) = (Mat::new(&a, m, k).unwrap(), Mat::new(&b, n, k).unwrap());
        let (fa, fb) = (Operand::F32(am), Operand::F32(bm));
        let mut product = vec![0.0; m * n];
        gemm(&fa, &fb, Output::F32(&mut product), &GemmParams::default()).unwrap();
        let bias = values(n, 3);
        let old = values(m * n, 4);
        let params = GemmParams {
            alpha: 0.75,
            beta: -1.5,
            bias: Some((&bias).into()),
            ..GemmParams::default()
        };
        let (mut want, mut got) = (old.clone(), old.clone());
        let want_report = gemm(&fa, &fb, Output::F32(&mut want), &params).unwrap();
        let got_report = host_epilogue(&mut product.clone(), n, &params, Output::F32(&mut got)).unwrap();
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(got_report.amax.to_bits(), want_report.amax.to_bits());
        // Narrow outputs: no beta (the CPU GEMM accumulates into f32 outputs only).
        let params = GemmParams {
            alpha: 2.0,
            bias: Some((&bias).into()),
            ..GemmParams::default()
        };
        let (mut want, mut got) = (vec![bf16::ZERO; m * n], vec![bf16::ZERO; m * n]);
        gemm(&fa, &fb, Output::Bf16(&mut want), &params).unwrap();
        host_epilogue(&mut product.clone(), n, &params, Output::Bf16(&mut got)).unwrap();
        assert_eq!(got, want);
        let (mut want, mut got) = (vec![0u8; m * n], vec![0u8; m * n]);
        let fp8 = |d| Output::Fp8 {
            codes: d,
            format: Fp8Format::E4M3,
            scale: 16.0,
        };
        let w = gemm(&fa, &fb, fp8(&mut want), &params).unwrap();
        let g = host_epilogue(&mut product, n, &params, fp8(&mut got)).unwrap();
        assert_eq!(got, want);
        assert_eq!(g.amax.to_bits(), w.amax.to_bits());
    }

    #[test]
    fn a_nan_result_makes_the_amax_nan_and_the_order_bound_grows_with_k() {
        let mut p = vec![1.0, f32::NAN, -3.0, 2.0];
        let mut d = vec![0.0; 4];
        let r = host_epilogue(&mut p, 2, &GemmParams::default(), Output::F32(&mut d)).unwrap();
        assert!(r.amax.is_nan());
        let mut p = vec![1.0, -5.0, -3.0, 2.0];
        let r = host_epilogue(&mut p, 2, &GemmParams::default(), Output::F32(&mut d)).unwrap();
        assert_eq!(r.amax, 5.0);
        // 2 K u / (1 - K u) with u = 2^-24: 64 products of |a b| summing to 10.
        let bound = f32_order_bound(64, 10.0);
        let first_order = 2.0 * 64.0 * 2f64.powi(-24) * 10.0;
        // The 1 / (1 - K u) factor adds K u = 3.8e-6 relative.
        assert!(bound > first_order && bound < first_order * (1.0 + 1e-5), "{bound}");
        assert!(f32_order_bound(4096, 10.0) > 60.0 * bound);
    }
}
