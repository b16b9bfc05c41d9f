//! A model written outside the crate from its public layers: a two-layer transformer
//! that learns to copy a token pattern one position late (a regression target), trained
//! with plain SGD for a few steps under two precisions.
//!
//! `cargo run --release --example custom_model`

use fp8_engine::Result;
use fp8_engine::amp::{Precision, PrecisionChoice, resolve};
use fp8_engine::device::{Device, DeviceChoice};
use fp8_engine::nn::{Linear, Module, Parameter, Tensor, TransformerConfig, TransformerLayer};

/// Input projection, transformer layers, and a head kept in high precision.
struct TinyModel {
    embed: Linear,
    layers: Vec<TransformerLayer>,
    head: Linear,
}

impl TinyModel {
    fn new(precision: &Precision) -> Result<Self> {
        let config = TransformerConfig {
            hidden: 64,
            heads: 4,
            ffn_hidden: 128,
            ..TransformerConfig::default()
        };
        Ok(TinyModel {
            embed: Linear::new("embed", 16, 64, true, precision, 1)?,
            layers: (0..2)
                .map(|i| TransformerLayer::new(&format!("layers.{i}"), &config, precision, 10 + i))
                .collect::<Result<_>>()?,
            head: Linear::new_high_precision("head", 64, 16, true, precision, 2)?,
        })
    }

    fn forward(&mut self, x: &Tensor, batch: usize, seq: usize) -> Result<Tensor> {
        let mut h = self.embed.forward(x)?;
        for layer in &mut self.layers {
            h = layer.forward(&h, batch, seq)?;
        }
        self.head.forward(&h)
    }

    fn backward(&mut self, dy: &Tensor) -> Result<()> {
        let mut d = self.head.backward(dy)?;
        for layer in self.layers.iter_mut().rev() {
            d = layer.backward(&d)?;
        }
        self.embed.backward(&d)?;
        Ok(())
    }
}

impl Module for TinyModel {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.embed.visit_parameters(f);
        self.layers.iter_mut().for_each(|l| l.visit_parameters(f));
        self.head.visit_parameters(f);
    }
}

/// A batch of sequences of 16-dim patterns; the target is the previous token's pattern.
fn batch(step: usize, batch: usize, seq: usize) -> (Tensor, Tensor) {
    let value = |b: usize, t: usize, c: usize| (((b * 31 + t * 7 + c * 3 + step) % 11) as f32 - 5.0) / 5.0;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for b in 0..batch {
        for t in 0..seq {
            x.extend((0..16).map(|c| value(b, t, c)));
            y.extend((0..16).map(|c| if t == 0 { 0.0 } else { value(b, t - 1, c) }));
        }
    }
    let rows = batch * seq;
    (Tensor::new(x, rows, 16).unwrap(), Tensor::new(y, rows, 16).unwrap())
}

fn train(choice: &str) -> Result<()> {
    let device = Device::select(DeviceChoice::Cpu)?;
    let (precision, why) = resolve(&choice.parse::<PrecisionChoice>()?, &device)?;
    println!("{choice}: {why}");
    let mut model = TinyModel::new(&precision)?;
    let (b, s) = (2, 16);
    for step in 0..8 {
        let (x, target) = batch(step, b, s);
        model.zero_grad();
        let y = model.forward(&x, b, s)?;
        // Mean squared error and its gradient.
        let n = y.len() as f32;
        let diff: Vec<f32> = y.data().iter().zip(target.data()).map(|(a, t)| a - t).collect();
        let loss = diff.iter().map(|d| d * d).sum::<f32>() / n;
        model.backward(&Tensor::new(
            diff.iter().map(|d| 2.0 * d / n).collect(),
            y.rows(),
            y.cols(),
        )?)?;
        model.visit_parameters(&mut |p| {
            let (value, grad) = p.value_and_grad_mut();
            for (v, g) in value.iter_mut().zip(grad.iter()) {
                *v -= 0.05 * g;
            }
            p.mark_updated(); // the next forward casts the new weights
        });
        println!("  step {step}: loss {loss:.4}");
    }
    let mut stats = Vec::new();
    for layer in &model.layers {
        layer.collect_fp8_stats(&mut stats);
    }
    if let Some(s) = stats.first() {
        println!(
            "  {} FP8 tensors; {}: amax {:.3}, scale {:.1}",
            stats.len(),
            s.name,
            s.amax,
            s.scale
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    train("fp32")?;
    train("fp8-delayed")
}
