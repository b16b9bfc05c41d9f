//! How much host memory a run may take: `MemAvailable` of `/proc/meminfo` on
//! Linux (memory that can be had without swapping), unknown elsewhere.

use crate::error::{Error, Result};

/// Bytes of host memory available now, if the platform says.
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

/// `MemAvailable:  123 kB` -> bytes.
fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let value: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Fails with both numbers when `needed` bytes (`None`: the size overflowed 64 bits) exceed
/// `available` (`None`: unknown, then only the overflow is an error).
pub fn check_fits(what: &str, needed: Option<u64>, available: Option<u64>) -> Result<()> {
    match (needed, available) {
        (None, _) => Err(Error::NotEnoughMemory {
            what: what.to_string(),
            needed: "more than 2^64 bytes".into(),
            available: available.map_or("unknown".into(), |a| format!("{a} bytes")),
        }),
        (Some(n), Some(a)) if n > a => Err(Error::NotEnoughMemory {
            what: what.to_string(),
            needed: format!("{n} bytes ({})", crate::memory::human_bytes(n)),
            available: format!("{a} bytes ({})", crate::memory::human_bytes(a)),
        }),
        _ => Ok(()),
    }
}

/// [`check_fits`] against the host's available memory.
pub fn ensure_fits(what: &str, needed: Option<u64>) -> Result<()> {
    check_fits(what, needed, available_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_parsed() {
        let text = "MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(text), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn too_large_and_overflowing_sizes_are_errors_naming_both_numbers() {
        assert!(check_fits("run", Some(10), Some(10)).is_ok());
        assert!(check_fits("run", Some(10), None).is_ok());
        let err = check_fits("run", Some(11), Some(10)).unwrap_err().to_string();
        assert!(err.contains("11 bytes") && err.contains("10 bytes"), "{err}");
        let err = check_fits("run", None, Some(10)).unwrap_err().to_string();
        assert!(err.contains("2^64"), "{err}");
    }
}
