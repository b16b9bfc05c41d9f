//! Compute backends. The CPU backend is the crate's reference code
//! (`convert`, and the quantizers); the CUDA backend runs the kernels of
//! `cuda/` through the driver API.

pub mod cuda;

/// The fatbins compiled by `build.rs` from `cuda/*.cu` (empty without nvcc).
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

    /// Whether this build carries compiled CUDA kernels.
    pub fn compiled() -> bool {
        !cfg!(fp8_no_kernels)
    }

    /// The fatbin of kernel file `module` (`cuda/<module>.cu`).
    pub fn fatbin(module: &str) -> Option<&'static [u8]> {
        FATBINS
            .iter()
            .find(|(name, _)| *name == module)
            .map(|(_, bytes)| *bytes)
    }
}
