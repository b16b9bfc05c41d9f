//! A memory table in the spirit of `torch.cuda.memory_summary()`: current and
//! peak bytes of every [`MemoryCategory`] of a [`MemoryLedger`], and the
//! total's peak (the peak of the sum, which is less than the sum of the peaks).
//!
//! The CUDA backend's buffers update the ledger themselves. On the CPU the
//! training loop reports sizes it knows (parameters, moments, saved
//! activations, weight caches) with [`set_usage`] after each phase.

pub use crate::memory::human_bytes;
use std::fmt::Write;

use crate::device::{MemoryCategory, MemoryLedger};

/// Makes `category`'s current bytes equal `bytes` (allocating or freeing the difference),
/// so its peak follows. For one writer per category; concurrent writers would race.
pub fn set_usage(ledger: &MemoryLedger, category: MemoryCategory, bytes: u64) {
    let current = ledger.usage(category).current;
    if bytes > current {
        ledger.allocate(category, bytes - current);
    } else {
        ledger.free(category, current - bytes);
    }
}

/// The table: one row per category (current and peak, human-readable and in bytes), then the total.
pub fn memory_summary(ledger: &MemoryLedger) -> String {
    let report = ledger.report();
    let rule = |c: char| format!("|{}|\n", c.to_string().repeat(78));
    let mut out = String::new();
    out.push_str(&rule('='));
    let _ = writeln!(out, "|{:^78}|", "fp8-engine memory summary");
    out.push_str(&rule('-'));
    let _ = writeln!(
        out,
        "| {:<24}| {:>24}| {:>24} |",
        "category", "current (bytes)", "peak (bytes)"
    );
    out.push_str(&rule('-'));
    let row = |out: &mut String, name: &str, current: u64, peak: u64| {
        let cell = |b: u64| format!("{} ({b})", human_bytes(b));
        let _ = writeln!(out, "| {:<24}| {:>24}| {:>24} |", name, cell(current), cell(peak));
    };
    for (category, usage) in &report.categories {
        row(&mut out, category.name(), usage.current, usage.peak);
    }
    out.push_str(&rule('-'));
    row(&mut out, "total", report.total.current, report.total.peak);
    out.push_str(&rule('='));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(12 * 1024 * 1024), "12.0 MiB");
        assert_eq!(human_bytes(300 << 30), "300 GiB");
    }

    #[test]
    fn set_usage_moves_current_and_keeps_the_peak() {
        let ledger = MemoryLedger::new();
        set_usage(&ledger, MemoryCategory::Activations, 1000);
        set_usage(&ledger, MemoryCategory::Activations, 200);
        set_usage(&ledger, MemoryCategory::Activations, 600);
        let usage = ledger.usage(MemoryCategory::Activations);
        assert_eq!((usage.current, usage.peak), (600, 1000));
        assert_eq!(ledger.total().current, 600);
    }

    #[test]
    fn summary_lists_every_category_with_current_and_peak() {
        let ledger = MemoryLedger::new();
        set_usage(&ledger, MemoryCategory::MasterWeights, 4096);
        set_usage(&ledger, MemoryCategory::OptimizerState, 8192);
        set_usage(&ledger, MemoryCategory::Activations, 3 << 20);
        set_usage(&ledger, MemoryCategory::Activations, 0);
        let text = memory_summary(&ledger);
        for category in MemoryCategory::ALL {
            assert_eq!(
                text.lines()
                    .filter(|l| l.starts_with(&format!("| {:<24}|", category.name())))
                    .count(),
                1,
                "{}",
                category.name()
            );
        }
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("| {name:<24}|")))
                .unwrap()
                .to_string()
        };
        assert!(line("master weights").contains("4.00 KiB (4096)"));
        let activations = line("activations");
        assert!(
            activations.contains("0 B (0)") && activations.contains("3.00 MiB (3145728)"),
            "{activations}"
        );
        // Total: current 12288, peak 12288 + 3 MiB (activations peaked while the rest was live).
        let total = line("total");
        assert!(
            total.contains("(12288)") && total.contains(&format!("({})", 12288 + (3 << 20))),
            "{total}"
        );
        assert!(text.lines().all(|l| l.chars().count() == 80), "{text}");
    }
}
