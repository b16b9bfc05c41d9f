//! Atomic, symlink-safe replacement of an output file.
//!
//! The bytes go to a temporary file created exclusively (`O_CREAT | O_EXCL`,
//! which also refuses to follow a symlink planted at that name) with an
//! unpredictable name in the target's directory, are flushed to disk, and the
//! file is renamed over the target, so a reader sees the old file or the new
//! one, never a mix. Only a regular file (or nothing) is ever replaced, and a
//! replaced file's permissions are kept. Temporary files that a killed run left
//! behind are removed by the next write to the same directory.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

/// Every temporary file we create ends with this, after `.NAME.PID.` and a random part.
const TEMP_SUFFIX: &str = ".fp8tmp";

/// A stale temporary file whose writer cannot be identified as dead is removed after this long.
const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

fn io_error(path: &Path, message: String) -> Error {
    Error::Io {
        path: path.display().to_string(),
        message,
    }
}

/// What kind of thing sits at a path, for error messages.
fn kind_name(file_type: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_fifo() {
            return "a named pipe";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Checks that `path` is nothing or a regular file (never following a symlink), and returns the
/// existing file's metadata. Callers run it before long work so a bad output path fails first.
pub fn check_output_path(path: &Path) -> Result<Option<fs::Metadata>> {
    if path.file_name().is_none() {
        return Err(io_error(path, "not a file name".into()));
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => Ok(Some(meta)),
        Ok(meta) => Err(io_error(
            path,
            format!(
                "refusing to replace it: it is {}, and only a regular file is ever replaced",
                kind_name(&meta.file_type())
            ),
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(io_error(path, format!("cannot inspect the output path: {err}"))),
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `path` atomically (see the module documentation). On failure the temporary
/// file is removed and `path` is left as it was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let existing = check_output_path(path)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let dir = parent_dir(path);
    remove_stale_temps(&dir, &name);
    let prefix = format!(".{name}.{}.", std::process::id());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(TEMP_SUFFIX).rand_bytes(12);
    // A new output gets the usual 0666 less the umask, like any created file, not tempfile's 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let mut temp = builder.tempfile_in(&dir).map_err(|e| {
        io_error(
            path,
            format!("cannot create a temporary file in {}: {e}", dir.display()),
        )
    })?;
    temp.write_all(bytes)
        .map_err(|e| io_error(path, format!("cannot write: {e}")))?;
    if let Some(meta) = &existing {
        temp.as_file()
            .set_permissions(meta.permissions())
            .map_err(|e| io_error(path, format!("cannot keep the file's permissions: {e}")))?;
    }
    temp.as_file()
        .sync_all()
        .map_err(|e| io_error(path, format!("cannot flush: {e}")))?;
    // Checked again right before the rename: something may have appeared at the path meanwhile.
    check_output_path(path)?;
    temp.persist(path).map_err(|e| {
        io_error(
            path,
            format!("cannot rename the temporary file into place: {}", e.error),
        )
    })?;
    sync_dir(&dir);
    Ok(())
}

/// Flushes the directory entry of the rename (best effort: not every platform can open a directory).
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(handle) = fs::File::open(dir) {
        let _ = handle.sync_all();
    }
}

/// The writer's process id if `file` is one of our temporary files for `name`.
fn temp_owner(file: &OsStr, name: &str) -> Option<u32> {
    let file = file.to_str()?;
    let rest = file.strip_prefix(&format!(".{name}."))?.strip_suffix(TEMP_SUFFIX)?;
    let (pid, random) = rest.split_once('.')?;
    (!random.is_empty() && !random.contains('.')).then_some(())?;
    pid.parse().ok()
}

/// Whether the process that made a temporary file is certainly gone.
fn writer_is_gone(pid: u32, modified: Option<SystemTime>) -> bool {
    if pid == std::process::id() {
        return false;
    }
    let proc_fs = Path::new("/proc/self");
    if proc_fs.exists() {
        return !Path::new("/proc").join(pid.to_string()).exists();
    }
    modified
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age > STALE_AFTER)
}

/// Removes regular files of our temporary naming pattern for `name` in `dir` whose writer is gone.
/// Best effort: a file that cannot be removed is left for the next write.
fn remove_stale_temps(dir: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = temp_owner(&entry.file_name(), name) else {
            continue;
        };
        // symlink_metadata: a planted symlink is never followed, only our own regular files go.
        let Ok(meta) = fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if meta.file_type().is_file() && writer_is_gone(pid, meta.modified().ok()) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fp8-atomic-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn writes_and_replaces_a_regular_file_keeping_its_permissions() {
        let dir = scratch("replace");
        let path = dir.join("out.bin");
        write_atomic(&path, b"one").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // A new output gets the mode any newly created file gets (0666 less the umask).
            let plain = dir.join("plain");
            fs::File::create(&plain).unwrap();
            let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path), mode(&plain));
            fs::remove_file(&plain).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
            write_atomic(&path, b"two").unwrap();
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        }
        write_atomic(&path, b"three").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"three");
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    }

    #[test]
    fn refuses_directories_and_symlinks() {
        let dir = scratch("refuse");
        let sub = dir.join("sub");
        fs::create_dir(&sub).unwrap();
        let err = write_atomic(&sub, b"x").unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        #[cfg(unix)]
        {
            let victim = dir.join("victim");
            fs::write(&victim, b"keep").unwrap();
            let link = dir.join("link");
            std::os::unix::fs::symlink(&victim, &link).unwrap();
            let err = write_atomic(&link, b"x").unwrap_err().to_string();
            assert!(err.contains("a symbolic link"), "{err}");
            assert_eq!(fs::read(&victim).unwrap(), b"keep");
        }
    }

    #[test]
    fn stale_temps_of_dead_writers_are_removed_and_others_kept() {
        let dir = scratch("stale");
        // PID 0 is never a user process: the writer is gone.
        let stale = dir.join(".out.bin.0.abcdefabcdef.fp8tmp");
        let own = dir.join(format!(".out.bin.{}.abcdefabcdef.fp8tmp", std::process::id()));
        let other = dir.join(".other.0.abcdefabcdef.fp8tmp");
        for p in [&stale, &own, &other] {
            fs::write(p, b"partial").unwrap();
        }
        write_atomic(&dir.join("out.bin"), b"x").unwrap();
        assert!(!stale.exists());
        assert!(own.exists() && other.exists());
    }

    #[test]
    fn temp_names_parse_only_our_pattern() {
        assert_eq!(temp_owner(OsStr::new(".a.b.12.xYz.fp8tmp"), "a.b"), Some(12));
        assert_eq!(temp_owner(OsStr::new(".a.b.12.fp8tmp"), "a.b"), None);
        assert_eq!(temp_owner(OsStr::new(".a.b.x.yz.fp8tmp"), "a.b"), None);
        assert_eq!(temp_owner(OsStr::new(".a.b.12.xyz.tmp"), "a.b"), None);
    }
}
