//! `fp8 quantize` / `fp8 dequantize`: safetensors checkpoints to FP8 and back.
//!
//! Every 2-D F32/BF16/F16 tensor `NAME` is quantized row-wise and written as
//! `NAME` (dtype F8_E4M3 or F8_E5M2) plus its scales:
//!
//! | recipe | scale tensor | dtype | shape |
//! |---|---|---|---|
//! | `current` | `NAME.scale_inv` | F32 | `[]` |
//! | `block1x128` | `NAME.scale_inv` | F32 | `[M, ceil(K/128)]` |
//! | `block128` | `NAME.scale_inv` | F32 | `[ceil(M/128), ceil(K/128)]` |
//! | `mxfp8` | `NAME.scale_e8m0` | U8 | `[M, ceil(K/32)]` |
//!
//! Other tensors are copied unchanged. The file's metadata records the recipe
//! (`fp8.recipe`, `fp8.format`, `fp8.power_2_scale`) and each quantized
//! tensor's original dtype (`fp8.source_dtype.NAME`), so `dequantize` can
//! restore F32/BF16/F16 tensors under their names. Output files are written
//! atomically.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use half::{bf16, f16};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::safetensors_io::{
    FloatValues, LoadedFile, OutTensor, f32_bytes, float_values, parse, read_file, serialize, sorted_tensors,
    u16_bytes, write_atomic,
};
use crate::convert::HighPrecision;
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::quantize::{ScaleRule, quantize_1x128, quantize_block_128x128, quantize_current, quantize_mxfp8};
use crate::tensor::{QuantizedMatrix, QuantizedTensor, ScaleKind, Scales};

/// Metadata key of the recipe name.
pub const META_RECIPE: &str = "fp8.recipe";
/// Metadata key of the FP8 format (`e4m3`, `e5m2`).
pub const META_FORMAT: &str = "fp8.format";
/// Metadata key of the power-of-two flag (`true`, `false`; absent for MXFP8).
pub const META_POW2: &str = "fp8.power_2_scale";
/// Prefix of the per-tensor original dtype keys (`fp8.source_dtype.NAME`).
pub const META_SOURCE_DTYPE: &str = "fp8.source_dtype.";

/// The recipes a file can be quantized with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileRecipe {
    /// One scale per tensor from its amax (`docs/numerics.md`, current scaling).
    Current,
    /// 1x128 blocks along the last dimension (`docs/numerics.md`, block scaling).
    Block1x128,
    /// 128x128 blocks (`docs/numerics.md`, block scaling).
    Block128,
    /// MXFP8, 1x32 blocks with E8M0 scales (`docs/numerics.md`, MXFP8).
    Mxfp8,
}

impl FileRecipe {
    /// Every recipe, in the order the help lists them.
    pub const ALL: [FileRecipe; 4] = [
        FileRecipe::Current,
        FileRecipe::Block1x128,
        FileRecipe::Block128,
        FileRecipe::Mxfp8,
    ];

    /// Name on the command line and in the metadata.
    pub const fn name(self) -> &'static str {
        match self {
            FileRecipe::Current => "current",
            FileRecipe::Block1x128 => "block1x128",
            FileRecipe::Block128 => "block128",
            FileRecipe::Mxfp8 => "mxfp8",
        }
    }

    /// Power-of-two scales by default: on for the block recipes, off for `current`.
    pub const fn default_power_2_scale(self) -> bool {
        matches!(self, FileRecipe::Block1x128 | FileRecipe::Block128 | FileRecipe::Mxfp8)
    }

    /// Suffix of the scale tensor's name.
    pub const fn scale_suffix(self) -> &'static str {
        match self {
            FileRecipe::Mxfp8 => ".scale_e8m0",
            _ => ".scale_inv",
        }
    }

    const fn scale_kind(self) -> ScaleKind {
        match self {
            FileRecipe::Current => ScaleKind::PerTensor,
            FileRecipe::Block1x128 => ScaleKind::Block1x128,
            FileRecipe::Block128 => ScaleKind::Block128x128,
            FileRecipe::Mxfp8 => ScaleKind::Mxfp8,
        }
    }
}

impl fmt::Display for FileRecipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FileRecipe {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        FileRecipe::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| Error::InvalidRecipe {
                setting: "recipe",
                value: s.to_string(),
                reason: "expected one of: current, block1x128, block128, mxfp8".to_string(),
            })
    }
}

/// What `fp8 quantize` does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantizeOptions {
    /// The recipe.
    pub recipe: FileRecipe,
    /// The FP8 format of every quantized tensor (default E4M3).
    pub format: Fp8Format,
    /// Overrides the recipe's default power-of-two setting.
    pub power_2_scale: Option<bool>,
}

impl QuantizeOptions {
    /// `recipe` with E4M3 and its default power-of-two setting.
    pub fn new(recipe: FileRecipe) -> Self {
        QuantizeOptions {
            recipe,
            format: Fp8Format::E4M3,
            power_2_scale: None,
        }
    }

    /// The power-of-two setting in force.
    pub fn power_2_scale(&self) -> bool {
        self.power_2_scale.unwrap_or(self.recipe.default_power_2_scale())
    }

    fn validate(&self) -> Result<()> {
        if self.recipe == FileRecipe::Mxfp8 && self.power_2_scale == Some(false) {
            return Err(Error::InvalidRecipe {
                setting: "power_2_scale",
                value: "false".to_string(),
                reason: "MXFP8 scales are E8M0, always powers of two".to_string(),
            });
        }
        Ok(())
    }
}

/// Which tensors a conversion changed and which it copied, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConversionSummary {
    /// Quantized (or dequantized) tensors.
    pub converted: Vec<String>,
    /// Tensors copied unchanged.
    pub copied: Vec<String>,
}

fn tensor_error(name: &str, reason: impl Into<String>) -> Error {
    Error::InvalidTensor {
        name: name.to_string(),
        reason: reason.into(),
    }
}

fn is_fp8_dtype(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::F8_E8M0 | Dtype::F8_E4M3FNUZ | Dtype::F8_E5M2FNUZ
    )
}

fn fp8_dtype(format: Fp8Format) -> Dtype {
    match format {
        Fp8Format::E4M3 => Dtype::F8_E4M3,
        Fp8Format::E5M2 => Dtype::F8_E5M2,
    }
}

fn quantize_values<T: HighPrecision>(
    x: &[T],
    rows: usize,
    cols: usize,
    opts: &QuantizeOptions,
) -> Result<QuantizedTensor> {
    let rule = ScaleRule {
        format: opts.format,
        power_2_scale: opts.power_2_scale(),
        amax_epsilon: 0.0,
    };
    match opts.recipe {
        FileRecipe::Current => quantize_current(x, rows, cols, &rule, false).map(|(t, _)| t),
        FileRecipe::Block1x128 => quantize_1x128(x, rows, cols, &rule, false),
        FileRecipe::Block128 => quantize_block_128x128(x, rows, cols, &rule, false),
        FileRecipe::Mxfp8 => quantize_mxfp8(x, rows, cols, opts.format, false),
    }
}

/// The FP8 data tensor and its scale tensor.
fn quantized_outputs(t: QuantizedTensor) -> (OutTensor<'static>, OutTensor<'static>) {
    let [rows, cols] = t.shape();
    let (format, rowwise, _) = t.into_parts();
    let kind = rowwise.scale_kind();
    let (scale_rows, scale_cols) = kind.scale_shape(rows, cols);
    let (data, scales) = rowwise.into_parts();
    let data = OutTensor {
        dtype: fp8_dtype(format),
        shape: vec![rows, cols],
        data: Cow::Owned(data),
    };
    let scale = match scales {
        Scales::PerTensor(s) => OutTensor {
            dtype: Dtype::F32,
            shape: vec![],
            data: Cow::Owned(s.to_le_bytes().to_vec()),
        },
        Scales::Block1x128(s) | Scales::Block128x128(s) => OutTensor {
            dtype: Dtype::F32,
            shape: vec![scale_rows, scale_cols],
            data: Cow::Owned(f32_bytes(&s)),
        },
        Scales::Mxfp8(e) => OutTensor {
            dtype: Dtype::U8,
            shape: vec![scale_rows, scale_cols],
            data: Cow::Owned(e),
        },
    };
    (data, scale)
}

/// Quantizes a safetensors buffer; `label` names it in errors.
pub fn quantize_bytes(input: &[u8], label: &str, opts: &QuantizeOptions) -> Result<(Vec<u8>, ConversionSummary)> {
    opts.validate()?;
    let file = parse(input, label)?;
    let tensors = sorted_tensors(&file);
    let names: std::collections::HashSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    let mut metadata: HashMap<String, String> = file
        .metadata
        .into_iter()
        .filter(|(k, _)| !k.starts_with("fp8."))
        .collect();
    metadata.insert(META_RECIPE.to_string(), opts.recipe.name().to_string());
    metadata.insert(META_FORMAT.to_string(), opts.format.name().to_string());
    if opts.recipe != FileRecipe::Mxfp8 {
        metadata.insert(META_POW2.to_string(), opts.power_2_scale().to_string());
    }
    let mut out = Vec::with_capacity(tensors.len() * 2);
    let mut summary = ConversionSummary::default();
    for (name, view) in &tensors {
        if is_fp8_dtype(view.dtype()) {
            return Err(tensor_error(
                name,
                format!("is already FP8 ({}); run `fp8 dequantize` first", view.dtype()),
            ));
        }
        let values = match (view.shape(), float_values(view)) {
            (&[_, _], Some(values)) => values,
            _ => {
                out.push((name.clone(), OutTensor::copy_of(view)));
                summary.copied.push(name.clone());
                continue;
            }
        };
        let (rows, cols) = (view.shape()[0], view.shape()[1]);
        if rows == 0 || cols == 0 {
            return Err(tensor_error(
                name,
                format!("is empty (shape [{rows}, {cols}]): nothing to quantize"),
            ));
        }
        let scale_name = format!("{name}{}", opts.recipe.scale_suffix());
        if names.contains(scale_name.as_str()) {
            return Err(tensor_error(
                name,
                format!("its scales would be written as '{scale_name}', which the input already has"),
            ));
        }
        let quantized = match &values {
            FloatValues::F32(x) => quantize_values(x, rows, cols, opts),
            FloatValues::BF16(x) => quantize_values(x, rows, cols, opts),
            FloatValues::F16(x) => quantize_values(x, rows, cols, opts),
        }
        .map_err(|err| tensor_error(name, err.to_string()))?;
        metadata.insert(format!("{META_SOURCE_DTYPE}{name}"), view.dtype().to_string());
        let (data, scale) = quantized_outputs(quantized);
        out.push((name.clone(), data));
        out.push((scale_name, scale));
        summary.converted.push(name.clone());
    }
    Ok((serialize(&out, metadata, label)?, summary))
}

/// Quantizes the file `input` into `output` (written atomically).
pub fn quantize_file(input: &Path, output: &Path, opts: &QuantizeOptions) -> Result<ConversionSummary> {
    let bytes = read_file(input)?;
    let (out, summary) = quantize_bytes(&bytes, &input.display().to_string(), opts)?;
    write_atomic(output, &out)?;
    Ok(summary)
}

/// The recipe a file was quantized with, from its metadata; `None` if it has none.
pub fn file_recipe(file: &LoadedFile<'_>, label: &str) -> Result<Option<FileRecipe>> {
    match file.metadata.get(META_RECIPE) {
        None => Ok(None),
        Some(name) => name.parse().map(Some).map_err(|_| Error::InvalidFile {
            path: label.to_string(),
            reason: format!("unknown {META_RECIPE} '{name}' in the metadata"),
        }),
    }
}

/// Whether a tensor is the scale tensor of a quantized tensor in the file.
pub fn is_scale_of_quantized(file: &LoadedFile<'_>, recipe: FileRecipe, name: &str) -> bool {
    name.strip_suffix(recipe.scale_suffix())
        .and_then(|base| file.tensors.tensor(base).ok())
        .is_some_and(|base| is_fp8_dtype(base.dtype()))
}

/// Rebuilds the quantized tensor `name` (an FP8 tensor of a file written by
/// `quantize`) from its data and its scale tensor, checking dtypes and shapes.
pub fn read_quantized(
    file: &LoadedFile<'_>,
    recipe: FileRecipe,
    name: &str,
    view: &TensorView<'_>,
) -> Result<QuantizedTensor> {
    let format = match view.dtype() {
        Dtype::F8_E4M3 => Fp8Format::E4M3,
        Dtype::F8_E5M2 => Fp8Format::E5M2,
        other => {
            return Err(tensor_error(
                name,
                format!("unsupported dtype {other}: expected F8_E4M3 or F8_E5M2"),
            ));
        }
    };
    let (rows, cols) = match view.shape() {
        &[rows, cols] => (rows, cols),
        shape => {
            return Err(tensor_error(
                name,
                format!(
                    "unsupported rank {} (shape {shape:?}): quantized tensors are 2-D",
                    shape.len()
                ),
            ));
        }
    };
    let scale_name = format!("{name}{}", recipe.scale_suffix());
    let scale = file
        .tensors
        .tensor(&scale_name)
        .map_err(|_| tensor_error(name, format!("its scale tensor '{scale_name}' is missing")))?;
    let kind = recipe.scale_kind();
    let (scale_rows, scale_cols) = kind.scale_shape(rows, cols);
    let (want_dtype, want_shape) = match kind {
        ScaleKind::PerTensor => (Dtype::F32, vec![]),
        ScaleKind::Mxfp8 => (Dtype::U8, vec![scale_rows, scale_cols]),
        _ => (Dtype::F32, vec![scale_rows, scale_cols]),
    };
    let shape_ok = scale.shape() == want_shape.as_slice() || (want_shape.is_empty() && scale.shape() == [1]);
    if scale.dtype() != want_dtype || !shape_ok {
        return Err(tensor_error(
            &scale_name,
            format!(
                "is {} {:?}, but {} of a [{rows}, {cols}] tensor must be {want_dtype} {want_shape:?}",
                scale.dtype(),
                scale.shape(),
                recipe.name()
            ),
        ));
    }
    let floats = || match float_values(&scale) {
        Some(FloatValues::F32(v)) => v,
        _ => Vec::new(), // unreachable: the dtype was checked to be F32
    };
    let scales = match kind {
        ScaleKind::PerTensor => Scales::PerTensor(floats().first().copied().unwrap_or(f32::NAN)),
        ScaleKind::Block1x128 => Scales::Block1x128(floats()),
        ScaleKind::Block128x128 => Scales::Block128x128(floats()),
        ScaleKind::Mxfp8 => Scales::Mxfp8(scale.data().to_vec()),
    };
    let matrix = QuantizedMatrix::new(view.data().to_vec(), rows, cols, scales)
        .map_err(|err| tensor_error(name, err.to_string()))?;
    QuantizedTensor::new(format, matrix, None)
}

fn source_dtype(file: &LoadedFile<'_>, name: &str) -> Result<Dtype> {
    match file
        .metadata
        .get(&format!("{META_SOURCE_DTYPE}{name}"))
        .map(String::as_str)
    {
        None | Some("F32") => Ok(Dtype::F32),
        Some("BF16") => Ok(Dtype::BF16),
        Some("F16") => Ok(Dtype::F16),
        Some(other) => Err(tensor_error(
            name,
            format!("unsupported original dtype '{other}' in the metadata (expected F32, BF16 or F16)"),
        )),
    }
}

fn dequantized_output(t: &QuantizedTensor, dtype: Dtype) -> Result<OutTensor<'static>> {
    let data = match dtype {
        Dtype::BF16 => u16_bytes(t.dequantize::<bf16>()?.into_iter().map(bf16::to_bits)),
        Dtype::F16 => u16_bytes(t.dequantize::<f16>()?.into_iter().map(f16::to_bits)),
        _ => f32_bytes(&t.dequantize::<f32>()?),
    };
    Ok(OutTensor {
        dtype,
        shape: t.shape().to_vec(),
        data: Cow::Owned(data),
    })
}

/// Dequantizes a buffer written by [`quantize_bytes`]: FP8 tensors back to
/// their original dtype, scale tensors dropped, everything else copied.
pub fn dequantize_bytes(input: &[u8], label: &str) -> Result<(Vec<u8>, ConversionSummary)> {
    let file = parse(input, label)?;
    let recipe = file_recipe(&file, label)?.ok_or_else(|| Error::InvalidFile {
        path: label.to_string(),
        reason: format!("no '{META_RECIPE}' in the metadata: not written by `fp8 quantize`"),
    })?;
    let mut out = Vec::new();
    let mut summary = ConversionSummary::default();
    for (name, view) in &sorted_tensors(&file) {
        if is_scale_of_quantized(&file, recipe, name) {
            continue;
        }
        if !is_fp8_dtype(view.dtype()) {
            out.push((name.clone(), OutTensor::copy_of(view)));
            summary.copied.push(name.clone());
            continue;
        }
        let quantized = read_quantized(&file, recipe, name, view)?;
        let tensor = dequantized_output(&quantized, source_dtype(&file, name)?)
            .map_err(|err| tensor_error(name, err.to_string()))?;
        out.push((name.clone(), tensor));
        summary.converted.push(name.clone());
    }
    let metadata = file
        .metadata
        .into_iter()
        .filter(|(k, _)| !k.starts_with("fp8."))
        .collect();
    Ok((serialize(&out, metadata, label)?, summary))
}

/// Dequantizes the file `input` into `output` (written atomically).
pub fn dequantize_file(input: &Path, output: &Path) -> Result<ConversionSummary> {
    let bytes = read_file(input)?;
    let (out, summary) = dequantize_bytes(&bytes, &input.display().to_string())?;
    write_atomic(output, &out)?;
    Ok(summary)
}
