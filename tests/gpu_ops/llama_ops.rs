//! The ops Llama-family models add: the rotary embedding (same bits as its twin), cached
//! attention with grouped key/value heads (the reduction contract), and the f32 reference GEMM
//! on cuBLASLt (the f32 reordering bound of `backend::cuda::gemm_f32`).

use fp8_engine::backend::cuda::cublaslt::{CublasLt, cublaslt_present};
use fp8_engine::backend::cuda::gemm_f32::{f32_order_bound, gemm_f32_host};
use fp8_engine::backend::cuda::rope::RopeDirection;
use fp8_engine::gemm::{GemmParams, Mat, Operand, Output, cpu::gemm};
use fp8_engine::ops::{self, CachedAttentionShape, Dtype, RopeFrequencyScaling, RopeShape, RopeTable, inv_freq};

use crate::compare::exact;
use crate::rows::attention_bound;
use crate::{Check, Ctx, cpu, gpu, worst};

pub fn run(ctx: &mut Ctx, results: &mut Vec<(String, Check)>) {
    // (rows, seq, heads, head_dim, rotary_dim, first position): whole sequences, a partial
    // rotary width, a decode step far into the table, llama3 frequencies.
    for (rows, seq, heads, head_dim, rotary, first) in [
        (1, 1, 1, 2, 2, 0),
        (2 * 37, 37, 3, 16, 16, 0),
        (64, 64, 8, 64, 32, 5),
        (1, 1, 4, 128, 128, 4000),
    ] {
        let shape = RopeShape {
            rows,
            seq,
            heads,
            head_dim,
            first_position: first,
        };
        results.push((format!("rope {shape:?} rotary {rotary}"), rope(ctx, shape, rotary)));
    }
    // (queries, keys, heads, kv_heads, head_dim): a decode step (GQA 4:1), a prefill (MHA), a
    // long cache (MQA), an odd head width.
    for (queries, keys, heads, kv_heads, head_dim) in [
        (1, 37, 8, 2, 16),
        (9, 9, 4, 4, 32),
        (1, 3000, 6, 1, 64),
        (3, 130, 6, 3, 24),
    ] {
        let shape = CachedAttentionShape {
            queries,
            keys,
            heads,
            kv_heads,
            head_dim,
        };
        for dtype in [Dtype::F32, Dtype::Bf16] {
            results.push((
                format!("attention_cached {shape:?} {dtype:?}"),
                cached(ctx, shape, dtype),
            ));
        }
    }
    if !cublaslt_present() {
        println!("  f32 GEMM: libcublasLt is not installed here: not checked");
        return;
    }
    for (m, n, k) in [(1, 1, 1), (7, 9, 40), (64, 256, 128), (130, 70, 1000), (256, 512, 4096)] {
        results.push((format!("gemm f32 {m}x{n}x{k}"), gemm_f32(ctx, (m, n, k))));
    }
}

/// Twin: `ops::rope_forward/backward`; the same bits, both directions.
fn rope(ctx: &mut Ctx, shape: RopeShape, rotary: usize) -> Check {
    let scaling = if rotary == 128 {
        RopeFrequencyScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        }
    } else {
        RopeFrequencyScaling::None
    };
    let table = RopeTable::new(&inv_freq(10000.0, rotary, scaling), shape.first_position + shape.seq);
    let n = shape.rows * shape.heads * shape.head_dim;
    let x = ctx.values(n, 3.0);
    let (cos, sin) = table
        .rows(shape.first_position, shape.seq.min(shape.rows))
        .ok_or("table rows")?;
    let (cos_d, sin_d) = (ctx.up(cos)?, ctx.up(sin)?);
    let mut checks = Vec::new();
    for direction in [RopeDirection::Forward, RopeDirection::Backward] {
        let mut xd = ctx.up(&x)?;
        gpu(ctx.gpu.rope(&mut xd, shape, rotary, &cos_d, &sin_d, direction))?;
        let mut want = x.clone();
        match direction {
            RopeDirection::Forward => cpu(ops::rope_forward(&mut want, &shape, &table))?,
            RopeDirection::Backward => cpu(ops::rope_backward(&mut want, &shape, &table))?,
        }
        checks.push(exact(&format!("{direction:?}"), &ctx.down(&xd)?, &want));
    }
    worst(checks)
}

/// Twin: `ops::attention_cached`, the reduction contract (the dtype's tolerance for bf16).
fn cached(ctx: &mut Ctx, shape: CachedAttentionShape, dtype: Dtype) -> Check {
    let q_len = shape.queries * shape.heads * shape.head_dim;
    let kv_len = shape.keys * shape.kv_heads * shape.head_dim;
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let round = |mut v: Vec<f32>| {
        dtype.round_slice(&mut v);
        v
    };
    let (q, k, v) = (
        round(ctx.values(q_len, 2.0)),
        round(ctx.values(kv_len, 2.0)),
        round(ctx.values(kv_len, 1.0)),
    );
    let (qd, kd, vd) = (ctx.up(&q)?, ctx.up(&k)?, ctx.up(&v)?);
    let mut out = ctx.poisoned(q_len)?;
    gpu(ctx.gpu.attention_cached(&qd, &kd, &vd, shape, scale, dtype, &mut out))?;
    let mut want = vec![0.0; q_len];
    cpu(ops::attention_cached(&q, &k, &v, shape, scale, dtype, &mut want))?;
    attention_bound("out", &ctx.down(&out)?, &want, dtype)
}

/// The f32 GEMM on cuBLASLt against the CPU f32 GEMM: per element within
/// `2 gamma_K (|A| |B|^T)_ij` (both orders of the same sum); the epilogue on the host
/// (alpha, bias, beta) on top, then within the same bound scaled by alpha plus the epilogue's
/// own two roundings.
fn gemm_f32(ctx: &mut Ctx, (m, n, k): (usize, usize, usize)) -> Check {
    let (a, b) = (ctx.values(m * k, 1.0), ctx.values(n * k, 1.0));
    let (bias, old) = (ctx.values(n, 1.0), ctx.values(m * n, 1.0));
    let (am, bm) = (
        Mat::new(&a, m, k).map_err(|e| e.to_string())?,
        Mat::new(&b, n, k).map_err(|e| e.to_string())?,
    );
    let params = GemmParams {
        alpha: 0.5,
        beta: 1.0,
        bias: Some((&bias).into()),
        ..GemmParams::default()
    };
    let mut lt = gpu(CublasLt::new(&ctx.gpu))?;
    let (mut got, mut want) = (old.clone(), old.clone());
    gpu(gemm_f32_host(
        &ctx.gpu,
        &mut lt,
        (&am, &bm),
        Output::F32(&mut got),
        &params,
    ))?;
    cpu(gemm(
        &Operand::F32(am),
        &Operand::F32(bm),
        Output::F32(&mut want),
        &params,
    ))?;
    let mut ratio = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let abs_dot: f64 = (0..k)
                .map(|c| (f64::from(a[i * k + c]) * f64::from(b[j * k + c])).abs())
                .sum();
            let (g, w) = (f64::from(got[i * n + j]), f64::from(want[i * n + j]));
            // alpha = 0.5 is exact; + bias and + old (both below 1) round twice on each side,
            // values below 0.5 sum|a b| + 2.
            let epilogue = 2.0 * f64::from(f32::EPSILON) * (0.5 * abs_dot + 2.0);
            let bound = 0.5 * f32_order_bound(k, abs_dot) + epilogue;
            let r = (g - w).abs() / bound;
            if r.is_nan() || r > 1.0 {
                return Err(format!("[{i}, {j}]: gpu {g:e}, cpu {w:e}: err/bound={r:.3}"));
            }
            ratio = ratio.max(r);
        }
    }
    Ok(ratio)
}
