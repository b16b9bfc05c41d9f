//! The GEMM's operands, output, parameters, and the checks every backend shares.

use std::borrow::Cow;
use std::sync::Arc;

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::tensor::device_values::Values;
use crate::tensor::{DeviceMirror, HalfValues, QuantizedMatrix, ScaleKind};

/// A borrowed `rows x cols` matrix of plain values: row-major, or read in place from its
/// stored transpose.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a, T> {
    /// `rows * cols` values: row-major, or the row-major `cols x rows` transpose when
    /// `transposed` is set.
    pub data: &'a [T],
    /// Rows (M for A, N for B).
    pub rows: usize,
    /// Columns (K, the reduction dimension).
    pub cols: usize,
    /// `data` holds the `cols x rows` transpose (K-minor): the GEMM reads it with swapped
    /// strides instead of a transposed copy (the backward reads `X`, `dY` and `W` this way).
    pub transposed: bool,
    /// The same values (as stored, `transposed` or not) already on a GPU: a device conversion
    /// kept them there, so a GEMM on that GPU reads them instead of uploading `data`.
    pub mirror: Option<&'a Arc<DeviceMirror>>,
}

impl<'a, T> Mat<'a, T> {
    /// Checks that `data` holds `rows * cols` values, row-major.
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        Self::checked(data, rows, cols, false)
    }

    /// The `rows x cols` transpose of the row-major `cols x rows` matrix `data`, read in place.
    pub fn transposed(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        Self::checked(data, rows, cols, true)
    }

    /// [`Mat::new`] (`transposed`: [`Mat::transposed`]).
    pub(crate) fn checked(data: &'a [T], rows: usize, cols: usize, transposed: bool) -> Result<Self> {
        let expected = rows.saturating_mul(cols);
        if data.len() != expected {
            return Err(Error::ShapeMismatch {
                what: "GEMM operand",
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        Ok(Mat {
            data,
            rows,
            cols,
            transposed,
            mirror: None,
        })
    }

    /// A matrix held only in `mirror` on a GPU (its stored values, as stored): `data` is empty,
    /// a GEMM on that GPU reads the mirror, and any other reader reads it back first
    /// ([`Mat::read_back`]). For plain matrices whose host copy nothing has read.
    pub(crate) fn on_device(rows: usize, cols: usize, transposed: bool, mirror: &'a Arc<DeviceMirror>) -> Self {
        Mat {
            data: &[],
            rows,
            cols,
            transposed,
            mirror: Some(mirror),
        }
    }

    /// Whether the values are only in the mirror ([`Mat::on_device`]).
    pub(crate) fn device_only(&self) -> bool {
        self.data.is_empty() && self.mirror.is_some() && self.rows * self.cols > 0
    }

    /// The same matrix with a device copy of its stored values (see [`Mat::mirror`]).
    pub(crate) fn with_mirror(self, mirror: Option<&'a Arc<DeviceMirror>>) -> Self {
        Mat { mirror, ..self }
    }

    /// `(row stride, K stride)` of element `(r, k)` at `r * row + k * k_stride` in `data`.
    pub fn strides(&self) -> (usize, usize) {
        match self.transposed {
            false => (self.cols, 1),
            true => (1, self.rows),
        }
    }
}

/// The stored values of `m`, a 16-bit matrix held on a device ([`Mat::on_device`]), read back
/// from its mirror.
pub(crate) fn read_back<T: Copy + 'static>(m: &Mat<'_, T>) -> Result<Vec<T>> {
    let Some(mirror) = m.mirror else {
        return Ok(m.data.to_vec());
    };
    let values = mirror.read_values::<T>()?;
    match values.len() == m.rows * m.cols {
        true => Ok(values),
        false => Err(Error::ShapeMismatch {
            what: "values read back from a device",
            rows: m.rows,
            cols: m.cols,
            expected: m.rows * m.cols,
            got: values.len(),
        }),
    }
}

impl<'a, T: Copy + Default + Send + Sync> Mat<'a, T> {
    /// The values row-major (K-major), as a backend that cannot read strides needs them:
    /// borrowed when they already are, else a transposed copy (the CPU GEMM's cache-tiled
    /// transpose, bands in parallel: the staged CUDA GEMM copies every transposed 16-bit operand
    /// here, up to 64 Mi values for a wgrad of the layer, where an element-by-element
    /// gather missed the cache on nearly every read).
    pub fn k_major(&self) -> Cow<'a, [T]> {
        if !self.transposed || self.rows <= 1 || self.cols <= 1 {
            return Cow::Borrowed(self.data);
        }
        // `data` is the stored transpose, `[cols, rows]` row-major.
        let mut out = vec![T::default(); self.data.len()];
        super::cpu::transpose_tiles(self.data, self.cols, self.rows, &mut out, |dst, column| {
            dst.copy_from_slice(column)
        });
        Cow::Owned(out)
    }
}

/// One GEMM input, `rows x K`: K-major, or a plain matrix read from its stored transpose.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// FP8 codes with their scales (per tensor, 1x128, 128x128 or MXFP8).
    Fp8(Fp8Format, &'a QuantizedMatrix),
    /// Plain f32 (the `Fp32` policy).
    F32(Mat<'a, f32>),
    /// Plain bf16 (the bf16 policy).
    Bf16(Mat<'a, bf16>),
    /// Plain fp16 (the fp16 policy).
    F16(Mat<'a, f16>),
}

impl<'a> Operand<'a> {
    /// 16-bit values `[rows, cols]` as an operand, read in place.
    pub(crate) fn half(values: &'a HalfValues, rows: usize, cols: usize) -> Result<Self> {
        Ok(match values {
            HalfValues::Bf16(v) => Operand::Bf16(Mat::new(v, rows, cols)?),
            HalfValues::F16(v) => Operand::F16(Mat::new(v, rows, cols)?),
        })
    }

    /// The `rows x cols` transpose of 16-bit values held `cols x rows`, read in place.
    pub(crate) fn half_transposed(values: &'a HalfValues, rows: usize, cols: usize) -> Result<Self> {
        Ok(match values {
            HalfValues::Bf16(v) => Operand::Bf16(Mat::transposed(v, rows, cols)?),
            HalfValues::F16(v) => Operand::F16(Mat::transposed(v, rows, cols)?),
        })
    }
}

impl Operand<'_> {
    /// `(rows, K)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Operand::Fp8(_, m) => (m.rows(), m.cols()),
            Operand::F32(m) => (m.rows, m.cols),
            Operand::Bf16(m) => (m.rows, m.cols),
            Operand::F16(m) => (m.rows, m.cols),
        }
    }

    /// A plain matrix built field by field must still hold `rows * cols` values.
    fn check_len(&self, what: &'static str) -> Result<()> {
        let (rows, cols, got) = match self {
            Operand::Fp8(..) => return Ok(()), // QuantizedMatrix::new checked it
            // Held on a device: its values are read there, or read back first.
            Operand::Bf16(m) if m.device_only() => return Ok(()),
            Operand::F16(m) if m.device_only() => return Ok(()),
            Operand::F32(m) => (m.rows, m.cols, m.data.len()),
            Operand::Bf16(m) => (m.rows, m.cols, m.data.len()),
            Operand::F16(m) => (m.rows, m.cols, m.data.len()),
        };
        match rows.checked_mul(cols) {
            Some(expected) if expected == got => Ok(()),
            expected => Err(Error::ShapeMismatch {
                what,
                rows,
                cols,
                expected: expected.unwrap_or(usize::MAX),
                got,
            }),
        }
    }

    /// `(row stride, K stride)` of the values the CPU GEMM reads (FP8 codes are K-major).
    pub fn strides(&self) -> (usize, usize) {
        match self {
            Operand::Fp8(_, m) => (m.cols(), 1),
            Operand::F32(m) => m.strides(),
            Operand::Bf16(m) => m.strides(),
            Operand::F16(m) => m.strides(),
        }
    }

    /// Short dtype name for messages: e4m3, e5m2, f32, bf16, f16.
    pub fn dtype(&self) -> &'static str {
        match self {
            Operand::Fp8(Fp8Format::E4M3, _) => "e4m3",
            Operand::Fp8(Fp8Format::E5M2, _) => "e5m2",
            Operand::F32(_) => "f32",
            Operand::Bf16(_) => "bf16",
            Operand::F16(_) => "f16",
        }
    }
}

/// Where the result goes: `M x N`, row-major.
#[derive(Debug)]
pub enum Output<'a> {
    /// f32; the only output `beta != 0` may accumulate into.
    F32(&'a mut [f32]),
    /// bf16, rounded to nearest even.
    Bf16(&'a mut [bf16]),
    /// fp16, rounded to nearest even.
    F16(&'a mut [f16]),
    /// FP8 codes `cast_sat(D * scale)`.
    Fp8 {
        /// `M * N` codes.
        codes: &'a mut [u8],
        /// Output format.
        format: Fp8Format,
        /// Output scale (finite, > 0).
        scale: f32,
    },
}

impl Output<'_> {
    /// Number of elements the output holds.
    pub fn len(&self) -> usize {
        match self {
            Output::F32(d) => d.len(),
            Output::Bf16(d) => d.len(),
            Output::F16(d) => d.len(),
            Output::Fp8 { codes, .. } => codes.len(),
        }
    }

    /// Whether the output is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Short dtype name: f32, bf16, f16, e4m3, e5m2.
    pub fn dtype(&self) -> &'static str {
        match self {
            Output::F32(_) => "f32",
            Output::Bf16(_) => "bf16",
            Output::F16(_) => "f16",
            Output::Fp8 {
                format: Fp8Format::E4M3,
                ..
            } => "e4m3",
            Output::Fp8 {
                format: Fp8Format::E5M2,
                ..
            } => "e5m2",
        }
    }
}

/// A GEMM's per-column bias, N f32 values: in host memory ([`Bias::host`], `From<&[f32]>`), or,
/// inside the crate, on a GPU (a layer's bias kept where its input lives), which a GEMM on that
/// GPU reads in place and the CPU GEMM refuses (`DeviceMismatch`: it takes host values only).
#[derive(Clone, Copy, Debug)]
pub struct Bias<'a>(Values<'a>);

impl<'a> Bias<'a> {
    /// Host values.
    pub fn host(values: &'a [f32]) -> Self {
        Bias(Values::Host(values))
    }

    /// Values wherever they live.
    pub(crate) fn of(values: Values<'a>) -> Self {
        Bias(values)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The host values, or `None` for values on a GPU.
    pub fn as_host(&self) -> Option<&'a [f32]> {
        match self.0 {
            Values::Host(v) => Some(v),
            Values::Device(_) => None,
        }
    }

    /// The values as an op argument.
    pub(crate) fn values(self) -> Values<'a> {
        self.0
    }
}

impl<'a> From<&'a [f32]> for Bias<'a> {
    fn from(values: &'a [f32]) -> Self {
        Bias::host(values)
    }
}

impl<'a> From<&'a Vec<f32>> for Bias<'a> {
    fn from(values: &'a Vec<f32>) -> Self {
        Bias::host(values)
    }
}

impl<'a, const N: usize> From<&'a [f32; N]> for Bias<'a> {
    fn from(values: &'a [f32; N]) -> Self {
        Bias::host(values)
    }
}

/// The bias of `params` in host memory, for a GEMM that runs there (the CPU GEMM, a host
/// epilogue): `DeviceMismatch` naming `op` for one on a GPU.
pub(crate) fn host_bias<'a>(params: &GemmParams<'a>, op: &'static str) -> Result<Option<&'a [f32]>> {
    params.bias.map(|b| b.values().host(op)).transpose()
}

/// Scalars and switches of one GEMM.
#[derive(Clone, Copy, Debug)]
pub struct GemmParams<'a> {
    /// Multiplies the product (after the input scale_invs).
    pub alpha: f32,
    /// Multiplies the f32 output's previous content; 0 ignores it (even NaN).
    pub beta: f32,
    /// Per-column bias, length N, added in f32 after alpha.
    pub bias: Option<Bias<'a>>,
    /// Promote the partial sum to an f32 accumulator every 128 of K (FP8 inputs);
    /// forced on for block scales.
    pub split_accumulator: bool,
    /// Whether the report carries max |D|. Off, its amax is 0 on every backend, and the CUDA
    /// GEMM neither reduces it nor reads it back: one 4-byte download, a stream sync, per GEMM
    /// whose caller drops it (wgrad, 16-bit precisions, frozen weights).
    pub report_amax: bool,
}

impl Default for GemmParams<'_> {
    fn default() -> Self {
        GemmParams {
            alpha: 1.0,
            beta: 0.0,
            bias: None,
            split_accumulator: true,
            report_amax: true,
        }
    }
}

/// What a GEMM reports besides its output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmReport {
    /// max |D| over the f32 result before the output cast (NaN propagates); 0 where
    /// [`GemmParams::report_amax`] is off.
    pub amax: f32,
}

/// How the two operands' scales combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalePair {
    /// Plain inputs: no scales.
    None,
    /// One scale_inv each: applied once to the whole sum.
    PerTensor,
    /// A 1x128, B 128x128 (forward and dgrad under block scaling).
    Block1x128By128x128,
    /// A 1x128, B 1x128 (wgrad under block scaling).
    Block1x128By1x128,
    /// MXFP8: one E8M0 per 32 of K on both sides.
    Mxfp8,
}

impl ScalePair {
    /// The K granularity at which scales change, if they do.
    pub fn k_block(self) -> Option<usize> {
        match self {
            ScalePair::None | ScalePair::PerTensor => None,
            ScalePair::Block1x128By128x128 | ScalePair::Block1x128By1x128 => Some(128),
            ScalePair::Mxfp8 => Some(32),
        }
    }
}

/// A checked GEMM: shapes and the scale combination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmPlan {
    /// Rows of A and D.
    pub m: usize,
    /// Rows of B, columns of D.
    pub n: usize,
    /// The reduction dimension.
    pub k: usize,
    /// How scales are applied.
    pub scales: ScalePair,
}

/// FP8 tensor cores read K in steps of 16 bytes per thread group: the engine asks the same of every backend.
pub const FP8_K_MULTIPLE: usize = 16;

fn args(detail: String) -> Error {
    Error::KernelArgs { kernel: "gemm", detail }
}

/// Checks that `a`, `b`, `out` and `params` make a GEMM every backend can run, and returns its plan.
pub fn plan(a: &Operand, b: &Operand, out: &Output, params: &GemmParams) -> Result<GemmPlan> {
    let plan = plan_output(a, b, out.len(), out.dtype(), params)?;
    if let Output::Fp8 { scale, .. } = out {
        crate::convert::check_scale(*scale)?;
    }
    Ok(plan)
}

/// [`plan`] for an f32 output of `out_len` values held anywhere (a device output has no
/// [`Output`]).
pub(crate) fn plan_f32(a: &Operand, b: &Operand, out_len: usize, params: &GemmParams) -> Result<GemmPlan> {
    plan_output(a, b, out_len, "f32", params)
}

/// The checks of [`plan`] on the output's length and dtype name (`"f32"` accumulates).
fn plan_output(
    a: &Operand,
    b: &Operand,
    out_len: usize,
    out_dtype: &'static str,
    params: &GemmParams,
) -> Result<GemmPlan> {
    a.check_len("GEMM operand A")?;
    b.check_len("GEMM operand B")?;
    let (m, k) = a.shape();
    let (n, kb) = b.shape();
    if k != kb {
        return Err(args(format!(
            "A is {m}x{k} and B is {n}x{kb}: both must be K-major with the same K"
        )));
    }
    let scales = match (a, b) {
        (Operand::Fp8(fa, qa), Operand::Fp8(fb, qb)) => {
            if *fa == Fp8Format::E5M2 && *fb == Fp8Format::E5M2 {
                return Err(args(
                    "E5M2 x E5M2 is not a supported FP8 GEMM (one side must be E4M3)".into(),
                ));
            }
            if k % FP8_K_MULTIPLE != 0 {
                return Err(args(format!(
                    "FP8 GEMM {m}x{n}x{k}: K must be a multiple of {FP8_K_MULTIPLE}"
                )));
            }
            match (qa.scale_kind(), qb.scale_kind()) {
                (ScaleKind::PerTensor, ScaleKind::PerTensor) => ScalePair::PerTensor,
                (ScaleKind::Block1x128, ScaleKind::Block128x128) => ScalePair::Block1x128By128x128,
                (ScaleKind::Block1x128, ScaleKind::Block1x128) => ScalePair::Block1x128By1x128,
                (ScaleKind::Mxfp8, ScaleKind::Mxfp8) => ScalePair::Mxfp8,
                (sa, sb) => {
                    return Err(args(format!(
                        "scales {sa:?} (A) x {sb:?} (B) are not a supported pair \
                         (per-tensor x per-tensor, 1x128 x 128x128, 1x128 x 1x128, MXFP8 x MXFP8)"
                    )));
                }
            }
        }
        (Operand::F32(_), Operand::F32(_))
        | (Operand::Bf16(_), Operand::Bf16(_))
        | (Operand::F16(_), Operand::F16(_)) => ScalePair::None,
        _ => {
            return Err(args(format!(
                "A is {} and B is {}: plain inputs must have the same dtype, FP8 goes with FP8",
                a.dtype(),
                b.dtype()
            )));
        }
    };
    let expected = m
        .checked_mul(n)
        .ok_or_else(|| args(format!("{m} x {n} outputs overflow usize")))?;
    if out_len != expected {
        return Err(Error::ShapeMismatch {
            what: "GEMM output",
            rows: m,
            cols: n,
            expected,
            got: out_len,
        });
    }
    if let Some(bias) = params.bias
        && bias.len() != n
    {
        return Err(args(format!("bias has {} elements, N is {n}", bias.len())));
    }
    if params.beta != 0.0 && out_dtype != "f32" {
        return Err(args(format!(
            "beta = {} needs an f32 output to accumulate into, not {out_dtype}",
            params.beta
        )));
    }
    Ok(GemmPlan { m, n, k, scales })
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    #[test]
    fn k_major_copies_of_transposed_views_match_the_definition() {
        // Ragged tiles, single rows/columns (borrowed as they are), one tile, a parallel size.
        for (rows, cols) in [(1, 9), (9, 1), (33, 65), (32, 32), (100, 37), (300, 260)] {
            // The stored transpose `[cols, rows]`: element (r, c) of the view at `c * rows + r`.
            let stored: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
            let want: Vec<f32> = (0..rows * cols).map(|i| stored[(i % cols) * rows + i / cols]).collect();
            let view = Mat::transposed(&stored, rows, cols).unwrap();
            assert_eq!(view.k_major().as_ref(), &want[..], "f32 {rows}x{cols}");
            let stored16: Vec<bf16> = stored.iter().map(|&x| bf16::from_f32(x)).collect();
            let want16: Vec<bf16> = want.iter().map(|&x| bf16::from_f32(x)).collect();
            let view16 = Mat::transposed(&stored16, rows, cols).unwrap();
            assert_eq!(view16.k_major().as_ref(), &want16[..], "bf16 {rows}x{cols}");
        }
        let plain = [1.0f32, 2.0, 3.0, 4.0];
        let m = Mat::new(&plain, 2, 2).unwrap();
        assert!(
            matches!(m.k_major(), Cow::Borrowed(_)),
            "a K-major matrix is not copied"
        );
    }
}
