//! A GEMM output buffer of any output dtype, shared by the GEMM tests that run two backends on
//! the same inputs.

use fp8_engine::backend::cuda::error_bound::OutputUlp;
use fp8_engine::format::Fp8Format;
use fp8_engine::gemm::Output;
use half::{bf16, f16};

/// The output dtype of a case.
#[derive(Clone, Copy, Debug)]
pub enum Out {
    F32,
    Bf16,
    F16,
    Fp8(Fp8Format),
}

/// An output buffer of either backend.
#[derive(Clone)]
pub enum OutBuf {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    Fp8(Vec<u8>, Fp8Format),
}

impl OutBuf {
    /// The output's rounding, for a GEMM error bound (`error_bound::OutputUlp`).
    pub fn ulp(&self) -> OutputUlp {
        match self {
            OutBuf::F32(_) => OutputUlp::F32,
            OutBuf::Bf16(_) => OutputUlp::BF16,
            OutBuf::F16(_) => OutputUlp::F16,
            OutBuf::Fp8(_, Fp8Format::E4M3) => OutputUlp::E4M3,
            OutBuf::Fp8(_, Fp8Format::E5M2) => OutputUlp::E5M2,
        }
    }

    /// An f32 buffer starts from `init` (what `beta` multiplies); the others from zeros.
    pub fn new(kind: Out, init: &[f32]) -> Self {
        match kind {
            Out::F32 => OutBuf::F32(init.to_vec()),
            Out::Bf16 => OutBuf::Bf16(vec![bf16::ZERO; init.len()]),
            Out::F16 => OutBuf::F16(vec![f16::ZERO; init.len()]),
            Out::Fp8(f) => OutBuf::Fp8(vec![0; init.len()], f),
        }
    }

    pub fn output(&mut self, scale: f32) -> Output<'_> {
        match self {
            OutBuf::F32(d) => Output::F32(d),
            OutBuf::Bf16(d) => Output::Bf16(d),
            OutBuf::F16(d) => Output::F16(d),
            OutBuf::Fp8(d, f) => Output::Fp8 {
                codes: d,
                format: *f,
                scale,
            },
        }
    }

    /// Values in output units (FP8 decoded and divided by the output scale).
    pub fn values(&self, scale: f32) -> Vec<f32> {
        match self {
            OutBuf::F32(d) => d.clone(),
            OutBuf::Bf16(d) => d.iter().map(|x| x.to_f32()).collect(),
            OutBuf::F16(d) => d.iter().map(|x| x.to_f32()).collect(),
            OutBuf::Fp8(d, f) => {
                let t = f.decode_table();
                d.iter().map(|&c| t[c as usize] / scale).collect()
            }
        }
    }
}
