//! The tied output head: `logits = h E^T` with the token embedding `E [vocab, hidden]`,
//! in the compute dtype (inputs converted like a linear layer's, f32 accumulation, f32 logits
//! for the loss).

use crate::dispatch::{Backend, PlainMat, Values};
use crate::error::Result;
use crate::gemm::{GemmParams, Operand, Output};
use crate::nn::{Linear, Parameter};
use crate::tensor::{Dtype, HalfValues, Tensor};

/// The token table `[vocab, hidden]` as held: f32 values, or a frozen table's 16-bit ones.
#[derive(Clone, Copy)]
enum Table<'a> {
    F32(&'a [f32]),
    Half(&'a HalfValues),
}

impl<'a> Table<'a> {
    fn of(tokens: &'a Parameter) -> Self {
        match tokens.half_values() {
            Some(half) => Table::Half(half),
            None => Table::F32(tokens.value()),
        }
    }

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
                &widened[..]
            }
            Table::F32(v) => v,
        };
        let kernels = backend.kernels();
        match transposed {
            true => slot
                .insert(kernels.convert_transposed(dtype, Values::Host(values), vocab, hidden)?)
                .operand_on(backend, (hidden, vocab, false)),
            false => slot
                .insert(kernels.convert(dtype, Values::Host(values))?)
                .operand_on(backend, (vocab, hidden, false)),
        }
    }
}

/// f32 logits `[rows, vocab]` of the final-norm output: through the untied `head`, or tied to
/// the token embedding `tokens`.
pub(super) fn logits(
    backend: &Backend,
    head: Option<&mut Linear>,
    normed: &Tensor,
    tokens: &Parameter,
    dtype: Dtype,
) -> Result<Vec<f32>> {
    match head {
        Some(head) => Ok(head.forward(normed)?.into_data()),
        None => forward(
            backend,
            normed.data(),
            Table::of(tokens),
            normed.rows(),
            normed.cols(),
            dtype,
        ),
    }
}

/// The gradient of the final-norm output from `dlogits` `[rows, vocab]`: through the untied
/// `head`, or through the tied `tokens` table, whose gradient it accumulates unless frozen.
pub(super) fn logits_backward(
    backend: &Backend,
    head: Option<&mut Linear>,
    dlogits: Vec<f32>,
    normed: &Tensor,
    tokens: &mut Parameter,
    dtype: Dtype,
) -> Result<Tensor> {
    let (rows, hidden) = (normed.rows(), normed.cols());
    match head {
        Some(head) => {
            let vocab = dlogits.len() / rows.max(1);
            head.backward(&Tensor::new(dlogits, rows, vocab)?)
        }
        None if tokens.half_values().is_some() => {
            // Held in 16 bits, so frozen: no table gradient.
            let table = Table::of(tokens);
            let dh = backward(backend, &dlogits, normed.data(), table, rows, hidden, dtype, None)?;
            Tensor::new(dh, rows, hidden)
        }
        None => {
            let frozen = tokens.is_frozen();
            let (table, dtable) = tokens.value_and_grad_mut();
            let dtable = (!frozen).then_some(dtable);
            let dh = backward(
                backend,
                &dlogits,
                normed.data(),
                Table::F32(table),
                rows,
                hidden,
                dtype,
                dtable,
            )?;
            Tensor::new(dh, rows, hidden)
        }
    }
}

/// `h [rows, hidden]`, `table [vocab, hidden]` -> logits `[rows, vocab]`.
fn forward(backend: &Backend, h: &[f32], table: Table, rows: usize, hidden: usize, dtype: Dtype) -> Result<Vec<f32>> {
    let vocab = table.len() / hidden.max(1);
    let kernels = backend.kernels();
    let h = kernels.convert(dtype, Values::Host(h))?;
    let mut slot = None;
    let e = table.operand(backend, dtype, (vocab, hidden, false), &mut slot)?;
    let mut logits = vec![0.0; rows * vocab];
    kernels.gemm(
        &h.operand_on(backend, (rows, hidden, false))?,
        &e,
        Output::F32(&mut logits),
        GemmParams::default(),
    )?;
    Ok(logits)
}

/// Returns dh `[rows, hidden]` and accumulates `dtable += dlogits^T h` (skipped for a frozen
/// table, `None`).
#[allow(clippy::too_many_arguments)]
fn backward(
    backend: &Backend,
    dlogits: &[f32],
    h: &[f32],
    table: Table,
    rows: usize,
    hidden: usize,
    dtype: Dtype,
    dtable: Option<&mut [f32]>,
) -> Result<Vec<f32>> {
    let vocab = table.len() / hidden.max(1);
    let kernels = backend.kernels();
    let dl = kernels.convert(dtype, Values::Host(dlogits))?;
    let mut slot = None;
    let e_t = table.operand(backend, dtype, (vocab, hidden, true), &mut slot)?;
    let mut dh = vec![0.0; rows * hidden];
    kernels.gemm(
        &dl.operand_on(backend, (rows, vocab, false))?,
        &e_t,
        Output::F32(&mut dh),
        GemmParams::default(),
    )?;
    let Some(dtable) = dtable else {
        dtype.round_slice(&mut dh);
        return Ok(dh);
    };
    let dl_t = kernels.convert_transposed(dtype, Values::Host(dlogits), rows, vocab)?;
    let h_t = kernels.convert_transposed(dtype, Values::Host(h), rows, hidden)?;
    kernels.gemm(
        &dl_t.operand_on(backend, (vocab, rows, false))?,
        &h_t.operand_on(backend, (hidden, rows, false))?,
        Output::F32(dtable),
        GemmParams {
            beta: 1.0,
            ..GemmParams::default()
        },
    )?;
    dtype.round_slice(&mut dh);
    Ok(dh)
}
