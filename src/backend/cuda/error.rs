//! CUDA driver errors as crate errors carrying the CUDA error name.

use cudarc::driver::DriverError;

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
