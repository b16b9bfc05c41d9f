//! Row reductions with saved statistics: LayerNorm/RMSNorm (with the fused FP8
//! output) and the causal attention core.

use fp8_engine::backend::cuda::norm::{NormFp8Out, NormParamsRef};
use fp8_engine::format::{Fp8Format, Overflow};
use fp8_engine::ops::{self, AttentionShape, Dtype, NormShape};

use crate::compare::{bounded_by_magnitude, exact, normwise, reduction};
use crate::{Check, Ctx, cpu, gpu, skipped, worst};

pub fn run(ctx: &mut Ctx, results: &mut Vec<(String, Check)>) {
    let norm_shapes: &[(usize, usize)] = if skipped("norm") {
        &[]
    } else {
        &[(1, 1), (5, 17), (64, 768), (300, 1024), (8, 4096), (2, 5000)]
    };
    for &(rows, cols) in norm_shapes {
        for zero_centered in [false, true] {
            for layer in [true, false] {
                let name = if layer { "layernorm" } else { "rmsnorm" };
                results.push((
                    format!("{name} {rows}x{cols} zero_centered={zero_centered}"),
                    norm(ctx, layer, NormShape { rows, cols }, zero_centered),
                ));
            }
        }
    }
    let attention_shapes: &[(usize, usize, usize, usize)] = if skipped("attention") {
        &[]
    } else {
        &[(1, 1, 1, 8), (2, 70, 3, 16), (1, 256, 4, 64), (1, 130, 2, 128)]
    };
    for &(batch, seq, heads, head_dim) in attention_shapes {
        let shape = AttentionShape {
            batch,
            seq,
            heads,
            head_dim,
        };
        for dtype in [Dtype::F32, Dtype::Bf16] {
            results.push((format!("attention {shape:?} {dtype:?}"), attention(ctx, shape, dtype)));
        }
    }
}

/// Twins: `ops::layernorm_forward/backward`, `ops::rmsnorm_forward/backward`, the reduction
/// bound; the FP8 copy is exactly `encode(y * scale)` of the GPU's y and the amax its max|y|.
fn norm(ctx: &mut Ctx, layer: bool, shape: NormShape, zero_centered: bool) -> Check {
    let NormShape { rows, cols } = shape;
    let n = rows * cols;
    let eps = 1e-5;
    // Rows with an offset: LayerNorm's two-pass mean must not cancel.
    let x: Vec<f32> = ctx
        .values(n, 2.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v + (i / cols.max(1)) as f32 * 0.1)
        .collect();
    let gamma = ctx.values(cols, 1.0);
    let beta = ctx.values(cols, 0.5);
    let dy = ctx.values(n, 1.0);
    let (xd, gd, bd, dyd) = (ctx.up(&x)?, ctx.up(&gamma)?, ctx.up(&beta)?, ctx.up(&dy)?);
    let (mut y, mut mean, mut rstd) = (ctx.poisoned(n)?, ctx.poisoned(rows)?, ctx.poisoned(rows)?);
    let mut codes = ctx.zeros::<u8>(n)?;
    let scale = ctx.up(&[8.0f32])?;
    let mut amax = ctx.up(&[0.0f32])?;
    let params = || NormParamsRef {
        gamma: &gd,
        beta: layer.then_some(&bd),
        zero_centered,
    };
    let fp8 = NormFp8Out {
        codes: &mut codes,
        format: Fp8Format::E4M3,
        scale: &scale,
        amax: &mut amax,
    };
    gpu(ctx.gpu.norm_forward(
        &xd,
        params(),
        shape,
        eps,
        Some(&mut y),
        Some(fp8),
        layer.then_some(&mut mean),
        &mut rstd,
    ))?;
    let (mut cy, mut cmean, mut crstd) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
    if layer {
        cpu(ops::layernorm_forward(
            &x,
            &gamma,
            &beta,
            shape,
            eps,
            zero_centered,
            &mut cy,
            &mut cmean,
            &mut crstd,
        ))?;
    } else {
        cpu(ops::rmsnorm_forward(
            &x,
            &gamma,
            shape,
            eps,
            zero_centered,
            &mut cy,
            &mut crstd,
        ))?;
    }
    let gy = ctx.down(&y)?;
    let want_codes: Vec<f32> = gy
        .iter()
        .map(|&v| Fp8Format::E4M3.encode(v * 8.0, Overflow::Saturate) as f32)
        .collect();
    let got_codes: Vec<f32> = ctx.down(&codes)?.iter().map(|&c| c as f32).collect();
    let want_amax = gy.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    // LayerNorm's y = (x - mean) rstd w + beta: a reordered row sum moves the mean by the
    // reduction's share of the row's inputs, so y moves by that share of |w| rstd max|x|
    // (its terms), which the offset rows make far larger than |y| where "+ beta" cancels
    // (the first GPU run: -2.30e-3 vs -2.33e-3 at rows of 30 +- 2). RMSNorm has no such sum.
    let y_check = if layer {
        let row_max: Vec<f32> = x
            .chunks(cols.max(1))
            .map(|row| row.iter().fold(0.0f32, |m, v| m.max(v.abs())))
            .collect();
        let magnitude: Vec<f64> = (0..n)
            .map(|idx| {
                let (i, j) = (idx / cols, idx % cols);
                let w = if zero_centered { 1.0 + gamma[j] } else { gamma[j] };
                (w.abs() * crstd[i] * row_max[i]) as f64
            })
            .collect();
        bounded_by_magnitude("y", &gy, &cy, &magnitude, 1e-5, 1e-6)
    } else {
        reduction("y", &gy, &cy)
    };
    let mut checks = vec![
        y_check,
        reduction("rstd", &ctx.down(&rstd)?, &crstd),
        exact("FP8 codes of the GPU's y", &got_codes, &want_codes),
        exact("amax of the GPU's y", &ctx.down(&amax)?, &[want_amax]),
    ];
    if layer {
        checks.push(reduction("mean", &ctx.down(&mean)?, &cmean));
    }
    // Backward on the GPU's saved statistics (the twin gets the same inputs).
    let (gmean, grstd) = (ctx.down(&mean)?, ctx.down(&rstd)?);
    let mut dx = ctx.poisoned(n)?;
    let start_dg = ctx.values(cols, 0.25);
    let start_db = ctx.values(cols, 0.25);
    let (mut dg, mut db) = (ctx.up(&start_dg)?, ctx.up(&start_db)?);
    gpu(ctx.gpu.norm_backward(
        &dyd,
        &xd,
        params(),
        layer.then_some(&mean),
        &rstd,
        shape,
        &mut dx,
        &mut dg,
        if layer { Some(&mut db) } else { None },
    ))?;
    let (mut cdx, mut cdg, mut cdb) = (vec![0.0; n], start_dg.clone(), start_db.clone());
    if layer {
        cpu(ops::layernorm_backward(
            &dy,
            &x,
            &gamma,
            &gmean,
            &grstd,
            shape,
            zero_centered,
            &mut cdx,
            &mut cdg,
            &mut cdb,
        ))?;
        checks.push(reduction("dbeta", &ctx.down(&db)?, &cdb));
    } else {
        cpu(ops::rmsnorm_backward(
            &dy,
            &x,
            &gamma,
            &grstd,
            shape,
            zero_centered,
            &mut cdx,
            &mut cdg,
        ))?;
    }
    checks.push(reduction("dx", &ctx.down(&dx)?, &cdx));
    checks.push(reduction("dgamma", &ctx.down(&dg)?, &cdg));
    worst(checks)
}

/// The contract's bound for attention results in `dtype`: the reduction bound for f32 (tighter
/// than the contract's normwise f32 one), the contract's normwise bound with the dtype's
/// tolerance for bf16/fp16 (`docs/numerics.md`, Op contracts): a gradient sums `P`s that may
/// land one dtype step apart with cancellation (the H200 run of 2026-11-28: a bf16 dv of
/// -2.9e-4 off by 3.4x a bound per element, well inside the normwise one).
pub fn attention_bound(what: &str, gpu: &[f32], cpu: &[f32], dtype: Dtype) -> Check {
    match dtype {
        Dtype::F32 => reduction(what, gpu, cpu),
        Dtype::Bf16 => normwise(what, gpu, cpu, 1.6e-2, 1e-5),
        Dtype::F16 => normwise(what, gpu, cpu, 1e-3, 1e-5),
    }
}

/// The attention output in a 16-bit dtype: `O_ic = sum_j P_ij V_jc` with each `P_ij` rounded to
/// the dtype on both sides from `exp`s that may differ by an ulp, so a `P` may land one dtype
/// step apart (2^-7 of itself in bf16) and move `O_ic` by up to that share of
/// `sum_j P_ij |V_jc| <= max_{j<=i} |V_jc|` (the `P` of a row sum to 1): the dtype's rtol
/// charged on that magnitude, not on `|O_ic|` alone, which cancellation makes small (the
/// first GPU run: bf16, seq 256, an output of -1.7e-3 one such step apart). f32: the reduction bound.
fn attention_out_bound(gpu: &[f32], cpu: &[f32], v: &[f32], shape: AttentionShape, dtype: Dtype) -> Check {
    if dtype == Dtype::F32 {
        return reduction("out", gpu, cpu);
    }
    let (seq, width) = (shape.seq, shape.heads * shape.head_dim);
    let mut magnitude = vec![0.0f64; v.len()];
    for b in 0..shape.batch {
        for c in 0..width {
            let mut running = 0.0f64;
            for i in 0..seq {
                let at = (b * seq + i) * width + c;
                running = running.max((v[at] as f64).abs());
                magnitude[at] = running;
            }
        }
    }
    let rtol = if dtype == Dtype::Bf16 { 1.6e-2 } else { 1e-3 };
    bounded_by_magnitude("out", gpu, cpu, &magnitude, rtol, 1e-5)
}

/// Twins: `ops::attention_forward` / `attention_backward`; the backward twin runs on the
/// GPU's out and lse, so each kernel is compared on the same inputs.
fn attention(ctx: &mut Ctx, shape: AttentionShape, dtype: Dtype) -> Check {
    let n = shape.batch * shape.seq * shape.heads * shape.head_dim;
    let stats = shape.batch * shape.heads * shape.seq;
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let round = |v: Vec<f32>| {
        let mut v = v;
        dtype.round_slice(&mut v);
        v
    };
    let (q, k, v, dout) = (
        round(ctx.values(n, 2.0)),
        round(ctx.values(n, 2.0)),
        round(ctx.values(n, 1.0)),
        round(ctx.values(n, 1.0)),
    );
    let (qd, kd, vd, dod) = (ctx.up(&q)?, ctx.up(&k)?, ctx.up(&v)?, ctx.up(&dout)?);
    let (mut out, mut lse) = (ctx.poisoned(n)?, ctx.poisoned(stats)?);
    gpu(ctx
        .gpu
        .attention_forward(&qd, &kd, &vd, shape, scale, dtype, &mut out, &mut lse))?;
    let (mut cout, mut clse) = (vec![0.0; n], vec![0.0; stats]);
    cpu(ops::attention_forward(
        &q, &k, &v, shape, scale, dtype, &mut cout, &mut clse,
    ))?;
    let (gout, glse) = (ctx.down(&out)?, ctx.down(&lse)?);
    let (mut dq, mut dk, mut dv) = (ctx.poisoned(n)?, ctx.poisoned(n)?, ctx.poisoned(n)?);
    gpu(ctx.gpu.attention_backward(
        &dod, &qd, &kd, &vd, &out, &lse, shape, scale, dtype, &mut dq, &mut dk, &mut dv,
    ))?;
    let (mut cdq, mut cdk, mut cdv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    cpu(ops::attention_backward(
        &dout, &q, &k, &v, &gout, &glse, shape, scale, dtype, &mut cdq, &mut cdk, &mut cdv,
    ))?;
    worst([
        reduction("lse", &glse, &clse),
        attention_out_bound(&gout, &cout, &v, shape, dtype),
        attention_bound("dq", &ctx.down(&dq)?, &cdq, dtype),
        attention_bound("dk", &ctx.down(&dk)?, &cdk, dtype),
        attention_bound("dv", &ctx.down(&dv)?, &cdv, dtype),
    ])
}
