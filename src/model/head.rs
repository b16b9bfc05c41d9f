//! The tied output head: `logits = h E^T` with the token embedding `E [vocab, hidden]`,
//! in the compute dtype (inputs converted like a linear layer's, f32 accumulation, f32 logits
//! for the loss). The logits and `dh` are made where `h` lives, and the table is read where it
//! lives (a resident GPU keeps a trainable one there: `ends::embed_tokens`), so a resident
//! model's head reads nothing back.

use crate::dispatch::{Backend, PlainMat, Values, ValuesMut};
use crate::error::Result;
use crate::gemm::{GemmParams, Operand};
use crate::nn::{Linear, Parameter};
use crate::tensor::{Dtype, HalfValues, Tensor};

/// The token table `[vocab, hidden]` as held: f32 values wherever they live, or a frozen
/// table's 16-bit ones.
#[derive(Clone, Copy)]
enum Table<'a> {
    F32(Values<'a>),
    Half(&'a HalfValues),
}

impl<'a> Table<'a> {
    fn len(self) -> usize {
        match self {
            Table::F32(v) => v.len(),
            Table::Half(h) => h.len(),
        }
    }

    /// The table in `dtype` as `[vocab, hidden]` (or, `transposed`, `[hidden, vocab]`): 16-bit
    /// values already in `dtype` are read in place; anything else is converted into `slot` as
    /// the f32 table always was (16-bit values widen exactly first, so the bits are the same).
    fn operand(
        self,
        backend: &'a Backend,
        dtype: Dtype,
        (vocab, hidden, transposed): (usize, usize, bool),
        slot: &'a mut Option<PlainMat>,
    ) -> Result<Operand<'a>> {
        let widened;
        let values = match self {
            Table::Half(h) if h.dtype() == dtype => {
                return match transposed {
                    true => Operand::half_transposed(h, hidden, vocab),
                    false => Operand::half(h, vocab, hidden),
                };
            }
            // fp32: the widened table is the operand (no second f32 copy).
            Table::Half(h) if dtype == Dtype::F32 => {
                let m = slot.insert(PlainMat::F32(h.to_f32()));
                return match transposed {
                    true => m.operand_on(backend, (hidden, vocab, true)),
                    false => m.operand_on(backend, (vocab, hidden, false)),
                };
            }
            Table::Half(h) => {
                widened = h.to_f32();
                Values::Host(&widened[..])
            }
            Table::F32(v) => v,
        };
        let kernels = backend.kernels();
        match transposed {
            true => slot
                .insert(kernels.convert_transposed(dtype, values, vocab, hidden)?)
                .operand_on(backend, (hidden, vocab, false)),
            false => slot
                .insert(kernels.convert(dtype, values)?)
                .operand_on(backend, (vocab, hidden, false)),
        }
    }
}

/// f32 logits `[rows, vocab]` of the final-norm output, where it lives: through the untied
/// `head`, or tied to the token embedding `tokens`.
pub(super) fn logits(
    backend: &Backend,
    head: Option<&mut Linear>,
    normed: &Tensor,
    tokens: &Parameter,
    dtype: Dtype,
) -> Result<Tensor> {
    match head {
        Some(head) => head.forward(normed),
        None => match tokens.half_values() {
            Some(half) => forward(backend, normed, Table::Half(half), dtype),
            None => {
                let host = tokens.host_op_values();
                forward(backend, normed, Table::F32(tokens.op_values(&host)), dtype)
            }
        },
    }
}

/// The gradient of the final-norm output from `dlogits` `[rows, vocab]` (where `normed`
/// lives): through the untied `head`, or through the tied `tokens` table, whose gradient it
/// accumulates unless frozen (kept where `dlogits` lives when it trains there).
pub(super) fn logits_backward(
    backend: &Backend,
    head: Option<&mut Linear>,
    dlogits: Tensor,
    normed: &Tensor,
    tokens: &mut Parameter,
    dtype: Dtype,
) -> Result<Tensor> {
    match head {
        Some(head) => head.backward(&dlogits),
        // Held in 16 bits, so frozen: no table gradient.
        None if tokens.half_values().is_some() => {
            let table = Table::Half(tokens.half_values().expect("matched"));
            backward(backend, &dlogits, normed, table, dtype, None)
        }
        None if tokens.is_frozen() => {
            let host = tokens.host_op_values();
            backward(
                backend,
                &dlogits,
                normed,
                Table::F32(tokens.op_values(&host)),
                dtype,
                None,
            )
        }
        None => {
            tokens.grad_where(backend, dlogits.device(), dtype)?;
            // A trainable f32 table is read in place: on the host, or where the forward put it.
            let (table, dtable) = tokens.value_and_trainable_grad_values();
            backward(backend, &dlogits, normed, Table::F32(table), dtype, dtable)
        }
    }
}

/// `h [rows, hidden]`, `table [vocab, hidden]` -> logits `[rows, vocab]`, where `h` lives.
fn forward(backend: &Backend, h: &Tensor, table: Table, dtype: Dtype) -> Result<Tensor> {
    let (rows, hidden) = h.shape();
    let vocab = table.len() / hidden.max(1);
    let kernels = backend.kernels();
    let hm = kernels.convert(dtype, h.values())?;
    let mut slot = None;
    let e = table.operand(backend, dtype, (vocab, hidden, false), &mut slot)?;
    // Every logit is written (beta = 0).
    let mut logits = backend.output_at(h.device(), rows, vocab)?;
    kernels.gemm_into(
        &hm.operand_on(backend, (rows, hidden, false))?,
        &e,
        logits.values_mut(),
        plain_params(0.0),
    )?;
    Ok(logits)
}

/// A plain GEMM's parameters: no amax (nobody reads it), `beta` into the output.
fn plain_params(beta: f32) -> GemmParams<'static> {
    GemmParams {
        beta,
        report_amax: false,
        ..GemmParams::default()
    }
}

/// Returns dh `[rows, hidden]` (where `dlogits` lives) and accumulates `dtable += dlogits^T h`
/// (skipped for a frozen table, `None`).
fn backward(
    backend: &Backend,
    dlogits: &Tensor,
    h: &Tensor,
    table: Table,
    dtype: Dtype,
    dtable: Option<ValuesMut<'_>>,
) -> Result<Tensor> {
    let (rows, hidden) = h.shape();
    let vocab = table.len() / hidden.max(1);
    let kernels = backend.kernels();
    let dl = kernels.convert(dtype, dlogits.values())?;
    let mut slot = None;
    let e_t = table.operand(backend, dtype, (vocab, hidden, true), &mut slot)?;
    let mut dh = backend.output_at(dlogits.device(), rows, hidden)?;
    kernels.gemm_into(
        &dl.operand_on(backend, (rows, vocab, false))?,
        &e_t,
        dh.values_mut(),
        plain_params(0.0),
    )?;
    if let Some(dtable) = dtable {
        let dl_t = kernels.convert_transposed(dtype, dlogits.values(), rows, vocab)?;
        let h_t = kernels.convert_transposed(dtype, h.values(), rows, hidden)?;
        kernels.gemm_into(
            &dl_t.operand_on(backend, (vocab, rows, false))?,
            &h_t.operand_on(backend, (hidden, rows, false))?,
            dtable,
            plain_params(1.0),
        )?;
    }
    kernels.round(dh.values_mut(), dtype)?;
    Ok(dh)
}
