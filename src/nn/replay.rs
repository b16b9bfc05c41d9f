//! Activation recompute's bookkeeping, shared by the layers that offer it.
//! With recompute on, a training forward keeps only the layer's input; backward
//! replays the forward from it (the FP8 casts reuse the scales of the first
//! pass, so the replay is bit-identical) and then runs the normal backward.

use super::no_forward;
use crate::error::Result;
use crate::tensor::Tensor;

/// The input a recomputing layer kept, with the `(batch, seq)` split it came with.
#[derive(Clone, Debug)]
pub(crate) struct KeptInput {
    pub x: Tensor,
    pub batch: usize,
    pub seq: usize,
}

/// Whether a layer recomputes, and the input it kept if it does.
#[derive(Clone, Debug)]
pub(crate) struct Replay {
    enabled: bool,
    kept: Option<KeptInput>,
}

impl Replay {
    pub fn new(enabled: bool) -> Self {
        Replay { enabled, kept: None }
    }

    /// Whether the layer recomputes.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// After a training forward whose saved activations the layer has just dropped: keeps its input.
    pub fn keep(&mut self, x: &Tensor, batch: usize, seq: usize) {
        debug_assert!(self.enabled, "only a recomputing layer keeps its input");
        self.kept = Some(KeptInput {
            x: x.clone(),
            batch,
            seq,
        });
    }

    /// In backward: the kept input to replay the forward from; `None` when the layer does not
    /// recompute; an error naming `layer` when it does but no forward ran.
    pub fn take(&mut self, layer: &str) -> Result<Option<KeptInput>> {
        if !self.enabled {
            return Ok(None);
        }
        self.kept.take().map(Some).ok_or_else(|| no_forward(layer))
    }

    /// Drops the kept input.
    pub fn clear(&mut self) {
        self.kept = None;
    }

    /// Bytes of the kept input stored at `dtype_bytes` per value.
    pub fn bytes(&self, dtype_bytes: usize) -> usize {
        self.kept.as_ref().map_or(0, |k| k.x.len() * dtype_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn keeps_one_input_until_taken_and_reports_a_missing_forward() {
        let x = Tensor::new(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3).unwrap();
        let mut off = Replay::new(false);
        assert!(off.take("l").unwrap().is_none());
        let mut on = Replay::new(true);
        assert!(matches!(on.take("layer.7"), Err(Error::LayerShape { layer, .. }) if layer == "layer.7"));
        on.keep(&x, 1, 2);
        assert_eq!(on.bytes(2), 12);
        let kept = on.take("l").unwrap().unwrap();
        assert_eq!((kept.x.data(), kept.batch, kept.seq), (x.data(), 1, 2));
        assert_eq!(on.bytes(2), 0);
        on.keep(&x, 1, 2);
        on.clear();
        assert!(on.take("l").is_err());
    }
}
