//! Every CUDA kernel against its CPU twin in the library (`fp8_engine::quantize`,
//! `fp8_engine::scaling`) on random inputs of awkward shapes: codes, scales
//! (f32 `scale_inv`, E8M0 exponents), amax and amax histories must be identical
//! (NaN codes and values compare as "both NaN", the contract leaves NaN payloads
//! open). The CPU side is exactly what the CPU backend computes, with the launch
//! options expressed as the library's recipe types (`ScaleRule`,
//! `BlockScaling`, `CurrentScaling`, `DelayedScaling`). Without a usable GPU this
//! prints one line, "gpu_kernels: skipped: <why>", and passes.

use std::process::ExitCode;

use fp8_engine::backend::cuda::{CudaDevice, DequantScales, DeviceBuffer, DeviceElement};
use fp8_engine::convert::HighPrecision;
use fp8_engine::device::MemoryCategory::{Activations, Fp8Copies, Workspace};
use fp8_engine::format::Fp8Format;
use fp8_engine::quantize::{self as twin, ScaleRule};
use fp8_engine::scaling::{
    AmaxComputeAlgo, BlockScaling, CurrentScaling, DelayedScaling, DelayedSlot, MAX_MARGIN, RecipeFormat, TensorRole,
};
use fp8_engine::tensor::{QuantizedMatrix, QuantizedTensor, Scales};
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

/// Share of NaN/inf/-0/0 elements: per-tensor casts get many; block quantizers
/// few, so most blocks still have a finite amax (one inf makes a block's scale 1).
const CAST_SPECIALS: f64 = 0.01;
const BLOCK_SPECIALS: f64 = 0.0005;

/// Values over eight decades with signs, and a `specials` share of NaN/inf/zeros.
fn random_values<T: HighPrecision>(rng: &mut StdRng, n: usize, specials: f64) -> Vec<T> {
    (0..n)
        .map(|_| {
            let x = if rng.random_bool(specials) {
                [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0][rng.random_range(0..5)]
            } else {
                let magnitude = 10f32.powf(rng.random_range(-4.0..4.0));
                if rng.random::<bool>() { magnitude } else { -magnitude }
            };
            T::from_f32(x)
        })
        .collect()
}

/// The recipe format and a tensor role under which a recipe picks `format`.
fn recipe_format(format: Fp8Format) -> (RecipeFormat, TensorRole) {
    match format {
        Fp8Format::E4M3 => (RecipeFormat::E4M3, TensorRole::Input),
        Fp8Format::E5M2 => (RecipeFormat::Hybrid, TensorRole::OutputGrad),
    }
}

/// An amax epsilon that is 0, below most blocks' amax, or above many.
fn random_epsilon(rng: &mut StdRng) -> f32 {
    [0.0, 0.0, 1.0, 1e3][rng.random_range(0..4)]
}

/// The per-block rule of a random block-scaling recipe in `format`.
fn block_rule(rng: &mut StdRng, format: Fp8Format) -> ScaleRule {
    let (recipe_format, role) = recipe_format(format);
    let recipe = BlockScaling {
        format: recipe_format,
        power_2_scale: rng.random(),
        amax_epsilon: random_epsilon(rng),
        ..BlockScaling::default()
    };
    ScaleRule::block(&recipe, role)
}

fn cpu<T>(r: fp8_engine::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("CPU twin: {e}"))
}

fn gpu<T>(r: fp8_engine::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("GPU: {e}"))
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

fn same_values<T: HighPrecision>(what: &str, gpu: &[T], cpu: &[T]) -> Check {
    let as_f32 = |v: &[T]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
    same_f32(what, &as_f32(gpu), &as_f32(cpu))
}

fn same_e8m0(what: &str, gpu: &[u8], cpu: &[u8]) -> Check {
    match gpu.iter().zip(cpu).position(|(g, c)| g != c) {
        Some(i) => Err(format!("{what}: scale {i}: gpu {:#04x}, cpu {:#04x}", gpu[i], cpu[i])),
        None if gpu.len() != cpu.len() => Err(format!("{what}: lengths differ")),
        None => Ok(()),
    }
}

/// The f32 `scale_inv` grid of a block-scaled copy.
fn f32_scales(matrix: &QuantizedMatrix) -> Result<&[f32], String> {
    match matrix.scales() {
        Scales::Block1x128(s) | Scales::Block128x128(s) => Ok(s),
        other => Err(format!("CPU twin: expected f32 block scales, got {:?}", other.kind())),
    }
}

fn e8m0_scales(matrix: &QuantizedMatrix) -> Result<&[u8], String> {
    match matrix.scales() {
        Scales::Mxfp8(e) => Ok(e),
        other => Err(format!("CPU twin: expected E8M0 scales, got {:?}", other.kind())),
    }
}

fn per_tensor_scale_inv(tensor: &QuantizedTensor) -> Result<f32, String> {
    match tensor.rowwise().scales() {
        Scales::PerTensor(s) => Ok(*s),
        other => Err(format!("CPU twin: expected a per-tensor scale, got {:?}", other.kind())),
    }
}

fn columnwise(tensor: &QuantizedTensor) -> Result<&QuantizedMatrix, String> {
    tensor.columnwise().ok_or("CPU twin: no column-wise copy".to_string())
}

struct Ctx {
    gpu: CudaDevice,
    rng: StdRng,
}

impl Ctx {
    fn up<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> DeviceBuffer<T> {
        self.gpu.upload(v, Activations).expect("upload")
    }
    /// A buffer of poison (0xA5 bytes / NaN), so a kernel that skips an element is caught.
    fn poison_u8(&self, n: usize) -> DeviceBuffer<u8> {
        self.gpu.upload(&vec![0xA5u8; n], Fp8Copies).expect("upload")
    }
    fn poison_f32(&self, n: usize) -> DeviceBuffer<f32> {
        self.gpu.upload(&vec![f32::NAN; n], Workspace).expect("upload")
    }
    fn poison_values<T: DeviceElement>(&self, n: usize) -> DeviceBuffer<T> {
        self.up(&vec![T::from_f32(f32::NAN); n])
    }
    fn down<T: cudarc::driver::DeviceRepr>(&self, b: &DeviceBuffer<T>) -> Vec<T> {
        self.gpu.download(b).expect("download")
    }

    /// GPU dequantize of one `[rows, cols]` copy, compared with the twin's `QuantizedMatrix::dequantize`.
    fn check_dequantize<T: DeviceElement>(
        &self,
        what: &str,
        format: Fp8Format,
        codes: &DeviceBuffer<u8>,
        scales: DequantScales<'_>,
        expected: &QuantizedMatrix,
    ) -> Check {
        let (rows, cols) = (expected.rows(), expected.cols());
        let mut y = self.poison_values::<T>(rows * cols);
        gpu(self.gpu.dequantize(codes, rows, cols, format, scales, &mut y))?;
        same_values(what, &self.down(&y), &cpu(expected.dequantize::<T>(format))?)
    }
}

/// An amax accumulator's value before a cast: zero, a NaN (which `fmaxf` drops),
/// a small or large earlier amax, or inf.
fn random_prior_amax(rng: &mut StdRng) -> f32 {
    [0.0, f32::NAN, -f32::NAN, 1e-3, 5.0, 1e5, f32::INFINITY][rng.random_range(0..7)]
}

/// What a cast leaves in an amax accumulator holding `prior` (the twin of the kernels' atomic max).
fn accumulated(prior: f32, amax: f32) -> f32 {
    let mut slot = DelayedSlot::new(1);
    slot.set_current_amax(prior);
    slot.record_amax(amax);
    slot.current_amax()
}

fn check_cast<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, CAST_SPECIALS);
    let scale: f32 = ctx.rng.random_range(0.01..100.0);
    let d_src = ctx.up(&src);
    let d_scale = ctx.up(&[scale]);
    // Delayed scaling: a given scale, cast (+ transpose) with a fused amax.
    for transpose_too in [false, true] {
        let (tensor, amax_cpu) = cpu(twin::quantize_per_tensor(
            &src,
            rows,
            cols,
            format,
            scale,
            transpose_too,
        ))?;
        let prior = random_prior_amax(&mut ctx.rng);
        let mut q = ctx.poison_u8(src.len());
        let mut qt = ctx.poison_u8(src.len());
        let mut amax = ctx.up(&[prior]);
        let mut scale_inv = ctx.poison_f32(1);
        let dst_t = if transpose_too { Some(&mut qt) } else { None };
        gpu(ctx.gpu.cast_amax(
            &d_src,
            rows,
            cols,
            format,
            (&d_scale, 0),
            &mut q,
            dst_t,
            (&mut amax, 0),
            Some(&mut scale_inv),
        ))?;
        same_codes("cast codes", format, &ctx.down(&q), tensor.rowwise().data())?;
        same_f32("cast amax", &ctx.down(&amax), &[accumulated(prior, amax_cpu)])?;
        same_f32(
            "cast scale_inv",
            &ctx.down(&scale_inv),
            &[per_tensor_scale_inv(&tensor)?],
        )?;
        if transpose_too {
            let expected = columnwise(&tensor)?.data();
            same_codes("cast transposed codes", format, &ctx.down(&qt), expected)?;
        }
    }
    let prior = random_prior_amax(&mut ctx.rng);
    let mut amax = ctx.up(&[prior]);
    gpu(ctx.gpu.amax(&d_src, &mut amax))?;
    same_f32("amax", &ctx.down(&amax), &[accumulated(prior, twin::amax(&src))])?;
    // Current scaling: the amax kernel, the recipe's scale, the cast (the CPU twin fuses nothing).
    let (recipe_format, role) = recipe_format(format);
    let recipe = CurrentScaling {
        format: recipe_format,
        power_2_scale: ctx.rng.random(),
        amax_epsilon: random_epsilon(&mut ctx.rng),
    };
    let rule = ScaleRule::current(&recipe, role);
    let (tensor, amax_cpu) = cpu(twin::quantize_current(&src, rows, cols, &rule, false))?;
    let mut amax = ctx.up(&[0.0f32]);
    gpu(ctx.gpu.amax(&d_src, &mut amax))?;
    let amax_gpu = ctx.down(&amax)[0];
    same_f32("current amax", &[amax_gpu], &[amax_cpu])?;
    // The scale made on the device from the amax there (nothing read back in a real cast).
    let mut d_scale = ctx.poison_f32(1);
    gpu(ctx.gpu.current_scale(&amax, &rule, &mut d_scale))?;
    same_f32("current scale", &ctx.down(&d_scale), &[rule.scale(amax_cpu)])?;
    let (mut q, mut scale_inv) = (ctx.poison_u8(src.len()), ctx.poison_f32(1));
    gpu(ctx.gpu.cast_amax(
        &d_src,
        rows,
        cols,
        format,
        (&d_scale, 0),
        &mut q,
        None,
        (&mut amax, 0),
        Some(&mut scale_inv),
    ))?;
    same_codes("current codes", format, &ctx.down(&q), tensor.rowwise().data())?;
    same_f32(
        "current scale_inv",
        &ctx.down(&scale_inv),
        &[per_tensor_scale_inv(&tensor)?],
    )?;
    // Per-tensor dequantize of the codes.
    ctx.check_dequantize::<T>(
        "per-tensor dequantize",
        format,
        &q,
        DequantScales::PerTensor(&scale_inv),
        tensor.rowwise(),
    )
}

/// `fp8_current_scale` against `ScaleRule::scale` on the amaxes where the rule branches:
/// zero, NaN, infinities, subnormals, the epsilon's edge, a scale that overflows to FLT_MAX,
/// and random ones, in both formats, with and without the power-of-two floor.
fn check_current_scale(ctx: &mut Ctx) -> Check {
    let mut amaxes = vec![
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1),
        1e-40,
        f32::MIN_POSITIVE,
        1e-12,
        1.0,
        448.0,
        57344.0,
        f32::MAX,
    ];
    amaxes.extend((0..32).map(|_| 10f32.powf(ctx.rng.random_range(-30.0..30.0))));
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        for power_2_scale in [false, true] {
            for amax_epsilon in [0.0, 1e-12, 1.0] {
                let rule = ScaleRule {
                    format,
                    power_2_scale,
                    amax_epsilon,
                };
                for &amax in &amaxes {
                    let d_amax = ctx.up(&[amax]);
                    let mut d_scale = ctx.poison_f32(1);
                    gpu(ctx.gpu.current_scale(&d_amax, &rule, &mut d_scale))?;
                    same_f32(
                        &format!("current scale of {amax:e} ({rule:?})"),
                        &ctx.down(&d_scale),
                        &[rule.scale(amax)],
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// `fp8_scale_inv_min` + `fp8_largest_scale` (a block cast's largest scale, `1 / min(scale_inv)`,
/// NaN dropped) against the host's fold, on f32 grids and E8M0 grids up to past one grid-stride
/// pass of an H200: random values (the minimum anywhere), the minimum in the last element (the
/// last block's partial warp), and NaN, 0xFF, zeros and infinities at random places.
fn check_largest_scale(ctx: &mut Ctx) -> Check {
    use fp8_engine::backend::cuda::gemm_operands::DeviceScales;
    let host = |values: &[f32]| 1.0 / values.iter().copied().fold(f32::INFINITY, f32::min);
    for len in [1usize, 5, 1000, 100_003, 2_000_003] {
        for variant in ["random", "last", "specials"] {
            let mut f32s: Vec<f32> = (0..len).map(|_| 2f32.powf(ctx.rng.random_range(-40.0..40.0))).collect();
            let mut e8m0: Vec<u8> = (0..len).map(|_| ctx.rng.random_range(1..=254)).collect();
            match variant {
                "last" => {
                    f32s[len - 1] = 2f32.powi(-41);
                    e8m0[len - 1] = 0;
                }
                "specials" => {
                    for special in [f32::NAN, f32::INFINITY, f32::MIN_POSITIVE, 1e-40] {
                        f32s[ctx.rng.random_range(0..len)] = special;
                    }
                    for special in [0xFFu8, 0, 127] {
                        e8m0[ctx.rng.random_range(0..len)] = special;
                    }
                }
                _ => {}
            }
            let decoded: Vec<f32> = e8m0.iter().map(|&e| fp8_engine::format::decode_e8m0(e)).collect();
            // The key starts poisoned: the launcher clears it.
            let (mut key, mut scale) = (ctx.up(&[0xA5A5_A5A5u32]), ctx.poison_f32(1));
            let d_f32 = ctx.up(&f32s);
            gpu(ctx
                .gpu
                .largest_scale(DeviceScales::Block1x128(&d_f32), &mut key, &mut scale))?;
            let what = format!("largest scale of {len} f32 scale_inv ({variant})");
            same_f32(&what, &ctx.down(&scale), &[host(&f32s)])?;
            let d_e8m0 = ctx.up(&e8m0);
            gpu(ctx
                .gpu
                .largest_scale(DeviceScales::Mxfp8(&d_e8m0), &mut key, &mut scale))?;
            let what = format!("largest scale of {len} E8M0 exponents ({variant})");
            same_f32(&what, &ctx.down(&scale), &[host(&decoded)])?;
        }
    }
    // A grid of NaN only: nothing left, 1 / inf.
    let (mut key, mut scale) = (ctx.up(&[0u32]), ctx.poison_f32(1));
    let nan = ctx.up(&[f32::NAN; 3]);
    gpu(ctx
        .gpu
        .largest_scale(DeviceScales::Block128x128(&nan), &mut key, &mut scale))?;
    same_f32("largest scale of NaN scales", &ctx.down(&scale), &[0.0])
}

fn check_1x128<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, BLOCK_SPECIALS);
    let rule = block_rule(&mut ctx.rng, format);
    let tensor = cpu(twin::quantize_1x128(&src, rows, cols, &rule, true))?;
    let (row, col) = (tensor.rowwise(), columnwise(&tensor)?);
    let (s_row, s_col) = (f32_scales(row)?, f32_scales(col)?);
    let d_src = ctx.up(&src);
    let (mut q, mut s) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_row.len()));
    let (mut qc, mut sc) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_col.len()));
    gpu(ctx.gpu.quantize_1x128(
        &d_src,
        rows,
        cols,
        &rule,
        Some((&mut q, &mut s)),
        Some((&mut qc, &mut sc)),
    ))?;
    same_codes("1x128 row-wise codes", format, &ctx.down(&q), row.data())?;
    same_f32("1x128 row-wise scale_inv", &ctx.down(&s), s_row)?;
    same_codes("1x128 column-wise codes", format, &ctx.down(&qc), col.data())?;
    same_f32("1x128 column-wise scale_inv", &ctx.down(&sc), s_col)?;
    let blocks = DequantScales::Blocks(&s, (1, 128));
    ctx.check_dequantize::<T>("1x128 row-wise dequantize", format, &q, blocks, row)?;
    let blocks = DequantScales::Blocks(&sc, (1, 128));
    ctx.check_dequantize::<T>("1x128 column-wise dequantize", format, &qc, blocks, col)
}

fn check_mxfp8<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, BLOCK_SPECIALS);
    let tensor = cpu(twin::quantize_mxfp8(&src, rows, cols, format, true))?;
    let (row, col) = (tensor.rowwise(), columnwise(&tensor)?);
    let (e_row, e_col) = (e8m0_scales(row)?, e8m0_scales(col)?);
    let d_src = ctx.up(&src);
    let (mut q, mut e) = (ctx.poison_u8(src.len()), ctx.poison_u8(e_row.len()));
    let (mut qc, mut ec) = (ctx.poison_u8(src.len()), ctx.poison_u8(e_col.len()));
    gpu(ctx.gpu.quantize_mxfp8(
        &d_src,
        rows,
        cols,
        format,
        Some((&mut q, &mut e)),
        Some((&mut qc, &mut ec)),
    ))?;
    same_codes("mxfp8 row-wise codes", format, &ctx.down(&q), row.data())?;
    same_e8m0("mxfp8 row-wise E8M0", &ctx.down(&e), e_row)?;
    same_codes("mxfp8 column-wise codes", format, &ctx.down(&qc), col.data())?;
    same_e8m0("mxfp8 column-wise E8M0", &ctx.down(&ec), e_col)?;
    ctx.check_dequantize::<T>("mxfp8 row-wise dequantize", format, &q, DequantScales::Mxfp8(&e), row)?;
    ctx.check_dequantize::<T>(
        "mxfp8 column-wise dequantize",
        format,
        &qc,
        DequantScales::Mxfp8(&ec),
        col,
    )
}

fn check_128x128<T: DeviceElement>(ctx: &mut Ctx, rows: usize, cols: usize, format: Fp8Format) -> Check {
    let src: Vec<T> = random_values(&mut ctx.rng, rows * cols, BLOCK_SPECIALS);
    let rule = block_rule(&mut ctx.rng, format);
    let d_src = ctx.up(&src);
    // Without the column-wise copy the kernel takes an early exit; with it, the staged transpose.
    for with_columnwise in [false, true] {
        let tensor = cpu(twin::quantize_block_128x128(&src, rows, cols, &rule, with_columnwise))?;
        let row = tensor.rowwise();
        let s_row = f32_scales(row)?;
        let (mut q, mut s) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_row.len()));
        let (mut qt, mut st) = (ctx.poison_u8(src.len()), ctx.poison_f32(s_row.len()));
        let copy_t = if with_columnwise {
            Some((&mut qt, &mut st))
        } else {
            None
        };
        gpu(ctx
            .gpu
            .quantize_128x128(&d_src, rows, cols, &rule, (&mut q, &mut s), copy_t))?;
        same_codes("128x128 codes", format, &ctx.down(&q), row.data())?;
        same_f32("128x128 scale_inv", &ctx.down(&s), s_row)?;
        let blocks = DequantScales::Blocks(&s, (128, 128));
        ctx.check_dequantize::<T>("128x128 dequantize", format, &q, blocks, row)?;
        if with_columnwise {
            let col = columnwise(&tensor)?;
            same_codes("128x128 column-wise codes", format, &ctx.down(&qt), col.data())?;
            same_f32("128x128 column-wise scale_inv", &ctx.down(&st), f32_scales(col)?)?;
            let blocks = DequantScales::Blocks(&st, (128, 128));
            ctx.check_dequantize::<T>("128x128 column-wise dequantize", format, &qt, blocks, col)?;
        }
    }
    Ok(())
}

/// A rule the CPU twin rejects is rejected by the launchers with the same error, before any launch.
fn check_rejected_rules(ctx: &mut Ctx) -> Check {
    let (rows, cols) = (3, 17);
    let src = vec![1.0f32; rows * cols];
    let d_src = ctx.up(&src);
    for amax_epsilon in [-1.0, f32::NAN, f32::INFINITY] {
        let rule = ScaleRule {
            amax_epsilon,
            ..block_rule(&mut ctx.rng, Fp8Format::E4M3)
        };
        let expected = match twin::quantize_block_128x128(&src, rows, cols, &rule, false) {
            Ok(_) => return Err(format!("CPU twin accepted amax_epsilon {amax_epsilon}")),
            Err(e) => e.to_string(),
        };
        let (mut q, mut s) = (ctx.poison_u8(src.len()), ctx.poison_f32(1));
        let (mut q1, mut s1) = (ctx.poison_u8(src.len()), ctx.poison_f32(rows * cols.div_ceil(128)));
        let results = [
            ctx.gpu
                .quantize_128x128(&d_src, rows, cols, &rule, (&mut q, &mut s), None),
            ctx.gpu
                .quantize_1x128(&d_src, rows, cols, &rule, Some((&mut q1, &mut s1)), None),
        ];
        for result in results {
            match result {
                Ok(()) => return Err(format!("GPU launcher accepted amax_epsilon {amax_epsilon}")),
                Err(e) if e.to_string() != expected => {
                    return Err(format!("GPU launcher error '{e}', CPU twin '{expected}'"));
                }
                Err(_) => {}
            }
        }
    }
    Ok(())
}

/// A history entry: mostly amaxes over six decades, with NaN, inf, zeros and a
/// tiny value whose scale overflows to `f32::MAX`.
fn random_history_entry(rng: &mut StdRng, first: bool) -> f32 {
    match rng.random_range(0..20) {
        0 if first => 0.0, // a slot that did not run this step
        1 if first => -0.0,
        2 => f32::NAN,
        3 => f32::INFINITY,
        4 => 1e-40,
        _ => 10f32.powf(rng.random_range(-3.0..3.0)),
    }
}

fn check_delayed(ctx: &mut Ctx, slots: usize, len: usize, algo: AmaxComputeAlgo) -> Check {
    let recipe = DelayedScaling {
        margin: ctx.rng.random_range(0..=MAX_MARGIN),
        amax_history_len: len,
        amax_compute_algo: algo,
        ..DelayedScaling::default()
    };
    cpu(recipe.validate())?;
    // Slots cycle through the five roles, so E4M3 and E5M2 slots mix in one launch.
    let roles = TensorRole::FORWARD.into_iter().chain(TensorRole::BACKWARD).cycle();
    let formats: Vec<Fp8Format> = roles.take(slots).map(|r| recipe.format.for_role(r)).collect();
    let mut cpu_slots: Vec<DelayedSlot> = (0..slots)
        .map(|s| {
            let mut slot = DelayedSlot::new(len);
            slot.scale = ctx.rng.random_range(0.5..2.0);
            for (i, h) in slot.history.iter_mut().enumerate() {
                // Slot 1: an all-NaN window, the one case where Max yields NaN.
                *h = if s == 1 {
                    f32::NAN
                } else {
                    random_history_entry(&mut ctx.rng, i == 0)
                };
            }
            slot
        })
        .collect();
    let history: Vec<f32> = cpu_slots.iter().flat_map(|s| s.history.iter().copied()).collect();
    let scale: Vec<f32> = cpu_slots.iter().map(|s| s.scale).collect();
    let scaled_max: Vec<f32> = formats.iter().map(|&f| recipe.scaled_max(f)).collect();
    let (mut d_h, mut d_s, d_m) = (ctx.up(&history), ctx.up(&scale), ctx.up(&scaled_max));
    gpu(ctx
        .gpu
        .delayed_update(&mut d_h, len, &mut d_s, &d_m, recipe.amax_compute_algo))?;
    for (slot, &format) in cpu_slots.iter_mut().zip(&formats) {
        slot.update(&recipe, format);
    }
    let history: Vec<f32> = cpu_slots.iter().flat_map(|s| s.history.iter().copied()).collect();
    let scale: Vec<f32> = cpu_slots.iter().map(|s| s.scale).collect();
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
    results.push(("rejected rules".to_string(), check_rejected_rules(&mut ctx)));
    results.push(("current scale".to_string(), check_current_scale(&mut ctx)));
    results.push(("largest block scale".to_string(), check_largest_scale(&mut ctx)));
    for (slots, len) in [(1, 1), (3, 2), (37, 1024), (100, 33), (5, 65)] {
        for algo in [AmaxComputeAlgo::Max, AmaxComputeAlgo::MostRecent] {
            results.push((
                format!("delayed {slots} slots x {len} {algo:?}"),
                check_delayed(&mut ctx, slots, len, algo),
            ));
        }
    }
    // Every check is bit-exact against its CPU twin: the bound is 0, so a passing
    // check has err/bound = 0 and any difference fails (printed with its values).
    for (label, r) in &results {
        if r.is_ok() {
            println!("ok {label}: exact (err/bound=0)");
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
