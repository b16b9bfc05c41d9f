//! `fp8 inspect`: per tensor the shape, dtype and amax; for FP8 tensors of a
//! file written by `fp8 quantize` also the share of values saturated, the
//! share flushed to zero, and (given the original file) the
//! signal-to-quantization-noise ratio.
//!
//! Without the original, "saturated" counts codes at the format's max
//! magnitude and "flushed" counts zero codes: an upper bound, since a value can
//! land on the max or on zero without being clipped or flushed. With it,
//! "saturated" counts originals beyond `(max + half an ulp) * scale_inv` (the
//! ones a non-saturating cast would overflow), "flushed" nonzero finite
//! originals that decode to zero, and SQNR is `10 log10(sum x^2 / sum (x - x')^2)`
//! over finite pairs. Scale tensors are reported with their FP8 tensor, not on
//! their own lines.

use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::safetensors_io::{FloatValues, LoadedFile, float_values, parse, read_file, sorted_tensors};
use super::safetensors_quant::{file_recipe, is_scale_of_quantized, read_quantized};
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::quantize::amax;
use crate::tensor::QuantizedTensor;

/// What `inspect` says about one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorReport {
    /// Tensor name.
    pub name: String,
    /// safetensors dtype name (`F32`, `F8_E4M3`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// `max |x|` of the values the tensor holds (dequantized for FP8
    /// tensors; NaN ignored); `None` for non-float dtypes.
    pub amax: Option<f32>,
    /// Quantization statistics, for FP8 tensors.
    pub quality: Option<QuantQuality>,
}

/// Quantization statistics of one FP8 tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantQuality {
    /// Elements in the tensor.
    pub elements: usize,
    /// Saturated elements (see the module doc for the two definitions).
    pub saturated: usize,
    /// Elements flushed to zero (see the module doc).
    pub flushed: usize,
    /// SQNR in dB; only with a reference. `inf` when the error is zero.
    pub sqnr_db: Option<f64>,
    /// Whether the counts compare with the original values.
    pub against_reference: bool,
}

fn tensor_error(name: &str, reason: impl Into<String>) -> Error {
    Error::InvalidTensor {
        name: name.to_string(),
        reason: reason.into(),
    }
}

/// `max |x|` of a plain float tensor; `None` for other dtypes.
fn plain_amax(view: &TensorView<'_>) -> Option<f32> {
    if view.dtype() == Dtype::F64 {
        let wide = view
            .data()
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])).abs())
            .fold(0.0f64, f64::max);
        return Some(wide as f32);
    }
    Some(match float_values(view)? {
        FloatValues::F32(v) => amax(&v),
        FloatValues::BF16(v) => amax(&v),
        FloatValues::F16(v) => amax(&v),
    })
}

/// Code-only statistics: codes at the max magnitude, zero codes.
fn code_quality(t: &QuantizedTensor) -> QuantQuality {
    let max_code = t.format().encode(t.format().max_finite(), Default::default());
    let codes = t.rowwise().data();
    QuantQuality {
        elements: codes.len(),
        saturated: codes.iter().filter(|&&c| c & 0x7F == max_code).count(),
        flushed: codes.iter().filter(|&&c| c & 0x7F == 0).count(),
        sqnr_db: None,
        against_reference: false,
    }
}

/// Per-element `scale_inv` of the row-wise copy, in f64.
fn element_scale_inv(t: &QuantizedTensor) -> Vec<f64> {
    use crate::tensor::Scales;
    let [rows, cols] = t.shape();
    let m = t.rowwise();
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            out.push(match m.scales() {
                Scales::PerTensor(s) => *s as f64,
                Scales::Block1x128(s) => s[r * cols.div_ceil(128) + c / 128] as f64,
                Scales::Block128x128(s) => s[(r / 128) * cols.div_ceil(128) + c / 128] as f64,
                Scales::Mxfp8(e) => crate::format::decode_e8m0(e[r * cols.div_ceil(32) + c / 32]) as f64,
            });
        }
    }
    out
}

/// The overflow threshold of a non-saturating cast: max finite plus half an ulp there.
fn overflow_threshold(format: Fp8Format) -> f64 {
    match format {
        Fp8Format::E4M3 => 464.0,   // 448 + 32/2
        Fp8Format::E5M2 => 61440.0, // 57344 + 8192/2
    }
}

/// Statistics against the original values `x`.
fn reference_quality(t: &QuantizedTensor, deq: &[f32], x: &[f32]) -> QuantQuality {
    let scale_inv = element_scale_inv(t);
    let limit = overflow_threshold(t.format());
    let (mut saturated, mut flushed) = (0, 0);
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for ((&x, &d), &s) in x.iter().zip(deq).zip(&scale_inv) {
        let (x, d) = (x as f64, d as f64);
        if !x.is_nan() && x.abs() > limit * s {
            saturated += 1;
        }
        if x.is_finite() && x != 0.0 && d == 0.0 {
            flushed += 1;
        }
        if x.is_finite() && d.is_finite() {
            signal += x * x;
            noise += (x - d) * (x - d);
        }
    }
    let sqnr_db = if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal / noise).log10()
    };
    QuantQuality {
        elements: x.len(),
        saturated,
        flushed,
        sqnr_db: Some(sqnr_db),
        against_reference: true,
    }
}

/// The original values of `name` from the reference file, as f32.
fn reference_values(reference: &LoadedFile<'_>, name: &str, shape: [usize; 2]) -> Result<Vec<f32>> {
    let view = reference
        .tensors
        .tensor(name)
        .map_err(|_| tensor_error(name, "not found in the reference file"))?;
    if view.shape() != shape {
        return Err(tensor_error(
            name,
            format!("shape {:?} in the reference file, {shape:?} here", view.shape()),
        ));
    }
    float_values(&view).map(|v| v.to_f32()).ok_or_else(|| {
        tensor_error(
            name,
            format!(
                "unsupported dtype {} in the reference file (expected F32, BF16 or F16)",
                view.dtype()
            ),
        )
    })
}

/// Inspects a safetensors buffer; `reference` is the original (unquantized)
/// buffer and its label, if given.
pub fn inspect_bytes(input: &[u8], label: &str, reference: Option<(&[u8], &str)>) -> Result<Vec<TensorReport>> {
    let file = parse(input, label)?;
    let reference = reference.map(|(bytes, label)| parse(bytes, label)).transpose()?;
    let recipe = file_recipe(&file, label)?;
    check_memory(&file, reference.is_some())?;
    let mut reports = Vec::new();
    for (name, view) in &sorted_tensors(&file) {
        let mut report = TensorReport {
            name: name.clone(),
            dtype: view.dtype().to_string(),
            shape: view.shape().to_vec(),
            amax: None,
            quality: None,
        };
        let quantized = matches!(view.dtype(), Dtype::F8_E4M3 | Dtype::F8_E5M2);
        match recipe {
            Some(recipe) if is_scale_of_quantized(&file, recipe, name) => continue,
            Some(recipe) if quantized => {
                let t = read_quantized(&file, recipe, name, view)?;
                let deq = t
                    .dequantize::<f32>()
                    .map_err(|err| tensor_error(name, err.to_string()))?;
                report.amax = Some(amax(&deq));
                report.quality = Some(match &reference {
                    Some(reference) => reference_quality(&t, &deq, &reference_values(reference, name, t.shape())?),
                    None => code_quality(&t),
                });
            }
            _ => report.amax = plain_amax(view),
        }
        reports.push(report);
    }
    Ok(reports)
}

/// Each quantized tensor is inspected in f32: its codes copied (1 byte per element), dequantized
/// (4) and, with a reference, the reference widened (4), so the largest tensor needs about 9
/// bytes per element on top of the files; refused up front if the machine does not have it.
fn check_memory(file: &LoadedFile<'_>, with_reference: bool) -> Result<()> {
    let per_element: u64 = if with_reference { 9 } else { 5 };
    let largest = file
        .tensors
        .tensors()
        .iter()
        .filter(|(_, v)| matches!(v.dtype(), Dtype::F8_E4M3 | Dtype::F8_E5M2))
        .max_by_key(|(_, v)| v.data().len())
        .map(|(name, v)| (name.clone(), v.data().len() as u64));
    match largest {
        Some((name, elements)) => crate::io::ensure_fits(
            &format!(
                "inspecting tensor '{}' ({elements} elements)",
                crate::io::escaped(&name)
            ),
            elements.checked_mul(per_element),
        ),
        None => Ok(()),
    }
}

/// Inspects the file at `path`, comparing with `reference` if given.
pub fn inspect_file(path: &Path, reference: Option<&Path>) -> Result<Vec<TensorReport>> {
    let bytes = read_file(path)?;
    let reference_bytes = reference.map(read_file).transpose()?;
    let reference_label = reference.map(|p| p.display().to_string()).unwrap_or_default();
    inspect_bytes(
        &bytes,
        &path.display().to_string(),
        reference_bytes.as_deref().map(|b| (b, reference_label.as_str())),
    )
}

fn share(count: usize, total: usize) -> String {
    let percent = if total == 0 {
        0.0
    } else {
        100.0 * count as f64 / total as f64
    };
    format!("{count} ({percent:.4}%)")
}

/// A table, one line per tensor, columns aligned; a closing note says what
/// the saturated/flushed columns count.
pub fn render(reports: &[TensorReport]) -> String {
    let header = ["name", "dtype", "shape", "amax", "saturated", "flushed", "sqnr_db"].map(String::from);
    let mut rows = vec![header];
    for r in reports {
        let (saturated, flushed, sqnr) = match &r.quality {
            Some(q) => (
                share(q.saturated, q.elements),
                share(q.flushed, q.elements),
                q.sqnr_db.map_or("-".to_string(), |db| format!("{db:.2}")),
            ),
            None => ("-".to_string(), "-".to_string(), "-".to_string()),
        };
        rows.push([
            crate::io::escaped(&r.name),
            r.dtype.clone(),
            format!("{:?}", r.shape),
            r.amax.map_or("-".to_string(), |a| a.to_string()),
            saturated,
            flushed,
            sqnr,
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    let code_only = reports
        .iter()
        .any(|r| r.quality.as_ref().is_some_and(|q| !q.against_reference));
    if code_only {
        out.push_str(
            "# saturated / flushed: codes at the format's max / at zero; pass --reference ORIG.safetensors \
             for clipped and flushed originals and the SQNR\n",
        );
    }
    out
}
