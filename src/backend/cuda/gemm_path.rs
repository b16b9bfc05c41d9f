//! Which kernel family runs an FP8 GEMM on a GPU: the portable mma.sync kernels or
//! the Hopper wgmma fast path. `CudaDevice::gemm` asks [`path_for`] for every call
//! without a kernel override; the choice itself is [`PathSelector`]'s
//! (`FP8_GEMM_PATH=auto|portable|hopper`), behind a gate on what the fast path
//! supports, and its self-check is [`self_check`].

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::error::describe_error_flag;
use super::gemm_dispatch::{GemmInputs, cached_kernel};
use super::gemm_operands::{DeviceGemmParams, DeviceOperand, DeviceOutput, DeviceScales};
use super::gemm_portable;
use super::hopper::{
    self, GemmPath, HopperScales, PathSelector, PlanOverride, SelfCheckProblem, SelfCheckRun, kernel_checks,
};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::memory::MemoryCategory;
use crate::tensor::ScaleKind;

/// Whether the fast path computes this FP8 x FP8 GEMM at all: B in E4M3, K a
/// positive multiple of 16, and a scale pair it was compiled for (per tensor on
/// both, or A 1x128 with B 128x128 or 1x128). Anything else runs portable, even
/// under `FP8_GEMM_PATH=hopper` (the variable picks a path where both exist).
pub fn hopper_supports(b_format: Fp8Format, a_scales: ScaleKind, b_scales: ScaleKind, k: usize) -> bool {
    let scales_ok = matches!(
        (a_scales, b_scales),
        (ScaleKind::PerTensor, ScaleKind::PerTensor)
            | (ScaleKind::Block1x128, ScaleKind::Block128x128)
            | (ScaleKind::Block1x128, ScaleKind::Block1x128)
    );
    b_format == Fp8Format::E4M3 && k > 0 && k.is_multiple_of(hopper::launch::K_MULTIPLE) && scales_ok
}

/// The path for one GEMM: portable whenever the fast path does not support it
/// (`supported` false; no self-check then), else the selector's choice for
/// device `ordinal` (`capable`: sm_90 and a build with kernels).
pub fn route<F>(selector: &PathSelector, ordinal: usize, capable: bool, supported: bool, check: F) -> Result<GemmPath>
where
    F: FnOnce() -> Result<SelfCheckRun>,
{
    if !supported {
        return Ok(GemmPath::Portable);
    }
    selector.select(ordinal, capable, check)
}

/// The fast path's input scales for two FP8 operands, when it supports them.
pub fn hopper_scales<'a>(a: &DeviceOperand<'a>, b: &DeviceOperand<'a>) -> Option<HopperScales<'a>> {
    let (DeviceOperand::Fp8 { scales: sa, .. }, DeviceOperand::Fp8 { scales: sb, .. }) = (a, b) else {
        return None;
    };
    match (*sa, *sb) {
        (DeviceScales::PerTensor(a), DeviceScales::PerTensor(b)) => Some(HopperScales::PerTensor { a, b }),
        (DeviceScales::Block1x128(a), DeviceScales::Block128x128(b)) => {
            Some(HopperScales::Block1x128By128x128 { a, b })
        }
        (DeviceScales::Block1x128(a), DeviceScales::Block1x128(b)) => Some(HopperScales::Block1x128By1x128 { a, b }),
        _ => None,
    }
}

/// The path the process-wide selector gives `a . b^T` on `device` (portable for
/// non-FP8 inputs). Runs the self-check the first time the fast path may be used.
pub fn path_for(device: &CudaDevice, a: &DeviceOperand, b: &DeviceOperand) -> Result<GemmPath> {
    let (
        DeviceOperand::Fp8 {
            scales: sa, cols: k, ..
        },
        DeviceOperand::Fp8 {
            format: fb, scales: sb, ..
        },
    ) = (a, b)
    else {
        return Ok(GemmPath::Portable);
    };
    let supported = hopper_supports(*fb, sa.kind(), sb.kind(), *k);
    route(
        PathSelector::global(),
        device.info().ordinal,
        hopper::device_capable(device),
        supported,
        || self_check(device),
    )
}

/// Checks the register count of every wgmma kernel, then runs [`SelfCheckProblem`]
/// (E4M3 x E4M3 and E5M2 x E4M3, f32 output, split accumulation) on the fast path
/// (its bounded-wait twin, with an error flag) and on the portable kernel, both
/// named explicitly (never through the selector); returns both outputs, concatenated.
pub fn self_check(device: &CudaDevice) -> Result<SelfCheckRun> {
    // Every production variant must have the register count setmaxnreg assumes, or none may run.
    for name in hopper::launch::all_kernel_names() {
        let func = device.function(hopper::launch::MODULE, name)?;
        kernel_checks::check_function(device.info().ordinal, name, &func)?;
    }
    let mut run = SelfCheckRun {
        fast: Vec::new(),
        reference: Vec::new(),
    };
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let p = SelfCheckProblem::new(format);
        let cat = MemoryCategory::Workspace;
        let a = device.upload(&p.a, cat)?;
        let b = device.upload(&p.b, cat)?;
        let sa = device.upload(&[p.scale_inv.0], cat)?;
        let sb = device.upload(&[p.scale_inv.1], cat)?;
        let mut fast: DeviceBuffer<f32> = device.alloc_zeros(p.m * p.n, cat)?;
        let mut flag: DeviceBuffer<u32> = device.alloc_zeros(1, cat)?;
        let gemm = hopper::HopperGemm {
            m: p.m,
            n: p.n,
            k: p.k,
            a: &a,
            a_format: format,
            b: &b,
            b_format: Fp8Format::E4M3,
            scales: HopperScales::PerTensor { a: &sa, b: &sb },
            bias: None,
            alpha: 1.0,
            beta: 0.0,
            split_accumulator: true,
            amax: None,
            error_flag: Some(&mut flag),
        };
        // The bounded twin: a protocol hang becomes an error here instead of a stuck process.
        let bounded = PlanOverride {
            bounded_waits: true,
            ..Default::default()
        };
        hopper::launch_with(device, gemm, DeviceOutput::F32(&mut fast), bounded)?;
        let mut portable: DeviceBuffer<f32> = device.alloc_zeros(p.m * p.n, cat)?;
        let operand = |codes, rows, format, scales| DeviceOperand::Fp8 {
            format,
            codes,
            rows,
            cols: p.k,
            scales: DeviceScales::PerTensor(scales),
        };
        let kernel = cached_kernel(
            device.info().compute_capability,
            GemmInputs::Fp8(format, Fp8Format::E4M3),
        )?;
        gemm_portable::gemm(
            device,
            &operand(&a, p.m, format, &sa),
            &operand(&b, p.n, Fp8Format::E4M3, &sb),
            DeviceOutput::F32(&mut portable),
            DeviceGemmParams {
                kernel: Some(kernel),
                ..Default::default()
            },
        )?;
        if let Some(what) = describe_error_flag(device.download(&flag)?[0]) {
            return Err(Error::KernelArgs {
                kernel: "gemm_wgmma (self-check)",
                detail: what,
            });
        }
        run.fast.extend(device.download(&fast)?);
        run.reference.extend(device.download(&portable)?);
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn passing() -> Result<SelfCheckRun> {
        Ok(SelfCheckRun {
            fast: vec![1.0, 2.0],
            reference: vec![1.0, 2.0],
        })
    }

    fn failing() -> Result<SelfCheckRun> {
        Ok(SelfCheckRun {
            fast: vec![1.0, 5.0],
            reference: vec![1.0, 2.0],
        })
    }

    #[test]
    fn supported_pairs() {
        use ScaleKind::*;
        let e4 = Fp8Format::E4M3;
        assert!(hopper_supports(e4, PerTensor, PerTensor, 16));
        assert!(hopper_supports(e4, Block1x128, Block128x128, 4096));
        assert!(hopper_supports(e4, Block1x128, Block1x128, 272));
        // B in E5M2, K = 0 or not a multiple of 16, and other scale pairs are not compiled.
        assert!(!hopper_supports(Fp8Format::E5M2, PerTensor, PerTensor, 16));
        assert!(!hopper_supports(e4, PerTensor, PerTensor, 0));
        assert!(!hopper_supports(e4, PerTensor, PerTensor, 24));
        assert!(!hopper_supports(e4, Block128x128, Block128x128, 128));
        assert!(!hopper_supports(e4, PerTensor, Block1x128, 128));
        assert!(!hopper_supports(e4, Block128x128, Block1x128, 128));
    }

    #[test]
    fn unsupported_problem_is_portable_without_check_even_when_forced() {
        let s = PathSelector::new(Some("hopper".into()), true);
        let path = route(&s, 0, true, false, || panic!("no self-check for an unsupported GEMM")).unwrap();
        assert_eq!(path, GemmPath::Portable);
    }

    #[test]
    fn default_auto_checks_then_uses_the_fast_path_and_falls_back_on_a_mismatch() {
        let s = PathSelector::new(None, hopper::self_check::HOPPER_AUTO_DEFAULT);
        let called = Cell::new(false);
        let path = route(&s, 0, true, true, || {
            called.set(true);
            passing()
        })
        .unwrap();
        assert_eq!(path, GemmPath::Hopper);
        assert!(called.get());
        // Another device whose self-check fails: portable, with one warning.
        let path = route(&s, 1, true, true, failing).unwrap();
        assert_eq!(path, GemmPath::Portable);
        assert_eq!(s.warnings().len(), 1);
    }

    #[test]
    fn forced_hopper_runs_the_check_once_then_uses_the_fast_path() {
        let s = PathSelector::new(Some("hopper".into()), false);
        let calls = Cell::new(0);
        for _ in 0..3 {
            let path = route(&s, 0, true, true, || {
                calls.set(calls.get() + 1);
                passing()
            })
            .unwrap();
            assert_eq!(path, GemmPath::Hopper);
        }
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn forced_hopper_mismatch_is_an_error_not_a_silent_fallback() {
        let s = PathSelector::new(Some("hopper".into()), false);
        let e = route(&s, 0, true, true, failing).unwrap_err();
        assert!(e.to_string().contains("self-check"), "{e}");
    }

    #[test]
    fn forced_hopper_on_a_non_sm90_gpu_is_an_error() {
        let s = PathSelector::new(Some("hopper".into()), false);
        assert!(matches!(route(&s, 1, false, true, passing), Err(Error::NoGpu { .. })));
    }

    #[test]
    fn auto_enabled_mismatch_falls_back_to_portable() {
        let s = PathSelector::new(Some("auto".into()), true);
        assert_eq!(route(&s, 0, true, true, failing).unwrap(), GemmPath::Portable);
        assert_eq!(s.warnings().len(), 1);
    }

    #[test]
    fn forced_portable_never_checks() {
        let s = PathSelector::new(Some("portable".into()), true);
        let path = route(&s, 0, true, true, || panic!("portable needs no self-check")).unwrap();
        assert_eq!(path, GemmPath::Portable);
    }
}
