//! The CUDA runner of `fp8 bench gemm --backend cuda`: per case, in one process,
//! the portable mma.sync kernel, the Hopper wgmma path (sm_90 only, forced
//! whatever `FP8_GEMM_PATH` says, after its self-check) and cuBLASLt, each timed
//! with CUDA events. `tflops` is the path the engine would choose
//! ([`path_for`]); a path that fails is reported in its own column, with the
//! kernel that ran; both paths' outputs are judged against the error bound.

use fp8_engine::backend::cuda::cublaslt::{CublasLt, LtInputs, LtOutput, cublaslt_present};
use fp8_engine::backend::cuda::gemm::{DeviceGemmParams, DeviceOperand, DeviceOutput, DeviceScales, HostUpload};
use fp8_engine::backend::cuda::gemm_dispatch::{GemmInputs, cached_kernel};
use fp8_engine::backend::cuda::gemm_path::{hopper_scales, path_for, self_check};
use fp8_engine::backend::cuda::hopper::{self, GemmPath};
use fp8_engine::backend::cuda::{CudaDevice, DeviceBuffer};
use fp8_engine::device::MemoryCategory;
use fp8_engine::format::Fp8Format;
use half::{bf16, f16};

use crate::bench_gemm_runner::{CaseInputs, GemmRunner, Measurement, OutFormat, out_scale};
use crate::error::CliError;
use crate::timing::median_ms;

/// Runs cases on GPU 0.
pub struct CudaRunner {
    device: CudaDevice,
    lt: Option<CublasLt>,
}

impl CudaRunner {
    /// Opens GPU 0 (and cuBLASLt when the library is present).
    pub fn open() -> Result<Self, CliError> {
        let device = CudaDevice::open(0)?;
        let lt = if cublaslt_present() {
            Some(CublasLt::new(&device)?)
        } else {
            None
        };
        Ok(CudaRunner { device, lt })
    }
}

/// Dense (no sparsity) datasheet peak in TFLOPS of the SXM H100/H200, by device
/// name: FP8 1979, bf16/fp16 989. Other GPUs (PCIe and NVL parts included) are unknown.
pub fn dense_peak_tflops(name: &str, fp8: bool) -> Option<f64> {
    let name = name.to_ascii_uppercase();
    let hopper_sxm =
        (name.contains("H100") || name.contains("H200")) && !name.contains("PCIE") && !name.contains("NVL");
    hopper_sxm.then_some(if fp8 { 1979.0 } else { 989.0 })
}

/// The output buffer on the device.
enum DeviceOut {
    F32(DeviceBuffer<f32>),
    Bf16(DeviceBuffer<bf16>),
    F16(DeviceBuffer<f16>),
    Fp8(DeviceBuffer<u8>, Fp8Format, DeviceBuffer<f32>, f32),
}

impl DeviceOut {
    fn new(device: &CudaDevice, format: OutFormat, len: usize, scale: f32) -> fp8_engine::Result<Self> {
        let cat = MemoryCategory::Activations;
        Ok(match format {
            OutFormat::F32 => DeviceOut::F32(device.alloc_zeros(len, cat)?),
            OutFormat::Bf16 => DeviceOut::Bf16(device.alloc_zeros(len, cat)?),
            OutFormat::F16 => DeviceOut::F16(device.alloc_zeros(len, cat)?),
            OutFormat::E4m3 | OutFormat::E5m2 => DeviceOut::Fp8(
                device.alloc_zeros(len, cat)?,
                format.fp8().expect("FP8 output"),
                device.upload(&[scale], MemoryCategory::Workspace)?,
                scale,
            ),
        })
    }

    fn target(&mut self) -> DeviceOutput<'_> {
        match self {
            DeviceOut::F32(d) => DeviceOutput::F32(d),
            DeviceOut::Bf16(d) => DeviceOutput::Bf16(d),
            DeviceOut::F16(d) => DeviceOutput::F16(d),
            DeviceOut::Fp8(codes, format, scale, _) => DeviceOutput::Fp8 {
                codes,
                format: *format,
                scale,
            },
        }
    }

    /// The output as f32 (FP8 codes decoded and divided by their scale).
    fn download(&self, device: &CudaDevice) -> fp8_engine::Result<Vec<f32>> {
        Ok(match self {
            DeviceOut::F32(d) => device.download(d)?,
            DeviceOut::Bf16(d) => device.download(d)?.iter().map(|x| x.to_f32()).collect(),
            DeviceOut::F16(d) => device.download(d)?.iter().map(|x| x.to_f32()).collect(),
            DeviceOut::Fp8(codes, format, _, scale) => {
                let table = format.decode_table();
                device
                    .download(codes)?
                    .iter()
                    .map(|&c| table[c as usize] / scale)
                    .collect()
            }
        })
    }
}

/// The kernel family of the operands (MXFP8 when both carry E8M0 scales).
fn gemm_inputs(a: &DeviceOperand, b: &DeviceOperand) -> Result<GemmInputs, CliError> {
    fp8_engine::backend::cuda::gemm::gemm_inputs(a, b)
        .ok_or_else(|| CliError("bench gemm: the two operands have different dtypes".into()))
}

fn path_name(path: GemmPath) -> &'static str {
    match path {
        GemmPath::Portable => "portable",
        GemmPath::Hopper => "hopper",
    }
}

/// One timed path: median seconds, its output and the kernel that ran, or why it did not run.
type PathResult = Result<(f64, Vec<f32>, &'static str), String>;

impl GemmRunner for CudaRunner {
    fn describe(&self) -> String {
        let info = self.device.info();
        let (major, minor) = info.compute_capability;
        format!("{} (sm_{major}{minor}, {} SMs)", info.name, info.multiprocessors)
    }

    fn peak_tflops(&self, fp8_inputs: bool) -> Option<f64> {
        dense_peak_tflops(&self.device.info().name, fp8_inputs)
    }

    fn measure(&mut self, inputs: &CaseInputs, repeat: usize) -> Result<Measurement, CliError> {
        let dev = &self.device;
        let (m, n, k) = (inputs.a.rows, inputs.b.rows, inputs.a.k);
        let a_up = HostUpload::new(dev, &inputs.a.view()?)?;
        let b_up = HostUpload::new(dev, &inputs.b.view()?)?;
        let (a, b) = (a_up.operand(), b_up.operand());
        let portable = cached_kernel(dev.info().compute_capability, gemm_inputs(&a, &b)?)?;
        let params = |kernel| DeviceGemmParams {
            split_accumulator: inputs.split,
            kernel,
            ..Default::default()
        };
        // FP8 outputs need a scale: fp8_max / amax of an untimed f32 run (as in the CPU runner).
        let scale = match inputs.out.fp8() {
            Some(format) => {
                let mut d = dev.alloc_zeros::<f32>(m * n, MemoryCategory::Activations)?;
                let mut amax = dev.alloc_zeros::<f32>(1, MemoryCategory::Workspace)?;
                let p = DeviceGemmParams {
                    amax: Some(&mut amax),
                    ..params(Some(portable))
                };
                dev.gemm(&a, &b, DeviceOutput::F32(&mut d), p)?;
                out_scale(format.max_finite(), dev.download(&amax)?[0])
            }
            None => 1.0,
        };
        let mut out = DeviceOut::new(dev, inputs.out, m * n, scale)?;
        let mut time_path = |path: GemmPath| -> PathResult {
            // The kernel that actually ran (the Hopper plan's variant, not the portable name).
            let mut kernel = portable.function;
            let mut run = || match path {
                GemmPath::Portable => dev.gemm(&a, &b, out.target(), params(Some(portable))).map(|_| ()),
                GemmPath::Hopper => {
                    let scales = hopper_scales(&a, &b).ok_or_else(|| fp8_engine::Error::KernelArgs {
                        kernel: "gemm_wgmma",
                        detail: "the fast path has no kernel for these formats/scales".into(),
                    })?;
                    kernel = dev.gemm_hopper(&a, &b, scales, out.target(), params(None))?.kernel;
                    Ok(())
                }
            };
            let ms = median_ms(dev, 1, repeat, &mut run).map_err(|e| e.to_string())?;
            let output = out.download(dev).map_err(|e| e.to_string())?;
            Ok((ms * 1e-3, output, kernel))
        };
        let portable_result = time_path(GemmPath::Portable);
        let fp8 = matches!(a, DeviceOperand::Fp8 { .. });
        let hopper_result: PathResult = if !fp8 {
            Err("FP8 inputs only".into())
        } else if !hopper::device_capable(dev) {
            Err("needs sm_90 and a build with kernels".into())
        } else {
            match self_check(dev) {
                Err(e) => Err(format!("self-check did not run: {e}")),
                Ok(run) => match hopper::self_check::compare(&run) {
                    Err(mismatch) => Err(format!("self-check mismatch: {mismatch}")),
                    Ok(()) => time_path(GemmPath::Hopper),
                },
            }
        };
        let chosen = path_for(dev, &a, &b).map_err(|e| e.to_string());
        let baseline = self.baseline(&a, &b, (m, n, k), inputs.split, repeat);
        let (seconds, output) = match &chosen {
            Ok(GemmPath::Portable) => split(&portable_result),
            Ok(GemmPath::Hopper) => split(&hopper_result),
            Err(e) => (Err(e.clone()), None),
        };
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        let tflops = |r: &PathResult| r.as_ref().ok().map(|(s, _, _)| flops / s / 1e12);
        let error = |r: &PathResult| r.as_ref().err().cloned();
        let kernel = |r: &PathResult| r.as_ref().ok().map(|(_, _, k)| *k);
        let extra = vec![
            ("path", serde_json::json!(chosen.as_ref().ok().map(|p| path_name(*p)))),
            ("portable_tflops", serde_json::json!(tflops(&portable_result))),
            ("portable_error", serde_json::json!(error(&portable_result))),
            ("portable_kernel", serde_json::json!(kernel(&portable_result))),
            ("hopper_tflops", serde_json::json!(tflops(&hopper_result))),
            ("hopper_error", serde_json::json!(error(&hopper_result))),
            ("hopper_kernel", serde_json::json!(kernel(&hopper_result))),
        ];
        let checked = [("portable", &portable_result), ("hopper", &hopper_result)]
            .into_iter()
            .filter_map(|(name, r)| r.as_ref().ok().map(|(_, out, _)| (name, out.clone(), scale)))
            .collect();
        Ok(Measurement {
            seconds,
            baseline_seconds: baseline,
            output,
            checked,
            extra,
        })
    }
}

fn split(r: &PathResult) -> (Result<f64, String>, Option<Vec<f32>>) {
    match r {
        Ok((s, out, _)) => (Ok(*s), Some(out.clone())),
        Err(e) => (Err(e.clone()), None),
    }
}

impl CudaRunner {
    /// cuBLASLt on the same device inputs (bf16 output): FP8 with per-tensor scales
    /// (fast accumulation = not split) or bf16 x bf16; median seconds.
    fn baseline(
        &mut self,
        a: &DeviceOperand,
        b: &DeviceOperand,
        mnk: (usize, usize, usize),
        split: bool,
        repeat: usize,
    ) -> Result<f64, String> {
        let lt = self.lt.as_mut().ok_or("libcublasLt not found")?;
        let inputs = match (a, b) {
            (
                DeviceOperand::Fp8 {
                    format: fa,
                    codes: ca,
                    scales: DeviceScales::PerTensor(sa),
                    ..
                },
                DeviceOperand::Fp8 {
                    format: fb,
                    codes: cb,
                    scales: DeviceScales::PerTensor(sb),
                    ..
                },
            ) => LtInputs::Fp8 {
                a: (ca, *fa),
                b: (cb, *fb),
                a_scale_inv: sa,
                b_scale_inv: sb,
                fast_accum: !split,
            },
            (DeviceOperand::Bf16 { data: da, .. }, DeviceOperand::Bf16 { data: db, .. }) => {
                LtInputs::Bf16 { a: da, b: db }
            }
            _ => return Err("cuBLASLt baseline: per-tensor FP8 or bf16 inputs only".into()),
        };
        let dev = &self.device;
        let mut d = dev
            .alloc_zeros::<bf16>(mnk.0 * mnk.1, MemoryCategory::Activations)
            .map_err(|e| e.to_string())?;
        let ms = median_ms(dev, 1, repeat, || {
            lt.matmul(dev, mnk, inputs, LtOutput::Bf16(&mut d), 1.0)
        })
        .map_err(|e| e.to_string())?;
        Ok(ms * 1e-3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_by_name() {
        assert_eq!(dense_peak_tflops("NVIDIA H100 80GB HBM3", true), Some(1979.0));
        assert_eq!(dense_peak_tflops("NVIDIA H200", false), Some(989.0));
        assert_eq!(dense_peak_tflops("NVIDIA H100 PCIe", true), None);
        assert_eq!(dense_peak_tflops("NVIDIA H100 NVL", true), None);
        assert_eq!(dense_peak_tflops("NVIDIA A100-SXM4-80GB", true), None);
        assert_eq!(dense_peak_tflops("NVIDIA GeForce RTX 4090", false), None);
    }
}
