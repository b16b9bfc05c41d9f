//! Staged arms of the layer ops: dtype conversion, norms, activations, attention
//! (training and cached), rotary embedding, residual add, column sum (launchers
//! in `backend::cuda::{convert, norm, activation, attention, attention_cached,
//! rope}`). Each: upload inputs (and in-place state), launch, download outputs;
//! the launcher checks every length against the shape.

use half::{bf16, f16};

use super::{Pooled, Staged, staged};
use crate::backend::cuda::DeviceElement;
use crate::backend::cuda::norm::NormParamsRef;
use crate::backend::cuda::rope::{RopeDirection, host_rows};
use crate::dispatch::{AttentionShape, CachedAttentionShape, CudaKernels, NormShape, PlainMat, RopeShape, RopeTable};
use crate::error::Result;
use crate::ops::attention_cached::nothing_to_do;
use crate::tensor::Dtype;

/// `[rows, cols]` f32 values converted on the device to `T`, transposed when asked.
fn convert_to<T: DeviceElement + Pooled>(
    s: &Staged,
    src: &[f32],
    (rows, cols): (usize, usize),
    transpose: bool,
) -> Result<Vec<T>> {
    let x = s.up(src)?;
    let mut y = s.scratch::<T>(src.len())?;
    s.device().convert(&x, rows, cols, transpose, &mut y)?;
    s.down_vec(&y)
}

fn convert_plain(
    k: &CudaKernels,
    dtype: Dtype,
    src: &[f32],
    shape: (usize, usize),
    transpose: bool,
) -> Result<PlainMat> {
    let s = staged(k)?;
    Ok(match dtype {
        Dtype::F32 => PlainMat::F32(convert_to::<f32>(&s, src, shape, transpose)?),
        Dtype::Bf16 => PlainMat::Bf16(convert_to::<bf16>(&s, src, shape, transpose)?),
        Dtype::F16 => PlainMat::F16(convert_to::<f16>(&s, src, shape, transpose)?),
    })
}

pub(crate) fn convert(k: &CudaKernels, dtype: Dtype, src: &[f32]) -> Result<PlainMat> {
    convert_plain(k, dtype, src, (1, src.len()), false)
}

pub(crate) fn convert_transposed(
    k: &CudaKernels,
    dtype: Dtype,
    src: &[f32],
    rows: usize,
    cols: usize,
) -> Result<PlainMat> {
    convert_plain(k, dtype, src, (rows, cols), true)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_forward(
    k: &CudaKernels,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    shape: NormShape,
    eps: f32,
    zero_centered: bool,
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (x_d, gamma_d, beta_d) = (s.up(x)?, s.up(gamma)?, s.up(beta)?);
    let (mut y_d, mut mean_d, mut rstd_d) = (s.scratch(y.len())?, s.scratch(mean.len())?, s.scratch(rstd.len())?);
    let params = NormParamsRef {
        gamma: &gamma_d,
        beta: Some(&beta_d),
        zero_centered,
    };
    s.device().norm_forward(
        &x_d,
        params,
        shape,
        eps,
        Some(&mut y_d),
        None,
        Some(&mut mean_d),
        &mut rstd_d,
    )?;
    s.down(&y_d, y)?;
    s.down(&mean_d, mean)?;
    s.down(&rstd_d, rstd)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_backward(
    k: &CudaKernels,
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    shape: NormShape,
    zero_centered: bool,
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (dy_d, x_d, gamma_d, mean_d, rstd_d) = (s.up(dy)?, s.up(x)?, s.up(gamma)?, s.up(mean)?, s.up(rstd)?);
    // LayerNorm has a beta; its value is not read by the backward, only its presence.
    let beta_d = s.scratch::<f32>(gamma.len())?;
    let mut dx_d = s.scratch(dx.len())?;
    let (mut dgamma_d, mut dbeta_d) = (s.up(dgamma)?, s.up(dbeta)?);
    let params = NormParamsRef {
        gamma: &gamma_d,
        beta: Some(&beta_d),
        zero_centered,
    };
    s.device().norm_backward(
        &dy_d,
        &x_d,
        params,
        Some(&mean_d),
        &rstd_d,
        shape,
        &mut dx_d,
        &mut dgamma_d,
        Some(&mut dbeta_d),
    )?;
    s.down(&dx_d, dx)?;
    s.down(&dgamma_d, dgamma)?;
    s.down(&dbeta_d, dbeta)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_forward(
    k: &CudaKernels,
    x: &[f32],
    gamma: &[f32],
    shape: NormShape,
    eps: f32,
    zero_centered: bool,
    y: &mut [f32],
    rstd: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (x_d, gamma_d) = (s.up(x)?, s.up(gamma)?);
    let (mut y_d, mut rstd_d) = (s.scratch(y.len())?, s.scratch(rstd.len())?);
    let params = NormParamsRef {
        gamma: &gamma_d,
        beta: None,
        zero_centered,
    };
    s.device()
        .norm_forward(&x_d, params, shape, eps, Some(&mut y_d), None, None, &mut rstd_d)?;
    s.down(&y_d, y)?;
    s.down(&rstd_d, rstd)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_backward(
    k: &CudaKernels,
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    rstd: &[f32],
    shape: NormShape,
    zero_centered: bool,
    dx: &mut [f32],
    dgamma: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (dy_d, x_d, gamma_d, rstd_d) = (s.up(dy)?, s.up(x)?, s.up(gamma)?, s.up(rstd)?);
    let (mut dx_d, mut dgamma_d) = (s.scratch(dx.len())?, s.up(dgamma)?);
    let params = NormParamsRef {
        gamma: &gamma_d,
        beta: None,
        zero_centered,
    };
    s.device().norm_backward(
        &dy_d,
        &x_d,
        params,
        None,
        &rstd_d,
        shape,
        &mut dx_d,
        &mut dgamma_d,
        None,
    )?;
    s.down(&dx_d, dx)?;
    s.down(&dgamma_d, dgamma)
}

pub(crate) fn gelu_forward(k: &CudaKernels, x: &[f32], y: &mut [f32]) -> Result<()> {
    let s = staged(k)?;
    let (x_d, mut y_d) = (s.up(x)?, s.scratch(y.len())?);
    s.device().gelu_forward(&x_d, &mut y_d)?;
    s.down(&y_d, y)
}

pub(crate) fn gelu_backward(k: &CudaKernels, dy: &[f32], x: &[f32], dx: &mut [f32]) -> Result<()> {
    let s = staged(k)?;
    let (dy_d, x_d, mut dx_d) = (s.up(dy)?, s.up(x)?, s.scratch(dx.len())?);
    s.device().gelu_backward(&dy_d, &x_d, &mut dx_d)?;
    s.down(&dx_d, dx)
}

pub(crate) fn swiglu_forward(k: &CudaKernels, x: &[f32], rows: usize, cols: usize, y: &mut [f32]) -> Result<()> {
    let s = staged(k)?;
    let (x_d, mut y_d) = (s.up(x)?, s.scratch(y.len())?);
    s.device().swiglu_forward(&x_d, rows, cols, &mut y_d)?;
    s.down(&y_d, y)
}

pub(crate) fn swiglu_backward(
    k: &CudaKernels,
    dy: &[f32],
    x: &[f32],
    rows: usize,
    cols: usize,
    dx: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (dy_d, x_d, mut dx_d) = (s.up(dy)?, s.up(x)?, s.scratch(dx.len())?);
    s.device().swiglu_backward(&dy_d, &x_d, rows, cols, &mut dx_d)?;
    s.down(&dx_d, dx)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward(
    k: &CudaKernels,
    q: &[f32],
    k_in: &[f32],
    v: &[f32],
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (q_d, k_d, v_d) = (s.up(q)?, s.up(k_in)?, s.up(v)?);
    let (mut out_d, mut lse_d) = (s.scratch(out.len())?, s.scratch(lse.len())?);
    s.device()
        .attention_forward(&q_d, &k_d, &v_d, shape, softmax_scale, dtype, &mut out_d, &mut lse_d)?;
    s.down(&out_d, out)?;
    s.down(&lse_d, lse)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    k: &CudaKernels,
    dout: &[f32],
    q: &[f32],
    k_in: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) -> Result<()> {
    let s = staged(k)?;
    let (dout_d, q_d, k_d, v_d) = (s.up(dout)?, s.up(q)?, s.up(k_in)?, s.up(v)?);
    let (out_d, lse_d) = (s.up(out)?, s.up(lse)?);
    let (mut dq_d, mut dk_d, mut dv_d) = (s.scratch(dq.len())?, s.scratch(dk.len())?, s.scratch(dv.len())?);
    s.device().attention_backward(
        &dout_d,
        &q_d,
        &k_d,
        &v_d,
        &out_d,
        &lse_d,
        shape,
        softmax_scale,
        dtype,
        &mut dq_d,
        &mut dk_d,
        &mut dv_d,
    )?;
    s.down(&dq_d, dq)?;
    s.down(&dk_d, dk)?;
    s.down(&dv_d, dv)
}

/// Generation's cached attention, grouped key/value heads read in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_cached(
    k: &CudaKernels,
    q: &[f32],
    keys: &[f32],
    v: &[f32],
    shape: CachedAttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    out: &mut [f32],
) -> Result<()> {
    // The twin's check first: a bad shape is the same error on both backends, before any copy.
    if nothing_to_do(&shape, [q.len(), keys.len(), v.len(), out.len()])? {
        return Ok(());
    }
    let s = staged(k)?;
    let (q_d, k_d, v_d, mut out_d) = (s.up(q)?, s.up(keys)?, s.up(v)?, s.scratch(out.len())?);
    s.device()
        .attention_cached(&q_d, &k_d, &v_d, shape, softmax_scale, dtype, &mut out_d)?;
    s.down(&out_d, out)
}

/// The rotary embedding in place: `x` and the table rows of the call's positions go up.
fn rope(k: &CudaKernels, x: &mut [f32], shape: RopeShape, table: &RopeTable, direction: RopeDirection) -> Result<()> {
    let (cos, sin) = host_rows(x, &shape, table)?;
    let s = staged(k)?;
    let (mut x_d, cos_d, sin_d) = (s.up(x)?, s.up(cos)?, s.up(sin)?);
    s.device()
        .rope(&mut x_d, shape, table.rotary_dim(), &cos_d, &sin_d, direction)?;
    s.down(&x_d, x)
}

pub(crate) fn rope_forward(k: &CudaKernels, x: &mut [f32], shape: RopeShape, table: &RopeTable) -> Result<()> {
    rope(k, x, shape, table, RopeDirection::Forward)
}

pub(crate) fn rope_backward(k: &CudaKernels, dx: &mut [f32], shape: RopeShape, table: &RopeTable) -> Result<()> {
    rope(k, dx, shape, table, RopeDirection::Backward)
}

pub(crate) fn residual_add(k: &CudaKernels, x: &[f32], f: &[f32], dtype: Dtype) -> Result<Vec<f32>> {
    let s = staged(k)?;
    let (x_d, f_d, mut out_d) = (s.up(x)?, s.up(f)?, s.scratch(x.len())?);
    s.device().residual_add(&x_d, &f_d, dtype, &mut out_d)?;
    s.down_vec(&out_d)
}

pub(crate) fn column_sum(k: &CudaKernels, x: &[f32], cols: usize, sums: &mut [f32]) -> Result<()> {
    let s = staged(k)?;
    let (x_d, mut sums_d) = (s.up(x)?, s.up(sums)?);
    s.device().column_sum(&x_d, cols, &mut sums_d)?;
    s.down(&sums_d, sums)
}
