//! The CPU reference GEMM: exact products (FP8 x FP8, bf16 x bf16 and f16 x f16
//! products are exact in f32), f32 accumulation, block scales applied per
//! block of K at promotion.
//!
//! This first version is a plain row-parallel dot-product loop: correct, not fast.

use rayon::prelude::*;

use super::operand::{GemmParams, GemmPlan, GemmReport, Operand, Output, ScalePair, plan};
use crate::error::Result;
use crate::format::decode_e8m0;
use crate::tensor::Scales;

/// `D = alpha * A B^T * sA * sB (+ bias) (+ beta D)`; see the module docs of [`crate::gemm`].
pub fn gemm(a: &Operand, b: &Operand, out: Output, params: &GemmParams) -> Result<GemmReport> {
    let plan = plan(a, b, &out, params)?;
    let av = unscaled_values(a);
    let bv = unscaled_values(b);
    let mut d = vec![0.0f32; plan.m * plan.n];
    if let Output::F32(old) = &out
        && params.beta != 0.0
    {
        d.copy_from_slice(old);
    }
    accumulate(&plan, a, b, &av, &bv, params, &mut d);
    let amax = d.iter().fold(0.0f32, |m, &x| {
        if x.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(x.abs())
        }
    });
    write_output(&d, out)?;
    Ok(GemmReport { amax })
}

/// Every element as f32 without its scale (codes decode exactly).
fn unscaled_values(op: &Operand) -> Vec<f32> {
    match op {
        Operand::Fp8(format, q) => {
            let table = format.decode_table();
            q.data().iter().map(|&c| table[c as usize]).collect()
        }
        Operand::F32(m) => m.data.to_vec(),
        Operand::Bf16(m) => m.data.iter().map(|x| x.to_f32()).collect(),
        Operand::F16(m) => m.data.iter().map(|x| x.to_f32()).collect(),
    }
}

/// scale_inv of `row` of an operand at K-block `kb` (1.0 for plain inputs).
fn block_scale(op: &Operand, row: usize, kb: usize, k_blocks: usize) -> f32 {
    let Operand::Fp8(_, q) = op else { return 1.0 };
    match q.scales() {
        Scales::PerTensor(s) => *s,
        Scales::Block1x128(s) => s[row * k_blocks + kb],
        Scales::Block128x128(s) => s[(row / 128) * k_blocks + kb],
        Scales::Mxfp8(e) => decode_e8m0(e[row * k_blocks + kb]),
    }
}

fn accumulate(plan: &GemmPlan, a: &Operand, b: &Operand, av: &[f32], bv: &[f32], params: &GemmParams, d: &mut [f32]) {
    let (n, k) = (plan.n, plan.k);
    if n == 0 {
        return;
    }
    let k_block = match plan.scales.k_block() {
        Some(kb) => kb,
        None if params.split_accumulator && plan.scales == ScalePair::PerTensor => 128,
        None => k.max(1),
    };
    let k_blocks = k.div_ceil(k_block);
    let tensor_factor = match plan.scales {
        ScalePair::None => params.alpha,
        ScalePair::PerTensor => params.alpha * block_scale(a, 0, 0, 1) * block_scale(b, 0, 0, 1),
        _ => params.alpha,
    };
    let blocked = plan.scales.k_block().is_some();
    d.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let arow = &av[i * k..(i + 1) * k];
        for (j, dij) in row.iter_mut().enumerate() {
            let brow = &bv[j * k..(j + 1) * k];
            let mut acc = 0.0f32;
            for kb in 0..k_blocks {
                let range = kb * k_block..((kb + 1) * k_block).min(k);
                let partial = arow[range.clone()]
                    .iter()
                    .zip(&brow[range])
                    .fold(0.0f32, |s, (x, y)| x.mul_add(*y, s));
                acc += if blocked {
                    partial * (block_scale(a, i, kb, k_blocks) * block_scale(b, j, kb, k_blocks))
                } else {
                    partial
                };
            }
            let mut v = acc * tensor_factor;
            if let Some(bias) = params.bias {
                v += bias[j];
            }
            if params.beta != 0.0 {
                v += params.beta * *dij;
            }
            *dij = v;
        }
    });
}

fn write_output(d: &[f32], out: Output) -> Result<()> {
    match out {
        Output::F32(o) => o.copy_from_slice(d),
        Output::Bf16(o) => o.iter_mut().zip(d).for_each(|(o, &x)| *o = half::bf16::from_f32(x)),
        Output::F16(o) => o.iter_mut().zip(d).for_each(|(o, &x)| *o = half::f16::from_f32(x)),
        Output::Fp8 { codes, format, scale } => {
            crate::convert::quantize(d, codes, format, scale, crate::format::Overflow::Saturate)?;
        }
    }
    Ok(())
}
