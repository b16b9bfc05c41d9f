//! Quantized tensors (in progress).
