//! The four recipes as plain configuration values with the spec's defaults.
//!
//! Fields are public so a recipe reads like a config file; [`Recipe::validate`]
//! (and each recipe's own `validate`) rejects settings the spec does not allow,
//! and every consumer in the crate validates before use.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::Fp8Format;

/// Largest accepted delayed-scaling margin. With `fp8_max * 2^-margin / amax`
/// and amax up to `f32::MAX`, a margin of 8 keeps the E4M3 scale >= 2^-128.2,
/// so `scale_inv = 1/scale` stays finite; beyond that a huge (but finite) amax
/// would give an infinite `scale_inv`. Real runs use 0 to 2.
pub const MAX_MARGIN: i32 = 8;

/// Longest accepted amax history: a million steps, 4 MB per slot. Guards
/// against a typo allocating gigabytes.
pub const MAX_AMAX_HISTORY_LEN: usize = 1 << 20;

/// Which FP8 format each tensor gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RecipeFormat {
    /// E4M3 everywhere.
    E4M3,
    /// E4M3 for forward tensors (input, weight, output), E5M2 for gradients.
    #[default]
    Hybrid,
}

impl RecipeFormat {
    /// Format of a forward tensor.
    pub const fn forward(self) -> Fp8Format {
        Fp8Format::E4M3
    }

    /// Format of a backward tensor.
    pub const fn backward(self) -> Fp8Format {
        match self {
            RecipeFormat::E4M3 => Fp8Format::E4M3,
            RecipeFormat::Hybrid => Fp8Format::E5M2,
        }
    }

    /// Format of the tensor in `role`.
    pub const fn for_role(self, role: TensorRole) -> Fp8Format {
        if role.is_forward() {
            self.forward()
        } else {
            self.backward()
        }
    }
}

/// The five quantized tensors of a linear module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TensorRole {
    /// Forward: the activation `X` of `Y = X W^T`.
    Input,
    /// Forward: the weight `W`.
    Weight,
    /// Forward: the output `Y` when it is itself cast to FP8.
    Output,
    /// Backward: `dY`.
    OutputGrad,
    /// Backward: `dX` when it is itself cast to FP8.
    InputGrad,
}

impl TensorRole {
    /// The forward slots, in state order.
    pub const FORWARD: [TensorRole; 3] = [TensorRole::Input, TensorRole::Weight, TensorRole::Output];
    /// The backward slots, in state order.
    pub const BACKWARD: [TensorRole; 2] = [TensorRole::OutputGrad, TensorRole::InputGrad];

    /// Whether the tensor belongs to the forward pass.
    pub const fn is_forward(self) -> bool {
        matches!(self, TensorRole::Input | TensorRole::Weight | TensorRole::Output)
    }
}

/// How the delayed recipe turns an amax history into one amax.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AmaxComputeAlgo {
    /// The largest amax of the window (NaN entries ignored unless all are NaN).
    #[default]
    Max,
    /// The amax of the step that just ran.
    MostRecent,
}

/// `docs/numerics.md`, delayed scaling: per-tensor scales from a history of amaxes, one step behind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DelayedScaling {
    /// Scale headroom in binades: `scale = fp8_max * 2^-margin / amax`. 0..=[`MAX_MARGIN`].
    pub margin: i32,
    /// E4M3 everywhere, or E4M3 forward and E5M2 backward.
    pub format: RecipeFormat,
    /// Steps kept in the history, slot 0 included. 1..=[`MAX_AMAX_HISTORY_LEN`].
    pub amax_history_len: usize,
    /// Max of the window or most recent.
    pub amax_compute_algo: AmaxComputeAlgo,
    /// Max-reduce the step's amaxes across the data-parallel group before the update.
    pub reduce_amax: bool,
}

impl Default for DelayedScaling {
    fn default() -> Self {
        DelayedScaling {
            margin: 0,
            format: RecipeFormat::Hybrid,
            amax_history_len: 1024,
            amax_compute_algo: AmaxComputeAlgo::Max,
            reduce_amax: true,
        }
    }
}

impl DelayedScaling {
    /// Rejects a negative or too large margin and a history length of 0 or above the cap.
    pub fn validate(&self) -> Result<()> {
        if !(0..=MAX_MARGIN).contains(&self.margin) {
            return Err(Error::InvalidRecipe {
                setting: "margin",
                value: self.margin.to_string(),
                reason: format!(
                    "must be between 0 and {MAX_MARGIN} (binades of headroom; a larger margin lets 1/scale overflow)"
                ),
            });
        }
        if !(1..=MAX_AMAX_HISTORY_LEN).contains(&self.amax_history_len) {
            return Err(Error::InvalidRecipe {
                setting: "amax_history_len",
                value: self.amax_history_len.to_string(),
                reason: format!("must be between 1 and {MAX_AMAX_HISTORY_LEN}"),
            });
        }
        Ok(())
    }

    /// `fp8_max * 2^-margin`, exact: a power-of-two multiply of a normal f32
    /// (the margin is at most 8). The numerator of the scale update.
    pub fn scaled_max(&self, format: Fp8Format) -> f32 {
        let pow2 = f32::from_bits(((127 - self.margin.clamp(0, MAX_MARGIN)) as u32) << 23);
        format.max_finite() * pow2
    }
}

/// `docs/numerics.md`, current scaling: per-tensor scale from the amax of the tensor being cast.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurrentScaling {
    /// E4M3 everywhere, or E4M3 forward and E5M2 backward.
    pub format: RecipeFormat,
    /// Floor every scale to a power of two (exact scale_inv, no mantissa error).
    pub power_2_scale: bool,
    /// Lower bound on the amax, so an almost-zero tensor does not get a huge scale.
    #[serde(with = "super::exact_f32")]
    pub amax_epsilon: f32,
}

impl Default for CurrentScaling {
    fn default() -> Self {
        CurrentScaling {
            format: RecipeFormat::Hybrid,
            power_2_scale: false,
            amax_epsilon: 0.0,
        }
    }
}

fn check_epsilon(amax_epsilon: f32) -> Result<()> {
    if amax_epsilon.is_finite() && amax_epsilon >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidRecipe {
            setting: "amax_epsilon",
            value: amax_epsilon.to_string(),
            reason: "must be finite and >= 0".to_string(),
        })
    }
}

impl CurrentScaling {
    /// Rejects a negative or non-finite epsilon.
    pub fn validate(&self) -> Result<()> {
        check_epsilon(self.amax_epsilon)
    }
}

/// The block shape one tensor is scaled with under [`BlockScaling`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockDims {
    /// One scale per row per 128 consecutive elements ("1D").
    Rows1x128,
    /// One scale per 128x128 tile ("2D").
    Tiles128x128,
}

impl BlockDims {
    /// Block height and width in elements.
    pub const fn shape(self) -> (usize, usize) {
        match self {
            BlockDims::Rows1x128 => (1, 128),
            BlockDims::Tiles128x128 => (128, 128),
        }
    }

    /// Whether the blocks are 2D tiles.
    pub const fn is_2d(self) -> bool {
        matches!(self, BlockDims::Tiles128x128)
    }
}

/// `docs/numerics.md`, block scaling: DeepSeek-V3 style block scaling, current-scaling formula per block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockScaling {
    /// E4M3 everywhere (default), or E5M2 for gradients.
    pub format: RecipeFormat,
    /// Floor each block scale to a power of two (default on).
    pub power_2_scale: bool,
    /// Lower bound on each block's amax (default 0).
    #[serde(with = "super::exact_f32")]
    pub amax_epsilon: f32,
    /// Blocks of the activation `X` (default 1x128).
    pub input_block: BlockDims,
    /// Blocks of the weight `W` (default 128x128).
    pub weight_block: BlockDims,
    /// Blocks of the gradient `dY` (default 1x128).
    pub grad_block: BlockDims,
}

impl Default for BlockScaling {
    fn default() -> Self {
        BlockScaling {
            format: RecipeFormat::E4M3,
            power_2_scale: true,
            amax_epsilon: 0.0,
            input_block: BlockDims::Rows1x128,
            weight_block: BlockDims::Tiles128x128,
            grad_block: BlockDims::Rows1x128,
        }
    }
}

impl BlockScaling {
    /// Rejects a bad epsilon and any GEMM whose two operands would both be
    /// 2D-scaled (forward `X W^T`, dgrad `dY W`, wgrad `dY^T X`): a 2D x 2D
    /// block GEMM has no split-accumulation kernel.
    pub fn validate(&self) -> Result<()> {
        check_epsilon(self.amax_epsilon)?;
        let gemms = [
            ("forward X.W^T", self.input_block, self.weight_block),
            ("dgrad dY.W", self.grad_block, self.weight_block),
            ("wgrad dY^T.X", self.grad_block, self.input_block),
        ];
        for (gemm, a, b) in gemms {
            if a.is_2d() && b.is_2d() {
                return Err(Error::InvalidRecipe {
                    setting: "block dims",
                    value: format!(
                        "input {:?}, weight {:?}, grad {:?}",
                        self.input_block, self.weight_block, self.grad_block
                    ),
                    reason: format!("GEMM {gemm} would be 2D x 2D block-scaled, which is not supported"),
                });
            }
        }
        Ok(())
    }

    /// Block shape of the tensor in `role` (outputs and input gradients are
    /// activations: 1x128).
    pub const fn block_for(&self, role: TensorRole) -> BlockDims {
        match role {
            TensorRole::Input => self.input_block,
            TensorRole::Weight => self.weight_block,
            TensorRole::OutputGrad => self.grad_block,
            TensorRole::Output | TensorRole::InputGrad => BlockDims::Rows1x128,
        }
    }
}

/// `docs/numerics.md`, MXFP8: MXFP8, one E8M0 scale per 32 consecutive elements.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mxfp8Scaling {
    /// E4M3 everywhere (default, as in TE), or E5M2 for gradients.
    pub format: Mxfp8Format,
}

/// [`Mxfp8Scaling`]'s format; defaults to E4M3 unlike the per-tensor recipes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mxfp8Format {
    /// E4M3 everywhere.
    #[default]
    E4M3,
    /// E4M3 forward, E5M2 backward.
    Hybrid,
}

impl From<Mxfp8Format> for RecipeFormat {
    fn from(format: Mxfp8Format) -> Self {
        match format {
            Mxfp8Format::E4M3 => RecipeFormat::E4M3,
            Mxfp8Format::Hybrid => RecipeFormat::Hybrid,
        }
    }
}

impl Mxfp8Scaling {
    /// Block length along a row (rowwise) or a column (columnwise).
    pub const BLOCK: usize = 32;

    /// Nothing to reject: every setting is valid.
    pub fn validate(&self) -> Result<()> {
        Ok(())
    }
}

/// Any of the four recipes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Recipe {
    /// `docs/numerics.md`, delayed scaling.
    Delayed(DelayedScaling),
    /// `docs/numerics.md`, current scaling.
    Current(CurrentScaling),
    /// `docs/numerics.md`, block scaling.
    Block(BlockScaling),
    /// `docs/numerics.md`, MXFP8.
    Mxfp8(Mxfp8Scaling),
}

impl Default for Recipe {
    fn default() -> Self {
        Recipe::Delayed(DelayedScaling::default())
    }
}

impl Recipe {
    /// Validates the wrapped recipe.
    pub fn validate(&self) -> Result<()> {
        match self {
            Recipe::Delayed(r) => r.validate(),
            Recipe::Current(r) => r.validate(),
            Recipe::Block(r) => r.validate(),
            Recipe::Mxfp8(r) => r.validate(),
        }
    }

    /// Format of the tensor in `role`.
    pub fn format_for(&self, role: TensorRole) -> Fp8Format {
        let format = match self {
            Recipe::Delayed(r) => r.format,
            Recipe::Current(r) => r.format,
            Recipe::Block(r) => r.format,
            Recipe::Mxfp8(r) => r.format.into(),
        };
        format.for_role(role)
    }
}
