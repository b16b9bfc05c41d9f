//! Guards around the wgmma kernels that need no GPU to test: the register
//! budget `setmaxnreg` relies on, and the meaning of the kernel's error flag.
//!
//! `setmaxnreg` moves registers between warpgroups of one CTA: the producer
//! gives up to 40, the consumers take 232, and 12 warps x 168 = 4 x 40 +
//! 8 x 232 = 64512 balances only if ptxas gave the kernel exactly 168. With
//! fewer, `setmaxnreg.inc 232` waits forever for registers nobody frees; so a
//! launch first asks the driver (`cuFuncGetAttribute`) and refuses otherwise.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute;

use crate::backend::cuda::error::CudaResultExt;
use crate::backend::cuda::params::FP8_WGMMA_THREADS;
use crate::error::{Error, Result};

/// Registers per thread the kernel's `setmaxnreg` split assumes (see the module doc).
pub const EXPECTED_REGS: i32 = 168;

/// `Ok` when a wgmma kernel got exactly [`EXPECTED_REGS`] registers and may run 384 threads.
pub fn check_resources(kernel: &'static str, num_regs: i32, max_threads: i32) -> Result<()> {
    if num_regs != EXPECTED_REGS || max_threads < FP8_WGMMA_THREADS as i32 {
        return Err(Error::KernelArgs {
            kernel,
            detail: format!(
                "the driver reports {num_regs} registers and at most {max_threads} threads per block; \
                 the kernel's setmaxnreg split needs exactly {EXPECTED_REGS} registers and {FP8_WGMMA_THREADS} \
                 threads (it would hang otherwise), so it is not launched"
            ),
        });
    }
    Ok(())
}

/// Asks the driver for `func`'s registers and thread limit once per (device, kernel) and checks them.
pub fn check_function(ordinal: usize, kernel: &'static str, func: &CudaFunction) -> Result<()> {
    static CHECKED: OnceLock<Mutex<HashSet<(usize, &'static str)>>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| Mutex::new(HashSet::new()));
    if checked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&(ordinal, kernel))
    {
        return Ok(());
    }
    let regs = func
        .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
        .call("cuFuncGetAttribute(NUM_REGS)")?;
    let threads = func
        .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        .call("cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)")?;
    check_resources(kernel, regs, threads)?;
    checked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((ordinal, kernel));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_balanced_register_count_passes() {
        check_resources("k", 168, 384).unwrap();
        check_resources("k", 168, 1024).unwrap();
        for (regs, threads) in [(160, 384), (128, 384), (232, 384), (168, 256)] {
            let e = check_resources("k", regs, threads).unwrap_err().to_string();
            assert!(e.contains(&regs.to_string()) && e.contains("168"), "{e}");
        }
    }

    #[test]
    fn the_balance_is_exact() {
        // 12 warps of 32 threads at 168 = producer 4 warps at 40 + consumers 8 warps at 232.
        assert_eq!(12 * 32 * EXPECTED_REGS, 4 * 32 * 40 + 8 * 32 * 232);
    }
}
