//! A frozen linear weight held only as E4M3 codes with their scales (`--base-precision fp8`):
//! no f32 master, no gradient, no per-step cast.
//!
//! The weight is kept as one segment per checkpoint tensor (a fused q/k/v linear is three: q, k,
//! v rows), each quantized on its own grid, so a segment is bit for bit what `fp8 quantize --hf`
//! writes for that tensor (128x128 blocks, exact scales) or what an HF FP8 checkpoint stores.
//!
//! Layouts kept, per backend: only the row-wise codes `W` `[out, in]` (K-major for the forward
//! `Y = X W^T`). The dgrad `dX = dY W` reads `W^T` K-major; the frozen weight has no wgrad, so
//! instead of a second resident copy, `W^T` of one segment at a time is made in backward (a
//! 128x128 block transposes with its own scale, a per-tensor scale is unchanged: the transpose is
//! exact) and dropped after its GEMM. On the CPU backend both live in host memory. On a GPU the
//! codes `W` also stay in device memory (a device copy made when the linear moves there, booked
//! under FP8 copies), so the forward GEMMs read them in place, and the transient `W^T` is
//! transposed there from them (`Kernels::transpose_fp8`; the planner's transient `W^T`,
//! `docs/finetune.md`).
//!
//! Activations are cast just in time (current scaling): `X` in E4M3 and `dY` by the base's recipe,
//! 1x128 blocks against 128x128 weight blocks, or per tensor against a per-tensor weight.

use super::columns::{put_columns, take_columns};
use crate::amp::{Fp8Recipe, Precision};
use crate::dispatch::{Backend, Values};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::gemm::{Bias, GemmParams, Operand};
use crate::quantize::{ScaleRule, amax, quantize_128x128, quantize_per_tensor};
use crate::scaling::{BlockScaling, CurrentScaling, TensorRole};
use crate::tensor::{Dtype, QuantizedMatrix, Scales, Tensor};

/// How a frozen FP8 weight is scaled (`--base-scaling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BaseScaling {
    /// One f32 scale per 128x128 block (the Hugging Face fine-grained FP8 layout).
    #[default]
    Block,
    /// One f32 scale per tensor.
    Tensor,
}

impl std::str::FromStr for BaseScaling {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "block" => Ok(BaseScaling::Block),
            "tensor" => Ok(BaseScaling::Tensor),
            other => Err(Error::InvalidSetting {
                setting: "base-scaling",
                value: other.to_string(),
                reason: "expected block (128x128 block scales) or tensor (one scale per tensor)".into(),
            }),
        }
    }
}

impl BaseScaling {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BaseScaling::Block => "block",
            BaseScaling::Tensor => "tensor",
        }
    }

    /// The recipe that casts the activations meeting this weight: the run's own when it pairs
    /// with the weight's scales, else the default of the matching family.
    fn activation_recipe(self, run: &Precision) -> Fp8Recipe {
        match (self, run) {
            (BaseScaling::Block, Precision::Fp8(r @ Fp8Recipe::Block(_))) => r.clone(),
            (BaseScaling::Block, _) => Fp8Recipe::Block(BlockScaling::default()),
            (BaseScaling::Tensor, Precision::Fp8(r @ Fp8Recipe::Current(_))) => r.clone(),
            (BaseScaling::Tensor, _) => Fp8Recipe::Current(CurrentScaling::default()),
        }
    }
}

/// The exact-scale E4M3 rule of the frozen weights (the one `fp8 quantize --hf` uses by default).
fn weight_rule() -> ScaleRule {
    ScaleRule {
        format: Fp8Format::E4M3,
        power_2_scale: false,
        amax_epsilon: 0.0,
    }
}

/// Edge of the weight blocks.
const BLOCK: usize = 128;

/// `values` `[rows, cols]` (one checkpoint tensor, f32) as frozen E4M3 codes with `scaling`.
pub fn quantize_weight(values: &[f32], rows: usize, cols: usize, scaling: BaseScaling) -> Result<QuantizedMatrix> {
    let rule = weight_rule();
    match scaling {
        BaseScaling::Block => {
            let mut codes = vec![0u8; rows * cols];
            let mut scale_inv = vec![0f32; rows.div_ceil(BLOCK) * cols.div_ceil(BLOCK)];
            quantize_128x128(values, rows, cols, &rule, &mut codes, &mut scale_inv)?;
            QuantizedMatrix::new(codes, rows, cols, Scales::Block128x128(scale_inv))
        }
        BaseScaling::Tensor => {
            let scale = rule.scale(amax(values));
            let (tensor, _) = quantize_per_tensor(values, rows, cols, rule.format, scale, false)?;
            let (_, rowwise, _) = tensor.into_parts();
            Ok(rowwise)
        }
    }
}

/// A frozen `[out, in]` weight as E4M3 segments stacked by rows.
#[derive(Clone, Debug, PartialEq)]
pub struct FrozenFp8Weight {
    scaling: BaseScaling,
    in_features: usize,
    segments: Vec<QuantizedMatrix>,
}

impl FrozenFp8Weight {
    /// The weight made of `segments` (each `[rows_i, in]`, 128x128 or per-tensor scales matching
    /// `scaling`), stacked by rows.
    pub fn new(scaling: BaseScaling, in_features: usize, segments: Vec<QuantizedMatrix>) -> Result<Self> {
        for s in &segments {
            let kind_ok = matches!(
                (scaling, s.scales()),
                (BaseScaling::Block, Scales::Block128x128(_)) | (BaseScaling::Tensor, Scales::PerTensor(_))
            );
            if s.cols() != in_features || !kind_ok {
                return Err(Error::InvalidTensor {
                    name: "frozen FP8 weight".into(),
                    reason: format!(
                        "segment {}x{} with {:?} scales does not fit a {} weight with {in_features} inputs",
                        s.rows(),
                        s.cols(),
                        s.scale_kind(),
                        scaling.name()
                    ),
                });
            }
        }
        Ok(FrozenFp8Weight {
            scaling,
            in_features,
            segments,
        })
    }

    /// How the segments are scaled.
    pub fn scaling(&self) -> BaseScaling {
        self.scaling
    }

    /// The segments, in row order (one per checkpoint tensor).
    pub fn segments(&self) -> &[QuantizedMatrix] {
        &self.segments
    }

    /// Output features: the rows of every segment.
    pub fn out_features(&self) -> usize {
        self.segments.iter().map(QuantizedMatrix::rows).sum()
    }

    /// Bytes held: one per value plus 4 per scale.
    pub fn bytes(&self) -> usize {
        self.segments.iter().map(QuantizedMatrix::bytes).sum()
    }

    /// Keeps a device copy of every segment on `backend`'s GPU (made once, kept while the
    /// weight lives), or drops them on the CPU. On an error (device memory) nothing changes.
    pub(crate) fn hold_on(&mut self, backend: &Backend) -> Result<()> {
        let copies = self
            .segments
            .iter()
            .map(|s| backend.resident_copy(s))
            .collect::<Result<Vec<_>>>()?;
        for (segment, copy) in self.segments.iter_mut().zip(copies) {
            segment.set_mirror(copy);
        }
        Ok(())
    }

    /// Bytes of the segments held in device memory as well ([`Self::hold_on`]), counted as
    /// [`Self::bytes`].
    pub fn device_bytes(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| s.mirror().is_some())
            .map(QuantizedMatrix::bytes)
            .sum()
    }

    /// The f32 values the codes stand for (code times its scale_inv), row-major.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.out_features() * self.in_features);
        for s in &self.segments {
            out.extend(s.dequantize::<f32>(Fp8Format::E4M3)?);
        }
        Ok(out)
    }

    /// `Y = X W^T (+ bias)` for `x` `[rows, in]`, an FP8 GEMM per segment on the stored codes,
    /// rounded to `dtype`; `Y` lives where `x` does (host memory, or `backend`'s GPU), the bias
    /// in host memory or on that GPU.
    pub(crate) fn forward(
        &self,
        backend: &Backend,
        run: &Precision,
        x: Values,
        rows: usize,
        bias: Option<Values>,
        dtype: Dtype,
    ) -> Result<Tensor> {
        let kernels = backend.kernels();
        let recipe = self.scaling.activation_recipe(run);
        let out = self.out_features();
        let xq = kernels.quantize(&recipe, TensorRole::Input, x, rows, self.in_features, 1.0)?;
        let a = Operand::Fp8(xq.tensor.format(), xq.tensor.rowwise());
        let mut y = backend.output_at(x.device(), rows, out)?;
        let mut offset = 0;
        for seg in &self.segments {
            let n = seg.rows();
            // The segment's entries of the bias: a host slice read in place; on a device, the
            // whole bias for one segment, else a copy of its part made there.
            let copied = match bias {
                Some(b @ Values::Device(_)) if n != out => Some(take_columns(backend, b, 1, out, offset, n)?),
                _ => None,
            };
            let seg_bias = match (bias, &copied) {
                (_, Some(part)) => Some(part.values()),
                (Some(Values::Host(b)), None) => Some(Values::Host(&b[offset..offset + n])),
                (whole, None) => whole,
            };
            let params = GemmParams {
                bias: seg_bias.map(Bias::of),
                split_accumulator: false,
                // No slot or statistic of a frozen weight's GEMMs reads it.
                report_amax: false,
                ..GemmParams::default()
            };
            let b = Operand::Fp8(Fp8Format::E4M3, seg);
            if self.segments.len() == 1 {
                kernels.gemm_into(&a, &b, y.values_mut(), params)?;
            } else {
                // Each segment's columns of `Y`: its GEMM into a part, copied in.
                let mut part = backend.output_at(x.device(), rows, n)?;
                kernels.gemm_into(&a, &b, part.values_mut(), params)?;
                put_columns(backend, part.values(), n, &mut y, offset)?;
                part.recycle();
            }
            offset += n;
        }
        kernels.round(y.values_mut(), dtype)?;
        Ok(y)
    }

    /// `dX = dY W` for `dy` `[rows, out]`, summed over the segments (each `dY` slice cast on its
    /// own, against its transient `W^T`), rounded to `dtype`; `dX` lives where `dy` does.
    pub(crate) fn backward(&self, backend: &Backend, run: &Precision, dy: Values, dtype: Dtype) -> Result<Tensor> {
        let kernels = backend.kernels();
        let recipe = self.scaling.activation_recipe(run);
        let out = self.out_features();
        let rows = dy.len() / out.max(1);
        let mut dx = backend.output_at(dy.device(), rows, self.in_features)?;
        let mut offset = 0;
        for (i, seg) in self.segments.iter().enumerate() {
            let n = seg.rows();
            // A segment's columns of `dY` (all of it for one segment).
            let part = match self.segments.len() {
                1 => None,
                _ => Some(take_columns(backend, dy, rows, out, offset, n)?),
            };
            let slice = part.as_ref().map_or(dy, Tensor::values);
            let dyq = kernels.quantize(&recipe, TensorRole::OutputGrad, slice, rows, n, 1.0)?;
            // `W^T` where the codes are held (`Kernels::transpose_fp8`), dropped after its GEMM.
            let wt = kernels.transpose_fp8(seg)?;
            let params = GemmParams {
                beta: if i == 0 { 0.0 } else { 1.0 },
                report_amax: false,
                ..GemmParams::default()
            };
            kernels.gemm_into(
                &Operand::Fp8(dyq.tensor.format(), dyq.tensor.rowwise()),
                &Operand::Fp8(Fp8Format::E4M3, &wt),
                dx.values_mut(),
                params,
            )?;
            if let Some(part) = part {
                part.recycle();
            }
            offset += n;
        }
        kernels.round(dx.values_mut(), dtype)?;
        Ok(dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::Backend;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn the_transpose_is_exact_for_both_scalings() {
        for scaling in [BaseScaling::Block, BaseScaling::Tensor] {
            let (rows, cols) = (144, 272);
            let m = quantize_weight(&values(rows * cols, 3), rows, cols, scaling).unwrap();
            let t = crate::quantize::transpose_matrix(&m).unwrap();
            let (a, b) = (
                m.dequantize::<f32>(Fp8Format::E4M3).unwrap(),
                t.dequantize::<f32>(Fp8Format::E4M3).unwrap(),
            );
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        a[r * cols + c].to_bits(),
                        b[c * rows + r].to_bits(),
                        "{scaling:?} ({r},{c})"
                    );
                }
            }
        }
    }

    #[test]
    fn row_block_layouts_have_no_exact_transpose() {
        // A 1x128 or MXFP8 scale belongs to a row's block: after a transpose it would span
        // 128 (32) rows, so the op refuses them on every backend.
        let codes = vec![0x38u8; 128 * 128];
        for scales in [Scales::Block1x128(vec![1.0; 128]), Scales::Mxfp8(vec![127; 128 * 4])] {
            let m = QuantizedMatrix::new(codes.clone(), 128, 128, scales).unwrap();
            let err = Backend::default().kernels().transpose_fp8(&m).unwrap_err();
            assert!(matches!(err, Error::InvalidTensor { .. }), "{err}");
        }
        // Per-tensor and 128x128 scales go through the op as the host transpose gives them.
        let m = quantize_weight(&values(256 * 128, 5), 256, 128, BaseScaling::Block).unwrap();
        let t = Backend::default().kernels().transpose_fp8(&m).unwrap();
        assert_eq!((t.rows(), t.cols()), (128, 256));
        assert_eq!(t, crate::quantize::transpose_matrix(&m).unwrap());
    }

    #[test]
    fn forward_and_backward_match_the_dequantized_weight() {
        // Two segments of 48 and 32 rows, 64 inputs, 16 tokens: the FP8 GEMMs against an f64
        // reference on the dequantized weight.
        let (inp, rows) = (64, 16);
        let run: Precision = "fp32".parse().unwrap();
        for scaling in [BaseScaling::Block, BaseScaling::Tensor] {
            let segs: Vec<QuantizedMatrix> = [(48, 1), (32, 2)]
                .iter()
                .map(|&(n, s)| quantize_weight(&values(n * inp, s), n, inp, scaling).unwrap())
                .collect();
            let w = FrozenFp8Weight::new(scaling, inp, segs).unwrap();
            assert_eq!(w.out_features(), 80);
            let wd = w.dequantize().unwrap();
            let x = values(rows * inp, 9);
            let backend = Backend::default();
            let y = w
                .forward(&backend, &run, Values::Host(&x), rows, None, Dtype::F32)
                .unwrap()
                .into_data();
            let dy = values(rows * 80, 11);
            let dx = w
                .backward(&backend, &run, Values::Host(&dy), Dtype::F32)
                .unwrap()
                .into_data();
            // Each product carries the activation cast's relative error only (the reference uses
            // the same weight codes): at most 2^-4 for E4M3, 2^-3 for E5M2 (dY, tensor scaling).
            for r in 0..rows {
                for o in 0..80 {
                    let terms = (0..inp).map(|i| (x[r * inp + i] as f64, wd[o * inp + i] as f64));
                    let (exact, size) = terms.fold((0.0, 0.0), |(s, m), (a, b)| (s + a * b, m + (a * b).abs()));
                    let err = (y[r * 80 + o] as f64 - exact).abs();
                    assert!(err <= size / 16.0 + 1e-6, "{scaling:?} y {r},{o}: {err} > {size}/16");
                }
                for i in 0..inp {
                    let terms = (0..80).map(|o| (dy[r * 80 + o] as f64, wd[o * inp + i] as f64));
                    let (exact, size) = terms.fold((0.0, 0.0), |(s, m), (a, b)| (s + a * b, m + (a * b).abs()));
                    let err = (dx[r * inp + i] as f64 - exact).abs();
                    assert!(err <= size / 8.0 + 1e-6, "{scaling:?} dx {r},{i}: {err} > {size}/8");
                }
            }
            assert!(y.iter().any(|v| *v != 0.0) && dx.iter().any(|v| *v != 0.0));
        }
    }

    #[test]
    fn segments_must_match_the_inputs_and_scaling() {
        let m = quantize_weight(&values(32 * 64, 1), 32, 64, BaseScaling::Tensor).unwrap();
        assert!(FrozenFp8Weight::new(BaseScaling::Block, 64, vec![m.clone()]).is_err());
        assert!(FrozenFp8Weight::new(BaseScaling::Tensor, 48, vec![m.clone()]).is_err());
        assert!("blocks".parse::<BaseScaling>().is_err());
        assert_eq!("tensor".parse::<BaseScaling>().unwrap(), BaseScaling::Tensor);
    }

    #[test]
    fn device_copies_are_counted_and_dropped_on_the_cpu_and_a_missing_gpu_changes_nothing() {
        use crate::tensor::{DeviceKind, DeviceMirror};
        let seg = |rows, seed| quantize_weight(&values(rows * 256, seed), rows, 256, BaseScaling::Block).unwrap();
        let mut w = FrozenFp8Weight::new(BaseScaling::Block, 256, vec![seg(128, 1), seg(256, 2)]).unwrap();
        assert_eq!(w.device_bytes(), 0);
        // As a GPU would leave them: a device copy of the second segment only.
        let copy = DeviceMirror {
            ordinal: 0,
            payload: Box::new(()),
            read_back: None,
            read_scales: None,
        };
        w.segments[1].set_mirror(Some(std::sync::Arc::new(copy)));
        assert_eq!(w.device_bytes(), 256 * 256 + 4 * 2 * 2, "codes plus 2x2 block scales");
        let before = w.clone();
        // No GPU 99: a typed error, the copies as they were.
        let err = w.hold_on(&Backend::on(DeviceKind::Cuda(99))).unwrap_err();
        assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
        assert_eq!(w.device_bytes(), 256 * 256 + 16);
        // On the CPU the device copies go; the codes and scales stay.
        w.hold_on(&Backend::default()).unwrap();
        assert_eq!(w.device_bytes(), 0);
        assert_eq!(w, before);
    }
}
