//! Every CUDA kernel against its CPU twin on random inputs of awkward shapes:
//! codes, scales and amax must be identical (NaN codes compare as "both NaN",
//! the contract leaves NaN payloads open). Without a usable GPU this prints
//! one line, "gpu_kernels: skipped: <why>", and passes.
//!
//! The CPU side is a deliberately simple element-by-element reference built on
//! `convert::quantize`/`dequantize` (the vectorized, exhaustively tested cast)
//! and the spec formulas; it is independent of the kernels' tiling.

use std::process::ExitCode;

use fp8_engine::backend::cuda::{BlockScale, CudaDevice, DequantScales, DeviceElement, UpdateAlgo};
use fp8_engine::convert::{self, HighPrecision};
use fp8_engine::device::MemoryCategory::{Activations, Fp8Copies, Workspace};
use fp8_engine::format::{Fp8Format, Overflow};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Check = Result<(), String>;

/// Shapes with partial blocks, odd strides and sizes that are not multiples of 16.
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (3, 17),
    (16, 16),
    (31, 130),
    (64, 64),
    (127, 129),
    (130, 300),
    (257, 1000),
    (128, 4096),
    (513, 256),
];

const FORMATS: [Fp8Format; 2] = [Fp8Format::E4M3, Fp8Format::E5M2];

/// Values over many binades with signs, zeros and (when `specials`) NaN/inf.
fn random_values<T: HighPrecision>(rng: &mut StdRng, n: usize, specials: bool) -> Vec<T> {
    (0..n)
        .map(|_| {
            let roll: f32 = rng.random();
            let x = if specials && roll < 0.01 {
                [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0][rng.random_range(0..5)]
            } else {
                let magnitude = 10f32.powf(rng.random_range(-4.0..4.0));
                if rng.random::<bool>() { magnitude } else { -magnitude }
            };
            T::from_f32(x)
        })
        .collect()
}

fn same_codes(what: &str, format: Fp8Format, gpu: &[u8], cpu: &[u8]) -> Check {
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        let both_nan = format.decode(g).is_nan() && format.decode(c).is_nan();
        if g != c && !both_nan {
            return Err(format!("{what}: code {i}: gpu {g:#04x}, cpu {c:#04x}"));
        }
    }
    (gpu.len() == cpu.len())
        .then_some(())
        .ok_or(format!("{what}: lengths differ"))
}

fn same_f32(what: &str, gpu: &[f32], cpu: &[f32]) -> Check {
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        if g.to_bits() != c.to_bits() && !(g.is_nan() && c.is_nan()) {
            return Err(format!(
                "{what}: value {i}: gpu {g:e} ({:#x}), cpu {c:e} ({:#x})",
                g.to_bits(),
                c.to_bits()
            ));
        }
    }
    (gpu.len() == cpu.len())
        .then_some(())
        .ok_or(format!("{what}: lengths differ"))
}

fn transpose<T: Copy>(src: &[T], rows: usize, cols: usize) -> Vec<T> {
    (0..cols)
        .flat_map(|j| (0..rows).map(move |i| src[i * cols + j]))
        .collect()
}

fn amax_ref<T: HighPrecision>(src: &[T]) -> f32 {
    src.iter().fold(0.0f32, |m, x| m.max(x.to_f32().abs()))
}

/// Spec 4.2 on a block's amax.
fn current_scale(amax: f32, max: f32, power_2: bool, eps: f32) -> f32 {
    let amax = if amax < eps { eps } else { amax };
    if !amax.is_finite() || amax == 0.0 {
        return 1.0;
    }
    let s = max / amax;
    let s = if s.is_infinite() { f32::MAX } else { s };
    if power_2 {
        f32::from_bits(s.to_bits() & 0xFF80_0000)
    } else {
        s
    }
}

/// Spec 4.4: the E8M0 exponent, rounded up.
fn mx_exponent(amax: f32, format: Fp8Format) -> u8 {
    let v = amax * (1.0 / format.max_finite());
    if v.is_nan() {
        return 0xFF;
    }
    if v.is_infinite() {
        return 0xFE;
    }
    if v == 0.0 {
        return 0;
    }
    let (e, m) = ((v.to_bits() >> 23) as u8, v.to_bits() & 0x7F_FFFF);
    if m != 0 && e != 0xFE && !(e == 0 && m <= 0x40_0000) {
        e + 1
    } else {
        e
    }
}

fn mx_data_scale(e: u8) -> f32 {
    match e {
        0xFF => f32::NAN,
        254 => f32::from_bits(0x0040_0000),
        e => f32::from_bits((254 - e as u32) << 23),
    }
}

/// Row-wise blocks of `block` elements of a `[rows, cols]` matrix; `rule(amax) -> (scale, stored)`.
fn blocks_ref<T: HighPrecision, S>(
    src: &[T],
    rows: usize,
    cols: usize,
    block: usize,
    format: Fp8Format,
    rule: impl Fn(f32) -> (f32, S),
) -> (Vec<u8>, Vec<S>) {
    let mut codes = vec![0u8; rows * cols];
    let mut scales = Vec::new();
    for (row, out) in src.chunks(cols).zip(codes.chunks_mut(cols)) {
        for (chunk, out) in row.chunks(block).zip(out.chunks_mut(block)) {
            let (scale, stored) = rule(amax_ref(chunk));
            convert::quantize(chunk, out, format, scale, Overflow::Saturate).expect("reference cast");
            scales.push(stored);
        }
    }
    (codes, scales)
}

struct Ctx {
    gpu: CudaDevice,
    rng: StdRng,
}

impl Ctx {
    fn up<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> fp8_engine::backend::cuda::DeviceBuffer<T> {
        self.gpu.upload(v, Activations).expect("upload")
    }
    /// A buffer of poison (0xA5 bytes / NaN), so a kernel that skips an element is caught.
    fn poison_u8(&self, n: usize) -> fp8_engine::backend::cuda::DeviceBuffer<u8> {
        self.gpu.upload(&vec![0xA5u8; n], Fp8Copies).expect("upload")
    }
    fn poison_f32(&self, n: usize) -> fp8_engine::backend::cuda::DeviceBuffer<f32> {
        self.gpu.upload(&vec![f32::NAN; n], Workspace).expect("upload")
    }
    fn down<T: cudarc::driver::DeviceRepr>(&self, b: &fp8_engine::backend::cuda::DeviceBuffer<T>) -> Vec<T> {
        self.gpu.download(b).expect("download")
    }
}

fn check_cast<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, true);
    let scale: f32 = ctx.rng.random_range(0.01..100.0);
    let mut q_cpu = vec![0u8; src.len()];
    let amax_cpu = convert::quantize(&src, &mut q_cpu, format, scale, Overflow::Saturate).map_err(|e| e.to_string())?;
    let d_src = ctx.up(&src);
    let d_scale = ctx.up(&[scale]);
    for transpose_too in [false, true] {
        let mut q = ctx.poison_u8(src.len());
        let mut qt = ctx.poison_u8(src.len());
        let mut amax = ctx.up(&[0.0f32]);
        let mut scale_inv = ctx.poison_f32(1);
        let dst_t = if transpose_too { Some(&mut qt) } else { None };
        let r = ctx.gpu.cast_amax(
            &d_src,
            rows,
            cols,
            format,
            (&d_scale, 0),
            &mut q,
            dst_t,
            (&mut amax, 0),
            Some(&mut scale_inv),
        );
        r.map_err(|e| e.to_string())?;
        same_codes("cast codes", format, &ctx.down(&q), &q_cpu)?;
        same_f32("cast amax", &ctx.down(&amax), &[amax_cpu])?;
        same_f32("cast scale_inv", &ctx.down(&scale_inv), &[1.0 / scale])?;
        if transpose_too {
            same_codes(
                "cast transposed codes",
                format,
                &ctx.down(&qt),
                &transpose(&q_cpu, rows, cols),
            )?;
        }
    }
    let mut amax = ctx.up(&[0.0f32]);
    ctx.gpu.amax(&d_src, &mut amax).map_err(|e| e.to_string())?;
    same_f32("amax", &ctx.down(&amax), &[amax_ref(&src)])
}

fn check_1x128<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, false);
    let rule = BlockScale {
        format,
        power_2_scale: ctx.rng.random(),
        amax_epsilon: 0.0,
    };
    let f = |amax: f32| {
        let s = current_scale(amax, format.max_finite(), rule.power_2_scale, 0.0);
        (s, 1.0 / s)
    };
    let (q_row, s_row) = blocks_ref(&src, rows, cols, 128, format, f);
    let (q_col, s_col) = blocks_ref(&transpose(&src, rows, cols), cols, rows, 128, format, f);
    let d_src = ctx.up(&src);
    let (mut q, mut s) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_row.len()));
    let (mut qc, mut sc) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_col.len()));
    ctx.gpu
        .quantize_1x128(
            &d_src,
            rows,
            cols,
            rule,
            Some((&mut q, &mut s)),
            Some((&mut qc, &mut sc)),
        )
        .map_err(|e| e.to_string())?;
    same_codes("1x128 row-wise codes", format, &ctx.down(&q), &q_row)?;
    same_f32("1x128 row-wise scale_inv", &ctx.down(&s), &s_row)?;
    same_codes("1x128 column-wise codes", format, &ctx.down(&qc), &q_col)?;
    same_f32("1x128 column-wise scale_inv", &ctx.down(&sc), &s_col)
}

fn check_mxfp8<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, false);
    let f = |amax: f32| {
        let e = mx_exponent(amax, format);
        (mx_data_scale(e), e)
    };
    let (q_row, e_row) = blocks_ref(&src, rows, cols, 32, format, f);
    let (q_col, e_col) = blocks_ref(&transpose(&src, rows, cols), cols, rows, 32, format, f);
    let d_src = ctx.up(&src);
    let (mut q, mut e) = (ctx.poison_u8(src.len()), ctx.poison_u8(e_row.len()));
    let (mut qc, mut ec) = (ctx.poison_u8(src.len()), ctx.poison_u8(e_col.len()));
    ctx.gpu
        .quantize_mxfp8(
            &d_src,
            rows,
            cols,
            format,
            Some((&mut q, &mut e)),
            Some((&mut qc, &mut ec)),
        )
        .map_err(|e| e.to_string())?;
    same_codes("mxfp8 row-wise codes", format, &ctx.down(&q), &q_row)?;
    (ctx.down(&e) == e_row)
        .then_some(())
        .ok_or("mxfp8 row-wise E8M0 scales differ")?;
    same_codes("mxfp8 column-wise codes", format, &ctx.down(&qc), &q_col)?;
    (ctx.down(&ec) == e_col)
        .then_some(())
        .ok_or_else(|| "mxfp8 column-wise E8M0 scales differ".to_string())?;
    // Dequantize the row-wise copy back.
    let mut y_cpu = vec![T::from_f32(0.0); src.len()];
    for (i, (&code, y)) in q_row.iter().zip(y_cpu.iter_mut()).enumerate() {
        let e = e_row[(i / cols) * cols.div_ceil(32) + (i % cols) / 32];
        *y = T::from_f32(format.decode(code) * fp8_engine::format::decode_e8m0(e));
    }
    let mut y = ctx.up(&vec![T::from_f32(f32::NAN); src.len()]);
    ctx.gpu
        .dequantize(&q, rows, cols, format, DequantScales::Mxfp8(&e), &mut y)
        .map_err(|e| e.to_string())?;
    let as_f32 = |v: &[T]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
    same_f32("mxfp8 dequantize", &as_f32(&ctx.down(&y)), &as_f32(&y_cpu))
}

fn check_128x128<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, false);
    let rule = BlockScale {
        format,
        power_2_scale: ctx.rng.random(),
        amax_epsilon: 0.0,
    };
    let (gr, gc) = (rows.div_ceil(128), cols.div_ceil(128));
    let mut q_cpu = vec![0u8; src.len()];
    let mut s_cpu = vec![0.0f32; gr * gc];
    for (t, stored) in s_cpu.iter_mut().enumerate() {
        let (r0, c0) = ((t / gc) * 128, (t % gc) * 128);
        let (r1, c1) = ((r0 + 128).min(rows), (c0 + 128).min(cols));
        let amax = (r0..r1).fold(0.0f32, |m, i| m.max(amax_ref(&src[i * cols + c0..i * cols + c1])));
        let scale = current_scale(amax, format.max_finite(), rule.power_2_scale, 0.0);
        for i in r0..r1 {
            let range = i * cols + c0..i * cols + c1;
            convert::quantize(
                &src[range.clone()],
                &mut q_cpu[range],
                format,
                scale,
                Overflow::Saturate,
            )
            .map_err(|e| e.to_string())?;
        }
        *stored = 1.0 / scale;
    }
    let d_src = ctx.up(&src);
    let (mut q, mut s) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_cpu.len()));
    let (mut qt, mut st) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_cpu.len()));
    ctx.gpu
        .quantize_128x128(&d_src, rows, cols, rule, (&mut q, &mut s), Some((&mut qt, &mut st)))
        .map_err(|e| e.to_string())?;
    same_codes("128x128 codes", format, &ctx.down(&q), &q_cpu)?;
    same_f32("128x128 scale_inv", &ctx.down(&s), &s_cpu)?;
    same_codes(
        "128x128 column-wise codes",
        format,
        &ctx.down(&qt),
        &transpose(&q_cpu, rows, cols),
    )?;
    same_f32(
        "128x128 column-wise scale_inv",
        &ctx.down(&st),
        &transpose(&s_cpu, gr, gc),
    )?;
    // Dequantize with the f32 grid.
    let mut y_cpu = vec![T::from_f32(0.0); src.len()];
    for (i, (&code, y)) in q_cpu.iter().zip(y_cpu.iter_mut()).enumerate() {
        *y = T::from_f32(format.decode(code) * s_cpu[(i / cols / 128) * gc + (i % cols) / 128]);
    }
    let mut y = ctx.up(&vec![T::from_f32(f32::NAN); src.len()]);
    ctx.gpu
        .dequantize(&q, rows, cols, format, DequantScales::Blocks(&s, (128, 128)), &mut y)
        .map_err(|e| e.to_string())?;
    let as_f32 = |v: &[T]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
    same_f32("128x128 dequantize", &as_f32(&ctx.down(&y)), &as_f32(&y_cpu))?;
    // Per-tensor dequantize against convert::dequantize.
    let scale_inv: f32 = ctx.rng.random_range(0.001..10.0);
    let mut y_cpu = vec![T::from_f32(0.0); src.len()];
    convert::dequantize(&q_cpu, &mut y_cpu, format, scale_inv).map_err(|e| e.to_string())?;
    let d_scale_inv = ctx.up(&[scale_inv]);
    ctx.gpu
        .dequantize(&q, rows, cols, format, DequantScales::PerTensor(&d_scale_inv), &mut y)
        .map_err(|e| e.to_string())?;
    same_f32("per-tensor dequantize", &as_f32(&ctx.down(&y)), &as_f32(&y_cpu))
}

/// Spec 4.1 for one slot, written out step by step.
fn delayed_ref(history: &mut [f32], scale: &mut f32, scaled_max: f32, algo: UpdateAlgo) {
    let last = history[0];
    if last == 0.0 {
        return;
    }
    let amax = match algo {
        UpdateAlgo::Max => history[1..].iter().fold(last, |a, &h| a.max(h)),
        UpdateAlgo::MostRecent => last,
    };
    let len = history.len();
    for i in 1..len.saturating_sub(1) {
        history[i] = history[i + 1];
    }
    if len > 1 {
        history[len - 1] = last;
    }
    history[0] = 0.0;
    if amax.is_finite() && amax > 0.0 {
        let s = scaled_max / amax;
        *scale = if s.is_infinite() { f32::MAX } else { s };
    }
}

fn check_delayed(ctx: &mut Ctx, slots: usize, len: usize, algo: UpdateAlgo) -> Check {
    let mut history: Vec<f32> = (0..slots * len)
        .map(|i| match ctx.rng.random_range(0..20) {
            0 if i % len == 0 => 0.0, // a slot that did not run this step
            1 => f32::NAN,
            2 => f32::INFINITY,
            3 => 1e-40, // tiny: scale overflows to f32::MAX
            _ => 10f32.powf(ctx.rng.random_range(-3.0..3.0)),
        })
        .collect();
    let mut scale: Vec<f32> = (0..slots).map(|_| ctx.rng.random_range(0.5..2.0)).collect();
    let scaled_max: Vec<f32> = (0..slots)
        .map(|i| if i % 2 == 0 { 448.0 } else { 57344.0 / 2.0 })
        .collect();
    let (mut d_h, mut d_s, d_m) = (ctx.up(&history), ctx.up(&scale), ctx.up(&scaled_max));
    ctx.gpu
        .delayed_update(&mut d_h, len, &mut d_s, &d_m, algo)
        .map_err(|e| e.to_string())?;
    for ((h, s), &m) in history.chunks_mut(len).zip(scale.iter_mut()).zip(&scaled_max) {
        delayed_ref(h, s, m, algo);
    }
    same_f32("delayed history", &ctx.down(&d_h), &history)?;
    same_f32("delayed scale", &ctx.down(&d_s), &scale)
}

fn for_types(
    ctx: &mut Ctx,
    name: &str,
    results: &mut Vec<(String, Check)>,
    run: &dyn Fn(&mut Ctx, usize, usize, Fp8Format, &str) -> Check,
) {
    for &(rows, cols) in SHAPES {
        for format in FORMATS {
            for ty in ["f32", "bf16", "f16"] {
                let label = format!("{name} {ty} {rows}x{cols} {format:?}");
                results.push((label, run(ctx, rows, cols, format, ty)));
            }
        }
    }
}

macro_rules! typed {
    ($f:ident) => {
        |ctx: &mut Ctx, r: usize, c: usize, fmt: Fp8Format, ty: &str| match ty {
            "f32" => $f::<f32>(ctx, r, c, fmt),
            "bf16" => $f::<bf16>(ctx, r, c, fmt),
            _ => $f::<f16>(ctx, r, c, fmt),
        }
    };
}

fn main() -> ExitCode {
    let gpu = match CudaDevice::open(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            println!("gpu_kernels: skipped: {err}");
            return ExitCode::SUCCESS;
        }
    };
    println!("gpu_kernels: on {:?}", gpu.info());
    let mut ctx = Ctx {
        gpu,
        rng: StdRng::seed_from_u64(0x005E_EDF8),
    };
    let mut results = Vec::new();
    for_types(&mut ctx, "cast", &mut results, &typed!(check_cast));
    for_types(&mut ctx, "1x128", &mut results, &typed!(check_1x128));
    for_types(&mut ctx, "mxfp8", &mut results, &typed!(check_mxfp8));
    for_types(&mut ctx, "128x128", &mut results, &typed!(check_128x128));
    for (slots, len) in [(1, 1), (3, 2), (37, 1024), (100, 33)] {
        for algo in [UpdateAlgo::Max, UpdateAlgo::MostRecent] {
            results.push((
                format!("delayed {slots} slots x {len} {algo:?}"),
                check_delayed(&mut ctx, slots, len, algo),
            ));
        }
    }
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    for (label, r) in &failed {
        println!("FAIL {label}: {}", r.as_ref().err().map(String::as_str).unwrap_or(""));
    }
    println!("gpu_kernels: {} checks, {} failed", results.len(), failed.len());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
