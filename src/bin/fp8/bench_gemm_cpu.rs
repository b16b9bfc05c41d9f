//! The CPU runner of `fp8 bench gemm`: the library's CPU GEMM against the f32
//! GEMM crate it builds on, run on the dequantized inputs.

use std::time::Instant;

use fp8_engine::gemm::{self, GemmParams, Mat, Output};
use half::{bf16, f16};

use crate::bench_gemm_runner::{CaseInputs, GemmRunner, Measurement, OutFormat, out_scale};
use crate::error::CliError;
use crate::timing::median;

/// Runs cases on the CPU with rayon's threads.
pub struct CpuRunner;

/// Runs `ours` and `baseline` once each to warm up, then `repeat` times
/// alternately, so a load change on the machine hits both alike; returns the
/// median seconds of each.
fn time_pair(
    repeat: usize,
    mut ours: impl FnMut() -> Result<(), CliError>,
    mut baseline: impl FnMut() -> Result<(), CliError>,
) -> Result<(f64, f64), CliError> {
    ours()?;
    baseline()?;
    let (mut t_ours, mut t_base) = (Vec::with_capacity(repeat), Vec::with_capacity(repeat));
    for _ in 0..repeat {
        let start = Instant::now();
        ours()?;
        t_ours.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        baseline()?;
        t_base.push(start.elapsed().as_secs_f64());
    }
    Ok((median(t_ours), median(t_base)))
}

impl GemmRunner for CpuRunner {
    fn describe(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn peak_tflops(&self, _fp8_inputs: bool) -> Option<f64> {
        None // no datasheet peak for an arbitrary CPU
    }

    fn measure(&mut self, inputs: &CaseInputs, repeat: usize) -> Result<Measurement, CliError> {
        let (m, n, k) = (inputs.a.rows, inputs.b.rows, inputs.a.k);
        let (a, b) = (inputs.a.view()?, inputs.b.view()?);
        let params = GemmParams {
            split_accumulator: inputs.split,
            ..GemmParams::default()
        };
        // FP8 outputs need a scale: take it from the f32 result's amax (one
        // untimed run, like delayed scaling's previous step).
        let mut d = vec![0.0f32; m * n];
        let amax = gemm::cpu::gemm(&a, &b, Output::F32(&mut d), &params)?.amax;
        let run_into = |format: OutFormat, out: &mut OutBuffers| -> Result<(), CliError> {
            let target = match format {
                OutFormat::F32 => Output::F32(&mut out.f32),
                OutFormat::Bf16 => Output::Bf16(&mut out.bf16),
                OutFormat::F16 => Output::F16(&mut out.f16),
                OutFormat::E4m3 | OutFormat::E5m2 => {
                    let fp8 = format.fp8().expect("FP8 output");
                    Output::Fp8 {
                        codes: &mut out.codes,
                        format: fp8,
                        scale: out_scale(fp8.max_finite(), amax),
                    }
                }
            };
            gemm::cpu::gemm(&a, &b, target, &params)?;
            Ok(())
        };
        let mut out = OutBuffers::new(inputs.out, m * n);
        let (ad, bd) = (inputs.a.dequantized(), inputs.b.dequantized());
        let (am, bm) = (Mat::new(&ad, m, k)?, Mat::new(&bd, n, k)?);
        let (seconds, baseline_seconds) = time_pair(
            repeat,
            || run_into(inputs.out, &mut out),
            || Ok(gemm::cpu::f32_crate_gemm(am, bm, &mut d)?),
        )?;
        let output = out.to_f32(inputs.out, out_scale_for(inputs.out, amax));
        Ok(Measurement {
            seconds: Ok(seconds),
            baseline_seconds: Ok(baseline_seconds),
            // The CPU GEMM is the reference itself: rel_err judges it, no GPU bound.
            checked: Vec::new(),
            output: Some(output),
            extra: Vec::new(),
        })
    }
}

fn out_scale_for(format: OutFormat, amax: f32) -> f32 {
    format.fp8().map_or(1.0, |f| out_scale(f.max_finite(), amax))
}

/// The output buffer of the requested type (the others stay empty).
struct OutBuffers {
    f32: Vec<f32>,
    bf16: Vec<bf16>,
    f16: Vec<f16>,
    codes: Vec<u8>,
}

impl OutBuffers {
    fn new(format: OutFormat, len: usize) -> Self {
        let size = |f: OutFormat| if f == format { len } else { 0 };
        let fp8_len = if format.fp8().is_some() { len } else { 0 };
        OutBuffers {
            f32: vec![0.0; size(OutFormat::F32)],
            bf16: vec![bf16::ZERO; size(OutFormat::Bf16)],
            f16: vec![f16::ZERO; size(OutFormat::F16)],
            codes: vec![0; fp8_len],
        }
    }

    /// The output as f32 values (FP8 codes decoded and divided by their scale).
    fn to_f32(&self, format: OutFormat, scale: f32) -> Vec<f32> {
        match format {
            OutFormat::F32 => self.f32.clone(),
            OutFormat::Bf16 => self.bf16.iter().map(|x| x.to_f32()).collect(),
            OutFormat::F16 => self.f16.iter().map(|x| x.to_f32()).collect(),
            OutFormat::E4m3 | OutFormat::E5m2 => {
                let table = format.fp8().expect("FP8 output").decode_table();
                self.codes.iter().map(|&c| table[c as usize] / scale).collect()
            }
        }
    }
}
