//! The CUDA arm of `transpose_fp8`: a frozen FP8 weight's `W^T` made from its device copy
//! (`fp8_transpose_8`), so the dgrad GEMM reads it in place and the host neither transposes
//! nor uploads the codes each backward.

use super::cast::read_fp8_codes;
use super::{staged, switches};
use crate::backend::cuda::gemm::{Fp8Mirror, UploadedScales, held_codes};
use crate::dispatch::CudaKernels;
use crate::error::{Error, Result};
use crate::quantize::{transpose_matrix, transposed_scales};
use crate::tensor::{DeviceMirror, QuantizedMatrix, Scales};

/// The exact transpose of `m` on the device: its codes transposed from its device copy (or,
/// without one on this GPU, from its codes uploaded for the transpose), its scales transposed on the
/// host (a 128x128 grid is `rows * cols / 16384` values) and uploaded. The result's codes stay
/// on the device (booked as workspace, freed with it); a host reader reads them back.
/// With `FP8_CUDA_MIRRORS=0` (no device copies) the host transpose, as the staged path did.
pub(crate) fn transpose_fp8(k: &CudaKernels, m: &QuantizedMatrix) -> Result<QuantizedMatrix> {
    let s = staged(k)?;
    // The layout is checked first: a refused one is refused on every path.
    let scales = transposed_scales(m)?;
    if m.is_empty() || !switches::mirrors_enabled() {
        return transpose_matrix(m);
    }
    // The held codes on this GPU, else the codes alone uploaded for this transpose.
    let uploaded;
    let codes = match held_codes(s.device(), m) {
        Some(codes) => codes,
        None => {
            uploaded = s.up(m.data())?;
            &*uploaded
        }
    };
    let mut codes_t = s.scratch::<u8>(m.len())?;
    s.device().transpose_8(codes, m.rows(), m.cols(), &mut codes_t)?;
    let device_scales = match &scales {
        Scales::PerTensor(v) => UploadedScales::F32(s.up(&[*v])?.into_buffer(), scales.kind()),
        Scales::Block128x128(v) => UploadedScales::F32(s.up(v)?.into_buffer(), scales.kind()),
        // `transposed_scales` returns no other layout.
        other => {
            return Err(Error::KernelArgs {
                kernel: "transpose_8",
                detail: format!("{:?} scales have no exact transpose", other.kind()),
            });
        }
    };
    let mirror = Fp8Mirror {
        codes: codes_t.into_buffer(),
        scales: device_scales,
    }
    .into_tensor_mirror(s.device());
    QuantizedMatrix::held_on_device(
        m.cols(),
        m.rows(),
        scales,
        DeviceMirror {
            read_back: Some(read_fp8_codes),
            read_scales: None,
            ..mirror
        },
    )
}
