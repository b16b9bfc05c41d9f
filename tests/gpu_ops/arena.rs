//! The device arenas: allocation reported to the ledger by category, and one
//! AdamW launch over every parameter against `ops::adamw_update` per parameter.

use fp8_engine::backend::cuda::arena::ArenaLayout;
use fp8_engine::backend::cuda::staging::{PINNED_MIN_BYTES, STAGING_CHUNK_BYTES};
use fp8_engine::device::MemoryCategory;
use fp8_engine::nn::{Module, Parameter};
use fp8_engine::ops::{self, AdamWStep};
use fp8_engine::tensor::DeviceKind;
use fp8_engine::train::adamw::{AdamW, AdamWConfig};

use crate::compare::exact;
use crate::{Check, Ctx, cpu, gpu, worst};

pub fn run(ctx: &mut Ctx, results: &mut Vec<(String, Check)>) {
    results.push(("arenas: ledger and one AdamW launch".into(), arenas(ctx)));
    results.push(("arenas: ranged copies in and out".into(), ranged_copies(ctx)));
    results.push((
        "arenas: copies through the pinned staging, across its chunks".into(),
        staged_copies(ctx),
    ));
    results.push((
        "arenas: AdamW on CUDA keeps its moments on the device".into(),
        optimizer(ctx),
    ));
    results.push((
        "arenas: views write their range of the allocation, book nothing".into(),
        views(ctx),
    ));
}

/// Views of one allocation (what a parameter holding its arena range is): an upload, a memset,
/// device copies and a kernel through them land in their range and nowhere else; a view of a
/// view is a view of the allocation; views book nothing in the ledger; a view keeps the
/// allocation alive after its owner let go, and the last one frees it. Empty buffers are views
/// too.
fn views(ctx: &mut Ctx) -> Check {
    use std::sync::Arc;
    let n = 1000;
    let mut expected = ctx.values(n, 1.0);
    let total = |ctx: &Ctx| ctx.gpu.ledger().total().current;
    let before = total(ctx);
    let base = Arc::new(ctx.up(&expected)?);
    let booked = total(ctx);
    if booked != before + 4 * n as u64 {
        return Err(format!(
            "the allocation booked {} bytes, not {}",
            booked - before,
            4 * n
        ));
    }
    let mut v = gpu(ctx.gpu.view(&base, 640, 300))?;
    let part = ctx.values(300, 2.0);
    gpu(ctx.gpu.write(&part, &mut v))?;
    expected[640..940].copy_from_slice(&part);
    // A view of the view: 50 values from 650 of the allocation, cleared, then 20 copied in at 5.
    let v = Arc::new(v);
    let mut w = gpu(ctx.gpu.view(&v, 10, 50))?;
    gpu(ctx.gpu.zero(&mut w))?;
    expected[650..700].fill(0.0);
    let src = ctx.values(20, 3.0);
    {
        // Freed before the ledger is checked below.
        let src_buffer = ctx.up(&src)?;
        gpu(ctx.gpu.copy_at(&src_buffer, &mut w, 5))?;
    }
    expected[655..675].copy_from_slice(&src);
    // The allocation's first 100 values into a view of its last 100.
    let mut tail = gpu(ctx.gpu.view(&base, 900, 100))?;
    gpu(ctx.gpu.copy_from_at(&base, 0, &mut tail))?;
    let head = expected[..100].to_vec();
    expected[900..1000].copy_from_slice(&head);
    // A kernel writing through a view (exact: a multiply by a power of two).
    let mut u = gpu(ctx.gpu.view(&base, 100, 200))?;
    gpu(ctx.gpu.multiply(&mut u, -0.5))?;
    expected[100..300].iter_mut().for_each(|x| *x *= -0.5);
    // One view into another of the same allocation.
    let (mut to, from) = (gpu(ctx.gpu.view(&base, 300, 20))?, gpu(ctx.gpu.view(&base, 400, 20))?);
    gpu(ctx.gpu.copy(&from, &mut to))?;
    let moved = expected[400..420].to_vec();
    expected[300..320].copy_from_slice(&moved);
    drop((to, from));
    if total(ctx) != booked {
        return Err(format!("views booked {} bytes", total(ctx) as i64 - booked as i64));
    }
    if ctx.gpu.view(&base, 901, 100).is_ok() {
        return Err("a view past the allocation was accepted".into());
    }
    let whole = ctx.down(&base)?;
    crate::compare::exact("the allocation after writes through views", &whole, &expected)?;
    // Reads through views, then through one that outlived every owner of the allocation.
    crate::compare::exact("a view of a view", &ctx.down(&w)?, &expected[650..700])?;
    {
        // A view copied into an allocation of its own (how a clone of a held range is made).
        let mut own = ctx.zeros::<f32>(50)?;
        gpu(ctx.gpu.copy(&w, &mut own))?;
        crate::compare::exact("a view copied out", &ctx.down(&own)?, &expected[650..700])?;
    }
    drop((base, v, tail, w));
    if total(ctx) != booked {
        return Err("the allocation was freed while a view of it lived".into());
    }
    let alone = ctx.down(&u)?;
    drop(u);
    if total(ctx) != before {
        return Err(format!(
            "the last view left {} bytes booked",
            total(ctx) as i64 - before as i64
        ));
    }
    // Buffers of no elements (the driver refuses zero bytes): views of none of one element.
    let none = gpu(ctx.gpu.alloc_zeros::<f32>(0, MemoryCategory::Activations))?;
    let uploaded = ctx.up::<f32>(&[])?;
    if !none.is_empty() || !uploaded.is_empty() || total(ctx) != before + 8 {
        return Err(format!(
            "empty buffers: lengths {} and {}, {} bytes booked (4 each expected)",
            none.len(),
            uploaded.len(),
            total(ctx) as i64 - before as i64
        ));
    }
    drop((none, uploaded));
    crate::compare::exact("a view after its owner let go", &alone, &expected[100..300])
}

/// `write_at` / `read_at` move exactly their range, and a range past the buffer is an error.
fn ranged_copies(ctx: &mut Ctx) -> Check {
    let mut buffer = ctx.zeros::<f32>(1000)?;
    let part = ctx.values(300, 1.0);
    gpu(ctx.gpu.write_at(&part, &mut buffer, 650))?;
    let mut back = vec![0.0f32; 302];
    gpu(ctx.gpu.read_at(&buffer, 649, &mut back))?;
    let mut expected = vec![0.0f32; 302];
    expected[1..301].copy_from_slice(&part);
    if ctx.gpu.write_at(&part, &mut buffer, 701).is_ok() || ctx.gpu.read_at(&buffer, 699, &mut back).is_ok() {
        return Err("a range past the buffer was accepted".into());
    }
    exact("read_at", &back, &expected)
}

/// Uploads and downloads of lengths around the staging's chunk (one chunk, one more or less,
/// two and a half: both pinned halves, each reused) and around the size where staging starts
/// come back bit for bit, for 4- and 2-byte values; so does a ranged write and read at an odd
/// offset, longer than a chunk (chunks count from the start of each copy); and a kernel between
/// a staged upload and a staged download sees the upload and is waited for.
fn staged_copies(ctx: &mut Ctx) -> Check {
    let chunk = STAGING_CHUNK_BYTES / 4;
    let first_staged = PINNED_MIN_BYTES / 4;
    for len in [
        1,
        3,
        first_staged - 1,
        first_staged,
        chunk - 1,
        chunk,
        chunk + 1,
        2 * chunk + chunk / 2,
    ] {
        let values = ctx.values(len, 1.0);
        let buffer = gpu(ctx.gpu.upload(&values, MemoryCategory::Workspace))?;
        exact(
            &format!("f32 x {len} round trip"),
            &gpu(ctx.gpu.download(&buffer))?,
            &values,
        )?;
        let halves: Vec<half::bf16> = values.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let buffer = gpu(ctx.gpu.upload(&halves, MemoryCategory::Workspace))?;
        if gpu(ctx.gpu.download(&buffer))? != halves {
            return Err(format!("bf16 x {len} round trip differs"));
        }
    }
    // Stream order: upload, transpose on the device, download, all staged.
    let (rows, cols) = (1031, 2 * chunk / 1031 + 3);
    let values = ctx.values(rows * cols, 1.0);
    let source = gpu(ctx.gpu.upload(&values, MemoryCategory::Workspace))?;
    let mut transposed = ctx.zeros::<f32>(rows * cols)?;
    gpu(ctx.gpu.convert(&source, rows, cols, true, &mut transposed))?;
    let want: Vec<f32> = (0..rows * cols).map(|i| values[(i % rows) * cols + i / rows]).collect();
    exact(
        "staged upload, kernel, staged download",
        &gpu(ctx.gpu.download(&transposed))?,
        &want,
    )?;
    let mut buffer = ctx.zeros::<f32>(3 * chunk)?;
    let part = ctx.values(chunk + 7, 1.0);
    let offset = chunk / 2 + 1;
    gpu(ctx.gpu.write_at(&part, &mut buffer, offset))?;
    let mut back = vec![0.0f32; part.len()];
    gpu(ctx.gpu.read_at(&buffer, offset, &mut back))?;
    exact("staged write_at/read_at", &back, &part)?;
    let whole = gpu(ctx.gpu.download(&buffer))?;
    let untouched = whole[..offset].iter().chain(&whole[offset + part.len()..]);
    if untouched.into_iter().any(|&v| v != 0.0) {
        return Err("a staged ranged write touched values outside its range".into());
    }
    Ok(0.0)
}

/// Parameters of mixed shapes for the optimizer check.
struct Params(Vec<Parameter>);

impl Module for Params {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.0.iter_mut().for_each(f);
    }
}

/// `AdamW` moved to the GPU (its arenas: one upload of weights and gradients, one launch, one
/// download per step) against the same optimizer on the CPU, same bits at every step; a weight
/// edited on the host between steps; the moments read back (`state()`), a resume from them, and
/// a step on the CPU and back (the moments leave the device and return).
fn optimizer(ctx: &mut Ctx) -> Check {
    let shapes: [(&str, &[usize]); 4] = [("emb", &[50, 64]), ("norm", &[64]), ("w", &[64, 96]), ("b", &[96])];
    let mut cpu_params = Params(
        shapes
            .iter()
            .map(|(name, shape)| Parameter::new(*name, shape, ctx.values(shape.iter().product(), 1.0)).unwrap())
            .collect(),
    );
    let mut gpu_params = Params(cpu_params.0.clone());
    let config = AdamWConfig {
        weight_decay: 0.1,
        ..AdamWConfig::default()
    };
    let mut on_cpu = cpu(AdamW::new(config))?;
    let mut on_gpu = cpu(AdamW::new(config))?;
    on_gpu.to_device(DeviceKind::Cuda(0));
    let bits = |p: &Params| -> Vec<f32> { p.0.iter().flat_map(|p| p.value().to_vec()).collect() };
    let mut worst_seen = 0.0f64;
    for step in 0..6 {
        for p in 0..cpu_params.0.len() {
            let grad = ctx.values(cpu_params.0[p].len(), 10f32.powi(step % 3 - 1));
            cpu_params.0[p].grad_mut().copy_from_slice(&grad);
            gpu_params.0[p].grad_mut().copy_from_slice(&grad);
        }
        if step == 2 {
            // The host owns the weights: an edit there is what the next step updates.
            cpu_params.0[2].value_mut()[5] = 3.0;
            gpu_params.0[2].value_mut()[5] = 3.0;
        }
        if step == 3 {
            // Resume: a fresh GPU optimizer from the state read back from the device.
            let saved = gpu(on_gpu.state())?.into_owned();
            on_gpu = cpu(AdamW::new(config))?;
            on_gpu.set_state(saved);
            on_gpu.to_device(DeviceKind::Cuda(0));
        }
        // Step 4 runs on the CPU (the moments come home), step 5 back on the GPU.
        on_gpu.to_device(if step == 4 {
            DeviceKind::Cpu
        } else {
            DeviceKind::Cuda(0)
        });
        cpu(on_cpu.step(&mut cpu_params, 1e-2))?;
        gpu(on_gpu.step(&mut gpu_params, 1e-2))?;
        worst_seen = worst_seen.max(exact(
            &format!("values after step {step}"),
            &bits(&gpu_params),
            &bits(&cpu_params),
        )?);
    }
    let (g, c) = (gpu(on_gpu.state())?, cpu(on_cpu.state())?);
    let flat = |s: &fp8_engine::train::adamw::AdamWState, m: bool| -> Vec<f32> {
        s.moments
            .iter()
            .flat_map(|x| if m { x.m.clone() } else { x.v.clone() })
            .collect()
    };
    worst([
        Ok(worst_seen),
        exact("m", &flat(&g, true), &flat(&c, true)),
        exact("v", &flat(&g, false), &flat(&c, false)),
    ])
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
