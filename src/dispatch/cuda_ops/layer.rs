//! CUDA arms of the layer ops: dtype conversion, norms, activations, attention
//! (training and cached), rotary embedding, residual add, rounding, column copies, column sum
//! (launchers in `backend::cuda::{convert, norm, activation, attention, attention_cached,
//! rope}`). Each reads device values in place and stages host ones (upload inputs and
//! in-place state, launch, download host outputs: `resident`); the launcher checks every
//! length against the shape.

use half::{bf16, f16};

use super::resident::staged_for;
use super::{Pooled, Staged, staged};
use std::sync::Arc;

use crate::backend::cuda::DeviceElement;
use crate::backend::cuda::gemm::half_mirror;
use crate::backend::cuda::norm::NormParamsRef;
use crate::backend::cuda::rope::{RopeDirection, host_rows};
use crate::dispatch::Halves;
use crate::dispatch::plain::Mirror;
use crate::dispatch::{
    AttentionShape, CachedAttentionShape, ColumnCopy, CudaKernels, NormShape, PlainMat, RopeShape, RopeTable,
};
use crate::error::Result;
use crate::ops::DropoutMask;
use crate::ops::attention_cached::nothing_to_do;
use crate::tensor::DeviceMirror;
use crate::tensor::Dtype;
use crate::tensor::device_values::{Values, ValuesMut};

/// `[rows, cols]` f32 values converted on the device to `T`, transposed when asked.
fn convert_on<'s, T: DeviceElement + Pooled>(
    s: &'s Staged,
    src: Values<'_>,
    (rows, cols): (usize, usize),
    transpose: bool,
) -> Result<super::Lease<'s, T>> {
    let x = s.input("convert", src)?;
    let mut y = s.scratch::<T>(src.len())?;
    s.device().convert(&x, rows, cols, transpose, &mut y)?;
    Ok(y)
}

/// [`convert_on`] to a 16-bit `T`; with `keep`, the device result stays as the matrix's mirror
/// for the GEMMs that read it, and where layers keep their activations on the device
/// (the default; not with `FP8_CUDA_RESIDENT=0`) the values stay there only, read back if a host reader needs them.
fn convert_half<T: DeviceElement + Pooled + Send + Sync + 'static>(
    s: &Staged,
    src: Values<'_>,
    shape: (usize, usize),
    transpose: bool,
    keep: bool,
) -> Result<(Halves<T>, Mirror)> {
    let y = convert_on::<T>(s, src, shape, transpose)?;
    let n = src.len();
    if !keep || n == 0 {
        return Ok((Halves::host(s.down_vec(&y)?), None));
    }
    if crate::backend::cuda::env_switch::resident_layers() {
        let mirror = DeviceMirror {
            read_back: Some(read_half::<T>),
            read_scales: None,
            ..half_mirror(s.device(), y.into_buffer())
        };
        return Ok((Halves::on_device(n), Some(Arc::new(mirror))));
    }
    let host = s.down_vec(&y)?;
    Ok((
        Halves::host(host),
        Some(Arc::new(half_mirror(s.device(), y.into_buffer()))),
    ))
}

/// The values of a 16-bit mirror, downloaded ([`convert_half`]'s read-back): a `Vec<T>`.
fn read_half<T: DeviceElement + Pooled + 'static>(mirror: &DeviceMirror) -> Result<Box<dyn std::any::Any>> {
    let Some(values) = mirror.payload.downcast_ref::<crate::backend::cuda::DeviceBuffer<T>>() else {
        return Err(crate::error::Error::KernelArgs {
            kernel: "16-bit read-back",
            detail: format!("the mirror holds no {} values", T::SUFFIX),
        });
    };
    let host = staged(&CudaKernels {
        ordinal: mirror.ordinal,
    })?
    .down_vec(values)?;
    Ok(Box::new(host))
}

fn convert_plain(
    k: &CudaKernels,
    dtype: Dtype,
    src: Values<'_>,
    shape: (usize, usize),
    transpose: bool,
) -> Result<PlainMat> {
    let s = staged_for(k, "convert", [src.ordinal()])?;
    // A 16-bit result keeps its device copy for the GEMMs where layers keep their activations
    // on the device (a device source, or resident layers for the weights' copies); the
    // staged path of host layers uploads its operands as before.
    let resident = src.ordinal().is_some() || crate::backend::cuda::env_switch::resident_layers();
    // (Asked only for 16-bit results: f32 keeps no mirror, and the check queries the driver.)
    let keep = || resident && super::cast::room_for_mirrors(&s);
    Ok(match dtype {
        Dtype::F32 => {
            let values = convert_on::<f32>(&s, src, shape, transpose)?;
            PlainMat::F32(s.down_vec(&values)?)
        }
        Dtype::Bf16 => {
            let (values, mirror) = convert_half::<bf16>(&s, src, shape, transpose, keep())?;
            PlainMat::Bf16(values, mirror)
        }
        Dtype::F16 => {
            let (values, mirror) = convert_half::<f16>(&s, src, shape, transpose, keep())?;
            PlainMat::F16(values, mirror)
        }
    })
}

pub(crate) fn convert(k: &CudaKernels, dtype: Dtype, src: Values<'_>) -> Result<PlainMat> {
    convert_plain(k, dtype, src, (1, src.len()), false)
}

pub(crate) fn convert_transposed(
    k: &CudaKernels,
    dtype: Dtype,
    src: Values<'_>,
    rows: usize,
    cols: usize,
) -> Result<PlainMat> {
    convert_plain(k, dtype, src, (rows, cols), true)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_forward(
    k: &CudaKernels,
    x: Values<'_>,
    gamma: Values<'_>,
    beta: Values<'_>,
    shape: NormShape,
    eps: f32,
    zero_centered: bool,
    y: ValuesMut<'_>,
    mean: ValuesMut<'_>,
    rstd: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "layernorm_forward";
    let on = [
        x.ordinal(),
        gamma.ordinal(),
        beta.ordinal(),
        y.ordinal(),
        mean.ordinal(),
        rstd.ordinal(),
    ];
    let s = staged_for(k, OP, on)?;
    let (x_d, gamma_d, beta_d) = (s.input(OP, x)?, s.input(OP, gamma)?, s.input(OP, beta)?);
    let (mut y_d, mut mean_d, mut rstd_d) = (s.output(OP, y)?, s.output(OP, mean)?, s.output(OP, rstd)?);
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
    y_d.finish(&s)?;
    mean_d.finish(&s)?;
    rstd_d.finish(&s)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn layernorm_backward(
    k: &CudaKernels,
    dy: Values<'_>,
    x: Values<'_>,
    gamma: Values<'_>,
    mean: Values<'_>,
    rstd: Values<'_>,
    shape: NormShape,
    zero_centered: bool,
    dx: ValuesMut<'_>,
    dgamma: ValuesMut<'_>,
    dbeta: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "layernorm_backward";
    let on = [
        dy.ordinal(),
        x.ordinal(),
        gamma.ordinal(),
        mean.ordinal(),
        rstd.ordinal(),
    ];
    let s = staged_for(
        k,
        OP,
        on.into_iter().chain([dx.ordinal(), dgamma.ordinal(), dbeta.ordinal()]),
    )?;
    let (dy_d, x_d, gamma_d) = (s.input(OP, dy)?, s.input(OP, x)?, s.input(OP, gamma)?);
    let (mean_d, rstd_d) = (s.input(OP, mean)?, s.input(OP, rstd)?);
    // LayerNorm has a beta; its value is not read by the backward, only its presence.
    let beta_d = s.scratch::<f32>(gamma.len())?;
    let mut dx_d = s.output(OP, dx)?;
    let (mut dgamma_d, mut dbeta_d) = (s.in_place(OP, dgamma)?, s.in_place(OP, dbeta)?);
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
    dx_d.finish(&s)?;
    dgamma_d.finish(&s)?;
    dbeta_d.finish(&s)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_forward(
    k: &CudaKernels,
    x: Values<'_>,
    gamma: Values<'_>,
    shape: NormShape,
    eps: f32,
    zero_centered: bool,
    y: ValuesMut<'_>,
    rstd: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "rmsnorm_forward";
    let s = staged_for(k, OP, [x.ordinal(), gamma.ordinal(), y.ordinal(), rstd.ordinal()])?;
    let (x_d, gamma_d) = (s.input(OP, x)?, s.input(OP, gamma)?);
    let (mut y_d, mut rstd_d) = (s.output(OP, y)?, s.output(OP, rstd)?);
    let params = NormParamsRef {
        gamma: &gamma_d,
        beta: None,
        zero_centered,
    };
    s.device()
        .norm_forward(&x_d, params, shape, eps, Some(&mut y_d), None, None, &mut rstd_d)?;
    y_d.finish(&s)?;
    rstd_d.finish(&s)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_backward(
    k: &CudaKernels,
    dy: Values<'_>,
    x: Values<'_>,
    gamma: Values<'_>,
    rstd: Values<'_>,
    shape: NormShape,
    zero_centered: bool,
    dx: ValuesMut<'_>,
    dgamma: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "rmsnorm_backward";
    let on = [
        dy.ordinal(),
        x.ordinal(),
        gamma.ordinal(),
        rstd.ordinal(),
        dx.ordinal(),
        dgamma.ordinal(),
    ];
    let s = staged_for(k, OP, on)?;
    let (dy_d, x_d, gamma_d, rstd_d) = (
        s.input(OP, dy)?,
        s.input(OP, x)?,
        s.input(OP, gamma)?,
        s.input(OP, rstd)?,
    );
    let (mut dx_d, mut dgamma_d) = (s.output(OP, dx)?, s.in_place(OP, dgamma)?);
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
    dx_d.finish(&s)?;
    dgamma_d.finish(&s)
}

/// Device values run the `fp8_dropout` kernels; when both sides are host values the twin runs
/// on the host (as [`round`]: staging a cheap elementwise op would only add copies).
/// `add`: `dropout_add` (into `out`), else `dropout`.
fn dropout_on(
    k: &CudaKernels,
    add: bool,
    x: Values<'_>,
    mask: DropoutMask,
    dtype: Dtype,
    out: ValuesMut<'_>,
) -> Result<()> {
    let op = if add { "dropout_add" } else { "dropout" };
    // The GPU first, as every op of this backend: a missing one is an error here too.
    let s = staged_for(k, op, [x.ordinal(), out.ordinal()])?;
    let out = match (x, out) {
        (Values::Host(x), ValuesMut::Host(out)) if add => return crate::ops::dropout_add(x, mask, dtype, out),
        (Values::Host(x), ValuesMut::Host(out)) => return crate::ops::dropout(x, mask, dtype, out),
        (_, out) => out,
    };
    let x_d = s.input(op, x)?;
    let mut out_d = match add {
        true => s.in_place(op, out)?,
        false => s.output(op, out)?,
    };
    s.device().dropout(&x_d, mask, dtype, &mut out_d, add)?;
    out_d.finish(&s)
}

pub(crate) fn dropout(
    k: &CudaKernels,
    x: Values<'_>,
    mask: DropoutMask,
    dtype: Dtype,
    out: ValuesMut<'_>,
) -> Result<()> {
    dropout_on(k, false, x, mask, dtype, out)
}

pub(crate) fn dropout_add(
    k: &CudaKernels,
    g: Values<'_>,
    mask: DropoutMask,
    dtype: Dtype,
    out: ValuesMut<'_>,
) -> Result<()> {
    dropout_on(k, true, g, mask, dtype, out)
}

pub(crate) fn gelu_forward(k: &CudaKernels, x: Values<'_>, y: ValuesMut<'_>) -> Result<()> {
    const OP: &str = "gelu_forward";
    let s = staged_for(k, OP, [x.ordinal(), y.ordinal()])?;
    let (x_d, mut y_d) = (s.input(OP, x)?, s.output(OP, y)?);
    s.device().gelu_forward(&x_d, &mut y_d)?;
    y_d.finish(&s)
}

pub(crate) fn gelu_backward(k: &CudaKernels, dy: Values<'_>, x: Values<'_>, dx: ValuesMut<'_>) -> Result<()> {
    const OP: &str = "gelu_backward";
    let s = staged_for(k, OP, [dy.ordinal(), x.ordinal(), dx.ordinal()])?;
    let (dy_d, x_d, mut dx_d) = (s.input(OP, dy)?, s.input(OP, x)?, s.output(OP, dx)?);
    s.device().gelu_backward(&dy_d, &x_d, &mut dx_d)?;
    dx_d.finish(&s)
}

pub(crate) fn swiglu_forward(k: &CudaKernels, x: Values<'_>, rows: usize, cols: usize, y: ValuesMut<'_>) -> Result<()> {
    const OP: &str = "swiglu_forward";
    let s = staged_for(k, OP, [x.ordinal(), y.ordinal()])?;
    let (x_d, mut y_d) = (s.input(OP, x)?, s.output(OP, y)?);
    s.device().swiglu_forward(&x_d, rows, cols, &mut y_d)?;
    y_d.finish(&s)
}

pub(crate) fn swiglu_backward(
    k: &CudaKernels,
    dy: Values<'_>,
    x: Values<'_>,
    rows: usize,
    cols: usize,
    dx: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "swiglu_backward";
    let s = staged_for(k, OP, [dy.ordinal(), x.ordinal(), dx.ordinal()])?;
    let (dy_d, x_d, mut dx_d) = (s.input(OP, dy)?, s.input(OP, x)?, s.output(OP, dx)?);
    s.device().swiglu_backward(&dy_d, &x_d, rows, cols, &mut dx_d)?;
    dx_d.finish(&s)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_forward(
    k: &CudaKernels,
    q: Values<'_>,
    k_in: Values<'_>,
    v: Values<'_>,
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    out: ValuesMut<'_>,
    lse: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "attention_forward";
    let on = [q.ordinal(), k_in.ordinal(), v.ordinal(), out.ordinal(), lse.ordinal()];
    let s = staged_for(k, OP, on)?;
    let (q_d, k_d, v_d) = (s.input(OP, q)?, s.input(OP, k_in)?, s.input(OP, v)?);
    let (mut out_d, mut lse_d) = (s.output(OP, out)?, s.output(OP, lse)?);
    s.device()
        .attention_forward(&q_d, &k_d, &v_d, shape, softmax_scale, dtype, &mut out_d, &mut lse_d)?;
    out_d.finish(&s)?;
    lse_d.finish(&s)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    k: &CudaKernels,
    dout: Values<'_>,
    q: Values<'_>,
    k_in: Values<'_>,
    v: Values<'_>,
    out: Values<'_>,
    lse: Values<'_>,
    shape: AttentionShape,
    softmax_scale: f32,
    dtype: Dtype,
    dq: ValuesMut<'_>,
    dk: ValuesMut<'_>,
    dv: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "attention_backward";
    let on = [
        dout.ordinal(),
        q.ordinal(),
        k_in.ordinal(),
        v.ordinal(),
        out.ordinal(),
        lse.ordinal(),
    ];
    let s = staged_for(k, OP, on.into_iter().chain([dq.ordinal(), dk.ordinal(), dv.ordinal()]))?;
    let (dout_d, q_d, k_d, v_d) = (s.input(OP, dout)?, s.input(OP, q)?, s.input(OP, k_in)?, s.input(OP, v)?);
    let (out_d, lse_d) = (s.input(OP, out)?, s.input(OP, lse)?);
    let (mut dq_d, mut dk_d, mut dv_d) = (s.output(OP, dq)?, s.output(OP, dk)?, s.output(OP, dv)?);
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
    dq_d.finish(&s)?;
    dk_d.finish(&s)?;
    dv_d.finish(&s)
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

/// The rotary embedding in place: `x` (if on the host) and the table rows of the call's
/// positions go up.
fn rope(
    k: &CudaKernels,
    op: &'static str,
    x: ValuesMut<'_>,
    shape: RopeShape,
    table: &RopeTable,
    direction: RopeDirection,
) -> Result<()> {
    let (cos, sin) = host_rows(x.len(), &shape, table)?;
    let s = staged_for(k, op, [x.ordinal()])?;
    let (mut x_d, cos_d, sin_d) = (s.in_place(op, x)?, s.up(cos)?, s.up(sin)?);
    s.device()
        .rope(&mut x_d, shape, table.rotary_dim(), &cos_d, &sin_d, direction)?;
    x_d.finish(&s)
}

pub(crate) fn rope_forward(k: &CudaKernels, x: ValuesMut<'_>, shape: RopeShape, table: &RopeTable) -> Result<()> {
    rope(k, "rope_forward", x, shape, table, RopeDirection::Forward)
}

pub(crate) fn rope_backward(k: &CudaKernels, dx: ValuesMut<'_>, shape: RopeShape, table: &RopeTable) -> Result<()> {
    rope(k, "rope_backward", dx, shape, table, RopeDirection::Backward)
}

pub(crate) fn residual_add(
    k: &CudaKernels,
    x: Values<'_>,
    f: Values<'_>,
    dtype: Dtype,
    out: ValuesMut<'_>,
) -> Result<()> {
    const OP: &str = "residual_add";
    let s = staged_for(k, OP, [x.ordinal(), f.ordinal(), out.ordinal()])?;
    let (x_d, f_d, mut out_d) = (s.input(OP, x)?, s.input(OP, f)?, s.output(OP, out)?);
    s.device().residual_add(&x_d, &f_d, dtype, &mut out_d)?;
    out_d.finish(&s)
}

/// Device values are moved by the `fp8_copy_columns` kernel; when both sides are host values
/// they are moved on the host (staging them would only add copies: a data move placed where
/// its values are, as [`round`]).
pub(crate) fn copy_columns(k: &CudaKernels, a: Values<'_>, out: ValuesMut<'_>, copy: ColumnCopy) -> Result<()> {
    const OP: &str = "copy_columns";
    // The twin's check first: a bad range is the same error on both backends, before any copy.
    copy.check(a.len(), out.len())?;
    // The GPU first, as every op of this backend: a missing one is an error here too.
    let s = staged_for(k, OP, [a.ordinal(), out.ordinal()])?;
    let out = match (a, out) {
        (Values::Host(a), ValuesMut::Host(out)) => return crate::ops::elementwise::copy_columns(a, out, copy),
        (_, out) => out,
    };
    let (a_d, mut out_d) = (s.input(OP, a)?, s.in_place(OP, out)?);
    s.device().copy_columns(&a_d, &mut out_d, copy)?;
    out_d.finish(&s)
}

/// Device values are rounded by the `fp8_round` kernel in place; host values on the host (a
/// round trip to the GPU would cost far more than the rounding: a cheap op placed where its
/// values are, not a missing kernel).
pub(crate) fn round(k: &CudaKernels, values: ValuesMut<'_>, dtype: Dtype) -> Result<()> {
    const OP: &str = "round";
    // The GPU first, as every op of this backend: a missing one is an error here too.
    let s = staged_for(k, OP, [values.ordinal()])?;
    match values {
        // f32 values are their own rounding: nothing to launch or copy.
        _ if dtype == Dtype::F32 => Ok(()),
        ValuesMut::Host(host) => {
            dtype.round_slice(host);
            Ok(())
        }
        device => {
            let mut x = s.in_place(OP, device)?;
            s.device().round_to(&mut x, dtype)?;
            x.finish(&s)
        }
    }
}

pub(crate) fn multiply(k: &CudaKernels, values: ValuesMut<'_>, factor: f32) -> Result<()> {
    const OP: &str = "multiply";
    let s = staged_for(k, OP, [values.ordinal()])?;
    match values {
        // Host values are multiplied where they are, as `round` rounds them.
        ValuesMut::Host(host) => crate::ops::elementwise::multiply(host, factor),
        device => {
            let mut x = s.in_place(OP, device)?;
            s.device().multiply(&mut x, factor)?;
            x.finish(&s)
        }
    }
}

pub(crate) fn column_sum(k: &CudaKernels, x: Values<'_>, cols: usize, sums: ValuesMut<'_>) -> Result<()> {
    const OP: &str = "column_sum";
    let s = staged_for(k, OP, [x.ordinal(), sums.ordinal()])?;
    let (x_d, mut sums_d) = (s.input(OP, x)?, s.in_place(OP, sums)?);
    s.device().column_sum(&x_d, cols, &mut sums_d)?;
    sums_d.finish(&s)
}
