//! Data parallelism (`docs/distributed.md`): N ranks train one model on N slices of each
//! batch and agree on every number after each step.
//!
//! * [`collective`]: the [`Collective`] trait and its reduction-order contract; [`SingleRank`].
//! * [`cpu_group`]: the CPU implementation, ranks as threads in one process.
//! * [`shard`]: bucket and shard arithmetic; [`options`]: a run's settings, a rank's place.
//! * [`env`] and [`rendezvous`]: torchrun-style launch settings and the TCP exchange that
//!   hands every rank the NCCL unique id.
//!
//! This folder is the transport: it knows ranks and buffers, not models. What a training step
//! does with it (bucketed gradient all-reduce, the per-step amax reduce, ZeRO-1, one thread per
//! rank) lives in `train` (`grad_sync`, `amax_sync`, `zero1`, `data_parallel`).

pub mod collective;
pub mod cpu_group;
pub mod env;
pub mod options;
pub mod rendezvous;
pub mod shard;

pub use collective::{Collective, SingleRank, Wire};
pub use cpu_group::{AbortOnDrop, CpuCollective, cpu_group};
pub use options::{DEFAULT_BUCKET_BYTES, DataParallel, Parallel};
