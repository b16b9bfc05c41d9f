//! Timing of the portable CUDA GEMMs against cuBLASLt in one process: a CUDA-event
//! timer and [`bench_case`], which `fp8 bench gemm --backend cuda` can call.

use cudarc::driver::sys::CUevent_flags;
use half::bf16;

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::cublaslt::{CublasLt, LtInputs, LtOutput, cublaslt_present};
use super::error::CudaResultExt;
use super::gemm::{DeviceGemmParams, DeviceOperand, DeviceOutput, DeviceScales};
use super::gemm_dispatch::{GemmInputs, cached_kernel};
use crate::device::MemoryCategory;
use crate::error::{Error, Result};
use crate::format::{Fp8Format, Overflow};

/// Median milliseconds of `runs` calls of `f` (each timed by a pair of CUDA events on the
/// device's stream) after `warmup` untimed calls.
pub fn median_ms(device: &CudaDevice, warmup: usize, runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let ctx = device.context();
    let mut times = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        let start = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .call("cuEventCreate")?;
        let end = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .call("cuEventCreate")?;
        start.record(device.stream()).call("cuEventRecord")?;
        f()?;
        end.record(device.stream()).call("cuEventRecord")?;
        times.push(start.elapsed_ms(&end).call("cuEventElapsedTime")? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The input dtypes of a benchmarked GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchInputs {
    /// E4M3 x E4M3 (forward), per-tensor scales.
    Fp8E4M3,
    /// E5M2 x E4M3 (dgrad/wgrad), per-tensor scales.
    Fp8E5M2xE4M3,
    /// bf16 x bf16.
    Bf16,
}

/// One GEMM to time: `D [m, n] = A [m, k] . B [n, k]^T`, bf16 output.
#[derive(Clone, Copy, Debug)]
pub struct BenchCase {
    /// Rows of A and D.
    pub m: usize,
    /// Rows of B, columns of D.
    pub n: usize,
    /// Reduction dimension.
    pub k: usize,
    /// Input dtypes.
    pub inputs: BenchInputs,
    /// Our kernel's split accumulation (FP8); cuBLASLt's fast accumulation is its opposite.
    pub split_accumulator: bool,
    /// Untimed calls before timing.
    pub warmup: usize,
    /// Timed calls (the median is reported).
    pub runs: usize,
}

/// What [`bench_case`] measured.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// Our kernel's function name.
    pub kernel: &'static str,
    /// Median ms of our kernel.
    pub ours_ms: f64,
    /// Median ms of cuBLASLt on the same buffers (None without libcublasLt).
    pub cublaslt_ms: Option<f64>,
    /// `2 m n k / time` of ours.
    pub ours_tflops: f64,
    /// Same for cuBLASLt.
    pub cublaslt_tflops: Option<f64>,
    /// max |ours - cuBLASLt| over the bf16 outputs, and max |cuBLASLt|, for a sanity check.
    pub max_abs_diff: Option<(f32, f32)>,
}

/// Deterministic values in (-1, 1) (a 64-bit LCG: benches need no statistical quality).
fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn fp8_codes(n: usize, seed: u64, format: Fp8Format) -> Result<Vec<u8>> {
    let values = pseudo_random(n, seed);
    let mut codes = vec![0u8; n];
    // Values in (-1, 1) times 64 spread over most of both formats' binades.
    crate::convert::quantize(&values, &mut codes, format, 64.0, Overflow::Saturate)?;
    Ok(codes)
}

/// Times our kernel and cuBLASLt on the same random inputs (bf16 output, per-tensor
/// scales of 1/64 for FP8) and compares their outputs. Inputs are uploaded once; at
/// 8192^3 each operand (64-128 MiB) is larger than L2, so no rotation is needed there.
pub fn bench_case(device: &CudaDevice, case: &BenchCase) -> Result<BenchResult> {
    let (m, n, k) = (case.m, case.n, case.k);
    let cat = MemoryCategory::Workspace;
    let mut ours_out = device.alloc_zeros::<bf16>(m * n, MemoryCategory::Activations)?;
    let scale_inv = device.upload(&[1.0f32 / 64.0], cat)?;
    enum Inputs {
        Fp8(DeviceBuffer<u8>, DeviceBuffer<u8>, Fp8Format, Fp8Format),
        Bf16(DeviceBuffer<bf16>, DeviceBuffer<bf16>),
    }
    let inputs = match case.inputs {
        BenchInputs::Fp8E4M3 | BenchInputs::Fp8E5M2xE4M3 => {
            let fa = if case.inputs == BenchInputs::Fp8E4M3 {
                Fp8Format::E4M3
            } else {
                Fp8Format::E5M2
            };
            let a = device.upload(&fp8_codes(m * k, 1, fa)?, cat)?;
            let b = device.upload(&fp8_codes(n * k, 2, Fp8Format::E4M3)?, cat)?;
            Inputs::Fp8(a, b, fa, Fp8Format::E4M3)
        }
        BenchInputs::Bf16 => {
            let to_bf16 = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
            let a = device.upload(&to_bf16(pseudo_random(m * k, 1)), cat)?;
            let b = device.upload(&to_bf16(pseudo_random(n * k, 2)), cat)?;
            Inputs::Bf16(a, b)
        }
    };
    let (a_op, b_op, gemm_inputs) = match &inputs {
        Inputs::Fp8(a, b, fa, fb) => (
            DeviceOperand::Fp8 {
                format: *fa,
                codes: a,
                rows: m,
                cols: k,
                scales: DeviceScales::PerTensor(&scale_inv),
            },
            DeviceOperand::Fp8 {
                format: *fb,
                codes: b,
                rows: n,
                cols: k,
                scales: DeviceScales::PerTensor(&scale_inv),
            },
            GemmInputs::Fp8(*fa, *fb),
        ),
        Inputs::Bf16(a, b) => (
            DeviceOperand::Bf16 {
                data: a,
                rows: m,
                cols: k,
            },
            DeviceOperand::Bf16 {
                data: b,
                rows: n,
                cols: k,
            },
            GemmInputs::Bf16,
        ),
    };
    let kernel = cached_kernel(device.info().compute_capability, gemm_inputs)?.function;
    let ours_ms = median_ms(device, case.warmup, case.runs, || {
        device
            .gemm(
                &a_op,
                &b_op,
                DeviceOutput::Bf16(&mut ours_out),
                DeviceGemmParams {
                    alpha: 1.0,
                    split_accumulator: case.split_accumulator,
                    ..Default::default()
                },
            )
            .map(|_| ())
    })?;
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let tflops = |ms: f64| flops / (ms * 1e-3) / 1e12;
    let mut result = BenchResult {
        kernel,
        ours_ms,
        cublaslt_ms: None,
        ours_tflops: tflops(ours_ms),
        cublaslt_tflops: None,
        max_abs_diff: None,
    };
    if !cublaslt_present() {
        return Ok(result);
    }
    let mut lt = CublasLt::new(device)?;
    let mut lt_out = device.alloc_zeros::<bf16>(m * n, MemoryCategory::Activations)?;
    let lt_inputs = match &inputs {
        Inputs::Fp8(a, b, fa, fb) => LtInputs::Fp8 {
            a: (a, *fa),
            b: (b, *fb),
            a_scale_inv: &scale_inv,
            b_scale_inv: &scale_inv,
            fast_accum: !case.split_accumulator,
        },
        Inputs::Bf16(a, b) => LtInputs::Bf16 { a, b },
    };
    let lt_ms = median_ms(device, case.warmup, case.runs, || {
        lt.matmul(device, (m, n, k), lt_inputs, LtOutput::Bf16(&mut lt_out), 1.0)
    })?;
    let ours = device.download(&ours_out)?;
    let theirs = device.download(&lt_out)?;
    let (diff, max_ref) = ours.iter().zip(&theirs).fold((0.0f32, 0.0f32), |(d, r), (x, y)| {
        let (x, y) = (x.to_f32(), y.to_f32());
        (d.max((x - y).abs()), r.max(y.abs()))
    });
    if !diff.is_finite() {
        return Err(Error::KernelArgs {
            kernel: "bench_case",
            detail: format!("ours and cuBLASLt differ by {diff} at {m}x{n}x{k}"),
        });
    }
    result.cublaslt_ms = Some(lt_ms);
    result.cublaslt_tflops = Some(tflops(lt_ms));
    result.max_abs_diff = Some((diff, max_ref));
    Ok(result)
}
