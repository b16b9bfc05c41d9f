//! Token embedding lookup: `out[i] = table[ids[i]]` with `table [vocab, dim]`.

use rayon::prelude::*;

use super::check::len;
use crate::error::{Error, Result};

/// Rows of the table, after checking that it is a whole number of `dim`-wide rows and that every id is one.
fn vocab_of(what: &'static str, ids: &[u32], table_len: usize, dim: usize) -> Result<usize> {
    if dim == 0 {
        return Err(Error::InvalidShape {
            what,
            reason: "dim is 0".into(),
        });
    }
    if !table_len.is_multiple_of(dim) {
        return Err(Error::InvalidShape {
            what,
            reason: format!("a table of {table_len} values is not a whole number of rows of {dim}"),
        });
    }
    let vocab = table_len / dim;
    if let Some((position, &id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= vocab) {
        return Err(Error::IndexOutOfRange {
            what: "token id",
            index: id.into(),
            position,
            len: vocab,
        });
    }
    Ok(vocab)
}

/// Rows per parallel task (~16 K values).
fn rows_per_task(dim: usize) -> usize {
    (16 * 1024 / dim).max(1)
}

/// `out [ids.len(), dim]` gets row `ids[i]` of `table [vocab, dim]` for each `i`.
pub fn embedding_forward(ids: &[u32], table: &[f32], dim: usize, out: &mut [f32]) -> Result<()> {
    vocab_of("embedding forward", ids, table.len(), dim)?;
    len("embedding output [ids, dim]", ids.len(), dim, out.len())?;
    let block = rows_per_task(dim);
    out.par_chunks_mut(block * dim)
        .zip(ids.par_chunks(block))
        .for_each(|(ob, ib)| {
            for (row, &id) in ob.chunks_mut(dim).zip(ib) {
                let at = id as usize * dim;
                row.copy_from_slice(&table[at..at + dim]);
            }
        });
    Ok(())
}

/// `dtable[ids[i]] += dout[i]` for each `i` in order (repeated ids add up; the table gradient
/// is accumulated across calls). Sequential: a scatter-add is memory-bound, and a fixed order
/// keeps it deterministic.
pub fn embedding_backward(ids: &[u32], dout: &[f32], dim: usize, dtable: &mut [f32]) -> Result<()> {
    vocab_of("embedding backward", ids, dtable.len(), dim)?;
    len("embedding output gradient [ids, dim]", ids.len(), dim, dout.len())?;
    for (g, &id) in dout.chunks(dim).zip(ids) {
        let at = id as usize * dim;
        dtable[at..at + dim].iter_mut().zip(g).for_each(|(t, g)| *t += g);
    }
    Ok(())
}
