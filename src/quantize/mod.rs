//! CPU quantizers: the bit-exact twins of the GPU cast kernels.
//!
//! Every quantizer takes a row-major `[rows, cols]` slice and its shape, as a
//! CUDA kernel would, and writes codes (and scales) into caller-provided
//! buffers; a convenience function per recipe wraps the result in a
//! [`QuantizedTensor`](crate::tensor::QuantizedTensor). Rows or tiles run in
//! parallel (rayon); contiguous runs go through [`crate::convert::quantize`],
//! the vectorized cast. Partial blocks at the right and bottom edges get their
//! own scale, so no shape has to be a multiple of the block size.
//!
//! | quantizer | scales | file |
//! |---|---|---|
//! | cast + amax | one given scale | `cast_amax` |
//! | cast + transpose + amax | one given scale, both copies in one pass | `cast_transpose` |
//! | 1x128 blocks | `[M, ceil(K/128)]`, column-wise copy from the source | `block_1x128` |
//! | 128x128 blocks | `[ceil(M/128), ceil(K/128)]` | `block_128x128` |
//! | MXFP8 | E8M0 `[M, ceil(K/32)]`, column-wise copy from the source | `mxfp8` |
//! | dequantize | any of the above | `dequantize` |

mod amax;
mod block_128x128;
mod block_1x128;
mod blocks;
mod cast_amax;
mod cast_transpose;
mod mxfp8;
mod transpose;

/// Kept under its old path: the dequantizers live next to the quantized tensor they read.
pub use crate::tensor::dequantize;
pub use amax::amax;
pub(crate) use amax::amax_serial;
pub use block_1x128::{quantize_1x128, quantize_1x128_columnwise, quantize_1x128_rowwise};
pub use block_128x128::{quantize_128x128, quantize_block_128x128};
pub use cast_amax::{cast_amax, quantize_current, quantize_per_tensor};
pub use cast_transpose::cast_transpose_amax;
pub(crate) use cast_transpose::cast_transpose_visit;
pub use mxfp8::{quantize_mxfp8, quantize_mxfp8_columnwise, quantize_mxfp8_rowwise};
pub use transpose::{transpose_codes, transpose_matrix, transposed_scales};

use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::scaling::{BlockScaling, CurrentScaling, TensorRole, current_scale};

/// How a just-in-time scale follows from an amax: the current scaling formula of `docs/numerics.md`, used
/// per tensor by current scaling and per block by block scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleRule {
    /// Data format; its max finite value is the numerator.
    pub format: Fp8Format,
    /// Floor scales to powers of two.
    pub power_2_scale: bool,
    /// Lower bound on the amax.
    pub amax_epsilon: f32,
}

impl ScaleRule {
    /// The rule of a current-scaling recipe for the tensor in `role`.
    pub fn current(recipe: &CurrentScaling, role: TensorRole) -> Self {
        ScaleRule {
            format: recipe.format.for_role(role),
            power_2_scale: recipe.power_2_scale,
            amax_epsilon: recipe.amax_epsilon,
        }
    }

    /// The per-block rule of a block-scaling recipe for the tensor in `role`.
    pub fn block(recipe: &BlockScaling, role: TensorRole) -> Self {
        ScaleRule {
            format: recipe.format.for_role(role),
            power_2_scale: recipe.power_2_scale,
            amax_epsilon: recipe.amax_epsilon,
        }
    }

    /// The scale for a tensor or block whose amax is `amax`.
    pub fn scale(&self, amax: f32) -> f32 {
        current_scale(amax, self.format.max_finite(), self.power_2_scale, self.amax_epsilon)
    }

    /// Rejects a negative or non-finite epsilon.
    pub fn validate(&self) -> Result<()> {
        if self.amax_epsilon.is_finite() && self.amax_epsilon >= 0.0 {
            Ok(())
        } else {
            Err(Error::InvalidRecipe {
                setting: "amax_epsilon",
                value: self.amax_epsilon.to_string(),
                reason: "must be finite and >= 0".to_string(),
            })
        }
    }
}

pub(crate) use crate::tensor::{check_len, rows_per_task};

/// The quantizers check the scale up front with `convert`'s own check, so an
/// empty tensor rejects a bad scale too.
pub(crate) use crate::convert::check_scale;
