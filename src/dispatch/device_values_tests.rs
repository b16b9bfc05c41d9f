//! Device values through the op trait. On any machine: where each backend accepts them, what
//! it says when it does not, and how shadow mode reads them (a host-memory stand-in plays the
//! GPU's array, `tensor::device_values::HostArray`). With a GPU, `device_arms_match_host_arms`:
//! every op that takes device values gives the same bits with its inputs and outputs on the
//! device as with them staged from the host (it prints `skipped:` without one).

use super::contract::Contract;
use super::twin::Twin;
use super::{AttentionShape, Backend, CpuKernels, CudaKernels, Kernels, NormShape, RopeShape, RopeTable};
use super::{Values, ValuesMut};
use crate::error::Error;
use crate::tensor::device_values::{CudaStorage, HostArray};
use crate::tensor::{DeviceKind, Dtype, Tensor};

pub(super) fn stand_in(ordinal: usize, values: Vec<f32>) -> CudaStorage {
    CudaStorage::new(Box::new(HostArray { ordinal, values }))
}

pub(crate) fn ramp(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37 + seed).sin() * 2.0).collect()
}

/// On GPU 0: one forward and backward of `staged` fed host tensors (its ops stage them) and of
/// `resident` fed their uploads: the resident outputs stay on the GPU with the staged bits, and
/// both modules end with the same gradients, slots and statistics.
pub(super) fn same_pass<M: crate::nn::Module>(
    case: &str,
    (staged, resident): (&mut M, &mut M),
    (x, dy): (&Tensor, &Tensor),
    forward: impl Fn(&mut M, &Tensor) -> crate::error::Result<Tensor>,
    backward: impl Fn(&mut M, &Tensor) -> crate::error::Result<Tensor>,
) {
    let gpu = Backend::on(DeviceKind::Cuda(0));
    // Errors name the case: the loops over precisions and shapes call this many times.
    let ok = |what: &str, r: crate::error::Result<Tensor>| r.unwrap_or_else(|e| panic!("{case}: {what}: {e}"));
    let (xd, dyd) = (ok("upload x", gpu.to_device(x)), ok("upload dy", gpu.to_device(dy)));
    let (y, yd) = (
        ok("staged forward", forward(staged, x)),
        ok("resident forward", forward(resident, &xd)),
    );
    assert_eq!(
        yd.device(),
        DeviceKind::Cuda(0),
        "{case}: the output stays on the device"
    );
    assert_eq!(bits(&y), bits(&yd), "{case}: forward");
    let (dx, dxd) = (
        ok("staged backward", backward(staged, dy)),
        ok("resident backward", backward(resident, &dyd)),
    );
    assert_eq!(dxd.device(), DeviceKind::Cuda(0), "{case}: the input gradient too");
    assert_eq!(bits(&dx), bits(&dxd), "{case}: backward");
    assert_eq!(state(staged), state(resident), "{case}: gradients, slots, statistics");
}

/// Whether GPU 0 cannot be opened, printing `<test>: skipped: <why>` then.
pub(crate) fn skipped_without_a_gpu(test: &str) -> bool {
    match crate::backend::cuda::CudaDevice::open(0) {
        Ok(_) => false,
        Err(err) => {
            println!("{test}: skipped: {err}");
            true
        }
    }
}

/// The FP8 recipe of precision `name` (`fp8-delayed`, `mxfp8`, ...).
fn fp8_recipe(name: &str) -> crate::amp::Fp8Recipe {
    match name.parse::<crate::amp::Precision>().unwrap() {
        crate::amp::Precision::Fp8(recipe) => recipe,
        other => panic!("{name} parsed as {other:?}"),
    }
}

/// A tensor's values as bits, downloaded from wherever they live.
fn bits(t: &Tensor) -> Vec<u32> {
    t.to_host().unwrap().data().iter().map(|v| v.to_bits()).collect()
}

/// What a module's backward leaves behind: each parameter's name and gradient, its
/// delayed-scaling slots (scale and history, printed) and its FP8 statistics.
type ModuleState = (Vec<(String, Vec<f32>)>, String, Vec<crate::scaling::Fp8TensorStats>);

/// The [`ModuleState`] of `module`.
fn state(module: &mut dyn crate::nn::Module) -> ModuleState {
    let mut grads = Vec::new();
    module.visit_parameters(&mut |p| grads.push((p.name().to_string(), p.grad().to_vec())));
    let mut slots = Vec::new();
    module.visit_fp8_slots(&mut |name, slot| slots.push((name.to_string(), slot.scale, slot.history.clone())));
    let mut stats = Vec::new();
    module.collect_fp8_stats(&mut stats);
    (grads, format!("{slots:?}"), stats)
}

#[test]
fn the_cpu_backend_names_the_op_of_a_device_value_and_writes_nothing() {
    let x = stand_in(0, ramp(8, 0.0));
    let mut y = vec![7.0f32; 8];
    let err = CpuKernels
        .gelu_forward(Values::Device(&x), ValuesMut::Host(&mut y))
        .unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            op: "gelu_forward",
            expected: "cpu".into(),
            got: "cuda:0".into()
        }
    );
    assert_eq!(y, vec![7.0; 8]);
    // A device output is refused the same way, before the input is read.
    let mut out = stand_in(1, vec![0.0; 8]);
    let host_x = ramp(8, 0.0);
    let err = CpuKernels
        .residual_add(
            Values::Host(&host_x),
            Values::Host(&host_x),
            Dtype::F32,
            ValuesMut::Device(&mut out),
        )
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "residual_add", .. }), "{err}");
}

#[test]
fn a_gemm_into_device_values_checks_its_arguments_and_placement_first() {
    use crate::gemm::{GemmParams, Mat, Operand};
    let (a, b) = (ramp(2 * 16, 0.0), ramp(3 * 16, 1.0));
    let (a, b) = (
        Operand::F32(Mat::new(&a, 2, 16).unwrap()),
        Operand::F32(Mat::new(&b, 3, 16).unwrap()),
    );
    // The CPU arm refuses a device output, naming the op.
    let mut on_0 = stand_in(0, vec![0.0; 6]);
    let err = CpuKernels
        .gemm_into(&a, &b, ValuesMut::Device(&mut on_0), GemmParams::default())
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "gemm_into", .. }), "{err}");
    // The CUDA arm checks the shape like the CPU GEMM, then where the output lives, then opens
    // its GPU.
    let cuda = Backend::on(DeviceKind::Cuda(99));
    let mut short = stand_in(99, vec![0.0; 5]);
    let err = cuda
        .kernels()
        .gemm_into(&a, &b, ValuesMut::Device(&mut short), GemmParams::default())
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    let err = cuda
        .kernels()
        .gemm_into(&a, &b, ValuesMut::Device(&mut on_0), GemmParams::default())
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "gemm_into", .. }), "{err}");
    let mut on_99 = stand_in(99, vec![7.0; 6]);
    let err = cuda
        .kernels()
        .gemm_into(&a, &b, ValuesMut::Device(&mut on_99), GemmParams::default())
        .unwrap_err();
    assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
    assert_eq!(on_99.to_vec().unwrap(), vec![7.0; 6], "nothing written");
}

#[test]
fn a_gemm_bias_on_a_device_is_refused_by_the_cpu_and_placed_by_the_cuda_arm() {
    use crate::gemm::{Bias, GemmParams, Mat, Operand, Output};
    let (a, b) = (ramp(2 * 16, 0.0), ramp(3 * 16, 1.0));
    let (a, b) = (
        Operand::F32(Mat::new(&a, 2, 16).unwrap()),
        Operand::F32(Mat::new(&b, 3, 16).unwrap()),
    );
    fn with(bias: &CudaStorage) -> GemmParams<'_> {
        GemmParams {
            bias: Some(Bias::of(Values::Device(bias))),
            ..GemmParams::default()
        }
    }
    let on_0 = stand_in(0, ramp(3, 2.0));
    // The CPU arms and the CPU GEMM itself take host values only: the op named, nothing written.
    let mut d = vec![7.0f32; 6];
    let err = CpuKernels.gemm(&a, &b, Output::F32(&mut d), with(&on_0)).unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            op: "gemm",
            expected: "cpu".into(),
            got: "cuda:0".into()
        }
    );
    let err = CpuKernels
        .gemm_into(&a, &b, ValuesMut::Host(&mut d), with(&on_0))
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "gemm_into", .. }), "{err}");
    let err = crate::gemm::cpu::gemm(&a, &b, Output::F32(&mut d), &with(&on_0)).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "gemm", .. }), "{err}");
    assert_eq!(d, vec![7.0; 6], "nothing written");
    // The CPU GEMM checks its length first, as a host bias's.
    let short = stand_in(0, ramp(2, 2.0));
    let err = crate::gemm::cpu::gemm(&a, &b, Output::F32(&mut d), &with(&short)).unwrap_err();
    assert!(matches!(err, Error::KernelArgs { .. }), "{err}");
    // The CUDA arms check that the bias is on their GPU before opening it...
    let cuda = Backend::on(DeviceKind::Cuda(99));
    let err = cuda
        .kernels()
        .gemm(&a, &b, Output::F32(&mut d), with(&on_0))
        .unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            op: "gemm",
            expected: "cuda:99".into(),
            got: "cuda:0".into()
        }
    );
    let mut out_99 = stand_in(99, vec![7.0; 6]);
    let err = cuda
        .kernels()
        .gemm_into(&a, &b, ValuesMut::Device(&mut out_99), with(&on_0))
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "gemm_into", .. }), "{err}");
    // ... after its length; a bias on their own GPU passes: then GPU 99 itself is missing.
    let err = cuda
        .kernels()
        .gemm(&a, &b, Output::F32(&mut d), with(&short))
        .unwrap_err();
    assert!(matches!(err, Error::KernelArgs { .. }), "{err}");
    let on_99 = stand_in(99, ramp(3, 2.0));
    let err = cuda
        .kernels()
        .gemm(&a, &b, Output::F32(&mut d), with(&on_99))
        .unwrap_err();
    assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
    let err = cuda
        .kernels()
        .gemm_into(&a, &b, ValuesMut::Device(&mut out_99), with(&on_99))
        .unwrap_err();
    assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
    assert_eq!(d, vec![7.0; 6]);
    assert_eq!(out_99.to_vec().unwrap(), vec![7.0; 6], "nothing written");
}

#[test]
fn shadow_mode_gives_the_gemm_twin_a_download_of_a_device_bias() {
    use crate::gemm::{Bias, GemmParams, Mat, Operand, Output};
    let (a, b) = (ramp(2 * 16, 0.0), ramp(3 * 16, 1.0));
    let (a, b) = (
        Operand::F32(Mat::new(&a, 2, 16).unwrap()),
        Operand::F32(Mat::new(&b, 3, 16).unwrap()),
    );
    let host_bias = ramp(3, 2.0);
    let on_0 = stand_in(0, host_bias.clone());
    let mut params = GemmParams {
        alpha: 0.5,
        bias: Some(Bias::of(Values::Device(&on_0))),
        ..GemmParams::default()
    };
    let contract = Contract::Gemm { k: 16, call: None };
    let mut saved = Twin::save(&params, contract).unwrap();
    assert_eq!(
        saved.as_deref(),
        Some(&host_bias[..]),
        "downloaded before the primary runs"
    );
    let twin = Twin::twin(&params, &mut saved);
    assert_eq!(twin.bias.and_then(|b| b.as_host()), Some(&host_bias[..]));
    assert_eq!(twin.alpha, 0.5, "the scalars as they were");
    // The twin's scalars pass the CPU arm, with the bits of a host bias.
    let (mut got, mut want) = (vec![0.0f32; 6], vec![0.0f32; 6]);
    CpuKernels.gemm(&a, &b, Output::F32(&mut got), twin).unwrap();
    let host = GemmParams {
        bias: Some(Bias::host(&host_bias)),
        ..params
    };
    CpuKernels.gemm(&a, &b, Output::F32(&mut want), host).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
    // The primary reads it where it lives; a host bias (or none) is read in place: nothing saved.
    let primary = Twin::primary(&mut params);
    assert!(primary.bias.is_some_and(|b| b.as_host().is_none()));
    assert!(Twin::save(&host, contract).unwrap().is_none());
    assert!(Twin::save(&GemmParams::default(), contract).unwrap().is_none());
}

#[test]
fn a_cuda_op_checks_where_its_values_live_before_opening_its_gpu() {
    let on_3 = stand_in(3, ramp(8, 0.0));
    let mut y = vec![7.0f32; 8];
    let err = Backend::on(DeviceKind::Cuda(99))
        .kernels()
        .gelu_forward(Values::Device(&on_3), ValuesMut::Host(&mut y))
        .unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            op: "gelu_forward",
            expected: "cuda:99".into(),
            got: "cuda:3".into()
        }
    );
    // An in-place argument on another GPU too (rope's x), and a device output (layernorm's y).
    let table = RopeTable::new(&[1.0, 0.5], 4);
    let shape = RopeShape {
        rows: 2,
        seq: 2,
        heads: 1,
        head_dim: 4,
        first_position: 0,
    };
    let mut x = stand_in(3, ramp(8, 1.0));
    let err = Backend::on(DeviceKind::Cuda(99))
        .kernels()
        .rope_forward(ValuesMut::Device(&mut x), shape, &table)
        .unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "rope_forward", .. }), "{err}");
    assert_eq!(x.to_vec().unwrap(), ramp(8, 1.0), "a refused op writes nothing");
    // Values on the op's own GPU pass the check: then GPU 99 itself is missing.
    let on_99 = stand_in(99, ramp(8, 0.0));
    let err = Backend::on(DeviceKind::Cuda(99))
        .kernels()
        .gelu_forward(Values::Device(&on_99), ValuesMut::Host(&mut y))
        .unwrap_err();
    assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
    assert_eq!(y, vec![7.0; 8]);
}

#[test]
fn ops_that_stay_on_the_host_for_host_values_still_need_their_gpu() {
    // round and copy_columns move host values on the host, but a missing GPU is still the
    // backend's typed error, the values untouched.
    let mut x = ramp(8, 0.25);
    let cuda = Backend::on(DeviceKind::Cuda(99));
    let err = cuda.kernels().round(ValuesMut::Host(&mut x), Dtype::Bf16).unwrap_err();
    assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
    let copy = super::ColumnCopy {
        rows: 2,
        width: 2,
        a_cols: 4,
        a_first: 1,
        out_cols: 4,
        out_first: 0,
    };
    let mut out = vec![0.0; 8];
    let err = cuda
        .kernels()
        .copy_columns(Values::Host(&ramp(8, 0.0)), ValuesMut::Host(&mut out), copy)
        .unwrap_err();
    assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
    assert_eq!((x, out), (ramp(8, 0.25), vec![0.0; 8]));
    // A bad range is the twin's error on both backends, before the GPU is looked for.
    let bad = super::ColumnCopy { a_first: 3, ..copy };
    let err = cuda
        .kernels()
        .copy_columns(Values::Host(&ramp(8, 0.0)), ValuesMut::Host(&mut [0.0; 8]), bad)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidShape { .. }), "{err}");
}

#[test]
fn shadow_mode_gives_the_twin_a_download_of_device_values() {
    // An input: saved as a download before the primary runs, the twin reads that copy.
    let x = stand_in(0, ramp(6, 2.0));
    let mut input = Values::Device(&x);
    let mut saved = Twin::save(&input, Contract::Exact).unwrap();
    assert_eq!(saved.as_deref(), Some(&ramp(6, 2.0)[..]));
    assert!(matches!(Twin::twin(&input, &mut saved), Values::Host(v) if v == &ramp(6, 2.0)[..]));
    assert!(matches!(Twin::primary(&mut input), Values::Device(_)));
    // A host input is read in place: nothing saved.
    let host = ramp(6, 2.0);
    assert!(Twin::save(&Values::Host(&host), Contract::Exact).unwrap().is_none());
    // An output on the device: the twin starts from a host copy, the primary's result is read
    // back to compare, and a difference is a breach at its index.
    let mut y = stand_in(0, vec![1.0; 4]);
    let mut output = ValuesMut::Device(&mut y);
    let mut twin_copy = Twin::save(&output, Contract::Exact).unwrap();
    assert_eq!(twin_copy.twin, vec![1.0; 4]);
    if let ValuesMut::Host(t) = Twin::twin(&output, &mut twin_copy) {
        t[2] = 5.0;
    }
    let breach = Twin::check(&output, &twin_copy, Contract::Exact)
        .unwrap()
        .expect("element 2 differs");
    assert_eq!(breach.index, 2);
    twin_copy.twin[2] = 1.0;
    assert!(Twin::check(&output, &twin_copy, Contract::Exact).unwrap().is_none());
    assert!(matches!(Twin::primary(&mut output), ValuesMut::Device(_)));
}

#[test]
fn a_tensor_on_a_device_reports_it_and_comes_back_whole() {
    let t = Tensor::on_device(stand_in(2, ramp(6, 0.5)), 2, 3).unwrap();
    assert_eq!((t.device(), t.shape(), t.len()), (DeviceKind::Cuda(2), (2, 3), 6));
    assert!(matches!(t.values(), Values::Device(_)));
    let back = t.to_host().unwrap();
    assert_eq!((back.device(), back.shape()), (DeviceKind::Cpu, (2, 3)));
    assert_eq!(back.data(), &ramp(6, 0.5)[..]);
    assert_eq!(t.clone().into_host().unwrap(), back);
    // The CPU backend brings a device tensor home; a host one stays as it is.
    assert_eq!(Backend::default().to_device(&t).unwrap(), back);
    assert_eq!(Backend::default().to_device(&back).unwrap(), back);
    // A wrong length is refused, as for host tensors.
    assert!(matches!(
        Tensor::on_device(stand_in(2, ramp(5, 0.0)), 2, 3),
        Err(Error::ShapeMismatch { .. })
    ));
    // An op's output follows its input: a host input gets a host output of the asked shape.
    let out = Backend::default().output_like(&back, 3, 4).unwrap();
    assert_eq!((out.device(), out.shape()), (DeviceKind::Cpu, (3, 4)));
}

#[test]
fn a_layer_refuses_a_tensor_on_a_device_its_ops_do_not_run_on() {
    use crate::nn::{Linear, Module};
    let mut linear = Linear::new("fc", 4, 3, false, &"bf16".parse().unwrap(), 7).unwrap();
    let x = Tensor::on_device(stand_in(0, ramp(8, 0.0)), 2, 4).unwrap();
    let err = linear.forward(&x).unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            op: "linear forward",
            expected: "cpu".into(),
            got: "cuda:0".into()
        }
    );
    // On a GPU's backend: host tensors (staged) and that GPU's tensors pass the check, another
    // GPU's tensor is refused before any op runs (no GPU is opened here).
    linear.to_device(DeviceKind::Cuda(3)).unwrap();
    let err = linear
        .backward(&Tensor::on_device(stand_in(0, ramp(6, 0.0)), 2, 3).unwrap())
        .unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            op: "linear backward",
            expected: "cuda:3".into(),
            got: "cuda:0".into()
        }
    );
    let gpu = Backend::on(DeviceKind::Cuda(3));
    assert_eq!(gpu.expect_on("op", &Tensor::zeros(2, 4)), Ok(()));
    assert_eq!(
        gpu.expect_on("op", &Tensor::on_device(stand_in(3, ramp(8, 0.0)), 2, 4).unwrap()),
        Ok(())
    );
    // Layers upload their inputs at their boundary only on a GPU's backend, unless the switch
    // is off (`FP8_CUDA_RESIDENT=0`); the CPU backend never does.
    assert_eq!(Backend::default().resident_input(&Tensor::zeros(2, 4)).unwrap(), None);
    if std::env::var("FP8_CUDA_RESIDENT").is_ok_and(|v| v.trim() == "0") {
        assert_eq!(gpu.resident_input(&Tensor::zeros(2, 4)).unwrap(), None);
    }
    // Empty outputs and uploads hold nothing, so they stay on the host (a GPU allocates no
    // zero-byte buffer).
    let empty = Tensor::on_device(stand_in(0, Vec::new()), 0, 4).unwrap();
    let out = Backend::on(DeviceKind::Cuda(99)).output_like(&empty, 0, 4).unwrap();
    assert_eq!((out.device(), out.shape()), (DeviceKind::Cpu, (0, 4)));
    let moved = Backend::on(DeviceKind::Cuda(99))
        .to_device(&Tensor::zeros(0, 4))
        .unwrap();
    assert_eq!(moved.device(), DeviceKind::Cpu);
}

/// A linear fed host tensors brings a bias kept on a GPU (here a stand-in) home before its
/// GEMMs, which take it from host memory: the bits of a layer whose bias never moved, with an
/// f32 weight and a weight frozen in FP8 (three segments, each reading its part of the bias).
#[test]
fn a_host_input_brings_a_linear_bias_home() {
    use crate::nn::{BaseScaling, Linear, Module};
    let (rows, inp, out) = (16, 32, 48);
    for (name, segments) in [("bf16", None), ("fp8-delayed", None), ("bf16", Some([16, 16, 16]))] {
        let layer = || {
            let mut l = Linear::new("fc", inp, out, true, &name.parse().unwrap(), 5).unwrap();
            l.visit_parameters(&mut |p| {
                if p.name() == "fc.bias" {
                    p.value_mut().copy_from_slice(&ramp(out, 0.6));
                    p.mark_updated();
                }
            });
            if let Some(s) = segments {
                l.freeze_to_fp8(&s, BaseScaling::Tensor).unwrap();
            }
            l
        };
        let (mut home, mut away) = (layer(), layer());
        away.visit_parameters(&mut |p| {
            if p.name() == "fc.bias" {
                p.value_on_stand_in_gpu(0);
            }
        });
        assert_eq!(away.bias().unwrap().value_device(), DeviceKind::Cuda(0));
        let x = Tensor::new(ramp(rows * inp, 0.1), rows, inp).unwrap();
        let (want, got) = (home.forward(&x).unwrap(), away.forward(&x).unwrap());
        assert_eq!(bits(&got), bits(&want), "{name} {segments:?}");
        assert_eq!(
            away.bias().unwrap().value_device(),
            DeviceKind::Cpu,
            "{name} {segments:?}"
        );
    }
}

#[test]
#[should_panic(expected = "live on cuda:2")]
fn host_slices_of_device_values_are_a_bug_that_names_the_gpu() {
    let t = Tensor::on_device(stand_in(2, ramp(6, 0.5)), 2, 3).unwrap();
    let _ = t.data();
}

/// On GPU 0: each op with its inputs and outputs on the device against the same op with host
/// values (the staged path `gpu_layers` and `gpu_ops` validated): the same kernels on the same
/// values, so the same bits. Also: accumulators and in-place values on the device start from
/// their values, and a shared device tensor is copied before an in-place op writes it.
#[test]
fn device_arms_match_host_arms() {
    if skipped_without_a_gpu("device_arms_match_host_arms") {
        return;
    }
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let k = CudaKernels { ordinal: 0 };
    let (rows, cols) = (96, 160);
    let n = rows * cols;
    let up = |v: &[f32], r: usize, c: usize| gpu.to_device(&Tensor::new(v.to_vec(), r, c).unwrap()).unwrap();
    let down = |t: &Tensor| t.to_host().unwrap().into_data();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let same = |what: &str, host: &[f32], device: &Tensor| {
        assert_eq!(
            bits(host),
            bits(&down(device)),
            "{what}: device values differ from host values"
        );
    };
    let (x, dy) = (ramp(n, 0.1), ramp(n, 0.9));
    let (xd, dyd) = (up(&x, rows, cols), up(&dy, rows, cols));
    assert_eq!(down(&xd), x, "upload and download");

    // GELU forward and backward.
    let mut y = vec![0.0; n];
    k.gelu_forward(Values::Host(&x), ValuesMut::Host(&mut y)).unwrap();
    let mut yd = gpu.output_like(&xd, rows, cols).unwrap();
    k.gelu_forward(xd.values(), yd.values_mut()).unwrap();
    same("gelu_forward", &y, &yd);
    let mut dx = vec![0.0; n];
    k.gelu_backward(Values::Host(&dy), Values::Host(&x), ValuesMut::Host(&mut dx))
        .unwrap();
    let mut dxd = gpu.output_like(&xd, rows, cols).unwrap();
    k.gelu_backward(dyd.values(), xd.values(), dxd.values_mut()).unwrap();
    same("gelu_backward", &dx, &dxd);

    // Dropout: the kernel draws the host arm's counter-based mask, over more elements than one
    // grid-stride sweep (so later sweeps' indices count too), and adds through it in place.
    let big = 5 * 1024 * 1024 + 3;
    let (xb, gb) = (ramp(big, 0.4), ramp(big, 1.7));
    let (xbd, gbd) = (up(&xb, 1, big), up(&gb, 1, big));
    let mask = crate::ops::DropoutMask::new(0x5eed, 0.15).unwrap();
    let mut dropped = vec![0.0; big];
    k.dropout(Values::Host(&xb), mask, Dtype::Bf16, ValuesMut::Host(&mut dropped))
        .unwrap();
    let mut droppedd = gpu.output_like(&xbd, 1, big).unwrap();
    k.dropout(xbd.values(), mask, Dtype::Bf16, droppedd.values_mut())
        .unwrap();
    same("dropout", &dropped, &droppedd);
    k.dropout_add(Values::Host(&gb), mask, Dtype::F16, ValuesMut::Host(&mut dropped))
        .unwrap();
    k.dropout_add(gbd.values(), mask, Dtype::F16, droppedd.values_mut())
        .unwrap();
    same("dropout_add", &dropped, &droppedd);
    // Mixed placements, f32: a device input into a host output and a device gradient into a
    // host accumulator (uploaded, added on the device, downloaded).
    let (mut host_out, mut mixed) = (vec![0.0; big], vec![0.0; big]);
    k.dropout(Values::Host(&xb), mask, Dtype::F32, ValuesMut::Host(&mut host_out))
        .unwrap();
    k.dropout(xbd.values(), mask, Dtype::F32, ValuesMut::Host(&mut mixed))
        .unwrap();
    assert_eq!(bits(&host_out), bits(&mixed), "dropout into host values");
    k.dropout_add(Values::Host(&gb), mask, Dtype::F32, ValuesMut::Host(&mut host_out))
        .unwrap();
    k.dropout_add(gbd.values(), mask, Dtype::F32, ValuesMut::Host(&mut mixed))
        .unwrap();
    assert_eq!(bits(&host_out), bits(&mixed), "dropout_add into host values");

    // LayerNorm forward and backward, the gamma/beta gradients accumulating into device values.
    let shape = NormShape { rows, cols };
    let (gamma, beta) = (ramp(cols, 3.0), ramp(cols, 4.0));
    let (gd, bd) = (up(&gamma, 1, cols), up(&beta, 1, cols));
    let (mut y, mut mean, mut rstd) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
    k.layernorm_forward(
        Values::Host(&x),
        Values::Host(&gamma),
        Values::Host(&beta),
        shape,
        1e-5,
        false,
        ValuesMut::Host(&mut y),
        ValuesMut::Host(&mut mean),
        ValuesMut::Host(&mut rstd),
    )
    .unwrap();
    let mut yd = gpu.output_like(&xd, rows, cols).unwrap();
    let (mut meand, mut rstdd) = (
        gpu.output_like(&xd, rows, 1).unwrap(),
        gpu.output_like(&xd, rows, 1).unwrap(),
    );
    k.layernorm_forward(
        xd.values(),
        gd.values(),
        bd.values(),
        shape,
        1e-5,
        false,
        yd.values_mut(),
        meand.values_mut(),
        rstdd.values_mut(),
    )
    .unwrap();
    same("layernorm_forward y", &y, &yd);
    same("layernorm_forward mean", &mean, &meand);
    same("layernorm_forward rstd", &rstd, &rstdd);
    let (mut dx, mut dgamma, mut dbeta) = (vec![0.0; n], ramp(cols, 5.0), ramp(cols, 6.0));
    let (mut dgd, mut dbd) = (up(&dgamma, 1, cols), up(&dbeta, 1, cols));
    k.layernorm_backward(
        Values::Host(&dy),
        Values::Host(&x),
        Values::Host(&gamma),
        Values::Host(&mean),
        Values::Host(&rstd),
        shape,
        false,
        ValuesMut::Host(&mut dx),
        ValuesMut::Host(&mut dgamma),
        ValuesMut::Host(&mut dbeta),
    )
    .unwrap();
    let mut dxd = gpu.output_like(&xd, rows, cols).unwrap();
    k.layernorm_backward(
        dyd.values(),
        xd.values(),
        gd.values(),
        meand.values(),
        rstdd.values(),
        shape,
        false,
        dxd.values_mut(),
        dgd.values_mut(),
        dbd.values_mut(),
    )
    .unwrap();
    same("layernorm_backward dx", &dx, &dxd);
    same("layernorm_backward dgamma (accumulated)", &dgamma, &dgd);
    same("layernorm_backward dbeta (accumulated)", &dbeta, &dbd);

    // Residual add and column sums (an accumulator).
    let mut sum = vec![0.0; n];
    k.residual_add(
        Values::Host(&x),
        Values::Host(&dy),
        Dtype::Bf16,
        ValuesMut::Host(&mut sum),
    )
    .unwrap();
    let mut sumd = gpu.output_like(&xd, rows, cols).unwrap();
    k.residual_add(xd.values(), dyd.values(), Dtype::Bf16, sumd.values_mut())
        .unwrap();
    same("residual_add", &sum, &sumd);
    let mut sums = ramp(cols, 7.0);
    let mut sumsd = up(&sums, 1, cols);
    k.column_sum(Values::Host(&x), cols, ValuesMut::Host(&mut sums))
        .unwrap();
    k.column_sum(xd.values(), cols, sumsd.values_mut()).unwrap();
    same("column_sum (accumulated)", &sums, &sumsd);

    // Rounding in place, and a column range into a device matrix whose other columns stay.
    let mut rounded = x.clone();
    k.round(ValuesMut::Host(&mut rounded), Dtype::F16).unwrap();
    let mut roundd = xd.kept_copy();
    k.round(roundd.values_mut(), Dtype::F16).unwrap();
    same("round", &rounded, &roundd);
    same("round leaves the tensor it shared values with", &x, &xd);
    let copy = super::ColumnCopy {
        rows,
        width: 40,
        a_cols: cols,
        a_first: 100,
        out_cols: cols,
        out_first: 7,
    };
    let mut moved = dy.clone();
    k.copy_columns(Values::Host(&x), ValuesMut::Host(&mut moved), copy)
        .unwrap();
    let mut movedd = up(&dy, rows, cols);
    k.copy_columns(xd.values(), movedd.values_mut(), copy).unwrap();
    same("copy_columns", &moved, &movedd);
    // A host source into a device matrix: the source goes up, the rest stays.
    let mut mixed = up(&dy, rows, cols);
    k.copy_columns(Values::Host(&x), mixed.values_mut(), copy).unwrap();
    same("copy_columns from host values", &moved, &mixed);

    // Rope in place on a shared tensor: the op's copy changes, the other keeps its values.
    let (heads, head_dim, seq) = (4, 40, 48);
    let table = RopeTable::new(
        &ramp(head_dim / 2, 8.0)
            .iter()
            .map(|v| v.abs() / 4.0)
            .collect::<Vec<_>>(),
        seq,
    );
    let rope = RopeShape {
        rows,
        seq,
        heads,
        head_dim,
        first_position: 0,
    };
    let mut roped = x.clone();
    k.rope_forward(ValuesMut::Host(&mut roped), rope, &table).unwrap();
    let mut shared = xd.clone();
    k.rope_forward(shared.values_mut(), rope, &table).unwrap();
    same("rope_forward", &roped, &shared);
    same("rope_forward leaves the clone it shared with", &x, &xd);

    // GEMMs into device outputs: FP8 (the device cast of a device input as A), bf16 and the
    // f32 reference path, each with beta = 1 accumulating into what the output holds.
    // (In a block: its m x n x k must not shadow the n and kk of the sections after it.)
    {
        use crate::gemm::{GemmParams, Mat, Operand};
        let (m, n, kk) = (rows, 64, cols);
        let w = ramp(n * kk, 9.0);
        let recipe = fp8_recipe("fp8-delayed");
        let role = crate::scaling::TensorRole::Input;
        let (xq, xqd) = (
            k.quantize(&recipe, role, Values::Host(&x), m, kk, 2.0).unwrap(),
            k.quantize(&recipe, role, xd.values(), m, kk, 2.0).unwrap(),
        );
        assert_eq!(
            xq.tensor, xqd.tensor,
            "the cast of a device input is the cast of its host copy"
        );
        let wq = k
            .quantize(
                &recipe,
                crate::scaling::TensorRole::Weight,
                Values::Host(&w),
                n,
                kk,
                1.0,
            )
            .unwrap();
        let start = ramp(m * n, 10.0);
        let accumulate = GemmParams {
            beta: 1.0,
            ..GemmParams::default()
        };
        // A is the device cast of the device input: its codes and their device copy (mirror).
        let fp8 = (
            Operand::Fp8(xqd.tensor.format(), xqd.tensor.rowwise()),
            Operand::Fp8(wq.tensor.format(), wq.tensor.rowwise()),
        );
        let (xb, wb) = (
            x.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(),
            w.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>(),
        );
        let bf = (
            Operand::Bf16(Mat::new(&xb, m, kk).unwrap()),
            Operand::Bf16(Mat::new(&wb, n, kk).unwrap()),
        );
        let f = (
            Operand::F32(Mat::new(&x, m, kk).unwrap()),
            Operand::F32(Mat::new(&w, n, kk).unwrap()),
        );
        for (what, (a, b)) in [("fp8", &fp8), ("bf16", &bf), ("f32", &f)] {
            let mut host = start.clone();
            let want = k.gemm_into(a, b, ValuesMut::Host(&mut host), accumulate).unwrap();
            let mut on_gpu = up(&start, m, n);
            let got = k.gemm_into(a, b, on_gpu.values_mut(), accumulate).unwrap();
            same(&format!("gemm_into {what}"), &host, &on_gpu);
            let (want, got) = (want.get().unwrap(), got.get().unwrap());
            assert_eq!(want.to_bits(), got.to_bits(), "gemm_into {what}: amax");
        }
    }

    // Attention forward and backward (bf16 probabilities), every tensor on the device.
    let attn = AttentionShape {
        batch: 2,
        seq: 48,
        heads,
        head_dim,
    };
    let scale = 1.0 / (head_dim as f32).sqrt();
    let (q, kk, v) = (ramp(n, 1.5), ramp(n, 2.5), ramp(n, 3.5));
    let (qd, kd, vd) = (up(&q, rows, cols), up(&kk, rows, cols), up(&v, rows, cols));
    let lse_len = attn.batch * heads * attn.seq;
    let (mut out, mut lse) = (vec![0.0; n], vec![0.0; lse_len]);
    k.attention_forward(
        Values::Host(&q),
        Values::Host(&kk),
        Values::Host(&v),
        attn,
        scale,
        Dtype::Bf16,
        ValuesMut::Host(&mut out),
        ValuesMut::Host(&mut lse),
    )
    .unwrap();
    let (mut outd, mut lsed) = (
        gpu.output_like(&qd, rows, cols).unwrap(),
        gpu.output_like(&qd, 1, lse_len).unwrap(),
    );
    k.attention_forward(
        qd.values(),
        kd.values(),
        vd.values(),
        attn,
        scale,
        Dtype::Bf16,
        outd.values_mut(),
        lsed.values_mut(),
    )
    .unwrap();
    same("attention_forward out", &out, &outd);
    same("attention_forward lse", &lse, &lsed);
    let [mut dq, mut dk, mut dv] = [(); 3].map(|()| vec![0.0; n]);
    k.attention_backward(
        Values::Host(&dy),
        Values::Host(&q),
        Values::Host(&kk),
        Values::Host(&v),
        Values::Host(&out),
        Values::Host(&lse),
        attn,
        scale,
        Dtype::Bf16,
        ValuesMut::Host(&mut dq),
        ValuesMut::Host(&mut dk),
        ValuesMut::Host(&mut dv),
    )
    .unwrap();
    let [mut dqd, mut dkd, mut dvd] = [(); 3].map(|()| gpu.output_like(&qd, rows, cols).unwrap());
    k.attention_backward(
        dyd.values(),
        qd.values(),
        kd.values(),
        vd.values(),
        outd.values(),
        lsed.values(),
        attn,
        scale,
        Dtype::Bf16,
        dqd.values_mut(),
        dkd.values_mut(),
        dvd.values_mut(),
    )
    .unwrap();
    same("attention_backward dq", &dq, &dqd);
    same("attention_backward dk", &dk, &dkd);
    same("attention_backward dv", &dv, &dvd);
    println!(
        "device_arms_match_host_arms: gelu, dropout, layernorm, residual, column sums, round, copy_columns, fp8/bf16/f32 \
         gemm_into, rope, attention: same bits"
    );
}

/// On GPU 0: a norm layer fed a device tensor keeps its output, its saved state and its input
/// gradient on the device, with the same bits (and the same parameter gradients) as the same
/// layer fed host tensors, whose ops stage them (bf16, so the roundings run on the device too).
#[test]
fn norm_layers_keep_device_inputs_on_the_device() {
    use crate::amp::Precision;
    use crate::nn::{LayerNorm, Module, NormConfig, RMSNorm};
    if skipped_without_a_gpu("norm_layers_keep_device_inputs_on_the_device") {
        return;
    }
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let precision: Precision = "bf16".parse().unwrap();
    let (rows, hidden) = (64, 192);
    let x = Tensor::new(ramp(rows * hidden, 0.3), rows, hidden).unwrap();
    let dy = Tensor::new(ramp(rows * hidden, 1.3), rows, hidden).unwrap();
    let (xd, dyd) = (gpu.to_device(&x).unwrap(), gpu.to_device(&dy).unwrap());
    macro_rules! check {
        ($layer:ty) => {{
            let mut staged = <$layer>::new("norm", hidden, NormConfig::default(), &precision).unwrap();
            let mut resident = <$layer>::new("norm", hidden, NormConfig::default(), &precision).unwrap();
            staged.to_device(DeviceKind::Cuda(0)).unwrap();
            resident.to_device(DeviceKind::Cuda(0)).unwrap();
            let (y, yd) = (staged.forward(&x).unwrap(), resident.forward(&xd).unwrap());
            assert_eq!(yd.device(), DeviceKind::Cuda(0), "the output stays where the input is");
            assert_eq!(bits(&y), bits(&yd), "{} forward", stringify!($layer));
            let (dx, dxd) = (staged.backward(&dy).unwrap(), resident.backward(&dyd).unwrap());
            assert_eq!(dxd.device(), DeviceKind::Cuda(0));
            assert_eq!(bits(&dx), bits(&dxd), "{} backward", stringify!($layer));
            let mut grads = Vec::new();
            staged.visit_parameters(&mut |p| {
                assert_eq!((p.value_device(), p.grad_device()), (DeviceKind::Cpu, DeviceKind::Cpu));
                grads.push((p.value().to_vec(), p.grad().to_vec()));
            });
            let mut i = 0;
            resident.visit_parameters(&mut |p| {
                // gamma and beta live where the layer's tensors do, values and gradients.
                let on = (p.value_device(), p.grad_device());
                assert_eq!(on, (DeviceKind::Cuda(0), DeviceKind::Cuda(0)), "{}", p.name());
                assert_eq!(
                    p.value(),
                    &grads[i].0[..],
                    "{} values of {}",
                    stringify!($layer),
                    p.name()
                );
                assert_eq!(
                    p.grad(),
                    &grads[i].1[..],
                    "{} gradient of {}",
                    stringify!($layer),
                    p.name()
                );
                i += 1;
            });
            // A second backward on the device accumulates where the first left its gradients.
            resident.forward(&xd).unwrap();
            resident.backward(&dyd).unwrap();
            staged.forward(&x).unwrap();
            staged.backward(&dy).unwrap();
            let mut twice = Vec::new();
            staged.visit_parameters(&mut |p| twice.push(p.grad().to_vec()));
            let mut i = 0;
            resident.visit_parameters(&mut |p| {
                assert_eq!(
                    p.grad(),
                    &twice[i][..],
                    "{} accumulated {}",
                    stringify!($layer),
                    p.name()
                );
                i += 1;
            });
        }};
    }
    check!(LayerNorm);
    check!(RMSNorm);
    println!(
        "norm_layers_keep_device_inputs_on_the_device: LayerNorm, RMSNorm: same bits, gamma and beta and their \
         gradients on the device"
    );
}

/// Values that exercise every count of the FP8 statistics under a scale of 2: saturating
/// (|x| * 2 > 448, and > 57344 for E5M2), flushed (non-zero, below E4M3's smallest subnormal), zeros, non-finite,
/// and ordinary values.
fn stats_probe(n: usize) -> Vec<f32> {
    let specials = [
        1000.0,
        -3000.0,
        // Saturates E5M2 too (57344 < 2e5 * 2): the gradients' format.
        -1e5,
        1e-6,
        0.0,
        -1e-7,
        f32::INFINITY,
        f32::NAN,
        0.5,
        -0.0,
        300.0,
    ];
    (0..n)
        .map(|i| match i % 7 {
            0 => specials[(i / 7) % specials.len()],
            _ => (i as f32 * 0.37).sin() * 2.0,
        })
        .collect()
}

/// GPU 0's backend and kernels, the statistics probe `[48, 336]` (ragged: 16-element vector
/// chunks and grid strides leave a tail) in host memory and on the GPU.
fn probe_on_gpu() -> (CudaKernels, Vec<f32>, Tensor, (usize, usize)) {
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let (rows, cols) = (48, 336);
    let x = stats_probe(rows * cols);
    let xd = gpu.to_device(&Tensor::new(x.clone(), rows, cols).unwrap()).unwrap();
    (CudaKernels { ordinal: 0 }, x, xd, (rows, cols))
}

/// On GPU 0: the FP8 statistics of a device tensor, counted on the device (a cast's counts made
/// beside the cast, per tensor or by each block's scale, a high-precision value's counts by
/// `fp8_count_stats`), are the counts the host makes of the same values.
#[test]
fn statistics_counted_on_the_device_match_the_host_counts() {
    use crate::format::Fp8Format;
    use crate::scaling::TensorRole;
    if skipped_without_a_gpu("statistics_counted_on_the_device_match_the_host_counts") {
        return;
    }
    let (k, x, xd, (rows, cols)) = probe_on_gpu();
    for precision in ["fp8-delayed", "fp8-current", "fp8-block", "mxfp8"] {
        let recipe = fp8_recipe(precision);
        for role in [TensorRole::Input, TensorRole::OutputGrad] {
            let host = k.quantize(&recipe, role, Values::Host(&x), rows, cols, 2.0).unwrap();
            let device = k.quantize(&recipe, role, xd.values(), rows, cols, 2.0).unwrap();
            assert_eq!(host.tensor, device.tensor, "{precision} {role:?}: the same codes");
            let on_host = k
                .cast_stats("x".into(), Values::Host(&x), &host)
                .unwrap()
                .finish()
                .unwrap();
            let on_device = k
                .cast_stats("x".into(), xd.values(), &device)
                .unwrap()
                .finish()
                .unwrap();
            assert_eq!(on_host, on_device, "{precision} {role:?}: cast statistics");
            // Both counted on the device where codes stay there (block casts by each block's
            // scale since 2026-11-28): the CPU twin's statistics of its own cast.
            let cpu = CpuKernels
                .quantize(&recipe, role, Values::Host(&x), rows, cols, 2.0)
                .unwrap();
            let twin = CpuKernels
                .cast_stats("x".into(), Values::Host(&x), &cpu)
                .unwrap()
                .finish()
                .unwrap();
            assert_eq!(on_device, twin, "{precision} {role:?}: the CPU's statistics");
            let counted_there = device.counts.as_ref().and_then(|c| c.ordinal()) == Some(0);
            assert!(
                counted_there,
                "{precision} {role:?}: a device source's cast counts on the device"
            );
            // (Block scales follow each block's amax: only the fixed delayed scale is sure to
            // saturate some of the probe.)
            let saturates = precision != "fp8-delayed" || on_host.saturated > 0.0;
            assert!(
                saturates && on_host.underflow > 0.0 && on_host.nonfinite > 0,
                "{precision} {role:?}: the probe exercises every count: {on_host:?}"
            );
        }
    }
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        for scale in [2.0, 1e-3] {
            let on_host = k
                .uncast_stats("y".into(), Values::Host(&x), format, 7.0.into(), scale.into())
                .and_then(|s| s.finish())
                .unwrap();
            let on_device = k
                .uncast_stats("y".into(), xd.values(), format, 7.0.into(), scale.into())
                .and_then(|s| s.finish())
                .unwrap();
            assert_eq!(on_host, on_device, "{format:?} scale {scale}: uncast statistics");
        }
    }
    println!(
        "statistics_counted_on_the_device_match_the_host_counts: cast (4 recipes x 2 roles) and uncast (2 formats \
         x 2 scales) statistics: same counts"
    );
}

/// On GPU 0: a cast of a device source under every recipe, and its statistics, read nothing
/// back (current scaling makes its amax and scale on the device, block casts keep their scales
/// there and count by them), nor do a GEMM output's statistics by the current scale of a device
/// amax; read when asked, each is the CPU twin's.
#[test]
fn device_casts_read_nothing_back() {
    use super::Deferred;
    use crate::backend::cuda::transfer_times::{self, Transfer};
    use crate::scaling::TensorRole;
    const TEST: &str = "device_casts_read_nothing_back";
    if skipped_without_a_gpu(TEST) {
        return;
    }
    if !crate::backend::cuda::env_switch::resident_layers() || !super::cuda_ops::switches::mirrors_enabled() {
        // Not "skipped:", which would mark the whole bundle step skipped.
        println!("{TEST}: not run here: staged casts (FP8_CUDA_RESIDENT=0 or FP8_CUDA_MIRRORS=0) download their codes");
        return;
    }
    let (k, x, xd, (rows, cols)) = probe_on_gpu();
    // Downloads made by `f` on this thread.
    let downloads = |f: &mut dyn FnMut()| {
        transfer_times::enable(true);
        let _ = transfer_times::take();
        f();
        let calls = transfer_times::take()[Transfer::DeviceToHost.index()].calls;
        transfer_times::enable(false);
        calls
    };
    let recipes = ["fp8-delayed", "fp8-current", "fp8-block", "mxfp8"];
    for (precision, role) in recipes
        .into_iter()
        .flat_map(|p| [(p, TensorRole::Input), (p, TensorRole::OutputGrad)])
    {
        let what = format!("{precision} {role:?}");
        let recipe = fp8_recipe(precision);
        let cpu = CpuKernels
            .quantize(&recipe, role, Values::Host(&x), rows, cols, 2.0)
            .unwrap();
        let cpu_stats = CpuKernels.cast_stats("x".into(), Values::Host(&x), &cpu).unwrap();
        let (mut cast, mut stats) = (None, None);
        let reads = downloads(&mut || {
            let c = k.quantize(&recipe, role, xd.values(), rows, cols, 2.0).unwrap();
            stats = Some(k.cast_stats("x".into(), xd.values(), &c).unwrap());
            cast = Some(c);
        });
        let (cast, stats) = (cast.unwrap(), stats.unwrap());
        assert_eq!(
            reads, 0,
            "{what}: the amax, scales, codes and counts stay on the device"
        );
        if precision != "fp8-delayed" {
            assert!(
                matches!(cast.scale, Deferred::Device(_)),
                "{what}: the scale is found there"
            );
            assert!(!cast.tensor.rowwise().scales_on_host(), "{what}: scale_inv stays there");
        }
        assert_eq!(
            cast.scale.get().unwrap().to_bits(),
            cpu.scale.get().unwrap().to_bits(),
            "{what}"
        );
        assert_eq!(cast.tensor, cpu.tensor, "{what}: the twin's codes and scales");
        assert_eq!(
            stats.finish().unwrap(),
            cpu_stats.finish().unwrap(),
            "{what}: statistics"
        );
        if precision != "fp8-current" {
            continue;
        }
        // A GEMM output's statistics by current scaling: the scale of a device amax, made there.
        let format = recipe.format_for(role);
        let (mut scale, mut uncast) = (None, None);
        let reads = downloads(&mut || {
            let sc = k.current_scale(cast.amax.clone(), format, false, 0.0).unwrap();
            uncast = Some(
                k.uncast_stats("y".into(), xd.values(), format, cast.amax.clone(), sc.clone())
                    .unwrap(),
            );
            scale = Some(sc);
        });
        assert_eq!(reads, 0, "{what}: a GEMM output's statistics read nothing back");
        let amax = cpu.amax.get().unwrap();
        let want_scale = CpuKernels.current_scale(amax.into(), format, false, 0.0).unwrap();
        let got_scale = scale.unwrap().get().unwrap();
        assert_eq!(got_scale.to_bits(), want_scale.get().unwrap().to_bits(), "{what}");
        let want = CpuKernels
            .uncast_stats("y".into(), Values::Host(&x), format, amax.into(), want_scale)
            .unwrap();
        assert_eq!(uncast.unwrap().finish().unwrap(), want.finish().unwrap(), "{what}");
    }
    println!(
        "{TEST}: casts (4 recipes x 2 roles) with their statistics, and current GEMM-output statistics: no \
         downloads, the twin's bits when read"
    );
}

/// On GPU 0: a `Linear` fed device tensors keeps its output and input gradient on the device
/// and gives the bits, parameter gradients, delayed-scaling slots and FP8 statistics of the same
/// layer fed host tensors (whose ops stage them), over two forward and backward passes, under
/// every precision.
#[test]
fn linear_layers_keep_device_inputs_on_the_device() {
    use crate::amp::Precision;
    use crate::nn::{Linear, Module};
    if skipped_without_a_gpu("linear_layers_keep_device_inputs_on_the_device") {
        return;
    }
    let (rows, inp, out) = (64, 192, 96);
    for name in ["fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8"] {
        let precision: Precision = name.parse().unwrap();
        let mut staged = Linear::new("fc", inp, out, true, &precision, 11).unwrap();
        let mut resident = Linear::new("fc", inp, out, true, &precision, 11).unwrap();
        staged.to_device(DeviceKind::Cuda(0)).unwrap();
        resident.to_device(DeviceKind::Cuda(0)).unwrap();
        for pass in 0..2 {
            // Finite (a NaN would poison every later value), with flushed tiny values.
            let values = stats_probe(rows * inp)
                .iter()
                .map(|&v| {
                    if v.is_finite() {
                        v.clamp(-4.0, 4.0) * (pass + 1) as f32
                    } else {
                        0.0
                    }
                })
                .collect();
            let x = Tensor::new(values, rows, inp).unwrap();
            let dy = Tensor::new(ramp(rows * out, pass as f32 + 0.7), rows, out).unwrap();
            let layers = (&mut staged, &mut resident);
            same_pass(
                &format!("{name} pass {pass}"),
                layers,
                (&x, &dy),
                |l, x| l.forward(x),
                |l, dy| l.backward(dy),
            );
            // As after an optimizer step: the next pass casts the weight again, the resident
            // layer's from the master values it keeps on the device (not under fp32).
            staged.visit_parameters(&mut |p| p.mark_updated());
            resident.visit_parameters(&mut |p| p.mark_updated());
            let want = if name == "fp32" {
                DeviceKind::Cpu
            } else {
                DeviceKind::Cuda(0)
            };
            assert_eq!(resident.weight().value_device(), want, "{name}: the weight's values");
            assert_eq!(
                staged.weight().value_device(),
                DeviceKind::Cpu,
                "{name}: the staged weight"
            );
        }
        // The wgrad GEMMs and the bias sum accumulated on the device (the passes above added
        // two micro-batches there and matched the host's sums); a cleared gradient stays there.
        // fp32's GEMM finishes on the host, so its gradients stay there.
        let want = match name {
            "fp32" => DeviceKind::Cpu,
            _ => DeviceKind::Cuda(0),
        };
        resident.visit_parameters(&mut |p| {
            p.zero_grad();
            assert_eq!(p.grad_device(), want, "{name}: {}", p.name());
            assert!(p.grad().iter().all(|&g| g == 0.0), "{name}: {} cleared", p.name());
        });
    }
    println!(
        "linear_layers_keep_device_inputs_on_the_device: fp32, bf16, fp8-delayed/current/block, mxfp8: same bits, \
         gradients (kept on the device), slots and statistics"
    );
}

/// Two passes of [`same_pass`] of `[rows, inp] -> [rows, out]` linear layers, each on its own
/// input and output gradient.
fn linear_passes(
    case: &str,
    (staged, resident): (&mut crate::nn::Linear, &mut crate::nn::Linear),
    (rows, inp, out): (usize, usize, usize),
) {
    for pass in 0..2 {
        let x = Tensor::new(ramp(rows * inp, pass as f32 + 0.2), rows, inp).unwrap();
        let dy = Tensor::new(ramp(rows * out, pass as f32 + 1.3), rows, out).unwrap();
        same_pass(
            &format!("{case} pass {pass}"),
            (&mut *staged, &mut *resident),
            (&x, &dy),
            |l, x| l.forward(x),
            |l, dy| l.backward(dy),
        );
    }
}

/// On GPU 0: a `Linear` whose weight is frozen in FP8 (one segment, and three stacked as a fused
/// projection's; block and tensor scales; a trainable bias) fed device tensors keeps its output
/// and input gradient on the device and gives the staged layer's bits and bias gradient.
#[test]
fn frozen_fp8_linears_keep_device_inputs_on_the_device() {
    use crate::amp::Precision;
    use crate::nn::{BaseScaling, Linear, Module};
    if skipped_without_a_gpu("frozen_fp8_linears_keep_device_inputs_on_the_device") {
        return;
    }
    let (rows, inp, out) = (64, 256, 384);
    for name in ["bf16", "fp8-current"] {
        let precision: Precision = name.parse().unwrap();
        for scaling in [BaseScaling::Block, BaseScaling::Tensor] {
            for segments in [vec![out], vec![128, 128, 128]] {
                let case = format!("{name} {scaling:?} segments {segments:?}");
                let layer = || {
                    let mut l = Linear::new("fc", inp, out, true, &precision, 13).unwrap();
                    l.freeze_to_fp8(&segments, scaling).unwrap();
                    l.to_device(DeviceKind::Cuda(0)).unwrap();
                    l
                };
                let (mut staged, mut resident) = (layer(), layer());
                linear_passes(&case, (&mut staged, &mut resident), (rows, inp, out));
            }
        }
    }
    println!(
        "frozen_fp8_linears_keep_device_inputs_on_the_device: bf16, fp8-current x block/tensor scales x 1 and 3 \
         segments: same bits and bias gradients"
    );
}

/// On GPU 0: a `Linear` with a nonzero trainable bias fed device tensors keeps the bias's values
/// on the device (not under fp32: its GEMM finishes on the host) and its GEMMs read them there,
/// with the bits, gradients, slots and statistics of the same layer fed host tensors (its bias
/// uploaded by every GEMM), under every precision; so does a weight frozen in FP8 (one segment,
/// and three, whose parts of the bias are copied on the device). The same layer in shadow mode
/// passes its twins, which read a download of the bias.
#[test]
fn linear_biases_stay_on_the_device() {
    use crate::amp::Precision;
    use crate::nn::{BaseScaling, Linear, Module};
    const TEST: &str = "linear_biases_stay_on_the_device";
    if skipped_without_a_gpu(TEST) {
        return;
    }
    let (rows, inp, out) = (64, 256, 384);
    let gpu = Backend::on(DeviceKind::Cuda(0));
    for name in ["fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8"] {
        let precision: Precision = name.parse().unwrap();
        let mut weights = vec![None];
        if matches!(name, "bf16" | "fp8-current") {
            weights.extend([Some(vec![out]), Some(vec![128, 128, 128])]);
        }
        for segments in weights {
            let case = format!("{name}, FP8 segments {segments:?}");
            let layer = |shadow: bool| {
                let mut l = Linear::new("fc", inp, out, true, &precision, 17).unwrap();
                l.visit_parameters(&mut |p| {
                    if p.name() == "fc.bias" {
                        p.value_mut().copy_from_slice(&ramp(out, 0.4));
                        p.mark_updated();
                    }
                });
                if let Some(rows) = &segments {
                    l.freeze_to_fp8(rows, BaseScaling::Block).unwrap();
                }
                l.to_device(DeviceKind::Cuda(0)).unwrap();
                l.check_against_cpu(shadow);
                l
            };
            let (mut staged, mut resident) = (layer(false), layer(false));
            linear_passes(&case, (&mut staged, &mut resident), (rows, inp, out));
            let want = match name {
                "fp32" => DeviceKind::Cpu,
                _ => DeviceKind::Cuda(0),
            };
            let bias = |l: &Linear| l.bias().unwrap().value_device();
            assert_eq!(bias(&resident), want, "{case}: the bias's values");
            let bias_grad = resident.bias().unwrap().grad_device();
            assert_eq!(bias_grad, want, "{case}: the bias's gradient (FP8-frozen weights' too)");
            assert_eq!(bias(&staged), DeviceKind::Cpu, "{case}: the staged bias's values");
            let mut shadowed = layer(true);
            let x = Tensor::new(ramp(rows * inp, 0.2), rows, inp).unwrap();
            let dy = Tensor::new(ramp(rows * out, 1.3), rows, out).unwrap();
            let (x, dy) = (gpu.to_device(&x).unwrap(), gpu.to_device(&dy).unwrap());
            shadowed
                .forward(&x)
                .unwrap_or_else(|e| panic!("{case}: shadow forward: {e}"));
            shadowed
                .backward(&dy)
                .unwrap_or_else(|e| panic!("{case}: shadow backward: {e}"));
            assert_eq!(bias(&shadowed), want, "{case}: the shadowed bias's values");
        }
    }
    println!(
        "{TEST}: fp32, bf16, fp8-delayed/current/block, mxfp8, and FP8 weights of 1 and 3 segments: biases on the \
         device (not fp32), same bits and gradients as host-fed layers; shadow mode passes"
    );
}

/// On GPU 0: a frozen linear with LoRA adapters (with and without dropout) fed device tensors keeps its
/// output, its input gradient and the adapters' gradients on the device, with the staged
/// layer's bits and gradients: adapters on two row ranges of a fused output, B made nonzero so
/// every GEMM of the update counts; an FP8 base and a bf16 one.
#[test]
fn lora_adapters_keep_device_inputs_on_the_device() {
    use crate::amp::Precision;
    use crate::nn::{BaseScaling, Linear, LoraAdapter, LoraSettings, Module};
    if skipped_without_a_gpu("lora_adapters_keep_device_inputs_on_the_device") {
        return;
    }
    let (rows, inp, out) = (64, 256, 384);
    // With dropout the staged layer's masks come from the op's host arm, the resident one's
    // from the kernel: the same counter-based mask, so the same bits.
    for (name, dropout) in [
        ("bf16", 0.0),
        ("fp8-delayed", 0.0),
        ("fp8-block", 0.0),
        ("bf16", 0.1),
        ("fp8-delayed", 0.25),
    ] {
        let settings = LoraSettings {
            rank: 16,
            alpha: 24.0,
            dropout,
        };
        let precision: Precision = name.parse().unwrap();
        for fp8_base in [true, false] {
            let case = format!("{name} dropout {dropout} fp8 base {fp8_base}");
            let layer = || {
                let mut l = Linear::new("fc", inp, out, false, &precision, 13).unwrap();
                match fp8_base {
                    true => l.freeze_to_fp8(&[128, 128, 128], BaseScaling::Block).unwrap(),
                    false => l.weight_mut().freeze(),
                }
                for (i, (offset, n)) in [(0, 128), (256, 128)].into_iter().enumerate() {
                    let mut a =
                        LoraAdapter::new(&format!("fc.{i}"), offset, n, inp, &settings, &precision, 5 + i as u64)
                            .unwrap();
                    a.visit_parameters(&mut |p| {
                        let len = p.value().len();
                        p.value_mut().copy_from_slice(&ramp(len, 0.9)[..]);
                    });
                    l.add_adapter(a).unwrap();
                }
                l.to_device(DeviceKind::Cuda(0)).unwrap();
                l
            };
            let (mut staged, mut resident) = (layer(), layer());
            linear_passes(&case, (&mut staged, &mut resident), (rows, inp, out));
            if dropout > 0.0 {
                replayed_pass(&case, (&mut staged, &mut resident), (rows, inp, out));
            }
            let on_device = resident.adapters().iter().all(|a| {
                [a.a(), a.b()]
                    .iter()
                    .all(|p| (p.value_device(), p.grad_device()) == (DeviceKind::Cuda(0), DeviceKind::Cuda(0)))
            });
            assert!(
                on_device,
                "{case}: the adapters' values and gradients stay on the device"
            );
        }
    }
    println!(
        "lora_adapters_keep_device_inputs_on_the_device: bf16, fp8-delayed, fp8-block, and bf16 and fp8-delayed \
         with dropout, x FP8 and bf16 bases, two adapters: same bits and gradients, adapter values and gradients on \
         the device"
    );
}

/// One more pass where the resident layer recomputes: its saved state dropped after the
/// forward and the forward replayed before the backward (the dropout kernel redraws that
/// forward's mask), against the staged layer's plain pass: the same bits and state.
fn replayed_pass(
    case: &str,
    (staged, resident): (&mut crate::nn::Linear, &mut crate::nn::Linear),
    (rows, inp, out): (usize, usize, usize),
) {
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let x = Tensor::new(ramp(rows * inp, 3.2), rows, inp).unwrap();
    let dy = Tensor::new(ramp(rows * out, 4.3), rows, out).unwrap();
    let (xd, dyd) = (gpu.to_device(&x).unwrap(), gpu.to_device(&dy).unwrap());
    let y = staged.forward(&x).unwrap();
    let yd = resident.forward(&xd).unwrap();
    resident.clear_saved();
    let replayed = resident.forward_pass(&xd, true).unwrap();
    assert_eq!(bits(&y), bits(&yd), "{case} recompute: forward");
    assert_eq!(
        bits(&yd),
        bits(&replayed),
        "{case} recompute: the replay redraws the mask"
    );
    let (dx, dxd) = (staged.backward(&dy).unwrap(), resident.backward(&dyd).unwrap());
    assert_eq!(bits(&dx), bits(&dxd), "{case} recompute: backward");
    assert_eq!(
        state(staged),
        state(resident),
        "{case} recompute: gradients, slots, statistics"
    );
}

/// On GPU 0: a frozen weight segment's `W^T` made on the device (`fp8_transpose_8` from its
/// device copy, or from codes uploaded for it) is the CPU transpose, codes and scales, and its
/// codes stay on the device until read; refused layouts are refused there too.
#[test]
fn frozen_weights_transpose_on_the_device() {
    use crate::nn::{BaseScaling, quantize_frozen_weight as quantize_weight};
    use crate::quantize::transpose_matrix;
    use crate::tensor::{QuantizedMatrix, Scales};
    if skipped_without_a_gpu("frozen_weights_transpose_on_the_device") {
        return;
    }
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let mut checked = 0;
    // Whole and ragged 128x128 blocks and 32x32 kernel tiles; one row or one column.
    for (rows, cols) in [(128, 256), (300, 200), (1, 640), (384, 1)] {
        for scaling in [BaseScaling::Block, BaseScaling::Tensor] {
            let m = quantize_weight(&ramp(rows * cols, 0.7), rows, cols, scaling).unwrap();
            let want = transpose_matrix(&m).unwrap();
            let mut held = m.clone();
            held.set_mirror(gpu.resident_copy(&m).unwrap());
            for (source, input) in [("held", &held), ("uploaded", &m)] {
                let case = format!("{rows}x{cols} {scaling:?} {source}");
                let got = gpu.kernels().transpose_fp8(input).unwrap();
                // (`FP8_CUDA_MIRRORS=0` keeps the host transpose.)
                if super::cuda_ops::switches::mirrors_enabled() {
                    assert!(
                        got.mirror().is_some() && !got.codes_on_host(),
                        "{case}: codes stay on the device"
                    );
                }
                assert_eq!(got, want, "{case}: codes and scales");
                checked += 1;
            }
        }
    }
    let rows_only = QuantizedMatrix::new(vec![0x38; 128 * 128], 128, 128, Scales::Block1x128(vec![1.0; 128])).unwrap();
    assert!(
        gpu.kernels().transpose_fp8(&rows_only).is_err(),
        "1x128 scales have no exact transpose"
    );
    println!("frozen_weights_transpose_on_the_device: {checked} transposes, same codes and scales as the CPU");
}

/// On GPU 0: three micro-batches of a step accumulated into gradients kept on the device (each
/// micro-batch's gradient from zero, the earlier sum added on the device) give the bits of the
/// same layer fed host tensors, whose gradients are summed on the host.
#[test]
fn micro_batches_accumulate_gradients_on_the_device() {
    use crate::amp::Precision;
    use crate::nn::{Linear, Module};
    use crate::train::accumulate::{Share, accumulate_share};
    if skipped_without_a_gpu("micro_batches_accumulate_gradients_on_the_device") {
        return;
    }
    let (rows, inp, out) = (48, 128, 64);
    let gpu = Backend::on(DeviceKind::Cuda(0));
    for name in ["bf16", "fp8-delayed"] {
        let precision: Precision = name.parse().unwrap();
        let mut layers = Vec::new();
        for resident in [false, true] {
            let mut layer = Linear::new("fc", inp, out, true, &precision, 3).unwrap();
            layer.to_device(DeviceKind::Cuda(0)).unwrap();
            let share = Share {
                first: 0,
                count: 3,
                total: 3,
            };
            accumulate_share(&mut layer, share, 1.0, |l, micro| {
                let k = micro.index as f32;
                let x = Tensor::new(ramp(rows * inp, k + 0.3), rows, inp)?;
                let dy = Tensor::new(ramp(rows * out, k + 1.1), rows, out)?;
                let (x, dy) = match resident {
                    true => (gpu.to_device(&x)?, gpu.to_device(&dy)?),
                    false => (x, dy),
                };
                l.forward(&x)?;
                l.backward(&dy)?;
                Ok(1.0)
            })
            .unwrap();
            layer.visit_parameters(&mut |p| {
                let want = if resident { DeviceKind::Cuda(0) } else { DeviceKind::Cpu };
                assert_eq!(p.grad_device(), want, "{name}: {}", p.name());
            });
            layers.push(state(&mut layer).0);
        }
        assert_eq!(layers[1], layers[0], "{name}: accumulated gradients");
    }
    println!(
        "micro_batches_accumulate_gradients_on_the_device: bf16, fp8-delayed: same gradient bits over 3 micro-batches"
    );
}

/// On GPU 0 with `FP8_CUDA_DEVICE_BANKS=1`: a delayed-scaling linear fed device tensors keeps
/// its slot bank on the device (amaxes folded there, the update in place, its scales read back
/// behind the update) with the bits of the same layer fed host tensors, whose bank stays in
/// host memory: outputs, gradients, slots and statistics over passes with an update each, then
/// (after a change of both banks at home) a step of two micro-batches updated once
/// (`update_per_step`), then a recompute; the statistics read in one go as the trainer does.
#[test]
fn slot_banks_on_the_device_match_host_banks() {
    use crate::amp::Precision;
    use crate::nn::{Linear, Module};
    const TEST: &str = "slot_banks_on_the_device_match_host_banks";
    if skipped_without_a_gpu(TEST) {
        return;
    }
    if !crate::backend::cuda::env_switch::device_slot_banks() {
        // Not "skipped:", which would mark the whole bundle step skipped.
        println!("{TEST}: not run here: FP8_CUDA_DEVICE_BANKS is not 1");
        return;
    }
    let (rows, inp, out) = (64, 128, 96);
    let precision: Precision = "fp8-delayed".parse().unwrap();
    let mut staged = Linear::new("fc", inp, out, true, &precision, 5).unwrap();
    let mut resident = Linear::new("fc", inp, out, true, &precision, 5).unwrap();
    staged.to_device(DeviceKind::Cuda(0)).unwrap();
    resident.to_device(DeviceKind::Cuda(0)).unwrap();
    let bank_of = |l: &mut Linear| {
        let mut at = None;
        l.visit_gemms(&mut |g| at = g.slots_device());
        at
    };
    let data = |pass: usize| {
        let x = Tensor::new(ramp(rows * inp, pass as f32 * 0.9 + 0.2), rows, inp).unwrap();
        let scale = 10f32.powi(pass as i32 - 1);
        let dy = ramp(rows * out, pass as f32 + 0.7).iter().map(|v| v * scale).collect();
        (x, Tensor::new(dy, rows, out).unwrap())
    };
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let start = state(&mut resident).1;
    // Reading the slots brings a bank home, so the passes run unread: each pass's casts take the
    // scales the previous updates left on the device (their pinned copies), and the outputs
    // say whether they were the host bank's.
    for pass in 0..3 {
        let (x, dy) = data(pass);
        let (xd, dyd) = (gpu.to_device(&x).unwrap(), gpu.to_device(&dy).unwrap());
        let (y, yd) = (staged.forward(&x).unwrap(), resident.forward(&xd).unwrap());
        assert_eq!(bank_of(&mut resident), Some(0), "pass {pass}: the bank went up");
        assert_eq!(
            bank_of(&mut staged),
            None,
            "pass {pass}: a host input's bank stays home"
        );
        assert_eq!(bits(&y), bits(&yd), "pass {pass}: forward");
        let (dx, dxd) = (staged.backward(&dy).unwrap(), resident.backward(&dyd).unwrap());
        assert_eq!(
            bank_of(&mut resident),
            Some(0),
            "pass {pass}: still there after backward"
        );
        assert_eq!(bits(&dx), bits(&dxd), "pass {pass}: backward");
    }
    // The trainer's one-go read of the statistics (gathered on the device) first.
    let read_all = crate::train::fp8_stats_reads::read_pending_stats;
    read_all(&mut resident).unwrap();
    let (want, got) = (state(&mut staged), state(&mut resident));
    assert_eq!(want, got, "after 3 passes: gradients, slots, statistics");
    assert_ne!(got.1, start, "the updates moved the slots");
    // Both banks are home now: changed there (as a checkpoint load or an evaluation's restore
    // does), the device bank must go up again with the host's values and scales.
    for l in [&mut staged, &mut resident] {
        l.visit_fp8_slots(&mut |_, slot| {
            slot.scale *= 0.5;
            slot.history[0] = 3.0;
        });
    }
    // One step of two micro-batches, the update once at its end.
    for l in [&mut staged, &mut resident] {
        l.visit_gemms(&mut |g| g.set_update_per_step(true));
    }
    for micro in 0..2 {
        let (x, dy) = data(3 + micro);
        let (xd, dyd) = (gpu.to_device(&x).unwrap(), gpu.to_device(&dy).unwrap());
        let (y, yd) = (staged.forward(&x).unwrap(), resident.forward(&xd).unwrap());
        assert_eq!(bits(&y), bits(&yd), "micro-batch {micro}: forward");
        let (dx, dxd) = (staged.backward(&dy).unwrap(), resident.backward(&dyd).unwrap());
        assert_eq!(bits(&dx), bits(&dxd), "micro-batch {micro}: backward");
    }
    assert_eq!(
        bank_of(&mut resident),
        Some(0),
        "the micro-batches folded their amaxes there"
    );
    for l in [&mut staged, &mut resident] {
        let mut result = Ok(());
        l.visit_gemms(&mut |g| result = result.clone().and(g.update_step()));
        result.unwrap();
    }
    read_all(&mut resident).unwrap();
    assert_eq!(state(&mut staged), state(&mut resident), "the step's update");
    // A recompute in backward casts with the forward's input scale and records nothing.
    for l in [&mut staged, &mut resident] {
        l.visit_gemms(&mut |g| g.set_update_per_step(false));
    }
    let (x, dy) = data(5);
    let (xd, dyd) = (gpu.to_device(&x).unwrap(), gpu.to_device(&dy).unwrap());
    staged.forward(&x).unwrap();
    resident.forward(&xd).unwrap();
    let (y, yd) = (
        staged.forward_pass(&x, true).unwrap(),
        resident.forward_pass(&xd, true).unwrap(),
    );
    assert_eq!(bits(&y), bits(&yd), "recompute");
    let (dx, dxd) = (staged.backward(&dy).unwrap(), resident.backward(&dyd).unwrap());
    assert_eq!(bits(&dx), bits(&dxd), "backward after the recompute");
    read_all(&mut resident).unwrap();
    assert_eq!(state(&mut staged), state(&mut resident), "after the recompute");
    println!(
        "{TEST}: fp8-delayed: same outputs, gradients, slots and statistics over 3 passes, a 2-micro-batch step \
         and a recompute"
    );
}

/// On GPU 0: AdamW over the device arenas updates master values kept on the device in place
/// (a copy on the device each way) and host ones through the host, with the bits of the same
/// steps on a module whose values all live in host memory.
#[test]
fn optimizer_arenas_update_device_weights_on_the_device() {
    use crate::train::adamw::{AdamW, AdamWConfig};
    use crate::train::test_util::ParamList;
    if skipped_without_a_gpu("optimizer_arenas_update_device_weights_on_the_device") {
        return;
    }
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let module = || {
        ParamList::new(&[
            ("w", &[48, 64], ramp(48 * 64, 0.3)),
            ("b", &[64], ramp(64, 1.3)),
            ("fc", &[100, 33], ramp(3300, 2.3)),
        ])
    };
    let (mut host, mut device) = (module(), module());
    for i in [0, 2] {
        device.params[i].keep_value_on(&gpu).unwrap();
        assert_eq!(device.params[i].value_device(), DeviceKind::Cuda(0));
    }
    let config = AdamWConfig {
        weight_decay: 0.1,
        ..AdamWConfig::default()
    };
    let (mut a, mut b) = (AdamW::new(config).unwrap(), AdamW::new(config).unwrap());
    a.to_device(DeviceKind::Cuda(0));
    b.to_device(DeviceKind::Cuda(0));
    let arenas = std::env::var("FP8_CUDA_ARENAS").map_or(true, |v| v.trim() != "0");
    for step in 0..3 {
        for m in [&mut host, &mut device] {
            for (j, p) in m.params.iter_mut().enumerate() {
                let g = ramp(p.grad_len(), (step * 3 + j) as f32);
                p.grad_mut().copy_from_slice(&g);
            }
        }
        a.step(&mut host, 1e-2).unwrap();
        b.step(&mut device, 1e-2).unwrap();
        for (h, d) in host.params.iter().zip(&device.params) {
            let vbits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(vbits(h.value()), vbits(d.value()), "step {step}: {}", h.name());
        }
        if arenas {
            for i in [0, 2] {
                assert_eq!(device.params[i].value_device(), DeviceKind::Cuda(0), "step {step}");
            }
        }
    }
    println!("optimizer_arenas_update_device_weights_on_the_device: 3 steps, same bits as host values");
}

/// On GPU 0 with `FP8_CUDA_ARENA_VIEWS=1`: a linear fed device tensors, whose optimizer's arenas
/// were made before its first forward, keeps its weight, its weight gradient and its bias
/// gradient in their arena ranges (no device copy of their own: checked after every backward
/// and every step) through steps of two micro-batches, and trains with the bits of the same
/// linear fed host tensors (its values and gradients in host memory, copied into its arenas
/// each step): values, gradients, slots and statistics after every step, moments at the end.
/// The steps go the trainer's way, checked and clipped in the arenas (the held gradients in
/// place) with a clip that bites, then the update.
#[test]
fn linear_layers_train_in_their_arena_ranges() {
    use crate::amp::Precision;
    use crate::nn::{Linear, Module};
    use crate::train::accumulate::{Share, accumulate_share};
    use crate::train::adamw::{AdamW, AdamWConfig};
    const TEST: &str = "linear_layers_train_in_their_arena_ranges";
    if skipped_without_a_gpu(TEST) {
        return;
    }
    if !crate::backend::cuda::env_switch::arena_views() {
        // Not "skipped:", which would mark the whole bundle step skipped.
        println!("{TEST}: not run here: FP8_CUDA_ARENA_VIEWS is not 1");
        return;
    }
    let (rows, inp, out) = (48, 128, 64);
    let gpu = Backend::on(DeviceKind::Cuda(0));
    let held = |p: &crate::nn::Parameter| {
        let range = |v: Values<'_>| matches!(v, Values::Device(d) if d.arena_view().is_some());
        (range(p.value_values()), range(p.grad_values()))
    };
    let where_held = |m: &mut Linear| {
        let mut at = Vec::new();
        m.visit_parameters(&mut |p| at.push((p.name().to_string(), held(p))));
        at
    };
    // What holds its range: the weight's and the bias's values and gradients (the GEMM's
    // epilogue reads the bias on the device).
    let in_ranges = vec![
        ("fc.weight".to_string(), (true, true)),
        ("fc.bias".to_string(), (true, true)),
    ];
    for name in ["bf16", "fp8-delayed"] {
        let precision: Precision = name.parse().unwrap();
        let config = AdamWConfig {
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        let mut layers = Vec::new();
        let mut optimizers = Vec::new();
        for _ in 0..2 {
            let mut layer = Linear::new("fc", inp, out, true, &precision, 3).unwrap();
            layer.to_device(DeviceKind::Cuda(0)).unwrap();
            let mut opt = AdamW::new(config).unwrap();
            opt.to_device(DeviceKind::Cuda(0));
            opt.prepare(&mut layer).unwrap();
            layers.push(layer);
            optimizers.push(opt);
        }
        for step in 0..3 {
            // Gradients, slots and statistics before each update (the update clips the held
            // gradients in place, the host ones only in the arena).
            let (mut before, mut norms) = (Vec::new(), Vec::new());
            for (resident, (layer, opt)) in layers.iter_mut().zip(&mut optimizers).enumerate() {
                let share = Share {
                    first: 0,
                    count: 2,
                    total: 2,
                };
                accumulate_share(layer, share, 1.0, |l, micro| {
                    let k = (step * 2 + micro.index) as f32;
                    let x = Tensor::new(ramp(rows * inp, k + 0.3), rows, inp)?;
                    let dy = Tensor::new(ramp(rows * out, k + 1.1), rows, out)?;
                    let (x, dy) = match resident == 1 {
                        true => (gpu.to_device(&x)?, gpu.to_device(&dy)?),
                        false => (x, dy),
                    };
                    l.forward(&x)?;
                    l.backward(&dy)?;
                    if resident == 1 {
                        assert_eq!(
                            where_held(l),
                            in_ranges,
                            "{name}, step {step}, micro-batch {}",
                            micro.index
                        );
                    }
                    Ok(1.0)
                })
                .unwrap();
                before.push(state(layer));
                let mut scaler = crate::amp::loss_scaler::DynamicLossScaler::disabled();
                let outcome = crate::train::step::apply_gradients(layer, &mut scaler, opt, 1e-2, Some(0.05)).unwrap();
                assert!(
                    outcome.grad_norm > 0.05,
                    "{name}: the clip must bite (norm {})",
                    outcome.grad_norm
                );
                norms.push(outcome.grad_norm.to_bits());
            }
            let (host, device) = layers.split_at_mut(1);
            let (host, device) = (&mut host[0], &mut device[0]);
            assert_eq!(where_held(device), in_ranges, "{name}, step {step}: after the update");
            let values = |m: &mut Linear| {
                let mut v = Vec::new();
                m.visit_parameters(&mut |p| v.push(p.value().iter().map(|x| x.to_bits()).collect::<Vec<_>>()));
                v
            };
            assert_eq!(
                before[0], before[1],
                "{name}, step {step}: gradients, slots, statistics"
            );
            assert_eq!(values(host), values(device), "{name}, step {step}: values");
            assert_eq!(norms[0], norms[1], "{name}, step {step}: the norms");
            // The held gradients are the arena's, clipped in place: the host ones (left as they
            // were) times the clip coefficient, one f32 multiply each.
            let coef = crate::train::clip::clip_coefficient(f64::from_bits(norms[0]), 0.05).unwrap();
            for ((name_h, h), (_, d)) in state(host).0.iter().zip(&state(device).0) {
                let clipped: Vec<u32> = h.iter().map(|g| (g * coef).to_bits()).collect();
                let held: Vec<u32> = d.iter().map(|g| g.to_bits()).collect();
                assert_eq!(held, clipped, "{name}, step {step}: {name_h} clipped in place");
            }
        }
        let moments = |o: &AdamW| {
            let s = o.state().unwrap();
            let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            s.moments.iter().map(|m| (b(&m.m), b(&m.v))).collect::<Vec<_>>()
        };
        assert_eq!(moments(&optimizers[0]), moments(&optimizers[1]), "{name}: moments");
    }
    println!("{TEST}: bf16, fp8-delayed: 3 steps of 2 micro-batches in arena ranges, same bits as host parameters");
}

/// On GPU 0: a `TransformerLayer` fed a device tensor (what a resident GPU backend uploads at its
/// boundary) runs every op on device tensors and gives the bits, parameter gradients, slots and
/// statistics of the same layer fed host tensors (staged ops), over two passes, with and without
/// recompute, under bf16 and FP8 (delayed and block), with GELU + LayerNorm and SwiGLU + RMSNorm.
#[test]
fn transformer_layers_keep_device_inputs_on_the_device() {
    use crate::amp::Precision;
    use crate::nn::{Activation, Module, NormKind, TransformerConfig, TransformerLayer};
    if skipped_without_a_gpu("transformer_layers_keep_device_inputs_on_the_device") {
        return;
    }
    let (batch, seq, hidden) = (2, 32, 128);
    let shapes = [
        (Activation::Gelu, NormKind::LayerNorm, false),
        (Activation::SwiGlu, NormKind::RmsNorm, true),
    ];
    for name in ["bf16", "fp8-delayed", "fp8-block"] {
        let precision: Precision = name.parse().unwrap();
        for (activation, norm, recompute) in shapes {
            let config = TransformerConfig {
                hidden,
                heads: 4,
                ffn_hidden: 256,
                activation,
                norm,
                recompute,
                ..TransformerConfig::default()
            };
            let case = format!("{name} {activation:?} {norm:?} recompute {recompute}");
            let mut staged = TransformerLayer::new("layer", &config, &precision, 5).unwrap();
            let mut resident = TransformerLayer::new("layer", &config, &precision, 5).unwrap();
            staged.to_device(DeviceKind::Cuda(0)).unwrap();
            resident.to_device(DeviceKind::Cuda(0)).unwrap();
            for pass in 0..2 {
                let x = Tensor::new(ramp(batch * seq * hidden, pass as f32), batch * seq, hidden).unwrap();
                let dy = Tensor::new(ramp(batch * seq * hidden, pass as f32 + 2.5), batch * seq, hidden).unwrap();
                let layers = (&mut staged, &mut resident);
                let forward = |l: &mut TransformerLayer, x: &Tensor| l.forward(x, batch, seq);
                same_pass(&format!("{case} pass {pass}"), layers, (&x, &dy), forward, |l, dy| {
                    l.backward(dy)
                });
            }
        }
    }
    println!(
        "transformer_layers_keep_device_inputs_on_the_device: bf16, fp8-delayed, fp8-block x (GELU + LayerNorm, \
         SwiGLU + RMSNorm with recompute): same bits, gradients, slots and statistics"
    );
}

/// Shadow mode checks the counts a cast made (a GPU cast of a device source counts there, and
/// `cast_stats` then reads the counts instead of the source): a cast whose values agree but
/// whose counts differ from the CPU cast's is a breach at the index after the values.
#[test]
fn shadow_mode_checks_the_counts_a_cast_made() {
    use super::twin::Outcome;
    let recipe = fp8_recipe("fp8-delayed");
    let x = stats_probe(16 * 32);
    let cpu = CpuKernels
        .quantize(
            &recipe,
            crate::scaling::TensorRole::Input,
            Values::Host(&x),
            16,
            32,
            2.0,
        )
        .unwrap();
    let counts = cpu
        .counts
        .as_ref()
        .expect("a CPU per-tensor cast counts")
        .get()
        .unwrap();
    // The same cast (`cpu` stays whole).
    let same = super::Cast {
        tensor: cpu.tensor.clone(),
        counts: Some(counts.into()),
        amax: cpu.amax.clone(),
        scale: cpu.scale.clone(),
    };
    let contract = super::contract::contract("quantize");
    assert_eq!(same.breach(&cpu, contract), None);
    let mut wrong = counts;
    wrong[1] += 1;
    let miscounted = super::Cast {
        counts: Some(wrong.into()),
        ..same
    };
    let breach = miscounted.breach(&cpu, contract).expect("a miscount is a breach");
    // Both copies' codes (16 x 32 each, per-tensor scales) and amax, scale come first.
    assert_eq!(breach.index, 2 * (16 * 32 + 1) + 2 + 1);
    assert_eq!((breach.primary, breach.cpu), ((counts[1] + 1) as f64, counts[1] as f64));
    // A cast that made no counts (the GPU's cast of a host source) has nothing to compare.
    let uncounted = super::Cast {
        counts: None,
        ..miscounted
    };
    assert_eq!(uncounted.breach(&cpu, contract), None);
}
