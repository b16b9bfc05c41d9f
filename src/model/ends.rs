//! A model's ends as ops on tensors where its layers keep them: the token embedding (and its
//! table gradient), the cross-entropy loss and its gradient. On a resident GPU
//! ([`Backend::resident_device`]) the trainable table and its gradient are kept there like a
//! norm's gamma (`Parameter::value_where`, `grad_where`), and the embedding output, the logits,
//! their log-sum-exp and `dlogits` stay on the device: only the ids and targets go up (a few KB
//! a micro-batch) and the loss comes back (4 bytes). Elsewhere every tensor is in host memory,
//! as before. The ops are the same either way, so a step gives the same bits staged or resident.

use crate::dispatch::{Backend, Values, ValuesMut};
use crate::error::{Error, Result};
use crate::nn::{Parameter, Tensor};
use crate::tensor::{DeviceKind, Dtype};

/// Brings tables a resident GPU kept (values and gradients) home, on a move of their model to
/// another device: the next forward takes them up again where it runs, and a model moved to the
/// CPU reads them there.
pub(super) fn tables_home<'a>(tables: impl IntoIterator<Item = &'a mut Parameter>) -> Result<()> {
    for table in tables {
        table.value_to_host()?;
        table.grad_to_host()?;
    }
    Ok(())
}

/// Rows `ids` of the token table into `[rows, hidden]` on `device` (unrounded: the table's own
/// values). On the host, rows past `ids.len()` are zero padding; a device output has exactly
/// one row per id.
///
/// A trainable f32 table moves to a resident GPU first. A frozen table held in 16 bits widens
/// only the rows it looks up (exact), and the same op reads them.
pub(super) fn embed_tokens(
    backend: &Backend,
    tokens: &mut Parameter,
    ids: &[u32],
    (rows, hidden): (usize, usize),
    dtype: Dtype,
    device: DeviceKind,
) -> Result<Tensor> {
    if device != DeviceKind::Cpu {
        tokens.value_where(backend, device, dtype)?;
    }
    let mut out = match device {
        DeviceKind::Cpu if rows >= ids.len() => Tensor::new(vec![0.0; rows * hidden], rows, hidden)?,
        _ if rows == ids.len() => backend.output_at(device, rows, hidden)?,
        _ => {
            return Err(Error::ShapeMismatch {
                what: "embedding rows [ids (or more on the host), hidden]",
                rows,
                cols: hidden,
                expected: ids.len() * hidden,
                got: rows * hidden,
            });
        }
    };
    let kernels = backend.kernels();
    let written = ids.len() * hidden;
    let looked_up = match out.values_mut() {
        ValuesMut::Host(host) => ValuesMut::Host(&mut host[..written]),
        device_values => device_values,
    };
    match tokens.half_values() {
        Some(half) => {
            let (local, table) = half.widen_rows(ids, hidden)?;
            kernels.embedding_forward(&local, Values::Host(&table), hidden, looked_up)?;
        }
        None => {
            let host = tokens.host_op_values();
            kernels.embedding_forward(ids, tokens.op_values(&host), hidden, looked_up)?;
        }
    }
    Ok(out)
}

/// `dtable[ids[i]] += dx[i]` into `table`'s gradient (nothing for a frozen table), kept where
/// `dx` lives when it trains there ([`Parameter::grad_where`]).
pub(super) fn embedding_backward(
    backend: &Backend,
    table: &mut Parameter,
    ids: &[u32],
    dx: &Tensor,
    dtype: Dtype,
) -> Result<()> {
    if table.is_frozen() {
        return Ok(());
    }
    table.grad_where(backend, dx.device(), dtype)?;
    let hidden = dx.cols();
    match table.trainable_grad_values() {
        Some(dtable) => backend.kernels().embedding_backward(ids, dx.values(), hidden, dtable),
        None => Ok(()),
    }
}

/// The mean cross-entropy of `logits` `[rows, vocab]` against `targets` (`ignore`d ones not
/// scored) and the log-sum-exp `[rows, 1]` of each row, kept where the logits live.
pub(super) fn loss(backend: &Backend, logits: &Tensor, targets: &[u32], ignore: u32) -> Result<(f32, Tensor)> {
    let (rows, vocab) = logits.shape();
    let mut lse = backend.output_at(logits.device(), rows, 1)?;
    let loss = backend
        .kernels()
        .cross_entropy_forward(logits.values(), targets, vocab, ignore, lse.values_mut())?;
    Ok((loss, lse))
}

/// `dlogits` `[rows, vocab]` of [`loss`] scaled by `dloss`, where the logits live (every value
/// written; ignored rows are zero).
pub(super) fn loss_backward(
    backend: &Backend,
    logits: &Tensor,
    targets: &[u32],
    ignore: u32,
    lse: &Tensor,
    dloss: f32,
) -> Result<Tensor> {
    let (rows, vocab) = logits.shape();
    let mut dlogits = match logits.device() {
        // Zeros on the host, as the host path always made them (an empty batch writes nothing).
        DeviceKind::Cpu => Tensor::new(vec![0.0; rows * vocab], rows, vocab)?,
        device => backend.output_at(device, rows, vocab)?,
    };
    backend.kernels().cross_entropy_backward(
        logits.values(),
        targets,
        vocab,
        ignore,
        lse.values(),
        dloss,
        dlogits.values_mut(),
    )?;
    Ok(dlogits)
}

/// The mean loss of `logits` `[rows, vocab]` against each of `target_sets` and the most likely id
/// of each row: a held-out evaluation's results (the logits come home once, for the argmax).
pub(super) fn evaluate(
    backend: &Backend,
    logits: Tensor,
    target_sets: &[&[u32]],
    ignore: u32,
) -> Result<(Vec<f32>, Vec<u32>)> {
    let vocab = logits.cols();
    let losses = target_sets
        .iter()
        .map(|targets| Ok(loss(backend, &logits, targets, ignore)?.0))
        .collect::<Result<Vec<f32>>>()?;
    Ok((losses, argmax_rows(logits.into_host()?.data(), vocab)))
}

/// The most likely id of each row of `logits` `[rows, vocab]` ([`argmax`]).
pub(super) fn argmax_rows(logits: &[f32], vocab: usize) -> Vec<u32> {
    logits.chunks_exact(vocab.max(1)).map(argmax).collect()
}

/// The first index of the largest value of `row` (NaN never wins; a NaN first element keeps
/// index 0): the greedy decoder's pick and the evaluations' prediction.
pub(super) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}
