//! Raw binary stdin/stdout for `cast` and `decode`. Input is read whole into
//! memory (so a GB of f32 needs a GB of RAM plus the output) and output is
//! written only once everything converted: a failure never leaves half a file.

use std::io::{self, IsTerminal, Read, Write};

use crate::error::CliError;

/// All of stdin. Refuses a terminal: the data is binary and would never end.
pub fn read_stdin(what: &str) -> Result<Vec<u8>, CliError> {
    let stdin = io::stdin();
    if stdin.is_terminal() {
        return Err(CliError(format!(
            "stdin is a terminal; pipe or redirect {what} into it"
        )));
    }
    let mut bytes = Vec::with_capacity(stdin_file_size().unwrap_or(0));
    stdin
        .lock()
        .read_to_end(&mut bytes)
        .map_err(|err| CliError(format!("reading stdin: {err}")))?;
    Ok(bytes)
}

/// The size of stdin when it is a redirected regular file, so a multi-GB read
/// allocates once instead of doubling its way there (and peaking at 2x).
#[cfg(unix)]
fn stdin_file_size() -> Option<usize> {
    use std::os::fd::AsFd;
    let file = std::fs::File::from(io::stdin().as_fd().try_clone_to_owned().ok()?);
    let meta = file.metadata().ok()?;
    meta.is_file().then(|| usize::try_from(meta.len()).ok()).flatten()
}

#[cfg(not(unix))]
fn stdin_file_size() -> Option<usize> {
    None
}

/// Writes `bytes` to stdout in one go. Refuses a terminal: binary output there is noise.
pub fn write_stdout(bytes: &[u8]) -> Result<(), CliError> {
    let stdout = io::stdout();
    if stdout.is_terminal() && !bytes.is_empty() {
        return Err(CliError(
            "stdout is a terminal; redirect the binary output to a file or a pipe".into(),
        ));
    }
    if !bytes.is_empty() && stdout_was_closed() {
        return Err(CliError(
            "stdout is closed; redirect the binary output to a file or a pipe".into(),
        ));
    }
    let mut lock = stdout.lock();
    lock.write_all(bytes)
        .and_then(|()| lock.flush())
        .map_err(|err| CliError(format!("writing stdout: {err}")))
}

/// Whether the process started with stdout closed (`fp8 cast >&-`). The Rust runtime then puts
/// `/dev/null` on descriptor 1, opened read-write, so writes would succeed and vanish; a shell
/// redirection to `/dev/null` opens it write-only. Linux only (read from `/proc`).
fn stdout_was_closed() -> bool {
    let target = std::fs::read_link("/proc/self/fd/1");
    if !target.is_ok_and(|t| t == std::path::Path::new("/dev/null")) {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/fdinfo/1") else {
        return false;
    };
    // `flags:` is octal; the access mode is its low two bits (O_RDWR = 2).
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & 0o3 == 0o2)
}

/// Writes text to stdout (tables, reports). A reader that stops early
/// (`fp8 formats | head -3`) is not an error for text.
pub fn print_text(text: &str) -> Result<(), CliError> {
    let mut lock = io::stdout().lock();
    match lock.write_all(text.as_bytes()).and_then(|()| lock.flush()) {
        Err(err) if err.kind() != io::ErrorKind::BrokenPipe => Err(CliError(format!("writing stdout: {err}"))),
        _ => Ok(()),
    }
}
