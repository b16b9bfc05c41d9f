//! Length checks shared by the ops: every buffer against the shape it is used with.

use crate::error::{Error, Result};

/// `rows * cols`, or a typed error when it overflows.
pub(crate) fn elements(what: &'static str, rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or_else(|| Error::InvalidShape {
        what,
        reason: format!("{rows} x {cols} elements overflow usize"),
    })
}

/// Checks that `got` is the `rows x cols` a buffer named `what` must hold.
pub(crate) fn len(what: &'static str, rows: usize, cols: usize, got: usize) -> Result<()> {
    let expected = elements(what, rows, cols)?;
    if got != expected {
        return Err(Error::ShapeMismatch {
            what,
            rows,
            cols,
            expected,
            got,
        });
    }
    Ok(())
}

/// Rows per parallel task in row-wise ops: big enough to amortise scheduling,
/// small enough to split a 2-core machine's work evenly. Fixed, so that partial
/// sums (dgamma, the loss) are added in the same order on any thread count.
pub(crate) fn rows_per_task(cols: usize) -> usize {
    // ~32 K values per task.
    (32 * 1024 / cols.max(1)).clamp(1, 1024)
}
