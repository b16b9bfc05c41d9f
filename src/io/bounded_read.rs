//! Bounded reads of input files: only regular files (a device, pipe or
//! directory where a file is expected is an error, not an endless read), never
//! more than a stated size, and safetensors files checked from their header
//! before the tensor data is read.

use std::fs::{self, File};
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// The safetensors format's own cap on the JSON header (the reference reader refuses larger ones).
pub const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

fn io_error(path: &Path, message: String) -> Error {
    Error::Io {
        path: path.display().to_string(),
        message,
    }
}

fn invalid(path: &Path, reason: String) -> Error {
    Error::InvalidFile {
        path: path.display().to_string(),
        reason,
    }
}

/// Opens `path` for reading if it is a regular file (a symlink to one is fine) and returns it
/// with its length. The type is checked before opening, because opening a named pipe blocks.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    let not_regular = |meta: &fs::Metadata| {
        io_error(
            path,
            format!(
                "not a regular file ({}): only regular files are read",
                if meta.is_dir() {
                    "a directory"
                } else {
                    "a device, pipe or socket"
                }
            ),
        )
    };
    let meta = fs::metadata(path).map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let file = File::open(path).map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    // Checked again on the open handle: the path may have been swapped in between.
    let meta = file
        .metadata()
        .map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    Ok((file, meta.len()))
}

/// Reads a whole regular file of at most `limit` bytes; `raise` says how to raise the limit.
pub fn read_regular(path: &Path, limit: u64, raise: &str) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path)?;
    let too_large = |len: u64| {
        io_error(
            path,
            format!("the file is {len} bytes, more than the limit of {limit} bytes{raise}"),
        )
    };
    if len > limit {
        return Err(too_large(len));
    }
    let mut bytes = Vec::new();
    // take(limit + 1): a file that grows while it is read still cannot exceed the limit.
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Reads a safetensors file after checking its header: the header length must fit the file and
/// the format's cap, the header must be JSON whose `data_offsets` end exactly at the end of the
/// file. Only then is the tensor data read, so a huge file with a lying header costs 8 + header
/// bytes, not its whole size.
pub fn read_safetensors(path: &Path) -> Result<Vec<u8>> {
    let (mut file, len) = open_regular(path)?;
    let mut prefix = [0u8; 8];
    if len < 8 {
        return Err(invalid(
            path,
            format!("not a valid safetensors file: {len} bytes, shorter than the 8-byte header length"),
        ));
    }
    file.read_exact(&mut prefix)
        .map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_SAFETENSORS_HEADER || header_len > len - 8 {
        return Err(invalid(
            path,
            format!(
                "not a valid safetensors file: header length {header_len} exceeds the file's {} remaining bytes \
                 or the format's cap of {MAX_SAFETENSORS_HEADER}",
                len - 8
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(8 + header_len as usize);
    bytes.extend_from_slice(&prefix);
    (&mut file)
        .take(header_len)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    let data_len = declared_data_len(&bytes[8..])
        .map_err(|reason| invalid(path, format!("not a valid safetensors file: {reason}")))?;
    let expected = len - 8 - header_len;
    if data_len != expected {
        return Err(invalid(
            path,
            format!(
                "not a valid safetensors file: the header describes {data_len} bytes of tensor data, the file holds {expected}"
            ),
        ));
    }
    bytes.try_reserve_exact(expected as usize).map_err(|e| {
        io_error(
            path,
            format!("cannot hold {expected} bytes of tensor data in memory: {e}"),
        )
    })?;
    file.take(expected)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 != len {
        return Err(io_error(path, "the file changed while it was read".into()));
    }
    Ok(bytes)
}

/// The end of the last tensor's data as the header declares it (0 with no tensors).
pub fn declared_data_len(header: &[u8]) -> std::result::Result<u64, String> {
    let text = std::str::from_utf8(header).map_err(|_| "the header is not UTF-8".to_string())?;
    let value: serde_json::Value =
        serde_json::from_str(text.trim_end()).map_err(|e| format!("the header is not JSON: {e}"))?;
    let map = value.as_object().ok_or("the header is not a JSON object")?;
    let mut end = 0u64;
    for (name, entry) in map {
        if name == "__metadata__" {
            continue;
        }
        let offsets = entry
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .and_then(|o| Some((o[0].as_u64()?, o[1].as_u64()?)))
            .ok_or_else(|| format!("tensor {} has no valid data_offsets", crate::io::escaped(name)))?;
        end = end.max(offsets.1);
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("fp8-bounded-{name}-{}", std::process::id()));
        fs::write(&path, bytes).unwrap();
        path
    }

    fn safetensors_with(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data, 0);
        out
    }

    #[test]
    fn directories_and_devices_are_refused() {
        let err = read_regular(&std::env::temp_dir(), 10, "").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        #[cfg(unix)]
        {
            let err = read_safetensors(Path::new("/dev/zero")).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
    }

    #[test]
    fn limits_are_enforced() {
        let path = scratch("limit", b"0123456789");
        assert_eq!(read_regular(&path, 10, "").unwrap().len(), 10);
        let err = read_regular(&path, 9, " (raise it with --flag)")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("10 bytes, more than the limit of 9 bytes (raise it with --flag)"),
            "{err}"
        );
    }

    #[test]
    fn safetensors_headers_are_checked_against_the_file_length() {
        let good = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let path = scratch("good", &safetensors_with(good, 8));
        assert_eq!(read_safetensors(&path).unwrap().len(), 8 + good.len() + 8);
        let path = scratch("extra", &safetensors_with(good, 4096));
        let err = read_safetensors(&path).unwrap_err().to_string();
        assert!(
            err.contains("describes 8 bytes of tensor data, the file holds 4096"),
            "{err}"
        );
        let mut lying = safetensors_with(good, 8);
        lying[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let path = scratch("lying", &lying);
        let err = read_safetensors(&path).unwrap_err().to_string();
        assert!(err.contains("header length"), "{err}");
    }
}
