//! Training FLOPs of the decoder model per token, for tokens/s -> model FLOP/s and MFU.
//!
//! The usual count (Kaplan et al.; Megatron's MFU): a weight matmul costs 2 FLOPs per weight per
//! token forward and twice that backward (dgrad and wgrad), so `6 N` for the `N` matmul weights;
//! causal attention's two products (`Q K^T`, `P V`) cost `2 * 2 * (seq / 2) * hidden` per token
//! per layer forward (a query sees `seq / 2` keys on average), so `6 L seq hidden` forward and
//! backward. Norms, activations, the softmax and the optimizer are left out, as in that count.

use super::ModelConfig;

impl ModelConfig {
    /// Weights that take part in a matmul per token: per layer the q, k, v and output
    /// projections (`4 h^2`) and the MLP (`2 h ffn`, `3 h ffn` with SwiGLU's gate), plus the
    /// output head (`vocab h`, tied or not: the head's matmul runs either way). The embedding
    /// gather is not a matmul.
    pub fn matmul_weights(&self) -> u64 {
        let (h, f) = (self.hidden as u64, self.ffn_hidden as u64);
        let mlp = if self.swiglu { 3 * h * f } else { 2 * h * f };
        self.layers as u64 * (4 * h * h + mlp) + self.vocab as u64 * h
    }

    /// Training FLOPs (forward + backward) per token at sequence length `seq`:
    /// `6 N + 6 L seq h` (module doc).
    pub fn training_flops_per_token(&self, seq: usize) -> f64 {
        6.0 * self.matmul_weights() as f64 + 6.0 * (self.layers * seq * self.hidden) as f64
    }
}

/// Dense bf16 tensor-core peak (TFLOP/s) of the data-center GPUs whose name says which they
/// are, from NVIDIA's data sheets; `None` for others (MFU is then not reported).
pub fn bf16_peak_tflops(gpu_name: &str) -> Option<f64> {
    let name = gpu_name.to_ascii_uppercase();
    let table: [(&str, f64); 6] = [
        ("H100 PCIE", 756.0),
        ("GH200", 989.4),
        ("H200", 989.4),
        ("H100", 989.4),
        ("A100", 312.0),
        ("L40S", 362.1),
    ];
    table.iter().find(|(key, _)| name.contains(key)).map(|&(_, peak)| peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_per_token_count_every_matmul_weight_and_the_causal_attention() {
        // GPT-2 small's shapes: 12 layers, 768 wide, FFN 3072, vocabulary 50257, seq 1024.
        let gpt2 = ModelConfig {
            vocab: 50257,
            hidden: 768,
            heads: 12,
            layers: 12,
            ffn_hidden: 3072,
            ..ModelConfig::default()
        };
        // 12 * (4 * 768^2 + 2 * 768 * 3072) + 50257 * 768 = 84,934,656 + 38,597,376.
        assert_eq!(gpt2.matmul_weights(), 123_532_032);
        let per_token = gpt2.training_flops_per_token(1024);
        assert_eq!(per_token, 6.0 * 123_532_032.0 + 6.0 * 12.0 * 1024.0 * 768.0);
        // SwiGLU's gate adds one h x ffn matrix per layer.
        let swiglu = ModelConfig { swiglu: true, ..gpt2 };
        assert_eq!(swiglu.matmul_weights() - gpt2.matmul_weights(), 12 * 768 * 3072);
    }

    #[test]
    fn peaks_are_known_only_for_named_data_center_gpus() {
        assert_eq!(bf16_peak_tflops("NVIDIA H200"), Some(989.4));
        assert_eq!(bf16_peak_tflops("NVIDIA H100 80GB HBM3"), Some(989.4));
        assert_eq!(bf16_peak_tflops("NVIDIA H100 PCIe"), Some(756.0));
        assert_eq!(bf16_peak_tflops("NVIDIA A100-SXM4-80GB"), Some(312.0));
        assert_eq!(bf16_peak_tflops("NVIDIA GeForce RTX 4090"), None);
    }
}
