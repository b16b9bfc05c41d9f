//! The settings of a data-parallel run, and one rank's place in it: what the training loop
//! needs to know about its group (`docs/distributed.md`).

use std::fmt;

use super::collective::{Collective, Wire};
use crate::error::{Error, Result};

/// How a data-parallel run reduces and shards (the world size is the group's).
#[derive(Clone, Debug, PartialEq)]
pub struct DataParallel {
    /// Gradient bucket size in bytes of f32 gradient: one all-reduce call per bucket.
    pub bucket_bytes: usize,
    /// The format gradients are all-reduced in.
    pub wire: Wire,
    /// ZeRO stage: 0 (every rank holds the whole optimizer state) or 1 (moments sharded).
    pub zero: u8,
    /// Reduce each gradient bucket on a communication thread as soon as backward has finished
    /// it (`true`), or all buckets after backward: the same bits either way.
    pub overlap: bool,
}

/// PyTorch DDP's default bucket: 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

impl Default for DataParallel {
    fn default() -> Self {
        DataParallel {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            wire: Wire::F32,
            zero: 0,
            overlap: true,
        }
    }
}

impl DataParallel {
    /// Checks the settings: a bucket of at least one value, ZeRO stage 0 or 1.
    pub fn validate(&self) -> Result<()> {
        if self.bucket_bytes < 4 {
            return Err(Error::InvalidSetting {
                setting: "bucket_bytes",
                value: self.bucket_bytes.to_string(),
                reason: "a bucket holds at least one f32 gradient (4 bytes)".into(),
            });
        }
        if self.zero > 1 {
            return Err(Error::InvalidSetting {
                setting: "zero",
                value: self.zero.to_string(),
                reason: "stages 0 and 1 exist (stage 1 shards the optimizer moments)".into(),
            });
        }
        Ok(())
    }
}

/// One rank's place in a data-parallel run: its group and the run's settings.
pub struct Parallel<'a> {
    /// The rank's handle on its group.
    pub collective: &'a dyn Collective,
    /// How the run reduces and shards.
    pub options: DataParallel,
}

impl fmt::Debug for Parallel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parallel")
            .field("rank", &self.collective.rank())
            .field("world_size", &self.collective.world_size())
            .field("options", &self.options)
            .finish()
    }
}
