//! The epilogue of one tile: `v = acc * factor (+ bias[j]) (+ beta * old)`,
//! the amax of `v` before the output cast, then the cast into the output.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::super::operand::Output;
use super::tiles::{Tile, split};
use crate::error::Result;
use crate::format::{Fp8Format, Overflow};
use crate::quantize::amax_serial;

/// Scalars applied after accumulation, in this order.
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a> {
    /// `alpha` (times the per-tensor scale_invs, if any).
    pub factor: f32,
    /// Per-column bias (length N).
    pub bias: Option<&'a [f32]>,
    /// Weight of the old f32 output; 0 never reads it.
    pub beta: f32,
}

/// One tile of whichever output type the GEMM writes.
pub(super) enum OutTile<'a> {
    F32(Tile<'a, f32>),
    Bf16(Tile<'a, bf16>),
    F16(Tile<'a, f16>),
    Fp8(Tile<'a, u8>, Fp8Format, f32),
}

impl OutTile<'_> {
    /// `(first row, first column, rows, columns)`.
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        fn of<T>(t: &Tile<T>) -> (usize, usize, usize, usize) {
            (t.i0, t.j0, t.rows.len(), t.width)
        }
        match self {
            OutTile::F32(t) => of(t),
            OutTile::Bf16(t) => of(t),
            OutTile::F16(t) => of(t),
            OutTile::Fp8(t, ..) => of(t),
        }
    }
}

/// Splits `out` (`n` columns) into `tm x tn` tiles.
pub(super) fn out_tiles(out: Output<'_>, n: usize, tm: usize, tn: usize) -> Vec<OutTile<'_>> {
    match out {
        Output::F32(d) => split(d, n, tm, tn).into_iter().map(OutTile::F32).collect(),
        Output::Bf16(d) => split(d, n, tm, tn).into_iter().map(OutTile::Bf16).collect(),
        Output::F16(d) => split(d, n, tm, tn).into_iter().map(OutTile::F16).collect(),
        Output::Fp8 { codes, format, scale } => split(codes, n, tm, tn)
            .into_iter()
            .map(|t| OutTile::Fp8(t, format, scale))
            .collect(),
    }
}

/// max |x| that propagates NaN (the GEMM reports a NaN result, unlike the
/// quantizers' fmaxf amax which ignores NaN inputs).
#[inline]
pub(super) fn nan_max(m: f32, x: f32) -> f32 {
    if x.is_nan() || m.is_nan() {
        f32::NAN
    } else {
        m.max(x.abs())
    }
}

impl Epilogue<'_> {
    /// Finishes the tile from its accumulator (`rows x width`, row-major;
    /// overwritten with the f32 result) and returns the tile's amax.
    pub fn finish(&self, acc: &mut [f32], tile: OutTile) -> Result<f32> {
        match tile {
            OutTile::F32(t) => self.finish_rows(acc, t, |&old| old, |v, d| d.copy_from_slice(v)),
            OutTile::Bf16(t) => self.finish_rows(acc, t, |old| old.to_f32(), crate::tensor::bf16_from_f32_slice),
            OutTile::F16(t) => self.finish_rows(acc, t, |old| old.to_f32(), narrow),
            OutTile::Fp8(t, format, scale) => {
                let mut result = Ok(());
                // `plan` allows beta != 0 for f32 outputs only: old codes are never read.
                let amax = self.finish_rows(
                    acc,
                    t,
                    |_| 0.0,
                    |v, d| {
                        if result.is_ok() {
                            result = crate::convert::quantize(v, d, format, scale, Overflow::Saturate).map(|_| ());
                        }
                    },
                )?;
                result.map(|()| amax)
            }
        }
    }

    /// Finishes an f32 output in place (`width` columns from column 0, beta = 0, so no old
    /// value is read): the arithmetic of [`Epilogue::finish`] without the copy.
    pub fn finish_in_place(&self, out: &mut [f32], width: usize) -> f32 {
        debug_assert!(self.beta == 0.0, "an in-place epilogue has no old output to weigh");
        let bias = self.bias.map(|b| &b[..width]);
        let mut amax = 0.0f32;
        for v in out.chunks_mut(width.max(1)) {
            v.iter_mut().for_each(|x| *x *= self.factor);
            if let Some(bias) = bias {
                v.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
            }
            amax = nan_max(amax, row_amax(v));
        }
        amax
    }

    fn finish_rows<T>(
        &self,
        acc: &mut [f32],
        tile: Tile<T>,
        old: impl Fn(&T) -> f32,
        mut write: impl FnMut(&[f32], &mut [T]),
    ) -> Result<f32> {
        let width = tile.width;
        let bias = self.bias.map(|b| &b[tile.j0..tile.j0 + width]);
        let mut amax = 0.0f32;
        for (v, out) in acc.chunks_mut(width.max(1)).zip(tile.rows) {
            v.iter_mut().for_each(|x| *x *= self.factor);
            if let Some(bias) = bias {
                v.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
            }
            if self.beta != 0.0 {
                v.iter_mut().zip(out.iter()).for_each(|(x, o)| *x += self.beta * old(o));
            }
            amax = nan_max(amax, row_amax(v));
            write(v, out);
        }
        Ok(amax)
    }
}

/// f16 RNE narrowing with `half`'s slice conversion (F16C where the CPU has it: ~10x the
/// scalar `f16::from_f32`); bf16 tiles use the crate's vectorized `bf16_from_f32_slice`.
fn narrow<T: HalfFloatSliceExt + ?Sized>(v: &[f32], d: &mut T) {
    d.convert_from_f32_slice(v);
}

/// max |x| of a row, NaN if any element is NaN: a vectorisable NaN scan,
/// then the quantizers' lane-parallel fmaxf amax (a plain NaN-propagating
/// fold is a serial dependency chain, ~2 ns per element).
fn row_amax(v: &[f32]) -> f32 {
    if v.iter().fold(false, |nan, x| nan | x.is_nan()) {
        f32::NAN
    } else {
        amax_serial(v)
    }
}
