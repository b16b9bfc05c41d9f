//! Launchers of `cuda/attention_mma.cu`: the causal attention core on tensor
//! cores (mma.sync m16n8k16 on bf16/f16 operands, f32 accumulators), forward
//! and backward, flash-attention style tiles, the same rounding points as the
//! simple kernels of `cuda/attention.cu` and the CPU twin (`docs/numerics.md`,
//! Attention), held to the same normwise contract.
//!
//! On by default since the H200 run of 2026-11-28 (their GPU tests, memcheck and self-check
//! passed; the layer 452 -> 102 ms): `FP8_CUDA_ATTENTION_MMA=0` keeps the simple
//! kernels; unset or `1` uses these kernels where they apply (compute
//! dtype bf16 or fp16, head_dim a multiple of 16 up to 128, compute capability
//! 8.0 or newer, 16-byte aligned tensors) once a per-device, per-dtype
//! self-check ([`self_check`]) has matched them with the simple kernels; on a
//! mismatch (or a self-check that cannot run) one warning line goes to stderr
//! and the simple kernels run for the rest of the process. The choice is
//! [`MmaSelector`]'s, testable without a GPU with an injected check.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::attention_simple::{base_params, check_grid, simple_backward, simple_forward};
use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::env_switch;
use super::error::CudaResultExt;
use super::op_args::{SHARED_LIMIT, dtype_code};
use super::params::Fp8AttentionParams;
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;
use crate::ops::AttentionShape;
use crate::tensor::Dtype;

/// The kernel file (`cuda/attention_mma.cu`).
pub const MODULE: &str = "attention_mma";
/// The switch: unset or `1` enables the tensor-core kernels (after the self-check), `0` not.
pub const ENV: &str = "FP8_CUDA_ATTENTION_MMA";
/// Threads per block of every kernel of the file (4 warps; `attn_mma::NTHREADS`).
pub const THREADS: u32 = 128;
/// Rows per block: query rows (forward, dq) or key rows (dk/dv), 16 per warp.
pub const BLOCK_ROWS: usize = 64;
/// The largest head_dim the kernels take (a multiple of 16 up to it).
pub const MAX_HEAD_DIM: usize = 128;

/// One kernel of the three the attention core runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Forward: out and lse.
    Forward,
    /// Backward, first: delta and dq.
    BackwardDq,
    /// Backward, second (reads delta): dk and dv.
    BackwardDkdv,
}

/// A compiled variant: the 16-bit operand dtype and the head width it pads head_dim to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// `Dtype::Bf16` or `Dtype::F16`.
    pub dtype: Dtype,
    /// 64 (head_dim <= 64) or 128.
    pub width: usize,
}

/// The variant for a call, or `None` where only the simple kernels apply: f32,
/// or head_dim not a positive multiple of 16 up to [`MAX_HEAD_DIM`].
pub fn variant(dtype: Dtype, head_dim: usize) -> Option<Variant> {
    if dtype == Dtype::F32 || head_dim == 0 || !head_dim.is_multiple_of(16) || head_dim > MAX_HEAD_DIM {
        return None;
    }
    Some(Variant {
        dtype,
        width: if head_dim <= 64 { 64 } else { 128 },
    })
}

/// Whether a GPU of this compute capability runs the kernels (bf16 mma.sync: sm_80 on).
pub fn capability_supported(compute_capability: (u32, u32)) -> bool {
    compute_capability >= (8, 0)
}

/// Whether every address is 16-byte aligned (the kernels read rows as float4).
pub fn aligned(addresses: &[u64]) -> bool {
    addresses.iter().all(|a| a.is_multiple_of(16))
}

/// The kernel's name in `cuda/attention_mma.cu`.
pub fn kernel_name(pass: Pass, v: Variant) -> &'static str {
    use Pass::*;
    match (pass, v.dtype == Dtype::F16, v.width == 64) {
        (Forward, false, true) => "fp8_attention_mma_forward_bf16_d64",
        (Forward, false, false) => "fp8_attention_mma_forward_bf16_d128",
        (Forward, true, true) => "fp8_attention_mma_forward_f16_d64",
        (Forward, true, false) => "fp8_attention_mma_forward_f16_d128",
        (BackwardDq, false, true) => "fp8_attention_mma_backward_dq_bf16_d64",
        (BackwardDq, false, false) => "fp8_attention_mma_backward_dq_bf16_d128",
        (BackwardDq, true, true) => "fp8_attention_mma_backward_dq_f16_d64",
        (BackwardDq, true, false) => "fp8_attention_mma_backward_dq_f16_d128",
        (BackwardDkdv, false, true) => "fp8_attention_mma_backward_dkdv_bf16_d64",
        (BackwardDkdv, false, false) => "fp8_attention_mma_backward_dkdv_bf16_d128",
        (BackwardDkdv, true, true) => "fp8_attention_mma_backward_dkdv_f16_d64",
        (BackwardDkdv, true, false) => "fp8_attention_mma_backward_dkdv_f16_d128",
    }
}

/// Every kernel of the file (what `scripts/check-sass.sh` lists under `attention_mma`).
pub fn all_kernel_names() -> Vec<&'static str> {
    let mut names = Vec::new();
    for pass in [Pass::Forward, Pass::BackwardDq, Pass::BackwardDkdv] {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for width in [64, 128] {
                names.push(kernel_name(pass, Variant { dtype, width }));
            }
        }
    }
    names
}

/// Dynamic shared memory of a kernel: 16-bit tiles of `width` columns; forward
/// K and V (64 rows each), dq K and V (32 rows each, which also stage the 64
/// rows of Q and dO), dk/dv K and V (64 rows) and Q and dO (32 rows).
pub fn shared_bytes(pass: Pass, width: usize) -> usize {
    let rows = match pass {
        Pass::Forward => 64 + 64,
        Pass::BackwardDq => 32 + 32,
        Pass::BackwardDkdv => 64 + 64 + 32 + 32,
    };
    rows * width * 2
}

/// The launch of one kernel: grid `(ceil(seq / 64), heads, batch)`, [`THREADS`] per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaLaunch {
    /// Row tiles, heads, sequences.
    pub grid: (u32, u32, u32),
    /// Dynamic shared memory per block (at most the 48 KiB every GPU gives without opt-in).
    pub shared_bytes: u32,
}

/// Sizes the launch of `pass` for a non-empty `shape`.
pub fn plan(pass: Pass, v: Variant, shape: &AttentionShape) -> Result<MmaLaunch> {
    let kernel = kernel_name(pass, v);
    check_grid(kernel, shape)?;
    if shape.seq == 0 || shape.heads == 0 || shape.batch == 0 {
        return Err(Error::KernelArgs {
            kernel,
            detail: format!("nothing to launch for {shape:?}"),
        });
    }
    let tiles = shape.seq.div_ceil(BLOCK_ROWS);
    let tiles = u32::try_from(tiles)
        .ok()
        .filter(|&t| t <= i32::MAX as u32)
        .ok_or_else(|| Error::KernelArgs {
            kernel,
            detail: format!("{tiles} row tiles exceed the grid limit of 2^31-1 blocks"),
        })?;
    let shared = shared_bytes(pass, v.width);
    debug_assert!(shared <= SHARED_LIMIT);
    Ok(MmaLaunch {
        grid: (tiles, shape.heads as u32, shape.batch as u32),
        shared_bytes: shared as u32,
    })
}

/// `(rtol, atol)` of the lse comparison: f32 sums in another order (an online max and sum
/// over key tiles against the simple kernel's whole-row max, then sum), with room for
/// `expf`'s last-bit differences.
pub const LSE_TOLERANCES: (f32, f32) = (1e-5, 1e-4);

/// The attention contract's `(rtol, atol)` of a compute dtype (`docs/numerics.md`, Op
/// contracts), in the f32 the comparison runs in.
pub fn tolerances(dtype: Dtype) -> (f32, f32) {
    let (rtol, atol) = crate::ops::attention::contract_tolerances(dtype);
    (rtol as f32, atol as f32)
}

/// The worst element of a normwise comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Breach {
    /// Its index.
    pub index: usize,
    /// The fast path's value.
    pub fast: f32,
    /// The reference's value.
    pub reference: f32,
    /// The distance allowed there.
    pub allowed: f32,
}

/// The first element where `|fast - reference| <= atol + rtol (|reference| + max |reference|)`
/// fails (NaN anywhere fails, and so does a length mismatch, at the shorter length).
pub fn normwise_breach(fast: &[f32], reference: &[f32], rtol: f32, atol: f32) -> Option<Breach> {
    let max = reference.iter().fold(0.0f32, |m, r| m.max(r.abs()));
    let n = fast.len().min(reference.len());
    for (index, (&f, &r)) in fast.iter().zip(reference).enumerate() {
        let allowed = atol + rtol * (r.abs() + max);
        // Written so that NaN (no ordering) fails too.
        let within = (f - r).abs() <= allowed;
        if !within {
            return Some(Breach {
                index,
                fast: f,
                reference: r,
                allowed,
            });
        }
    }
    (fast.len() != reference.len()).then_some(Breach {
        index: n,
        fast: f32::NAN,
        reference: f32::NAN,
        allowed: 0.0,
    })
}

/// One output of a self-check, from both paths.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedOutput {
    /// What it is (`"out d128"`, `"dk d64"`, ...).
    pub name: String,
    /// The tensor-core kernels' values.
    pub fast: Vec<f32>,
    /// The simple kernels' values.
    pub reference: Vec<f32>,
}

/// Compares every output of a self-check with the contract of `dtype`; the first breach, described.
pub fn compare(outputs: &[CheckedOutput], dtype: Dtype) -> std::result::Result<(), String> {
    for o in outputs {
        // lse is an f32 statistic in every dtype: the same sums in another order, so a bound
        // near f32's (the dtype's would let an lse off by 0.1 pass).
        let (rtol, atol) = match o.name.starts_with("lse") {
            true => LSE_TOLERANCES,
            false => tolerances(dtype),
        };
        if let Some(b) = normwise_breach(&o.fast, &o.reference, rtol, atol) {
            return Err(format!(
                "{} [{}]: {} against the simple kernel's {} (allowed {})",
                o.name, b.index, b.fast, b.reference, b.allowed
            ));
        }
    }
    Ok(())
}

/// Whether the tensor-core kernels run, per device and dtype: off when disabled
/// (`FP8_CUDA_ATTENTION_MMA=0`); else on after a self-check that passed, once.
pub struct MmaSelector {
    enabled: bool,
    /// `(ordinal, dtype code)` -> `None` (passed) or the failure.
    checks: Mutex<HashMap<(usize, u32), Option<String>>>,
    warnings: Mutex<Vec<String>>,
}

impl MmaSelector {
    /// A selector, the fast path enabled or not.
    pub fn new(enabled: bool) -> Self {
        MmaSelector {
            enabled,
            checks: Mutex::new(HashMap::new()),
            warnings: Mutex::new(Vec::new()),
        }
    }

    /// The process-wide selector (`FP8_CUDA_ATTENTION_MMA` read once).
    pub fn global() -> &'static MmaSelector {
        static GLOBAL: OnceLock<MmaSelector> = OnceLock::new();
        GLOBAL.get_or_init(|| MmaSelector::new(env_switch::on(ENV)))
    }

    /// Whether the fast path is enabled at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Warnings issued so far (each also printed once to stderr).
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether device `ordinal` runs `dtype` on the tensor-core kernels. `capable`:
    /// sm_80 or newer and a build with kernels. `check` runs the self-check (both
    /// paths' outputs); it is called at most once per device and dtype, and only
    /// when enabled and capable. A failure is warned about once and means `false`
    /// from then on.
    pub fn select<F>(&self, ordinal: usize, dtype: Dtype, capable: bool, check: F) -> bool
    where
        F: FnOnce() -> Result<Vec<CheckedOutput>>,
    {
        if !self.enabled || !capable {
            return false;
        }
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        let state = checks.entry((ordinal, dtype_code(dtype))).or_insert_with(|| {
            let failure = match check() {
                Ok(outputs) => compare(&outputs, dtype).err(),
                Err(e) => Some(format!("the self-check did not run: {e}")),
            };
            if let Some(detail) = &failure {
                let warning = format!(
                    "fp8-engine: warning: the tensor-core attention kernels failed their {dtype:?} \
                     self-check on GPU {ordinal} ({detail}); using the simple attention kernels for this process"
                );
                eprintln!("{warning}");
                self.warnings.lock().unwrap_or_else(|p| p.into_inner()).push(warning);
            }
            failure
        });
        state.is_none()
    }
}

/// Whether this device can run the kernels at all: sm_80+ and a build that has them.
pub fn device_capable(device: &CudaDevice) -> bool {
    capability_supported(device.info().compute_capability) && crate::backend::kernels::fatbin(MODULE).is_some()
}

/// The variant to run a call on, or `None` for the simple kernels: asks
/// [`variant`], the alignment of the tensors in `p`, and the process-wide
/// selector (running the self-check on first use).
pub fn route(device: &CudaDevice, shape: &AttentionShape, dtype: Dtype, p: &Fp8AttentionParams) -> Option<Variant> {
    let selector = MmaSelector::global();
    if !selector.enabled() {
        return None;
    }
    let v = variant(dtype, shape.head_dim)?;
    let used = [p.q, p.k, p.v, p.out, p.lse, p.dout, p.delta, p.dq, p.dk, p.dv];
    let set: Vec<u64> = used.into_iter().filter(|&a| a != 0).collect();
    if !aligned(&set) {
        return None;
    }
    selector
        .select(device.info().ordinal, dtype, device_capable(device), || {
            self_check(device, dtype)
        })
        .then_some(v)
}

/// Launches one kernel with [`THREADS`]-thread blocks.
fn launch(device: &CudaDevice, pass: Pass, v: Variant, shape: &AttentionShape, p: Fp8AttentionParams) -> Result<()> {
    let name = kernel_name(pass, v);
    let plan = plan(pass, v, shape)?;
    let func = device.function(MODULE, name)?;
    let config = LaunchConfig {
        grid_dim: plan.grid,
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: plan.shared_bytes,
    };
    let mut builder = device.stream().launch_builder(&func);
    builder.arg(&p);
    // SAFETY: the kernel's single parameter is Fp8AttentionParams (same header); the caller
    // (CudaDevice::attention_forward/backward or the self-check) filled every address the
    // kernel reads or writes from a live DeviceBuffer whose length matches the shape, the
    // addresses are 16-byte aligned (route), and all work is ordered on the device's stream.
    unsafe { builder.launch(config) }.call(name)?;
    Ok(())
}

/// The forward on tensor cores, on parameters filled as for the simple kernel (q, k, v, out, lse).
pub fn forward(device: &CudaDevice, shape: &AttentionShape, v: Variant, p: Fp8AttentionParams) -> Result<()> {
    launch(device, Pass::Forward, v, shape, p)
}

/// The backward on tensor cores (dq then dk/dv, in stream order: dq writes delta first).
pub fn backward(device: &CudaDevice, shape: &AttentionShape, v: Variant, p: Fp8AttentionParams) -> Result<()> {
    launch(device, Pass::BackwardDq, v, shape, p)?;
    launch(device, Pass::BackwardDkdv, v, shape, p)
}

/// The self-check's inputs: one sequence of 200 tokens (four 64-row tiles, the
/// last partial), 2 heads, values in [-1, 1) rounded to the dtype (q and k
/// twice that, for peaked rows), from a fixed generator.
#[derive(Clone, Debug)]
pub struct SelfCheckProblem {
    /// The shape.
    pub shape: AttentionShape,
    /// 1 / sqrt(head_dim).
    pub scale: f32,
    /// Queries.
    pub q: Vec<f32>,
    /// Keys.
    pub k: Vec<f32>,
    /// Values.
    pub v: Vec<f32>,
    /// Output gradient.
    pub dout: Vec<f32>,
}

impl SelfCheckProblem {
    /// The problem at `head_dim` in `dtype`, seeded by `seed`.
    pub fn new(batch: usize, seq: usize, heads: usize, head_dim: usize, dtype: Dtype, seed: u64) -> Self {
        let shape = AttentionShape::new(batch, seq, heads, head_dim);
        let n = batch * seq * heads * head_dim;
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut values = |amplitude: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    // xorshift64*: the top 24 bits as a fraction in [0, 1).
                    state ^= state >> 12;
                    state ^= state << 25;
                    state ^= state >> 27;
                    let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                    let unit = bits as f32 / (1u64 << 24) as f32;
                    dtype.round((2.0 * unit - 1.0) * amplitude)
                })
                .collect()
        };
        let q = values(2.0);
        let k = values(2.0);
        let v = values(1.0);
        let dout = values(1.0);
        SelfCheckProblem {
            shape,
            scale: 1.0 / (head_dim as f32).sqrt(),
            q,
            k,
            v,
            dout,
        }
    }
}

/// All outputs of one problem on both paths, named after `tag`: forward (out,
/// lse) of each, then the backward of each from the simple forward's out and lse
/// (dq, dk, dv). The fast path's outputs start as NaN, so an element it never
/// writes fails the comparison.
pub fn run_both(
    device: &CudaDevice,
    problem: &SelfCheckProblem,
    dtype: Dtype,
    tag: &str,
) -> Result<Vec<CheckedOutput>> {
    const K: &str = "attention_mma (self-check)";
    let shape = problem.shape;
    let v = variant(dtype, shape.head_dim).ok_or_else(|| Error::KernelArgs {
        kernel: K,
        detail: format!("no tensor-core variant for {dtype:?} at head_dim {}", shape.head_dim),
    })?;
    let cat = MemoryCategory::Workspace;
    let n = problem.q.len();
    let stats = shape.batch * shape.heads * shape.seq;
    let nan = |len: usize| device.upload(&vec![f32::NAN; len], cat);
    let q = device.upload(&problem.q, cat)?;
    let k = device.upload(&problem.k, cat)?;
    let val = device.upload(&problem.v, cat)?;
    let dout = device.upload(&problem.dout, cat)?;
    let mut outs: Vec<DeviceBuffer<f32>> = Vec::new();
    for len in [n, stats, n, stats] {
        outs.push(nan(len)?);
    }
    let [mut out_ref, mut lse_ref, mut out_fast, mut lse_fast]: [DeviceBuffer<f32>; 4] =
        outs.try_into().map_err(|_| Error::KernelArgs {
            kernel: K,
            detail: "buffer count".into(),
        })?;
    let mut p = base_params(K, &shape, problem.scale, dtype)?;
    p.q = q.address(device);
    p.k = k.address(device);
    p.v = val.address(device);
    p.out = out_ref.address_mut(device);
    p.lse = lse_ref.address_mut(device);
    simple_forward(device, K, &shape, p)?;
    p.out = out_fast.address_mut(device);
    p.lse = lse_fast.address_mut(device);
    forward(device, &shape, v, p)?;

    let mut grads: Vec<DeviceBuffer<f32>> = Vec::new();
    for _ in 0..6 {
        grads.push(nan(n)?);
    }
    let mut delta_ref = device.alloc_zeros::<f32>(stats, cat)?;
    let mut delta_fast = device.alloc_zeros::<f32>(stats, cat)?;
    p.out = out_ref.address(device);
    p.lse = lse_ref.address(device);
    p.dout = dout.address(device);
    let mut results = Vec::new();
    for (path, chunk) in grads.chunks_mut(3).enumerate() {
        let [dq, dk, dv] = chunk else {
            unreachable!("chunks of 3")
        };
        p.dq = dq.address_mut(device);
        p.dk = dk.address_mut(device);
        p.dv = dv.address_mut(device);
        if path == 0 {
            p.delta = delta_ref.address_mut(device);
            simple_backward(device, K, &shape, p)?;
        } else {
            p.delta = delta_fast.address_mut(device);
            backward(device, &shape, v, p)?;
        }
    }
    let mut named = |name: &str, fast: &DeviceBuffer<f32>, reference: &DeviceBuffer<f32>| -> Result<()> {
        results.push(CheckedOutput {
            name: format!("{name} {tag}"),
            fast: device.download(fast)?,
            reference: device.download(reference)?,
        });
        Ok(())
    };
    named("out", &out_fast, &out_ref)?;
    named("lse", &lse_fast, &lse_ref)?;
    named("dq", &grads[3], &grads[0])?;
    named("dk", &grads[4], &grads[1])?;
    named("dv", &grads[5], &grads[2])?;
    Ok(results)
}

/// The self-check of `dtype` on `device`: batch 1, seq 200, 2 heads, at head_dim
/// 64, 80 (zero-padded to the 128 variant) and 128, and batch 2, seq 77, head_dim 32 (the
/// batch stride, the 64 variant's padding), both paths named explicitly
/// (never through the selector); compared by [`MmaSelector::select`] with the
/// dtype's normwise contract.
pub fn self_check(device: &CudaDevice, dtype: Dtype) -> Result<Vec<CheckedOutput>> {
    let mut outputs = Vec::new();
    for (i, head_dim) in [64, 80, 128].into_iter().enumerate() {
        let problem = SelfCheckProblem::new(1, 200, 2, head_dim, dtype, 17 + i as u64);
        outputs.extend(run_both(device, &problem, dtype, &format!("d{head_dim}"))?);
    }
    // Two sequences (the batch stride) and head_dim 32 zero-padded into the d64 variant.
    let problem = SelfCheckProblem::new(2, 77, 2, 32, dtype, 23);
    outputs.extend(run_both(device, &problem, dtype, "d32 batch 2")?);
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const fn shape(batch: usize, seq: usize, heads: usize, head_dim: usize) -> AttentionShape {
        AttentionShape::new(batch, seq, heads, head_dim)
    }

    fn outputs(fast: f32) -> Vec<CheckedOutput> {
        vec![CheckedOutput {
            name: "out d64".into(),
            fast: vec![1.0, fast],
            reference: vec![1.0, 0.5],
        }]
    }

    #[test]
    fn variants_cover_bf16_and_f16_at_multiples_of_16_up_to_128() {
        assert_eq!(variant(Dtype::F32, 64), None);
        assert_eq!(variant(Dtype::Bf16, 0), None);
        assert_eq!(variant(Dtype::Bf16, 24), None);
        assert_eq!(variant(Dtype::F16, 144), None);
        for (d, width) in [(16, 64), (48, 64), (64, 64), (80, 128), (112, 128), (128, 128)] {
            assert_eq!(
                variant(Dtype::Bf16, d),
                Some(Variant {
                    dtype: Dtype::Bf16,
                    width
                })
            );
            assert_eq!(
                variant(Dtype::F16, d),
                Some(Variant {
                    dtype: Dtype::F16,
                    width
                })
            );
        }
        assert!(!capability_supported((7, 5)));
        assert!(capability_supported((8, 0)) && capability_supported((9, 0)) && capability_supported((12, 0)));
        assert!(aligned(&[0, 256, 4096 + 16]));
        assert!(!aligned(&[256, 260]));
    }

    #[test]
    fn kernel_names_are_distinct_and_name_their_variant() {
        let names = all_kernel_names();
        assert_eq!(names.len(), 12);
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 12);
        let v = Variant {
            dtype: Dtype::F16,
            width: 128,
        };
        assert_eq!(
            kernel_name(Pass::BackwardDkdv, v),
            "fp8_attention_mma_backward_dkdv_f16_d128"
        );
        assert_eq!(
            kernel_name(Pass::Forward, variant(Dtype::Bf16, 64).unwrap()),
            "fp8_attention_mma_forward_bf16_d64"
        );
    }

    #[test]
    fn the_grid_is_row_tiles_by_heads_by_sequences_within_48_kib() {
        let v = variant(Dtype::Bf16, 128).unwrap();
        let l = plan(Pass::Forward, v, &shape(2, 2048, 32, 128)).unwrap();
        assert_eq!(
            l,
            MmaLaunch {
                grid: (32, 32, 2),
                shared_bytes: 32 * 1024
            }
        );
        // A partial last tile still gets its block.
        assert_eq!(
            plan(Pass::BackwardDq, v, &shape(1, 200, 2, 80)).unwrap().grid,
            (4, 2, 1)
        );
        assert_eq!(plan(Pass::BackwardDq, v, &shape(1, 1, 1, 80)).unwrap().grid, (1, 1, 1));
        for pass in [Pass::Forward, Pass::BackwardDq, Pass::BackwardDkdv] {
            for width in [64, 128] {
                assert!(shared_bytes(pass, width) <= SHARED_LIMIT, "{pass:?} {width}");
            }
        }
        assert_eq!(shared_bytes(Pass::BackwardDkdv, 128), 48 * 1024);
        assert_eq!(shared_bytes(Pass::BackwardDq, 64), 8 * 1024);
        assert!(plan(Pass::Forward, v, &shape(70_000, 16, 1, 128)).is_err());
        assert!(plan(Pass::Forward, v, &shape(1, 0, 1, 128)).is_err());
    }

    #[test]
    fn normwise_comparison_scales_with_the_largest_reference_and_fails_on_nan() {
        // max |ref| = 2: 0.01 allowed 1e-5 + 1.6e-2 * (0 + 2) = 0.03201 at a zero reference.
        let reference = [0.0, 2.0, -1.0];
        assert_eq!(normwise_breach(&[0.03, 2.0, -1.0], &reference, 1.6e-2, 1e-5), None);
        let b = normwise_breach(&[0.04, 2.0, -1.0], &reference, 1.6e-2, 1e-5).unwrap();
        assert_eq!(b.index, 0);
        assert!(normwise_breach(&[0.0, f32::NAN, -1.0], &reference, 1.6e-2, 1e-5).is_some());
        assert!(normwise_breach(&[0.0, 2.0], &reference, 1.6e-2, 1e-5).is_some());
        assert_eq!(
            normwise_breach(&[f32::NAN], &[f32::NAN], 1.0, 1.0).map(|b| b.index),
            Some(0)
        );
        assert!(compare(&outputs(0.5), Dtype::Bf16).is_ok());
        let e = compare(&outputs(0.6), Dtype::F16).unwrap_err();
        assert!(e.contains("out d64 [1]"), "{e}");
    }

    #[test]
    fn disabled_never_checks_and_never_selects() {
        let s = MmaSelector::new(false);
        assert!(!s.select(0, Dtype::Bf16, true, || panic!("no self-check when disabled")));
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn enabled_checks_once_per_device_and_dtype_then_selects() {
        let s = MmaSelector::new(true);
        let calls = Cell::new(0);
        for _ in 0..3 {
            assert!(s.select(0, Dtype::Bf16, true, || {
                calls.set(calls.get() + 1);
                Ok(outputs(0.5))
            }));
        }
        assert_eq!(calls.get(), 1);
        // Another dtype, another device: their own checks.
        assert!(s.select(0, Dtype::F16, true, || {
            calls.set(calls.get() + 1);
            Ok(outputs(0.5))
        }));
        assert!(s.select(1, Dtype::Bf16, true, || {
            calls.set(calls.get() + 1);
            Ok(outputs(0.5))
        }));
        assert_eq!(calls.get(), 3);
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn an_incapable_device_uses_the_simple_kernels_without_a_check() {
        let s = MmaSelector::new(true);
        assert!(!s.select(0, Dtype::Bf16, false, || panic!("no self-check on an sm_75 GPU")));
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn a_mismatch_or_a_failed_run_warns_once_and_falls_back_for_good() {
        let s = MmaSelector::new(true);
        assert!(!s.select(0, Dtype::Bf16, true, || Ok(outputs(0.9))));
        assert!(!s.select(0, Dtype::Bf16, true, || panic!("checked once")));
        assert_eq!(s.warnings().len(), 1);
        assert!(
            s.warnings()[0].starts_with("fp8-engine: warning: "),
            "{:?}",
            s.warnings()
        );
        assert!(s.warnings()[0].contains("out d64 [1]"), "{:?}", s.warnings());
        let failed = || {
            Err(Error::KernelArgs {
                kernel: "x",
                detail: "launch failed".into(),
            })
        };
        assert!(!s.select(1, Dtype::Bf16, true, failed));
        assert_eq!(s.warnings().len(), 2);
        assert!(s.warnings()[1].contains("did not run"), "{:?}", s.warnings());
    }

    #[test]
    fn the_self_check_problem_is_fixed_and_rounded_to_the_dtype() {
        let a = SelfCheckProblem::new(1, 200, 2, 64, Dtype::Bf16, 17);
        let b = SelfCheckProblem::new(1, 200, 2, 64, Dtype::Bf16, 17);
        assert_eq!(a.q, b.q);
        assert_eq!(a.q.len(), 200 * 2 * 64);
        assert!(a.q.iter().all(|&x| Dtype::Bf16.round(x) == x && x.abs() <= 2.0));
        assert!(a.v.iter().all(|&x| x.abs() <= 1.0));
        assert!(a.q.iter().any(|&x| x > 1.0) && a.q.iter().any(|&x| x < -1.0));
        assert_ne!(a.q, a.k);
        assert_eq!(a.scale, 0.125);
    }

    // ---- on a GPU: the tensor-core kernels against the simple kernels and the CPU twin ----

    /// GPU 0 if it can run the kernels, else the reason it is skipped.
    fn gpu() -> std::result::Result<CudaDevice, String> {
        let device = CudaDevice::open(0).map_err(|e| e.to_string())?;
        if !device_capable(&device) {
            return Err(format!(
                "GPU 0 is sm_{}{} or the build has no kernels; the kernels need sm_80+",
                device.info().compute_capability.0,
                device.info().compute_capability.1
            ));
        }
        Ok(device)
    }

    /// One problem on both GPU paths and the CPU twin; panics on a contract breach.
    fn against_the_twin(device: &CudaDevice, s: AttentionShape, dtype: Dtype, seed: u64) {
        let problem = SelfCheckProblem::new(s.batch, s.seq, s.heads, s.head_dim, dtype, seed);
        let tag = format!("{dtype:?} {s:?}");
        let gpu = run_both(device, &problem, dtype, &tag).unwrap();
        // The CPU twin: forward, then backward from its own out and lse.
        let n = problem.q.len();
        let stats = s.batch * s.heads * s.seq;
        let (mut out, mut lse) = (vec![0.0; n], vec![0.0; stats]);
        crate::ops::attention_forward(
            &problem.q,
            &problem.k,
            &problem.v,
            s,
            problem.scale,
            dtype,
            &mut out,
            &mut lse,
        )
        .unwrap();
        let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        crate::ops::attention_backward(
            &problem.dout,
            &problem.q,
            &problem.k,
            &problem.v,
            &out,
            &lse,
            s,
            problem.scale,
            dtype,
            &mut dq,
            &mut dk,
            &mut dv,
        )
        .unwrap();
        let (rtol, atol) = tolerances(dtype);
        for (o, cpu) in gpu.iter().zip([&out, &lse, &dq, &dk, &dv]) {
            let ratio = |a: &[f32], b: &[f32]| {
                let max = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs() / (atol + rtol * (y.abs() + max)))
                    .fold(0.0f32, f32::max)
            };
            println!(
                "{}: err/bound vs simple {:.3}, vs cpu {:.3}",
                o.name,
                ratio(&o.fast, &o.reference),
                ratio(&o.fast, cpu)
            );
            assert_eq!(
                normwise_breach(&o.fast, &o.reference, rtol, atol),
                None,
                "{} vs simple",
                o.name
            );
            assert_eq!(normwise_breach(&o.fast, cpu, rtol, atol), None, "{} vs cpu", o.name);
        }
    }

    #[test]
    fn gpu_tensor_core_attention_matches_the_simple_kernels_and_the_cpu_twin() {
        let device = match gpu() {
            Ok(d) => d,
            Err(why) => {
                println!("gpu_tensor_core_attention_matches_the_simple_kernels_and_the_cpu_twin: skipped: {why}");
                return;
            }
        };
        let cases = [
            (shape(1, 2048, 4, 128), Dtype::Bf16),
            (shape(1, 2048, 4, 128), Dtype::F16),
            (shape(2, 200, 3, 64), Dtype::Bf16),
            (shape(1, 77, 2, 80), Dtype::F16),
            (shape(3, 130, 2, 32), Dtype::Bf16),
            (shape(1, 1, 1, 16), Dtype::Bf16),
            (shape(1, 65, 1, 112), Dtype::F16),
            (shape(2, 31, 5, 48), Dtype::F16),
        ];
        for (i, (s, dtype)) in cases.into_iter().enumerate() {
            against_the_twin(&device, s, dtype, 100 + i as u64);
        }
    }

    #[test]
    fn gpu_self_check_passes_for_bf16_and_f16() {
        let device = match gpu() {
            Ok(d) => d,
            Err(why) => {
                println!("gpu_self_check_passes_for_bf16_and_f16: skipped: {why}");
                return;
            }
        };
        let s = MmaSelector::new(true);
        for dtype in [Dtype::Bf16, Dtype::F16] {
            assert!(
                s.select(0, dtype, true, || self_check(&device, dtype)),
                "{:?}",
                s.warnings()
            );
        }
    }

    #[test]
    fn gpu_tensor_core_attention_is_deterministic() {
        let device = match gpu() {
            Ok(d) => d,
            Err(why) => {
                println!("gpu_tensor_core_attention_is_deterministic: skipped: {why}");
                return;
            }
        };
        let problem = SelfCheckProblem::new(1, 300, 2, 128, Dtype::Bf16, 5);
        let a = run_both(&device, &problem, Dtype::Bf16, "a").unwrap();
        let b = run_both(&device, &problem, Dtype::Bf16, "b").unwrap();
        for (x, y) in a.iter().zip(&b) {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x.fast), bits(&y.fast), "{}", x.name);
        }
    }
}
