//! Reading and writing safetensors files: header-checked whole-file reads with
//! errors that name the file, typed element decoding, and atomic writes.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// A parsed safetensors buffer with its free-form metadata.
pub struct LoadedFile<'a> {
    /// The tensors (views into the buffer).
    pub tensors: SafeTensors<'a>,
    /// The `__metadata__` map (empty if absent).
    pub metadata: HashMap<String, String>,
}

/// Reads a whole safetensors file, checking its header before the data; a missing, unreadable,
/// non-regular or malformed file is an error naming it. See [`crate::io::read_safetensors`].
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    crate::io::read_safetensors(path)
}

/// Parses a safetensors buffer; `label` (usually the path) names it in errors.
pub fn parse<'a>(bytes: &'a [u8], label: &str) -> Result<LoadedFile<'a>> {
    let invalid = |err: safetensors::SafeTensorError| Error::InvalidFile {
        path: label.to_string(),
        reason: format!("not a valid safetensors file: {err}"),
    };
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(invalid)?;
    let tensors = SafeTensors::deserialize(bytes).map_err(invalid)?;
    Ok(LoadedFile {
        tensors,
        metadata: header.metadata().clone().unwrap_or_default(),
    })
}

/// The tensors of a file sorted by name, for deterministic processing and output.
pub fn sorted_tensors<'a>(file: &LoadedFile<'a>) -> Vec<(String, TensorView<'a>)> {
    let mut tensors = file.tensors.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// A tensor to write: borrowed from the input or newly made.
#[derive(Clone, Debug)]
pub struct OutTensor<'a> {
    /// safetensors dtype.
    pub dtype: Dtype,
    /// Shape (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// Little-endian element bytes.
    pub data: Cow<'a, [u8]>,
}

impl<'a> OutTensor<'a> {
    /// An input tensor copied unchanged.
    pub fn copy_of(view: &TensorView<'a>) -> Self {
        OutTensor {
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: Cow::Borrowed(view.data()),
        }
    }
}

/// Serializes tensors and metadata into safetensors bytes, reproducibly: the
/// header's keys are sorted (the crate's own writer emits the metadata map in
/// hash order, so two runs would differ), and the data is laid out by element
/// size, largest first, then by name, so every tensor starts at a multiple of
/// its element size (the header is padded to 8 bytes).
pub fn serialize(
    tensors: &[(String, OutTensor<'_>)],
    metadata: HashMap<String, String>,
    label: &str,
) -> Result<Vec<u8>> {
    let mut order: Vec<&(String, OutTensor<'_>)> = tensors.iter().collect();
    order.sort_by(|(a, x), (b, y)| y.dtype.bitsize().cmp(&x.dtype.bitsize()).then(a.cmp(b)));
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let sorted: BTreeMap<String, String> = metadata.into_iter().collect();
        header.insert("__metadata__".to_string(), serde_json::json!(sorted));
    }
    let mut entries = BTreeMap::new();
    let mut offset = 0usize;
    for (name, tensor) in &order {
        let end = offset + tensor.data.len();
        entries.insert(
            name.clone(),
            serde_json::json!({
                "dtype": tensor.dtype.to_string(),
                "shape": tensor.shape,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    header.extend(entries);
    let mut json = serde_json::to_vec(&header).map_err(|err| Error::InvalidFile {
        path: label.to_string(),
        reason: format!("cannot serialize the header: {err}"),
    })?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + json.len() + offset);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    for (_, tensor) in &order {
        out.extend_from_slice(&tensor.data);
    }
    Ok(out)
}

/// Writes `bytes` to `path` atomically; see [`crate::io::write_atomic`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::io::write_atomic(path, bytes)
}

/// Decodes the little-endian elements of an F32, BF16 or F16 tensor; `None`
/// for any other dtype.
pub fn float_values(view: &TensorView<'_>) -> Option<FloatValues> {
    let data = view.data();
    let words16 = || data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    match view.dtype() {
        Dtype::F32 => Some(FloatValues::F32(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )),
        Dtype::BF16 => Some(FloatValues::BF16(words16().map(bf16::from_bits).collect())),
        Dtype::F16 => Some(FloatValues::F16(words16().map(f16::from_bits).collect())),
        _ => None,
    }
}

/// The elements of an F32, BF16 or F16 tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum FloatValues {
    /// F32 elements.
    F32(Vec<f32>),
    /// BF16 elements.
    BF16(Vec<bf16>),
    /// F16 elements.
    F16(Vec<f16>),
}

impl FloatValues {
    /// Every element widened to f32 (exact).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            FloatValues::F32(v) => v.clone(),
            FloatValues::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            FloatValues::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian bytes of 16-bit values given as their bit patterns.
pub fn u16_bytes(bits: impl Iterator<Item = u16>) -> Vec<u8> {
    bits.flat_map(|b| b.to_le_bytes()).collect()
}
