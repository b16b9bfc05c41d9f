//! The device arenas: allocation reported to the ledger by category, and one
//! AdamW launch over every parameter against `ops::adamw_update` per parameter.

use fp8_engine::backend::cuda::arena::ArenaLayout;
use fp8_engine::device::MemoryCategory;
use fp8_engine::ops::{self, AdamWStep};

use crate::compare::exact;
use crate::{Check, Ctx, cpu, gpu, worst};

pub fn run(ctx: &mut Ctx, results: &mut Vec<(String, Check)>) {
    results.push(("arenas: ledger and one AdamW launch".into(), arenas(ctx)));
}

fn arenas(ctx: &mut Ctx) -> Check {
    let layout = gpu(ArenaLayout::new([
        ("emb", 5000, true),
        ("norm", 7, false),
        ("w", 9000, true),
    ]))?;
    let before = [MemoryCategory::MasterWeights, MemoryCategory::Gradients].map(|c| ctx.gpu.ledger().usage(c).current);
    let mut arenas = gpu(ctx.gpu.allocate_arenas(layout.clone()))?;
    let bytes = (layout.len() * 4) as u64;
    let after = [MemoryCategory::MasterWeights, MemoryCategory::Gradients].map(|c| ctx.gpu.ledger().usage(c).current);
    if after[0] - before[0] != bytes || after[1] - before[1] != bytes {
        return Err(format!("ledger: {before:?} -> {after:?}, expected +{bytes} bytes each"));
    }
    let n = layout.len();
    let (value, grad, m) = (ctx.values(n, 1.0), ctx.values(n, 0.1), ctx.values(n, 0.01));
    let v: Vec<f32> = ctx.values(n, 1e-3).iter().map(|x| x.abs()).collect();
    for (host, buffer) in [
        (&value, &mut arenas.values),
        (&grad, &mut arenas.grads),
        (&m, &mut arenas.m),
        (&v, &mut arenas.v),
    ] {
        gpu(ctx.gpu.write(host, buffer))?;
    }
    let step = AdamWStep {
        decay: 1.0 - 1e-3 * 0.1,
        step_size: 1e-3 / (1.0 - 0.9f32.powi(3)),
        bc2_sqrt: (1.0 - 0.95f32.powi(3)).sqrt(),
        beta1: 0.9,
        beta2: 0.95,
        c1: 0.1,
        c2: 1.0 - 0.95,
        eps: 1e-8,
    };
    gpu(ctx.gpu.adamw_step(&mut arenas, &step))?;
    let (mut cv, mut cm, mut cs) = (value.clone(), m.clone(), v.clone());
    for e in layout.entries() {
        let r = e.offset..e.offset + e.len;
        let st = AdamWStep {
            decay: if e.decayed { step.decay } else { 1.0 },
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
    worst([
        exact("values", &ctx.down(&arenas.values)?, &cv),
        exact("m", &ctx.down(&arenas.m)?, &cm),
        exact("v", &ctx.down(&arenas.v)?, &cs),
    ])
}
