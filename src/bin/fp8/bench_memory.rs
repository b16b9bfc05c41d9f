//! Host-memory checks of `bench gemm` and `bench layer` before they allocate:
//! a size that does not fit is one error line with the bytes needed and the
//! bytes available, not an allocator abort or the OOM killer.

use fp8_engine::io::ensure_fits;
use fp8_engine::model::ModelConfig;
use fp8_engine::train::preflight::estimate_bytes;

use crate::error::CliError;

/// A GEMM case holds A (m x k), B (k x n) and D (m x n) in f32, their FP8 copies and the
/// reference's f32 copies: about 12 bytes per element of the three matrices (at least).
pub fn check_gemm(shapes: &[(usize, usize, usize)]) -> Result<(), CliError> {
    for &(m, n, k) in shapes {
        let elements = m
            .checked_mul(k)
            .and_then(|a| a.checked_add(k.checked_mul(n)?))
            .and_then(|ab| ab.checked_add(m.checked_mul(n)?));
        let bytes = elements.and_then(|e| (e as u64).checked_mul(12));
        ensure_fits(&format!("bench gemm {m}x{n}x{k}"), bytes)?;
    }
    Ok(())
}

/// One transformer layer's parameters, optimizer-free copies and saved activations, as the
/// training estimate counts them for a one-layer model.
pub fn check_layer(hidden: usize, heads: usize, ffn: usize, seq: usize, batch: usize) -> Result<(), CliError> {
    let model = ModelConfig {
        vocab: 1,
        max_seq: seq,
        hidden,
        heads,
        layers: 1,
        ffn_hidden: ffn,
        ..ModelConfig::default()
    };
    let what = format!("bench layer (hidden {hidden}, ffn {ffn}, {batch} x {seq} tokens)");
    ensure_fits(&what, estimate_bytes(&model, batch, seq))?;
    Ok(())
}
