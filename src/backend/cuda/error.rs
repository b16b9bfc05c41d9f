//! CUDA driver errors as crate errors carrying the CUDA error name.

use cudarc::driver::DriverError;

use super::params::{
    FP8_GEMM_ERROR_ARCH, FP8_WGMMA_ERROR_HANG, FP8_WGMMA_ERROR_SMEM, FP8_WGMMA_HANG_PARITY_SHIFT,
    FP8_WGMMA_HANG_ROLE_SHIFT, FP8_WGMMA_HANG_STAGE_SHIFT,
};
use crate::error::Error;

/// Wraps a failed driver call `call` with the error's name (e.g. `CUDA_ERROR_OUT_OF_MEMORY`) and text.
pub(crate) fn cuda_error(call: impl Into<String>, err: DriverError) -> Error {
    let name = err
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", err.0 as i32));
    let message = err
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::Cuda {
        call: call.into(),
        name,
        message,
    }
}

/// `Result<T, DriverError>` to the crate's `Result`, naming the call.
pub(crate) trait CudaResultExt<T> {
    fn call(self, call: &str) -> crate::Result<T>;
}

impl<T> CudaResultExt<T> for Result<T, DriverError> {
    fn call(self, call: &str) -> crate::Result<T> {
        self.map_err(|e| cuda_error(call, e))
    }
}

/// What a non-zero GEMM kernel error flag says (`None` for 0: no error).
pub fn describe_error_flag(flag: u32) -> Option<String> {
    if flag == 0 {
        return None;
    }
    Some(match flag & 0xFF {
        FP8_GEMM_ERROR_ARCH => "the kernel has no body for this GPU's architecture (not sm_90a)".to_string(),
        FP8_WGMMA_ERROR_SMEM => "launched with less dynamic shared memory than the ring needs".to_string(),
        FP8_WGMMA_ERROR_HANG => {
            let stage = (flag >> FP8_WGMMA_HANG_STAGE_SHIFT) & 0xFF;
            let parity = (flag >> FP8_WGMMA_HANG_PARITY_SHIFT) & 1;
            let role = match (flag >> FP8_WGMMA_HANG_ROLE_SHIFT) & 3 {
                0 => "the producer waited for the consumers to free a stage",
                1 => "the producer's final drain: the consumers never released a stage (stuck waiting for it to fill?)",
                _ => "unknown role",
            };
            format!("an mbarrier wait timed out (~10 s): {role}, stage {stage}, parity {parity}")
        }
        other => format!("unknown error code {other} (flag {flag:#x})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hang_codes_decode_like_the_kernel_encodes_them() {
        assert_eq!(describe_error_flag(0), None);
        let code = |stage: u32, parity: u32, role: u32| {
            FP8_WGMMA_ERROR_HANG
                | (stage << FP8_WGMMA_HANG_STAGE_SHIFT)
                | (parity << FP8_WGMMA_HANG_PARITY_SHIFT)
                | (role << FP8_WGMMA_HANG_ROLE_SHIFT)
        };
        let d = describe_error_flag(code(5, 1, 0)).unwrap();
        assert!(
            d.contains("producer") && d.contains("stage 5") && d.contains("parity 1"),
            "{d}"
        );
        let d = describe_error_flag(code(3, 0, 1)).unwrap();
        assert!(
            d.contains("drain") && d.contains("stage 3") && d.contains("parity 0"),
            "{d}"
        );
        assert!(
            describe_error_flag(FP8_WGMMA_ERROR_SMEM)
                .unwrap()
                .contains("shared memory")
        );
        assert!(describe_error_flag(FP8_GEMM_ERROR_ARCH).unwrap().contains("sm_90a"));
        assert!(describe_error_flag(0x77).unwrap().contains("unknown"));
    }
}
