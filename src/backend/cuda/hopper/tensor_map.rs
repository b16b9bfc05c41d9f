//! TMA tensor maps of the Hopper GEMM's operands: the arguments of
//! `cuTensorMapEncodeTiled`, built and checked on the CPU, and the driver call
//! that turns them into the 128-byte descriptor the kernel receives.
//!
//! An operand is `rows x K` FP8 codes, K-major (row stride K bytes). The map
//! is 2D with the inner dimension first, `{K, rows}`; its box is
//! `{128 bytes, box_rows}`, one 128-byte swizzle row per tile row, which is
//! the layout `wgmma` reads with a 128-byte-swizzle descriptor. Reads past the
//! edges are zero-filled, so ragged M, N and K tails add nothing to the sum.

use cudarc::driver::sys::{
    CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle,
};

use crate::backend::cuda::error::CudaResultExt;
use crate::backend::cuda::params::{FP8_WGMMA_BLOCK_K, Fp8TensorMap};
use crate::error::{Error, Result};

/// Bytes of one 128-byte swizzle span: the box's inner extent must equal it.
pub const SWIZZLE_SPAN: u64 = 128;
/// Largest box extent per dimension the hardware takes.
pub const MAX_BOX: u32 = 256;
/// Global address and row-stride alignment TMA needs.
pub const TMA_ALIGN: u64 = 16;
/// Largest global stride (bytes) a tensor map encodes.
pub const MAX_STRIDE: u64 = 1 << 40;
/// Largest extent per dimension.
pub const MAX_DIM: u64 = 1 << 32;

/// The arguments of `cuTensorMapEncodeTiled` for one 2D operand of FP8 codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapSpec {
    /// `{inner = K, outer = rows}` in elements (= bytes for FP8).
    pub global_dims: [u64; 2],
    /// Bytes from one row to the next (`globalStrides[0]`; the innermost stride is implicit).
    pub row_stride: u64,
    /// `{inner, outer}` extent of one TMA copy, in elements.
    pub box_dims: [u32; 2],
    /// Element strides within the box: `{1, 1}` (dense).
    pub element_strides: [u32; 2],
    /// Bytes per element (1 for FP8 codes).
    pub element_bytes: u64,
}

fn args(detail: String) -> Error {
    Error::KernelArgs {
        kernel: "gemm_wgmma",
        detail,
    }
}

impl TensorMapSpec {
    /// The map of a `rows x k` K-major FP8 operand read in boxes of `box_rows` rows x 128 bytes.
    pub fn fp8_operand(rows: usize, k: usize, box_rows: u32) -> Result<Self> {
        let spec = TensorMapSpec {
            global_dims: [k as u64, rows as u64],
            row_stride: k as u64,
            box_dims: [FP8_WGMMA_BLOCK_K, box_rows],
            element_strides: [1, 1],
            element_bytes: 1,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The driver's rules for a tiled, 128-byte-swizzled, non-interleaved map,
    /// plus ours (box inner extent = exactly one swizzle span).
    pub fn validate(&self) -> Result<()> {
        let [inner, outer] = self.global_dims;
        if inner == 0 || outer == 0 || inner > MAX_DIM || outer > MAX_DIM {
            return Err(args(format!(
                "tensor map dims {inner} x {outer}: each must be in 1..=2^32"
            )));
        }
        if !self.row_stride.is_multiple_of(TMA_ALIGN) || self.row_stride >= MAX_STRIDE {
            return Err(args(format!(
                "tensor map row stride {} bytes: must be a multiple of {TMA_ALIGN} and below 2^40 \
                 (K must be a multiple of 16)",
                self.row_stride
            )));
        }
        if self.row_stride < inner * self.element_bytes {
            return Err(args(format!(
                "tensor map row stride {} bytes is shorter than a row of {inner} elements",
                self.row_stride
            )));
        }
        for (i, &b) in self.box_dims.iter().enumerate() {
            if b == 0 || b > MAX_BOX {
                return Err(args(format!("tensor map box dim {i} = {b}: must be in 1..={MAX_BOX}")));
            }
        }
        let inner_box_bytes = self.box_dims[0] as u64 * self.element_bytes;
        if inner_box_bytes != SWIZZLE_SPAN {
            return Err(args(format!(
                "tensor map box inner extent {inner_box_bytes} bytes: the 128-byte swizzle needs exactly {SWIZZLE_SPAN}"
            )));
        }
        if self.element_strides.iter().any(|&s| s == 0 || s > 8) {
            return Err(args(format!(
                "tensor map element strides {:?}: each must be in 1..=8",
                self.element_strides
            )));
        }
        Ok(())
    }

    /// Bytes one box copies into shared memory (zero-filled parts included).
    pub fn box_bytes(&self) -> u64 {
        self.box_dims[0] as u64 * self.box_dims[1] as u64 * self.element_bytes
    }

    /// Checks the global address (16-byte aligned, non-null).
    pub fn validate_address(&self, address: u64) -> Result<()> {
        if address == 0 || !address.is_multiple_of(TMA_ALIGN) {
            return Err(args(format!(
                "tensor map global address {address:#x}: must be non-null and {TMA_ALIGN}-byte aligned"
            )));
        }
        Ok(())
    }

    /// Encodes the map for device address `address` with the driver
    /// (`cuTensorMapEncodeTiled`): u8 elements, 128-byte swizzle, no interleave,
    /// 256-byte L2 promotion, zero fill out of bounds. Needs the CUDA driver.
    pub fn encode(&self, address: u64) -> Result<Fp8TensorMap> {
        self.validate()?;
        self.validate_address(address)?;
        if !crate::backend::cuda::driver_present() {
            return Err(Error::NoGpu {
                reason: "the CUDA driver library (libcuda) is not installed".to_string(),
            });
        }
        cudarc::driver::result::init().call("cuInit")?;
        let strides = [self.row_stride];
        let mut map = CUtensorMap { opaque: [0; 16] };
        // SAFETY: the driver is loaded and initialised; `map` is a writable,
        // correctly aligned CUtensorMap; dims/strides/box/element-stride arrays
        // hold rank (2) entries, strides rank - 1; every value was validated
        // above against the documented limits; the address is only recorded.
        unsafe {
            cudarc::driver::sys::cuTensorMapEncodeTiled(
                &mut map,
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                2,
                address as *mut std::ffi::c_void,
                self.global_dims.as_ptr(),
                strides.as_ptr(),
                self.box_dims.as_ptr(),
                self.element_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .call("cuTensorMapEncodeTiled")?;
        Ok(Fp8TensorMap { opaque: map.opaque })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_map_fields() {
        let a = TensorMapSpec::fp8_operand(4096, 7168, 128).unwrap();
        assert_eq!(a.global_dims, [7168, 4096]);
        assert_eq!(a.row_stride, 7168);
        assert_eq!(a.box_dims, [128, 128]);
        assert_eq!(a.element_strides, [1, 1]);
        assert_eq!(a.box_bytes(), 16384);
        let b = TensorMapSpec::fp8_operand(2112, 7168, 256).unwrap();
        assert_eq!(b.box_dims, [128, 256]);
        assert_eq!(b.box_bytes(), 32768);
    }

    #[test]
    fn ragged_rows_and_short_k_are_fine() {
        // TMA zero-fills past the edges: rows and K need not fill a box.
        for (rows, k) in [(1, 16), (3, 48), (129, 144), (64, 2112)] {
            TensorMapSpec::fp8_operand(rows, k, 128).unwrap();
        }
    }

    #[test]
    fn k_must_keep_rows_16_byte_aligned() {
        for k in [1, 8, 24, 100, 7170] {
            let e = TensorMapSpec::fp8_operand(128, k, 128).unwrap_err();
            assert!(e.to_string().contains("multiple of 16"), "{k}: {e}");
        }
    }

    #[test]
    fn box_limits() {
        assert!(TensorMapSpec::fp8_operand(128, 128, 0).is_err());
        assert!(TensorMapSpec::fp8_operand(128, 128, 257).is_err());
        TensorMapSpec::fp8_operand(128, 128, 256).unwrap();
        let mut s = TensorMapSpec::fp8_operand(128, 128, 128).unwrap();
        s.box_dims[0] = 64; // half a swizzle span
        assert!(s.validate().unwrap_err().to_string().contains("exactly 128"));
        s.box_dims[0] = 128;
        s.element_bytes = 2; // 256 bytes: wider than the swizzle span
        assert!(s.validate().is_err());
    }

    #[test]
    fn dims_and_strides_limits() {
        assert!(TensorMapSpec::fp8_operand(0, 128, 128).is_err());
        assert!(TensorMapSpec::fp8_operand(128, 0, 128).is_err());
        assert!(TensorMapSpec::fp8_operand((1usize << 32) + 1, 128, 128).is_err());
        let mut s = TensorMapSpec::fp8_operand(128, 128, 128).unwrap();
        s.row_stride = 112; // shorter than a row
        assert!(s.validate().is_err());
        s.row_stride = MAX_STRIDE;
        assert!(s.validate().is_err());
        s.row_stride = 128;
        s.element_strides = [1, 9];
        assert!(s.validate().is_err());
    }

    #[test]
    fn address_alignment() {
        let s = TensorMapSpec::fp8_operand(128, 128, 128).unwrap();
        s.validate_address(0x7f00_0000_0100).unwrap();
        assert!(s.validate_address(0).is_err());
        assert!(s.validate_address(0x7f00_0000_0108).is_err());
    }

    #[test]
    fn encode_without_a_driver_is_an_error_not_a_panic() {
        let s = TensorMapSpec::fp8_operand(128, 128, 128).unwrap();
        if !crate::backend::cuda::driver_present() {
            assert!(matches!(s.encode(0x1000), Err(Error::NoGpu { .. })));
        }
        // A bad address is refused before the driver is asked.
        assert!(s.encode(0x1001).is_err());
    }
}
