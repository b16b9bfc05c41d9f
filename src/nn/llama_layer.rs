//! One Llama-family decoder layer: `h = x + attn(rmsnorm(x)); y = h + mlp(rmsnorm(h))` with
//! grouped-query rotary attention and a SwiGLU MLP without biases.

use super::gqa_attention::{GqaConfig, GroupedQueryAttention, KvCache};
use super::init::child_seed;
use super::linears::VisitLinears;
use super::mlp::{Activation, LayerNormMLP};
use super::param::{Module, Parameter};
use super::replay::Replay;
use crate::amp::Precision;
use crate::dispatch::{Backend, RopeTable};
use crate::error::Result;
use crate::scaling::{DelayedSlot, Fp8TensorStats};
use crate::tensor::{DeviceKind, Dtype, Tensor};

/// Parameters: `name.attn.*` ([`GroupedQueryAttention`]), `name.mlp.norm.weight`,
/// `name.mlp.fc1.weight` `[2 ffn, hidden]` (gate rows, then up rows), `name.mlp.fc2.weight`.
/// Residual sums in f32, stored in the compute dtype.
pub struct LlamaLayer {
    name: String,
    hidden: usize,
    dtype: Dtype,
    attn: GroupedQueryAttention,
    mlp: LayerNormMLP,
    replay: Replay,
    backend: Backend,
}

impl LlamaLayer {
    /// A layer with weights drawn from `seed`; `config.recompute` makes the whole layer recompute.
    pub fn new(name: &str, config: &GqaConfig, ffn: usize, precision: &Precision, seed: u64) -> Result<Self> {
        let attn_config = GqaConfig {
            recompute: false,
            ..*config
        };
        Ok(LlamaLayer {
            name: name.to_string(),
            hidden: config.hidden,
            dtype: precision.compute_dtype(),
            attn: GroupedQueryAttention::new(&format!("{name}.attn"), &attn_config, precision, child_seed(seed, 1))?,
            mlp: LayerNormMLP::new(
                &format!("{name}.mlp"),
                config.hidden,
                ffn,
                Activation::SwiGlu,
                false,
                config.norm,
                false,
                precision,
                child_seed(seed, 2),
            )?,
            replay: Replay::new(config.recompute),
            backend: Backend::default(),
        })
    }

    /// `x` `[batch * seq, hidden]` -> `[batch * seq, hidden]`, where `x` lives. On a GPU (unless
    /// `FP8_CUDA_RESIDENT=0`), a host `x` goes up once, every op between reads and writes device
    /// tensors, and the output comes back down (a device `x` stays there either way).
    pub fn forward(&mut self, x: &Tensor, batch: usize, seq: usize, rope: &RopeTable) -> Result<Tensor> {
        self.backend.clone().resident_boundary(x, |x| {
            let y = self.run(x, batch, seq, rope, false)?;
            if self.replay.enabled() {
                self.clear_saved();
                self.replay.keep(x, batch, seq);
            }
            Ok(y)
        })
    }

    fn run(&mut self, x: &Tensor, batch: usize, seq: usize, rope: &RopeTable, replay: bool) -> Result<Tensor> {
        let a = self.attn.run(x, batch, seq, rope, replay)?;
        let h = self.residual(x, &a)?;
        a.recycle();
        let m = self.mlp.run(&h, replay)?;
        let y = self.residual(&h, &m);
        h.recycle();
        m.recycle();
        y
    }

    /// The next `new` tokens of one sequence against `cache` (rows of `x` past `new` are zero
    /// padding); forward only.
    pub fn forward_cached(&mut self, x: &Tensor, new: usize, cache: &mut KvCache, rope: &RopeTable) -> Result<Tensor> {
        let a = self.attn.forward_cached(x, new, cache, rope)?;
        let h = self.residual(x, &a)?;
        let m = self.mlp.run(&h, false)?;
        self.mlp.clear_saved();
        self.residual(&h, &m)
    }

    fn residual(&self, x: &Tensor, f: &Tensor) -> Result<Tensor> {
        let mut sum = self.backend.output_like(x, x.rows(), x.cols())?;
        self.backend
            .kernels()
            .residual_add(x.values(), f.values(), self.dtype, sum.values_mut())?;
        Ok(sum)
    }

    /// dX, where `dy` lives (uploaded and brought back as in [`Self::forward`]); accumulates
    /// every parameter gradient.
    pub fn backward(&mut self, dy: &Tensor, rope: &RopeTable) -> Result<Tensor> {
        if let Some(kept) = self.replay.take(&self.name)? {
            self.run(&kept.x, kept.batch, kept.seq, rope, true)?;
        }
        dy.expect(&self.name, "output gradient", None, self.hidden)?;
        self.backend.clone().resident_boundary(dy, |dy| {
            let dm = self.mlp.backward(dy)?;
            let dh = self.residual(dy, &dm)?;
            dm.recycle();
            let da = self.attn.backward(&dh, rope)?;
            let dx = self.residual(&dh, &da)?;
            dh.recycle();
            da.recycle();
            Ok(dx)
        })
    }

    /// Drops what the last forward kept for backward.
    pub fn clear_saved(&mut self) {
        self.attn.clear_saved();
        self.mlp.clear_saved();
        self.replay.clear();
    }
}

impl Module for LlamaLayer {
    fn visit_parameters(&mut self, f: &mut dyn FnMut(&mut Parameter)) {
        self.attn.visit_parameters(f);
        self.mlp.visit_parameters(f);
    }

    fn to_device(&mut self, device: DeviceKind) -> Result<()> {
        self.backend = Backend::on(device);
        self.attn.to_device(device)?;
        self.mlp.to_device(device)
    }

    fn check_against_cpu(&mut self, on: bool) {
        self.backend = self.backend.checked_against_cpu(on, &self.name);
        self.attn.check_against_cpu(on);
        self.mlp.check_against_cpu(on);
    }

    fn visit_fp8_slots(&mut self, f: &mut dyn FnMut(&str, &mut DelayedSlot)) {
        self.attn.visit_fp8_slots(f);
        self.mlp.visit_fp8_slots(f);
    }

    fn saved_activation_bytes(&self) -> usize {
        self.replay.bytes(self.dtype.bytes()) + self.attn.saved_activation_bytes() + self.mlp.saved_activation_bytes()
    }

    fn weight_cache_bytes(&self) -> usize {
        self.attn.weight_cache_bytes() + self.mlp.weight_cache_bytes()
    }

    fn collect_fp8_stats(&self, out: &mut Vec<Fp8TensorStats>) {
        self.attn.collect_fp8_stats(out);
        self.mlp.collect_fp8_stats(out);
    }
}

impl VisitLinears for LlamaLayer {
    fn visit_linears(&mut self, f: &mut dyn FnMut(&mut crate::nn::Linear)) {
        self.attn.visit_linears(f);
        self.mlp.visit_linears(f);
    }
}
