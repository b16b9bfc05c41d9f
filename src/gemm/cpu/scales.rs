//! The scale_invs of one operand, looked up per K block for a run of rows.

use super::super::operand::Operand;
use crate::format::decode_e8m0;
use crate::tensor::Scales;

/// How one operand's scale depends on (row, K block).
#[derive(Clone, Copy)]
pub(super) enum RowScales<'a> {
    /// Plain or per-tensor (applied in the epilogue instead): 1.
    One,
    /// `[rows, k_blocks]` f32.
    PerRow(&'a [f32]),
    /// `[ceil(rows/128), k_blocks]` f32.
    PerTile(&'a [f32]),
    /// `[rows, k_blocks]` E8M0.
    E8m0(&'a [u8]),
}

impl<'a> RowScales<'a> {
    /// The block scales of `op`, or `One` when it has none per block.
    pub fn of(op: &Operand<'a>) -> Self {
        let Operand::Fp8(_, q) = op else { return RowScales::One };
        match q.scales() {
            Scales::PerTensor(_) => RowScales::One,
            Scales::Block1x128(s) => RowScales::PerRow(s),
            Scales::Block128x128(s) => RowScales::PerTile(s),
            Scales::Mxfp8(e) => RowScales::E8m0(e),
        }
    }

    /// scale_inv of `row` at K block `kb` of `k_blocks`.
    #[inline]
    pub fn get(self, row: usize, kb: usize, k_blocks: usize) -> f32 {
        match self {
            RowScales::One => 1.0,
            RowScales::PerRow(s) => s[row * k_blocks + kb],
            RowScales::PerTile(s) => s[(row / 128) * k_blocks + kb],
            RowScales::E8m0(e) => decode_e8m0(e[row * k_blocks + kb]),
        }
    }

    /// scale_invs of rows `first..first + out.len()` at K block `kb`.
    pub fn fill(self, first: usize, kb: usize, k_blocks: usize, out: &mut [f32]) {
        for (r, s) in out.iter_mut().enumerate() {
            *s = self.get(first + r, kb, k_blocks);
        }
    }
}

/// The per-tensor scale_inv of an FP8 operand (1 for plain ones).
pub(super) fn tensor_scale(op: &Operand) -> f32 {
    match op {
        Operand::Fp8(_, q) => match q.scales() {
            Scales::PerTensor(s) => *s,
            _ => 1.0,
        },
        _ => 1.0,
    }
}
