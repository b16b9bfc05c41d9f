//! What a backend of `fp8 bench gemm` implements and exchanges with the
//! report: the case's inputs, the measurement, the output type, and the FP8
//! output scale both runners use.

use clap::ValueEnum;
use fp8_engine::format::Fp8Format;

use crate::bench_gemm_inputs::Input;
use crate::error::CliError;

/// Output type of the benched GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutFormat {
    F32,
    Bf16,
    F16,
    E4m3,
    E5m2,
}

impl OutFormat {
    pub fn name(self) -> &'static str {
        match self {
            OutFormat::F32 => "f32",
            OutFormat::Bf16 => "bf16",
            OutFormat::F16 => "f16",
            OutFormat::E4m3 => "e4m3",
            OutFormat::E5m2 => "e5m2",
        }
    }

    /// The FP8 format of an FP8 output.
    pub fn fp8(self) -> Option<Fp8Format> {
        match self {
            OutFormat::E4m3 => Some(Fp8Format::E4M3),
            OutFormat::E5m2 => Some(Fp8Format::E5M2),
            _ => None,
        }
    }
}

/// The inputs of one case, ready for any backend.
pub struct CaseInputs {
    pub a: Input,
    pub b: Input,
    pub out: OutFormat,
    pub split: bool,
}

/// What a backend measured for one case; a GEMM that failed gives its error instead.
pub struct Measurement {
    /// Median seconds of our GEMM (the engine's chosen path).
    pub seconds: Result<f64, String>,
    /// Median seconds of the baseline GEMM on the same inputs.
    pub baseline_seconds: Result<f64, String>,
    /// Our `M x N` output as f32 (FP8 codes decoded and unscaled), if our GEMM ran.
    pub output: Option<Vec<f32>>,
    /// Backend-specific JSON keys (e.g. the CUDA runner's per-path throughput).
    pub extra: Vec<(&'static str, serde_json::Value)>,
    /// Outputs to judge against the error bound, by path name ("portable" and
    /// "hopper" on a GPU; none on the CPU), each with the output scale it was made with.
    pub checked: Vec<(&'static str, Vec<f32>, f32)>,
}

/// A backend of the bench: times our GEMM and its baseline on one case.
pub trait GemmRunner {
    /// The device in words.
    fn describe(&self) -> String;
    /// The device's dense peak in TFLOPS for FP8 (or else 16-bit) inputs, if known.
    fn peak_tflops(&self, fp8_inputs: bool) -> Option<f64>;
    /// Times both GEMMs (`repeat` runs after a warm-up, median).
    fn measure(&mut self, inputs: &CaseInputs, repeat: usize) -> Result<Measurement, CliError>;
}

/// `fp8_max / amax`, or 1 when the amax gives no usable scale.
pub fn out_scale(fp8_max: f32, amax: f32) -> f32 {
    let s = fp8_max / amax;
    if s.is_finite() && s > 0.0 { s } else { 1.0 }
}
