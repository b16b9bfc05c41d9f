//! The safetensors files of a Hugging Face model directory, memory-mapped:
//! `model.safetensors`, or the shards listed by `model.safetensors.index.json`.
//! Headers are checked when a shard is opened (a truncated file is an error
//! naming the first tensor past its end); tensor data is only touched when a
//! tensor is read, so opening a 1B-parameter checkpoint costs a few page faults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::{open_regular, read_regular};

/// Where one tensor lives.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    /// Index into the shard list.
    pub shard: usize,
    /// safetensors element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte range in the shard's file.
    pub start: usize,
    /// End of the byte range (exclusive).
    pub end: usize,
}

/// One memory-mapped safetensors file.
pub struct Shard {
    path: PathBuf,
    map: Mmap,
}

impl Shard {
    /// The file this shard maps.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Every tensor of a checkpoint, by name.
pub struct Shards {
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorEntry>,
}

fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidFile {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

impl Shards {
    /// The checkpoint files of model directory `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            Self::open_index(dir, &index)
        } else if single.exists() {
            Self::open_files(&[single], None)
        } else {
            Err(invalid(
                dir,
                "no model.safetensors or model.safetensors.index.json in this directory",
            ))
        }
    }

    /// Opens the shards named by an index file; every tensor must be in the shard the index says.
    fn open_index(dir: &Path, index: &Path) -> Result<Self> {
        // Published index files are a few hundred KiB (one line per tensor).
        let text = read_regular(index, 64 << 20, "")?;
        let json: Value =
            serde_json::from_slice(&text).map_err(|err| invalid(index, format!("not valid JSON: {err}")))?;
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid(index, "no weight_map object"))?;
        let mut files: Vec<String> = Vec::new();
        let mut expected = BTreeMap::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                invalid(
                    index,
                    format!("weight_map['{}'] is not a file name", name.escape_debug()),
                )
            })?;
            // Shard names are plain file names next to the index: no paths out of the directory.
            if file.contains('/') || file.contains('\\') || file == ".." || file.is_empty() {
                return Err(invalid(
                    index,
                    format!("shard name '{}' is not a plain file name", file.escape_debug()),
                ));
            }
            if !files.iter().any(|f| f == file) {
                files.push(file.to_string());
            }
            expected.insert(name.clone(), file.to_string());
        }
        files.sort();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        Self::open_files(&paths, Some((index, &expected)))
    }

    /// Maps `paths` and indexes their tensors; `index` (file, name -> shard file) is checked against them.
    fn open_files(paths: &[PathBuf], index: Option<(&Path, &BTreeMap<String, String>)>) -> Result<Self> {
        let mut shards = Vec::with_capacity(paths.len());
        let mut tensors = BTreeMap::new();
        for (i, path) in paths.iter().enumerate() {
            let (file, _) = open_regular(path)?;
            // SAFETY: the file is opened read-only and the mapping lives as long as `Shard`. Another
            // process truncating or rewriting the file while it is mapped would change the bytes under
            // us (or fault); checkpoints are inputs nobody writes while a run reads them, and every
            // tensor is copied out once at load time.
            let map = unsafe { Mmap::map(&file) }.map_err(|err| Error::Io {
                path: path.display().to_string(),
                message: format!("cannot memory-map: {err}"),
            })?;
            for (name, mut entry) in header_entries(path, &map)? {
                entry.shard = i;
                if tensors.insert(name.clone(), entry).is_some() {
                    return Err(invalid(
                        path,
                        format!("tensor '{}' is also in another shard", name.escape_debug()),
                    ));
                }
            }
            shards.push(Shard {
                path: path.clone(),
                map,
            });
        }
        if let Some((index, expected)) = index {
            for (name, file) in expected {
                let Some(entry) = tensors.get(name) else {
                    return Err(invalid(
                        index,
                        format!("tensor '{}' listed in {file} is not there", name.escape_debug()),
                    ));
                };
                if shards[entry.shard].path.file_name().and_then(|n| n.to_str()) != Some(file.as_str()) {
                    return Err(invalid(
                        index,
                        format!(
                            "tensor '{}' is listed in {file} but found in another shard",
                            name.escape_debug()
                        ),
                    ));
                }
            }
            if let Some(extra) = tensors.keys().find(|n| !expected.contains_key(*n)) {
                return Err(invalid(
                    index,
                    format!(
                        "tensor '{}' is in a shard but not in the weight_map",
                        extra.escape_debug()
                    ),
                ));
            }
        }
        Ok(Shards { shards, tensors })
    }

    /// Every tensor, by name.
    pub fn entries(&self) -> &BTreeMap<String, TensorEntry> {
        &self.tensors
    }

    /// The shard files.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Where `name` is, or an error naming it.
    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| Error::InvalidTensor {
            name: name.to_string(),
            reason: "missing from the checkpoint".to_string(),
        })
    }

    /// The raw little-endian bytes of `name`.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let e = self.entry(name)?;
        Ok(&self.shards[e.shard].map[e.start..e.end])
    }
}

/// The tensors in one file's header, with absolute byte ranges, after checking the file holds them.
fn header_entries(path: &Path, bytes: &[u8]) -> Result<Vec<(String, TensorEntry)>> {
    let too_short = || {
        invalid(
            path,
            format!("{} bytes: too short for a safetensors header", bytes.len()),
        )
    };
    let n = u64::from_le_bytes(
        bytes
            .get(..8)
            .ok_or_else(too_short)?
            .try_into()
            .map_err(|_| too_short())?,
    );
    let header_end = usize::try_from(n).ok().and_then(|n| n.checked_add(8));
    let Some(header) = header_end.and_then(|end| bytes.get(8..end)) else {
        return Err(invalid(
            path,
            format!("header length {n} is past the end of the file ({} bytes)", bytes.len()),
        ));
    };
    let data_start = 8 + header.len();
    // Name the first tensor that does not fit before the full validation below, which only says
    // that the buffer is incomplete.
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(header) {
        let available = bytes.len() - data_start;
        for (name, info) in &map {
            let end = info.get("data_offsets").and_then(|o| o.get(1)).and_then(Value::as_u64);
            if let Some(end) = end
                && end > available as u64
            {
                return Err(invalid(
                    path,
                    format!(
                        "tensor '{}' ends at data byte {end} but the file holds {available} data bytes (truncated?)",
                        name.escape_debug()
                    ),
                ));
            }
        }
    }
    let (_, metadata) = SafeTensors::read_metadata(bytes)
        .map_err(|err| invalid(path, format!("not a valid safetensors file: {err}")))?;
    let mut out = Vec::new();
    for (name, info) in metadata.tensors() {
        let (start, end) = info.data_offsets;
        out.push((
            name,
            TensorEntry {
                shard: 0,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: data_start + start,
                end: data_start + end,
            },
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}
