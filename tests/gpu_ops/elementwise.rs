//! Elementwise ops, column sums, embeddings, the loss, argmax and the optimizer ops.

use fp8_engine::backend::cuda::DeviceElement;
use fp8_engine::backend::cuda::optim::{AdamWSegment, adamw_items, sum_squares_bound};
use fp8_engine::device::MemoryCategory::Workspace;
use fp8_engine::gemm::Mat;
use fp8_engine::ops::{self, AdamWStep, Dtype};
use half::{bf16, f16};
use rand::Rng;

use crate::compare::{bounded, exact, reduction};
use crate::{Check, Ctx, cpu, gpu, worst};

const SHAPES: &[(usize, usize)] = &[(1, 1), (3, 17), (64, 64), (127, 129), (257, 1000)];

pub fn run(ctx: &mut Ctx, results: &mut Vec<(String, Check)>) {
    for &(r, c) in SHAPES {
        for transpose in [false, true] {
            results.push((
                format!("convert f32 {r}x{c} t={transpose}"),
                convert::<f32>(ctx, r, c, transpose),
            ));
            results.push((
                format!("convert bf16 {r}x{c} t={transpose}"),
                convert::<bf16>(ctx, r, c, transpose),
            ));
            results.push((
                format!("convert f16 {r}x{c} t={transpose}"),
                convert::<f16>(ctx, r, c, transpose),
            ));
        }
        results.push((format!("transpose_16 bf16 {r}x{c}"), transpose_16::<bf16>(ctx, r, c)));
        results.push((format!("transpose_16 f16 {r}x{c}"), transpose_16::<f16>(ctx, r, c)));
        results.push((format!("transpose_8 {r}x{c}"), transpose_8(ctx, r, c)));
        results.push((format!("column_sum {r}x{c}"), column_sum(ctx, r, c)));
        results.push((format!("gelu {r}x{c}"), gelu(ctx, r * c)));
        results.push((format!("swiglu {r}x{c}"), swiglu(ctx, r, c)));
        results.push((format!("cross_entropy {r}x{c}"), cross_entropy(ctx, r, c)));
        results.push((format!("argmax {r}x{c}"), argmax(ctx, r, c)));
    }
    for n in [1, 1000, 65_537] {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            results.push((format!("residual_add {n} {dtype:?}"), residual_add(ctx, n, dtype)));
            results.push((format!("round_to {n} {dtype:?}"), round_to(ctx, n, dtype)));
        }
        results.push((format!("unscale_and_check {n}"), unscale(ctx, n)));
        results.push((format!("sum_squares {n}"), sum_squares(ctx, n)));
    }
    results.push(("sum_squares 3000000".into(), sum_squares(ctx, 3_000_000)));
    for (tokens, vocab, dim) in [(1, 1, 1), (37, 11, 130), (2048, 50, 768), (300, 5000, 64)] {
        results.push((
            format!("embedding {tokens} ids {vocab}x{dim}"),
            embedding(ctx, tokens, vocab, dim),
        ));
    }
    results.push(("adamw one launch, 4 parameters".into(), adamw(ctx)));
}

/// Twin: `dispatch::plain::convert` / `convert_transposed` (crate-private), i.e. half's
/// round-to-nearest-even `from_f32` of each value (of the transpose): same bits.
fn convert<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, transpose: bool) -> Check {
    let x = ctx.values(rows * cols, 100.0);
    let src = ctx.up(&x)?;
    let mut dst = ctx.zeros::<T>(rows * cols)?;
    gpu(ctx.gpu.convert(&src, rows, cols, transpose, &mut dst))?;
    let got: Vec<f32> = ctx.down(&dst)?.iter().map(|v| v.to_f32()).collect();
    let ordered: Vec<f32> = if transpose {
        (0..rows * cols).map(|i| x[(i % rows) * cols + i / rows]).collect()
    } else {
        x
    };
    let want: Vec<f32> = ordered.iter().map(|&v| T::from_f32(v).to_f32()).collect();
    exact("converted values", &got, &want)
}

/// Twin: `gemm::Mat::k_major` of the transposed view, the host copy the staged 16-bit GEMM
/// made before: same bits, every destination element written (poisoned first).
fn transpose_16<T: DeviceElement + Default + Send + Sync + PartialEq>(
    ctx: &mut Ctx,
    rows: usize,
    cols: usize,
) -> Check {
    let x: Vec<T> = ctx.values(rows * cols, 100.0).into_iter().map(T::from_f32).collect();
    let src = ctx.up(&x)?;
    let poison = vec![T::from_f32(f32::NAN); rows * cols];
    let mut dst = ctx.up(&poison)?;
    gpu(ctx.gpu.transpose_16(&src, rows, cols, &mut dst))?;
    let got = ctx.down(&dst)?;
    // `x` is `[rows, cols]`: as an operand of `cols` rows and K = `rows`, read from its stored transpose.
    let want = Mat::transposed(&x, cols, rows).map_err(|e| e.to_string())?.k_major();
    let bits = |v: &[T]| -> Vec<u32> { v.iter().map(|t| t.to_f32().to_bits()).collect() };
    let (got, want) = (bits(&got), bits(&want));
    match got.iter().zip(&want).position(|(g, w)| g != w) {
        _ if got.len() != want.len() => Err(format!("{} values, expected {}", got.len(), want.len())),
        Some(i) => Err(format!("element {i}: gpu {:#010x}, host {:#010x}", got[i], want[i])),
        None => Ok(0.0),
    }
}

/// Twin: `quantize::transpose_codes` (a frozen FP8 weight's `W^T`): same bytes, every
/// destination byte written (poisoned first).
fn transpose_8(ctx: &mut Ctx, rows: usize, cols: usize) -> Check {
    let x: Vec<u8> = (0..rows * cols)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    let src = ctx.up(&x)?;
    let mut want = vec![0u8; rows * cols];
    cpu(fp8_engine::quantize::transpose_codes(&x, rows, cols, &mut want))?;
    // Two poisons: a byte left unwritten cannot match both.
    for poison in [0x00u8, 0xff] {
        let mut dst = ctx.up(&vec![poison; rows * cols])?;
        gpu(ctx.gpu.transpose_8(&src, rows, cols, &mut dst))?;
        let got = ctx.down(&dst)?;
        if got.len() != want.len() {
            return Err(format!("{} bytes, expected {}", got.len(), want.len()));
        }
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!(
                "byte {i} (poison {poison:#04x}): gpu {:#04x}, host {:#04x}",
                got[i], want[i]
            ));
        }
    }
    Ok(0.0)
}

/// Twin: `ops::elementwise::residual_add`: same bits.
fn residual_add(ctx: &mut Ctx, n: usize, dtype: Dtype) -> Check {
    let (x, f) = (ctx.values(n, 4.0), ctx.values(n, 4.0));
    let (xd, fd) = (ctx.up(&x)?, ctx.up(&f)?);
    let mut out = ctx.poisoned(n)?;
    gpu(ctx.gpu.residual_add(&xd, &fd, dtype, &mut out))?;
    exact(
        "sum",
        &ctx.down(&out)?,
        &cpu(ops::elementwise::residual_add(&x, &f, dtype))?,
    )
}

/// Twin: `Dtype::round_slice`: same bits, ties and the largest values included (wide values
/// overflow to infinity in fp16, as on the host).
fn round_to(ctx: &mut Ctx, n: usize, dtype: Dtype) -> Check {
    let mut want = ctx.values(n, 70000.0);
    let edges = [
        0.0,
        -0.0,
        1.0 + f32::EPSILON * 64.0,
        65520.0,
        f32::MAX,
        f32::MIN_POSITIVE / 2.0,
    ];
    want.iter_mut().zip(edges).for_each(|(v, e)| *v = e);
    let mut x = ctx.up(&want)?;
    gpu(ctx.gpu.round_to(&mut x, dtype))?;
    dtype.round_slice(&mut want);
    exact("rounded", &ctx.down(&x)?, &want)
}

/// Twin: `ops::elementwise::column_sum_accumulate`: same additions in the same order, same bits.
fn column_sum(ctx: &mut Ctx, rows: usize, cols: usize) -> Check {
    let x = ctx.values(rows * cols, 2.0);
    let mut want = ctx.values(cols, 1.0);
    let mut sums = ctx.up(&want)?;
    gpu(ctx.gpu.column_sum(&ctx.up(&x)?, cols, &mut sums))?;
    cpu(ops::elementwise::column_sum_accumulate(&x, cols, &mut want))?;
    exact("column sums", &ctx.down(&sums)?, &want)
}

/// Inputs past both ends of the f32 exp's range (flush to 0, overflow to inf) and zeros.
const ACTIVATION_EDGES: [f32; 6] = [-100.0, 100.0, -44.0, 44.0, 0.0, -0.0];

/// `x` with its first elements replaced by the edge inputs.
fn with_edges(mut x: Vec<f32>) -> Vec<f32> {
    x.iter_mut().zip(ACTIVATION_EDGES).for_each(|(v, e)| *v = e);
    x
}

/// Twins: `ops::gelu_forward` / `gelu_backward`; the kernel repeats the twin's f32
/// operations (its own exp included) in the same order, so the same bits.
fn gelu(ctx: &mut Ctx, n: usize) -> Check {
    let (x, dy) = (with_edges(ctx.values(n, 8.0)), ctx.values(n, 1.0));
    let (xd, dyd) = (ctx.up(&x)?, ctx.up(&dy)?);
    let (mut y, mut dx) = (ctx.poisoned(n)?, ctx.poisoned(n)?);
    gpu(ctx.gpu.gelu_forward(&xd, &mut y))?;
    gpu(ctx.gpu.gelu_backward(&dyd, &xd, &mut dx))?;
    let (mut cy, mut cdx) = (vec![0.0; n], vec![0.0; n]);
    cpu(ops::gelu_forward(&x, &mut cy))?;
    cpu(ops::gelu_backward(&dy, &x, &mut cdx))?;
    worst([
        exact("gelu y", &ctx.down(&y)?, &cy),
        exact("gelu dx", &ctx.down(&dx)?, &cdx),
    ])
}

/// Twins: `ops::swiglu_forward` / `swiglu_backward`; the same operations, so the same bits.
fn swiglu(ctx: &mut Ctx, rows: usize, cols: usize) -> Check {
    let (x, dy) = (
        with_edges(ctx.values(rows * 2 * cols, 8.0)),
        ctx.values(rows * cols, 1.0),
    );
    let (xd, dyd) = (ctx.up(&x)?, ctx.up(&dy)?);
    let (mut y, mut dx) = (ctx.poisoned(rows * cols)?, ctx.poisoned(rows * 2 * cols)?);
    gpu(ctx.gpu.swiglu_forward(&xd, rows, cols, &mut y))?;
    gpu(ctx.gpu.swiglu_backward(&dyd, &xd, rows, cols, &mut dx))?;
    let (mut cy, mut cdx) = (vec![0.0; rows * cols], vec![0.0; rows * 2 * cols]);
    cpu(ops::swiglu_forward(&x, rows, cols, &mut cy))?;
    cpu(ops::swiglu_backward(&dy, &x, rows, cols, &mut cdx))?;
    worst([
        exact("swiglu y", &ctx.down(&y)?, &cy),
        exact("swiglu dx", &ctx.down(&dx)?, &cdx),
    ])
}

/// Twins: `ops::cross_entropy_forward` / `cross_entropy_backward`, the reduction bound; every
/// fifth row ignored.
fn cross_entropy(ctx: &mut Ctx, rows: usize, vocab: usize) -> Check {
    let logits = ctx.values(rows * vocab, 6.0);
    let ignore = vocab as u32; // never a real class
    let targets: Vec<u32> = (0..rows)
        .map(|r| {
            if r % 5 == 4 {
                ignore
            } else {
                ctx.rng.random_range(0..vocab as u32)
            }
        })
        .collect();
    let ld = ctx.up(&logits)?;
    let (mut lse, mut loss, mut dl) = (ctx.poisoned(rows)?, ctx.poisoned(1)?, ctx.poisoned(rows * vocab)?);
    gpu(ctx
        .gpu
        .cross_entropy_forward(&ld, &targets, vocab, ignore, &mut lse, &mut loss))?;
    gpu(ctx
        .gpu
        .cross_entropy_backward(&ld, &targets, vocab, ignore, &lse, 0.75, &mut dl))?;
    let mut clse = vec![0.0; rows];
    let closs = cpu(ops::cross_entropy_forward(&logits, &targets, vocab, ignore, &mut clse))?;
    let mut cdl = vec![0.0; rows * vocab];
    // The backward twin reads the GPU's lse, so dlogits is compared on the same inputs.
    let glse = ctx.down(&lse)?;
    cpu(ops::cross_entropy_backward(
        &logits, &targets, vocab, ignore, &glse, 0.75, &mut cdl,
    ))?;
    worst([
        reduction("lse", &glse, &clse),
        reduction("loss", &ctx.down(&loss)?, &[closs]),
        reduction("dlogits", &ctx.down(&dl)?, &cdl),
    ])
}

/// Twin: the greedy decoder's argmax (`model::decoder`, private): the first index of the
/// largest value, NaN never winning; same indices. Ties and NaN are planted.
fn argmax(ctx: &mut Ctx, rows: usize, cols: usize) -> Check {
    let mut x = ctx.values(rows * cols, 3.0);
    for r in 0..rows {
        let row = &mut x[r * cols..(r + 1) * cols];
        match r % 4 {
            1 => row[cols / 2] = f32::NAN,
            2 if cols > 2 => {
                row[cols - 1] = 9.0;
                row[1] = 9.0; // a tie: the first wins
            }
            3 => row[0] = f32::NAN,
            _ => {}
        }
    }
    let mut out = ctx.up(&vec![u32::MAX; rows])?;
    gpu(ctx.gpu.argmax(&ctx.up(&x)?, rows, cols, &mut out))?;
    let want: Vec<u32> = x
        .chunks(cols)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect();
    let got = ctx.down(&out)?;
    match got.iter().zip(&want).position(|(g, w)| g != w) {
        None => Ok(0.0),
        Some(r) => Err(format!("row {r}: gpu {}, cpu {}", got[r], want[r])),
    }
}

/// Twin: `ops::embedding_forward` / `embedding_backward`: same bits (repeated ids included).
fn embedding(ctx: &mut Ctx, tokens: usize, vocab: usize, dim: usize) -> Check {
    let table = ctx.values(vocab * dim, 1.0);
    let ids: Vec<u32> = (0..tokens).map(|_| ctx.rng.random_range(0..vocab as u32)).collect();
    let dout = ctx.values(tokens * dim, 1.0);
    let mut out = ctx.poisoned(tokens * dim)?;
    gpu(ctx.gpu.embedding_forward(&ids, &ctx.up(&table)?, dim, &mut out))?;
    let mut cout = vec![0.0; tokens * dim];
    cpu(ops::embedding_forward(&ids, &table, dim, &mut cout))?;
    let mut cdt = ctx.values(vocab * dim, 0.5);
    let mut dtable = ctx.up(&cdt)?;
    gpu(ctx.gpu.embedding_backward(&ids, &ctx.up(&dout)?, dim, &mut dtable))?;
    cpu(ops::embedding_backward(&ids, &dout, dim, &mut cdt))?;
    worst([
        exact("gathered rows", &ctx.down(&out)?, &cout),
        exact("dtable", &ctx.down(&dtable)?, &cdt),
    ])
}

/// Twin: `ops::unscale_and_check`: same bits and the same verdict, finite and not.
fn unscale(ctx: &mut Ctx, n: usize) -> Check {
    let mut x = ctx.values(n, 1e4);
    let mut results = Vec::new();
    for poison in [false, true] {
        if poison {
            x[n / 2] = f32::INFINITY;
        }
        let mut d = ctx.up(&x)?;
        let ok = gpu(ctx.gpu.unscale_and_check(&mut d, 1.0 / 1024.0))?;
        let mut c = x.clone();
        let cok = ops::unscale_and_check(&mut c, 1.0 / 1024.0);
        if ok != cok {
            return Err(format!("verdict: gpu {ok}, cpu {cok} (inf planted: {poison})"));
        }
        results.push(exact("unscaled", &ctx.down(&d)?, &c));
    }
    worst(results)
}

/// Twin: `ops::sum_of_squares` (f64 in order); bound: `optim::sum_squares_bound`.
fn sum_squares(ctx: &mut Ctx, n: usize) -> Check {
    let x = ctx.values(n, 3.0);
    let got = gpu(ctx.gpu.sum_squares(&ctx.up(&x)?))?;
    let want = ops::sum_of_squares(&x);
    let bound = sum_squares_bound(n, want).max(f64::MIN_POSITIVE);
    let ratio = (got - want).abs() / bound;
    if ratio <= 1.0 {
        Ok(ratio)
    } else {
        Err(format!("gpu {got:e}, cpu {want:e}: err/bound={ratio:.3}"))
    }
}

/// Twin: `ops::adamw_update` per parameter (decay 1 for undecayed ones): one launch over
/// four parameters in one arena, same bits (held to the contract's rtol 1e-6 as the bound).
fn adamw(ctx: &mut Ctx) -> Check {
    let lens = [1usize, 4097, 130, 10_000];
    let mut segments = Vec::new();
    let mut offset = 0;
    for (i, &len) in lens.iter().enumerate() {
        segments.push(AdamWSegment {
            offset,
            len,
            decayed: i % 2 == 0,
        });
        offset += len + 3; // gaps, as an aligned arena has
    }
    let n = offset;
    let (value, grad) = (ctx.values(n, 1.0), ctx.values(n, 0.1));
    let m = ctx.values(n, 0.01);
    let v: Vec<f32> = ctx.values(n, 1e-3).iter().map(|x| x.abs()).collect();
    let step = AdamWStep {
        decay: 1.0 - 3e-4 * 0.1,
        step_size: 3e-4 / (1.0 - 0.9f32.powi(7)),
        bc2_sqrt: (1.0 - 0.999f32.powi(7)).sqrt(),
        beta1: 0.9,
        beta2: 0.999,
        c1: 0.1,
        c2: 1.0 - 0.999,
        eps: 1e-8,
    };
    let items = ctx
        .gpu
        .upload(&gpu(adamw_items(&segments, n))?, Workspace)
        .map_err(|e| e.to_string())?;
    let (mut vd, gd, mut md, mut sd) = (ctx.up(&value)?, ctx.up(&grad)?, ctx.up(&m)?, ctx.up(&v)?);
    gpu(ctx.gpu.adamw(&items, &mut vd, &gd, &mut md, &mut sd, &step))?;
    let (mut cv, mut cm, mut cs) = (value.clone(), m.clone(), v.clone());
    for s in &segments {
        let r = s.offset..s.offset + s.len;
        let st = AdamWStep {
            decay: if s.decayed { step.decay } else { 1.0 },
            ..step
        };
        cpu(ops::adamw_update(
            &mut cv[r.clone()],
            &grad[r.clone()],
            &mut cm[r.clone()],
            &mut cs[r],
            &st,
        ))?;
    }
    let (gv, gm, gs) = (ctx.down(&vd)?, ctx.down(&md)?, ctx.down(&sd)?);
    let bits = worst([exact("value", &gv, &cv), exact("m", &gm, &cm), exact("v", &gs, &cs)]);
    if let Err(why) = &bits {
        println!("  adamw not bit-exact ({why}); holding it to rtol 1e-6");
        return worst([
            bounded("value", &gv, &cv, 1e-6, 0.0),
            bounded("m", &gm, &cm, 1e-6, 0.0),
            bounded("v", &gs, &cs, 1e-6, 0.0),
        ]);
    }
    bits
}
