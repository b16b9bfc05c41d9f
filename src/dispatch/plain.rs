//! A matrix in a plain compute dtype (f32, bf16, fp16): the GEMM operand of the
//! non-FP8 precisions, made by the dtype conversion op.

use std::sync::{Arc, OnceLock};

use half::{bf16, f16};

use crate::error::Result;
use crate::gemm::cpu::transpose_tiles;
use crate::gemm::{Mat, Operand};
use crate::tensor::scratch;
use crate::tensor::{DeviceMirror, Dtype};

/// A plain matrix in a compute dtype. A 16-bit one made on a GPU may keep its device copy
/// there (`Mirror`), which that GPU's GEMMs read instead of uploading the host values.
#[derive(Clone, Debug)]
pub(crate) enum PlainMat {
    F32(Vec<f32>),
    Bf16(Halves<bf16>, Mirror),
    F16(Halves<f16>, Mirror),
}

/// The device copy of a 16-bit [`PlainMat`]'s values, as stored, if a GPU kept one.
pub(crate) type Mirror = Option<Arc<DeviceMirror>>;

/// A 16-bit matrix's values in host memory, or (a conversion on a GPU where the layers keep
/// their activations there) only in its mirror until a host reader needs them: read back then,
/// once. A GEMM on the mirror's GPU reads the mirror ([`PlainMat::operand_on`]).
#[derive(Clone, Debug)]
pub(crate) struct Halves<T> {
    len: usize,
    host: OnceLock<Vec<T>>,
}

impl<T: Copy + 'static> Halves<T> {
    /// Values in host memory.
    pub(crate) fn host(values: Vec<T>) -> Self {
        Halves {
            len: values.len(),
            host: OnceLock::from(values),
        }
    }

    /// `len` values held only in the matrix's mirror (which must read back).
    pub(crate) fn on_device(len: usize) -> Self {
        Halves {
            len,
            host: OnceLock::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the values are in host memory now.
    pub(crate) fn on_host(&self) -> bool {
        self.host.get().is_some()
    }

    /// The values, read back from `mirror` the first time if they are held there only.
    ///
    /// # Panics
    /// If that read fails (the GPU is gone) or the mirror is missing: the accessor hands out a
    /// slice.
    pub(crate) fn values(&self, mirror: &Mirror) -> &[T] {
        self.host.get_or_init(|| {
            let read = mirror.as_ref().map(|m| m.read_values::<T>());
            match read {
                Some(Ok(values)) if values.len() == self.len => values,
                Some(Ok(values)) => panic!("{} values came back for {} 16-bit values", values.len(), self.len),
                Some(Err(e)) => panic!("16-bit values could not come back from their GPU: {e}"),
                None => panic!("16-bit values held on a device without their mirror"),
            }
        })
    }
}

/// The operand of `h` `[rows, cols]` (`transposed`: read from its stored transpose): the
/// mirror alone when `device_only` is asked, the host has no copy and the GPU GEMM reads the
/// mirror as it is (K a multiple of its 8; else it would read it back on every call, so it is
/// read back once here), else the host values.
fn half_operand<'a, T: Copy + 'static>(
    h: &'a Halves<T>,
    m: &'a Mirror,
    (rows, cols, transposed): (usize, usize, bool),
    device_only: bool,
) -> Result<Mat<'a, T>> {
    let k_aligned = cols.is_multiple_of(crate::backend::cuda::gemm_dispatch::HALF_K_MULTIPLE);
    if let (true, true, false, Some(mirror)) = (device_only, k_aligned, h.on_host(), m)
        && h.len == rows.saturating_mul(cols)
    {
        return Ok(Mat::on_device(rows, cols, transposed, mirror));
    }
    Ok(Mat::checked(h.values(m), rows, cols, transposed)?.with_mirror(m.as_ref()))
}

impl PlainMat {
    /// `src` converted to `dtype` (round to nearest even).
    pub(crate) fn new(dtype: Dtype, src: &[f32]) -> Self {
        match dtype {
            Dtype::F32 => PlainMat::F32(scratch::copy_of(src)),
            Dtype::Bf16 => {
                let mut values = vec![bf16::ZERO; src.len()];
                crate::tensor::bf16_from_f32_slice(src, &mut values);
                PlainMat::Bf16(Halves::host(values), None)
            }
            Dtype::F16 => PlainMat::F16(Halves::host(src.iter().map(|&x| f16::from_f32(x)).collect()), None),
        }
    }

    /// The transpose of `[rows, cols]` `src`, in `dtype`: the same values as converting
    /// [`transpose`]'s result, in one cache-tiled pass.
    pub(crate) fn transposed(dtype: Dtype, src: &[f32], rows: usize, cols: usize) -> Self {
        match dtype {
            Dtype::F32 => PlainMat::F32(transpose_map(src, rows, cols, |x| x)),
            Dtype::Bf16 => PlainMat::Bf16(
                Halves::host(transpose_map(src, rows, cols, crate::tensor::bf16_of)),
                None,
            ),
            Dtype::F16 => PlainMat::F16(Halves::host(transpose_map(src, rows, cols, f16::from_f32)), None),
        }
    }

    /// `[rows, cols]` as the operand of `backend`'s GEMM (`transposed`: the transpose of this
    /// `cols x rows` matrix, read in place): a plain CUDA backend reads 16-bit values held on
    /// its GPU there, with no read-back; every other reader (the CPU, shadow mode's twins) gets
    /// host values (read back once if held on a device).
    pub(crate) fn operand_on(
        &self,
        backend: &super::Backend,
        (rows, cols, transposed): (usize, usize, bool),
    ) -> Result<Operand<'_>> {
        self.operand_as((rows, cols, transposed), matches!(backend, super::Backend::Cuda(_)))
    }

    fn operand_as(&self, (rows, cols, transposed): (usize, usize, bool), device_only: bool) -> Result<Operand<'_>> {
        let shape = (rows, cols, transposed);
        Ok(match self {
            PlainMat::F32(d) => Operand::F32(Mat::checked(d, rows, cols, transposed)?),
            PlainMat::Bf16(h, m) => Operand::Bf16(half_operand(h, m, shape, device_only)?),
            PlainMat::F16(h, m) => Operand::F16(half_operand(h, m, shape, device_only)?),
        })
    }

    /// Every element widened to f64 (exact for each dtype), for comparing two results.
    pub(crate) fn widened(&self) -> Vec<f64> {
        match self {
            PlainMat::F32(d) => d.iter().map(|&v| v as f64).collect(),
            PlainMat::Bf16(h, m) => h.values(m).iter().map(|v| v.to_f64()).collect(),
            PlainMat::F16(h, m) => h.values(m).iter().map(|v| v.to_f64()).collect(),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            PlainMat::F32(d) => 4 * d.len(),
            PlainMat::Bf16(h, _) => 2 * h.len(),
            PlainMat::F16(h, _) => 2 * h.len(),
        }
    }
}

/// `src` converted to `dtype` (the CPU dtype conversion op).
pub(crate) fn convert(dtype: Dtype, src: &[f32]) -> Result<PlainMat> {
    Ok(PlainMat::new(dtype, src))
}

/// The transpose of `[rows, cols]` `src` in `dtype` (the CPU transposing conversion op).
pub(crate) fn convert_transposed(dtype: Dtype, src: &[f32], rows: usize, cols: usize) -> Result<PlainMat> {
    Ok(PlainMat::transposed(dtype, src, rows, cols))
}

/// `[cols, rows]` transpose of a row-major `[rows, cols]` matrix.
#[cfg(test)]
fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    transpose_map(src, rows, cols, |x| x)
}

/// `out[c * rows + r] = f(src[r * cols + c])`: the `[cols, rows]` transpose of a row-major
/// `[rows, cols]` matrix, element by element through `f`, in the GEMM's cache-blocked tiles
/// (`gemm::cpu::transpose_tiles`).
fn transpose_map<T: Copy + Default + Send>(
    src: &[f32],
    rows: usize,
    cols: usize,
    f: impl Fn(f32) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); src.len()];
    if src.len() == rows * cols {
        transpose_tiles(src, rows, cols, &mut out, |dst, column| {
            for (d, &v) in dst.iter_mut().zip(column) {
                *d = f(v);
            }
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{GemmParams, Output};

    /// A stand-in GPU copy of bf16 values: the payload is the values, read back as they are.
    fn stand_in(values: Vec<bf16>) -> Mirror {
        Some(Arc::new(DeviceMirror {
            ordinal: 1,
            payload: Box::new(values),
            read_back: Some(|m| Ok(Box::new(m.payload.downcast_ref::<Vec<bf16>>().expect("values").clone()))),
            read_scales: None,
        }))
    }

    #[test]
    fn sixteen_bit_values_held_on_a_device_reach_a_gpu_gemm_as_the_mirror_and_others_as_values() {
        let (rows, cols) = (8, 16); // K a multiple of 8 in both orientations: read in place
        let values: Vec<bf16> = (0..rows * cols)
            .map(|i| bf16::from_f32(i as f32 * 0.25 - 1.0))
            .collect();
        let held = PlainMat::Bf16(Halves::on_device(rows * cols), stand_in(values.clone()));
        let host = PlainMat::Bf16(Halves::host(values.clone()), None);
        assert_eq!(held.bytes(), host.bytes());
        // A GPU GEMM gets the mirror alone: nothing is read back.
        let Operand::Bf16(m) = held.operand_as((rows, cols, false), true).unwrap() else {
            panic!("not bf16")
        };
        assert!(m.device_only() && m.data.is_empty() && m.mirror.is_some());
        let PlainMat::Bf16(h, _) = &held else { unreachable!() };
        assert!(!h.on_host());
        // The CPU GEMM reads it back: the same bits as the host operand, either orientation.
        let b = PlainMat::Bf16(Halves::host(values.iter().rev().copied().collect()), None);
        for transposed in [false, true] {
            let shape = if transposed {
                (cols, rows, true)
            } else {
                (rows, cols, false)
            };
            let b_op = b.operand_as(shape, false).unwrap();
            let (mut want, mut got) = (vec![0.0f32; shape.0 * shape.0], vec![0.0f32; shape.0 * shape.0]);
            let p = GemmParams::default();
            let from_host = host.operand_as(shape, false).unwrap();
            crate::gemm::cpu::gemm(&from_host, &b_op, Output::F32(&mut want), &p).unwrap();
            let from_device = held.operand_as(shape, true).unwrap();
            crate::gemm::cpu::gemm(&from_device, &b_op, Output::F32(&mut got), &p).unwrap();
            assert_eq!(got, want, "transposed {transposed}");
        }
        assert!(!h.on_host(), "the CPU GEMM's read-back is its own");
        // A host reader reads it back once; then GPU GEMMs get the host values and the mirror.
        assert_eq!(held.widened(), host.widened());
        assert!(h.on_host());
        let Operand::Bf16(m) = held.operand_as((rows, cols, false), true).unwrap() else {
            panic!("not bf16")
        };
        assert!(!m.device_only() && m.data == &values[..] && m.mirror.is_some());
    }

    /// The element-by-element definition the tiled transpose must match.
    fn naive(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut out = vec![0.0; src.len()];
        for r in 0..rows {
            for c in 0..cols {
                out[c * rows + r] = src[r * cols + c];
            }
        }
        out
    }

    #[test]
    fn tiled_transposes_match_the_definition() {
        // Ragged tiles at both edges, one tile, single rows/columns, and a parallel size.
        for (rows, cols) in [(1, 1), (1, 70), (70, 1), (33, 65), (32, 32), (100, 37), (300, 260)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
            let want = naive(&src, rows, cols);
            assert_eq!(transpose(&src, rows, cols), want, "{rows}x{cols}");
            let PlainMat::Bf16(b, m) = PlainMat::transposed(Dtype::Bf16, &src, rows, cols) else {
                panic!("bf16 transpose is not bf16");
            };
            let want_bf16: Vec<bf16> = want.iter().map(|&x| bf16::from_f32(x)).collect();
            assert_eq!(b.values(&m), want_bf16, "bf16 {rows}x{cols}");
            let PlainMat::F16(h, m) = PlainMat::transposed(Dtype::F16, &src, rows, cols) else {
                panic!("f16 transpose is not f16");
            };
            let want_f16: Vec<f16> = want.iter().map(|&x| f16::from_f32(x)).collect();
            assert_eq!(h.values(&m), want_f16, "f16 {rows}x{cols}");
        }
    }
}
