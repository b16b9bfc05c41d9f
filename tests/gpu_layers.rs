//! Every layer on the CUDA backend in shadow mode against the same layer on the CPU.
//!
//! Each layer x precision is built twice from one seed; one copy moves to GPU 0 with every op
//! checked against its CPU twin by the op's contract (`docs/numerics.md`, Op contracts between
//! backends: a breach is `Error::TwinMismatch` naming op, layer, element and both values). Both
//! copies run two micro-batches of forward + backward (gradients accumulate), and a third copy
//! with activation recompute runs the same on the GPU.
//!
//! Checks: no op breaks its contract; outputs, input gradients and parameter gradients of the
//! GPU copy are within the precision's layer tolerance of the CPU copy as a relative L2 norm
//! (the `docs/numerics.md` tolerances of that precision against fp32: a same-precision run on
//! two backends differs only by accumulation order and the roundings that flips, far less than
//! the precision's own error); recompute gives the GPU's own gradients bit for bit (the same
//! kernels on the same inputs). Precisions the GPU cannot run are listed and skipped; fp32 runs
//! its GEMMs on cuBLASLt (`docs/cuda-backend.md`); MXFP8 runs on the E8M0 variant of the
//! portable GEMM wherever that has FP8 tensor cores (sm_89+), also where `amp::resolve` keeps
//! a fixed `mxfp8` precision for sm_100+.
//!
//! The CUDA ops are staged through host memory (`docs/cuda-backend.md`). Without a GPU this
//! prints one `skipped:` line. Not yet run on a GPU.

use fp8_engine::Error;
use fp8_engine::amp::{Precision, PrecisionChoice, resolve};
use fp8_engine::device::{Device, DeviceChoice, DeviceKind};
use fp8_engine::nn::{
    Activation, LayerNorm, LayerNormLinear, LayerNormMLP, Module, MultiheadAttention, NormConfig, NormKind, RMSNorm,
    Tensor, TransformerConfig, TransformerLayer,
};

/// Two sequences of 64 tokens, width 128, 4 heads of 32, FFN 256: every GEMM dimension a
/// multiple of 128, so every FP8 recipe's kernels (1x128 and 128x128 blocks) take it.
const BATCH: usize = 2;
const SEQ: usize = 64;
const HIDDEN: usize = 128;
const HEADS: usize = 4;
const FFN: usize = 256;
const PRECISIONS: [&str; 7] = [
    "fp32",
    "bf16",
    "fp16",
    "fp8-delayed",
    "fp8-current",
    "fp8-block",
    "mxfp8",
];

/// One layer behind one interface.
trait Layer: Module {
    fn fwd(&mut self, x: &Tensor) -> Result<Tensor, Error>;
    fn bwd(&mut self, dy: &Tensor) -> Result<Tensor, Error>;
}

macro_rules! plain_layer {
    ($($t:ty),*) => {$(
        impl Layer for $t {
            fn fwd(&mut self, x: &Tensor) -> Result<Tensor, Error> { self.forward(x) }
            fn bwd(&mut self, dy: &Tensor) -> Result<Tensor, Error> { self.backward(dy) }
        }
    )*};
}
plain_layer!(LayerNorm, RMSNorm, LayerNormLinear, LayerNormMLP);

impl Layer for MultiheadAttention {
    fn fwd(&mut self, x: &Tensor) -> Result<Tensor, Error> {
        self.forward(x, BATCH, SEQ)
    }
    fn bwd(&mut self, dy: &Tensor) -> Result<Tensor, Error> {
        self.backward(dy)
    }
}

impl Layer for TransformerLayer {
    fn fwd(&mut self, x: &Tensor) -> Result<Tensor, Error> {
        self.forward(x, BATCH, SEQ)
    }
    fn bwd(&mut self, dy: &Tensor) -> Result<Tensor, Error> {
        self.backward(dy)
    }
}

type Build = fn(&Precision, bool) -> Result<Box<dyn Layer>, Error>;

fn norm(kind: NormKind) -> NormConfig {
    NormConfig {
        kind,
        eps: 1e-5,
        zero_centered_gamma: kind == NormKind::RmsNorm,
    }
}

fn transformer(
    activation: Activation,
    kind: NormKind,
    p: &Precision,
    recompute: bool,
) -> Result<Box<dyn Layer>, Error> {
    let config = TransformerConfig {
        hidden: HIDDEN,
        heads: HEADS,
        ffn_hidden: FFN,
        activation,
        norm: kind,
        zero_centered_gamma: kind == NormKind::RmsNorm,
        recompute,
        ..TransformerConfig::default()
    };
    Ok(Box::new(TransformerLayer::new("layer", &config, p, 7)?))
}

/// Every layer (name, builder, whether it has a recompute mode).
fn layers() -> Vec<(&'static str, Build, bool)> {
    vec![
        (
            "LayerNorm",
            |p, _| Ok(Box::new(LayerNorm::new("ln", HIDDEN, norm(NormKind::LayerNorm), p)?)),
            false,
        ),
        (
            "RMSNorm",
            |p, _| Ok(Box::new(RMSNorm::new("rms", HIDDEN, norm(NormKind::RmsNorm), p)?)),
            false,
        ),
        (
            "LayerNormLinear",
            |p, r| {
                Ok(Box::new(LayerNormLinear::new(
                    "lnl",
                    HIDDEN,
                    3 * HIDDEN,
                    true,
                    norm(NormKind::LayerNorm),
                    r,
                    p,
                    3,
                )?))
            },
            true,
        ),
        (
            "LayerNormMLP gelu",
            |p, r| {
                let n = norm(NormKind::LayerNorm);
                Ok(Box::new(LayerNormMLP::new(
                    "mlp",
                    HIDDEN,
                    FFN,
                    Activation::Gelu,
                    true,
                    n,
                    r,
                    p,
                    4,
                )?))
            },
            true,
        ),
        (
            "LayerNormMLP swiglu",
            |p, r| {
                let n = norm(NormKind::RmsNorm);
                Ok(Box::new(LayerNormMLP::new(
                    "mlp",
                    HIDDEN,
                    FFN,
                    Activation::SwiGlu,
                    false,
                    n,
                    r,
                    p,
                    5,
                )?))
            },
            true,
        ),
        (
            "MultiheadAttention",
            |p, r| {
                let n = Some(norm(NormKind::LayerNorm));
                Ok(Box::new(MultiheadAttention::new(
                    "attn", HIDDEN, HEADS, true, n, r, p, 6,
                )?))
            },
            true,
        ),
        (
            "TransformerLayer gelu",
            |p, r| transformer(Activation::Gelu, NormKind::LayerNorm, p, r),
            true,
        ),
        (
            "TransformerLayer swiglu",
            |p, r| transformer(Activation::SwiGlu, NormKind::RmsNorm, p, r),
            true,
        ),
    ]
}

/// Deterministic pseudo-normal values of standard deviation ~`std`.
fn values(seed: u64, n: usize, std: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            let s: f32 = (0..4)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .sum();
            std * s * 1.732
        })
        .collect()
}

fn tensor(seed: u64) -> Tensor {
    shaped(seed, HIDDEN)
}

/// `BATCH * SEQ` rows of `cols` seeded values (an output gradient takes the output's width:
/// LayerNormLinear's is 3 * HIDDEN).
fn shaped(seed: u64, cols: usize) -> Tensor {
    Tensor::new(values(seed, BATCH * SEQ * cols, 1.0), BATCH * SEQ, cols).expect("shape")
}

/// `docs/numerics.md` layer tolerance of `precision` (relative), forward or backward.
fn bound(precision: &str, backward: bool) -> f64 {
    match precision {
        "bf16" => 1.6e-2,
        "fp16" => 2e-3,
        "fp32" => 1.3e-6,
        _ if backward => 0.25,
        _ => 0.125,
    }
}

/// `|got - want|_2 / |want|_2` against `bound`, printed as err/bound; an error past 1.
fn compare(what: &str, got: &[f32], want: &[f32], bound: f64) -> Result<String, String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values vs {} on the CPU", got.len(), want.len()));
    }
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        return Err(format!("{what}[{i}] = {} is not finite (CPU {})", got[i], want[i]));
    }
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - f64::from(w)).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|&w| f64::from(w).powi(2)).sum();
    let ratio = (diff / norm.max(f64::MIN_POSITIVE)).sqrt() / bound;
    match ratio <= 1.0 {
        true => Ok(format!("{what} err/bound={ratio:.3}")),
        false => Err(format!("{what} err/bound={ratio:.3} (relative L2 bound {bound})")),
    }
}

fn grads(layer: &mut dyn Layer) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    layer.visit_parameters(&mut |p| out.push((p.name().to_string(), p.grad().to_vec())));
    out
}

/// Two micro-batches of forward + backward; the outputs and input gradients of both.
fn run(layer: &mut dyn Layer) -> Result<Vec<Tensor>, Error> {
    layer.zero_grad();
    let mut out = Vec::new();
    for micro in 0..2 {
        let y = layer.fwd(&tensor(10 + micro))?;
        let dy = shaped(20 + micro, y.shape().1);
        out.push(y);
        out.push(layer.bwd(&dy)?);
    }
    Ok(out)
}

fn case(gpu: DeviceKind, build: Build, recompute: bool, name: &str) -> Result<Vec<String>, String> {
    let precision: Precision = name.parse().map_err(|e| format!("{e}"))?;
    let make = |r: bool| build(&precision, r).map_err(|e| format!("build: {e}"));
    let (mut cpu, mut on_gpu) = (make(false)?, make(false)?);
    on_gpu.to_device(gpu).map_err(|e| format!("to_device: {e}"))?;
    on_gpu.check_against_cpu(true);
    let gpu_out = match run(on_gpu.as_mut()) {
        Ok(out) => out,
        Err(e) => return Err(format!("GPU: {e}")),
    };
    let cpu_out = run(cpu.as_mut()).map_err(|e| format!("CPU: {e}"))?;
    let mut lines = Vec::new();
    for (i, (g, c)) in gpu_out.iter().zip(&cpu_out).enumerate() {
        let what = format!("micro-batch {} {}", i / 2, if i % 2 == 0 { "output" } else { "dx" });
        lines.push(compare(&what, g.data(), c.data(), bound(name, i % 2 == 1))?);
    }
    let gpu_grads = grads(on_gpu.as_mut());
    for ((param, g), (_, c)) in gpu_grads.iter().zip(grads(cpu.as_mut())) {
        lines.push(compare(&format!("grad {param}"), g, &c, bound(name, true))?);
    }
    if recompute {
        let mut again = make(true)?;
        again.to_device(gpu).map_err(|e| format!("to_device: {e}"))?;
        again.check_against_cpu(true);
        let out = run(again.as_mut()).map_err(|e| format!("GPU recompute: {e}"))?;
        let bits = |ts: &[Tensor]| {
            ts.iter()
                .flat_map(|t| t.data().iter().map(|v| v.to_bits()))
                .collect::<Vec<_>>()
        };
        if bits(&out) != bits(&gpu_out) {
            return Err("recompute changed an output or input gradient".into());
        }
        for ((param, g), (_, r)) in gpu_grads.iter().zip(grads(again.as_mut())) {
            if g.iter().map(|v| v.to_bits()).ne(r.iter().map(|v| v.to_bits())) {
                return Err(format!("recompute changed grad {param}"));
            }
        }
        lines.push("recompute: same bits".into());
    }
    Ok(lines)
}

fn main() {
    let device = match Device::select(DeviceChoice::Cuda(0)) {
        Ok(device) => device,
        Err(err) => {
            println!("gpu_layers: skipped: no usable GPU ({err})");
            return;
        }
    };
    println!("gpu_layers on {} (staged CUDA ops, shadow mode)", device.describe());
    let cc = match &device {
        Device::Cuda(gpu) => gpu.info().compute_capability,
        _ => (0, 0),
    };
    let mut failures = 0;
    for name in PRECISIONS {
        let precision: Precision = name.parse().expect("a known precision");
        if let Err(why) = resolve(&PrecisionChoice::Fixed(precision), &device) {
            // MXFP8's GEMM kernels need FP8 tensor cores only; `resolve` asks sm_100 of the recipe.
            if !(name == "mxfp8" && cc >= (8, 9)) {
                println!("{name}: not on this GPU: {why}");
                continue;
            }
            println!("{name}: fp8 train refuses it here ({why}); its layers still run on the sm_89+ kernels");
        }
        for (layer, build, recompute) in layers() {
            match case(device.kind(), build, recompute, name) {
                Ok(lines) => println!("ok   {layer} {name}: {}", lines.join("; ")),
                Err(why) => {
                    failures += 1;
                    println!("FAIL {layer} {name}: {why}");
                }
            }
        }
    }
    if failures > 0 {
        println!("gpu_layers: {failures} failure(s)");
        std::process::exit(1);
    }
    println!("gpu_layers: every layer x precision passed");
}
