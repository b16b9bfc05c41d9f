//! The library side of the `fp8` tool's recipe and checkpoint commands, so
//! they can be tested without a process.
//!
//! * [`replay`]: `fp8 recipe replay`, the delayed-scaling update over an amax trace.
//! * [`safetensors_quant`]: `fp8 quantize` / `fp8 dequantize` of safetensors files.
//! * [`inspect`]: `fp8 inspect`, per-tensor statistics and quantization quality.

pub mod inspect;
pub mod replay;
pub mod safetensors_io;
pub mod safetensors_quant;
