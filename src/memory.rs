//! Memory accounting by category, shared by the CPU and CUDA backends: bytes
//! in use and the peak of each category, updated by every tracked allocation.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// What an allocation holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryCategory {
    /// Model parameters in their compute dtype (the bf16/fp16 copies the GEMMs read;
    /// with an f32 policy, the master weights themselves are counted under [`Self::MasterWeights`]).
    Parameters,
    /// f32 master weights the optimizer updates.
    MasterWeights,
    /// Gradients of the parameters.
    Gradients,
    /// Optimizer state (AdamW moments).
    OptimizerState,
    /// Activations saved for the backward pass.
    Activations,
    /// FP8 copies of tensors and their caches (transposes, scales).
    Fp8Copies,
    /// Scratch space of kernels and libraries.
    Workspace,
}

impl MemoryCategory {
    /// Number of categories.
    pub const COUNT: usize = 7;

    /// Every category, in report order.
    pub const ALL: [MemoryCategory; Self::COUNT] = [
        MemoryCategory::Parameters,
        MemoryCategory::MasterWeights,
        MemoryCategory::Gradients,
        MemoryCategory::OptimizerState,
        MemoryCategory::Activations,
        MemoryCategory::Fp8Copies,
        MemoryCategory::Workspace,
    ];

    /// Human-readable name.
    pub fn name(self) -> &'static str {
        match self {
            MemoryCategory::Parameters => "parameters",
            MemoryCategory::MasterWeights => "master weights",
            MemoryCategory::Gradients => "gradients",
            MemoryCategory::OptimizerState => "optimizer state",
            MemoryCategory::Activations => "activations",
            MemoryCategory::Fp8Copies => "FP8 copies and caches",
            MemoryCategory::Workspace => "workspace",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Current and peak bytes of one category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes allocated now.
    pub current: u64,
    /// Highest `current` seen.
    pub peak: u64,
}

/// Thread-safe counters: one current/peak pair per category, plus the total's peak.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    current: [AtomicU64; MemoryCategory::COUNT],
    peak: [AtomicU64; MemoryCategory::COUNT],
    total_current: AtomicU64,
    total_peak: AtomicU64,
}

impl MemoryLedger {
    /// All counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an allocation of `bytes` in `category`.
    pub fn allocate(&self, category: MemoryCategory, bytes: u64) {
        let i = category.index();
        let now = self.current[i].fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak[i].fetch_max(now, Ordering::Relaxed);
        let total = self.total_current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.total_peak.fetch_max(total, Ordering::Relaxed);
    }

    /// Records that `bytes` of `category` were freed. Freeing more than is booked leaves the
    /// counter at 0 (a booking released twice must not wrap to 2^64).
    pub fn free(&self, category: MemoryCategory, bytes: u64) {
        let i = category.index();
        let booked = self.current[i]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_sub(bytes)))
            .unwrap_or_else(|c| c);
        let freed = booked.min(bytes);
        let _ = self
            .total_current
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_sub(freed)));
    }

    /// Sets every peak to the current bytes, so later peaks count from now.
    pub fn restart_peaks(&self) {
        for (current, peak) in self.current.iter().zip(&self.peak) {
            peak.store(current.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.total_peak
            .store(self.total_current.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Current and peak bytes of one category.
    pub fn usage(&self, category: MemoryCategory) -> MemoryUsage {
        let i = category.index();
        MemoryUsage {
            current: self.current[i].load(Ordering::Relaxed),
            peak: self.peak[i].load(Ordering::Relaxed),
        }
    }

    /// Current and peak bytes of all categories together (the peak of the sum, not the sum of the peaks).
    pub fn total(&self) -> MemoryUsage {
        MemoryUsage {
            current: self.total_current.load(Ordering::Relaxed),
            peak: self.total_peak.load(Ordering::Relaxed),
        }
    }

    /// A snapshot of every category.
    pub fn report(&self) -> MemoryReport {
        MemoryReport {
            categories: MemoryCategory::ALL.map(|c| (c, self.usage(c))),
            total: self.total(),
        }
    }
}

/// A snapshot of a ledger, printable as a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    /// Each category's usage.
    pub categories: [(MemoryCategory, MemoryUsage); MemoryCategory::COUNT],
    /// All categories together.
    pub total: MemoryUsage,
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<22} {:>14} {:>14}", "category", "current bytes", "peak bytes")?;
        for (category, usage) in &self.categories {
            writeln!(f, "{:<22} {:>14} {:>14}", category.name(), usage.current, usage.peak)?;
        }
        write!(f, "{:<22} {:>14} {:>14}", "total", self.total.current, self.total.peak)
    }
}

/// Bytes in binary units with three significant digits: `512 B`, `1.50 KiB`, `12.0 MiB`, `3.25 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let decimals = if value < 10.0 {
        2
    } else if value < 100.0 {
        1
    } else {
        0
    };
    format!("{value:.decimals$} {}", UNITS[unit])
}

/// A byte count as people write it: `24GiB`, `24 GiB`, `80GB`, `512MiB`, `1048576`. Binary units
/// (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) of 1000; a fraction is
/// allowed with a unit (`1.5GiB`). `None` for anything else or a count past 2^64.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let factor: f64 = match unit.trim() {
        "" | "B" => return number.parse().ok(),
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    let bytes = (value * factor).round();
    (0.0..18_446_744_073_709_551_616.0)
        .contains(&bytes)
        .then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freeing_more_than_is_booked_stops_at_zero() {
        let ledger = MemoryLedger::new();
        ledger.allocate(MemoryCategory::Gradients, 100);
        ledger.allocate(MemoryCategory::Activations, 50);
        ledger.free(MemoryCategory::Gradients, 300);
        assert_eq!(ledger.usage(MemoryCategory::Gradients).current, 0);
        // The total loses only what the category had.
        assert_eq!(ledger.total().current, 50);
        assert_eq!(ledger.usage(MemoryCategory::Gradients).peak, 100);
    }

    #[test]
    fn byte_counts_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_bytes("24GiB"), Some(24 << 30));
        assert_eq!(parse_bytes("24 GiB"), Some(24 << 30));
        assert_eq!(parse_bytes("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_bytes("80GB"), Some(80_000_000_000));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        for bad in ["", "GiB", "24 GiBs", "-1GiB", "1.5", "1e3", "99999999999TiB"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn peaks_follow_the_highest_current_per_category_and_in_total() {
        let ledger = MemoryLedger::new();
        ledger.allocate(MemoryCategory::Parameters, 100);
        ledger.allocate(MemoryCategory::Workspace, 50);
        ledger.free(MemoryCategory::Workspace, 50);
        ledger.allocate(MemoryCategory::Workspace, 20);
        assert_eq!(
            ledger.usage(MemoryCategory::Parameters),
            MemoryUsage {
                current: 100,
                peak: 100
            }
        );
        assert_eq!(
            ledger.usage(MemoryCategory::Workspace),
            MemoryUsage { current: 20, peak: 50 }
        );
        assert_eq!(
            ledger.total(),
            MemoryUsage {
                current: 120,
                peak: 150
            }
        );
        assert_eq!(ledger.usage(MemoryCategory::Gradients), MemoryUsage::default());
    }
}
