//! Data parallelism (`docs/distributed.md`): N ranks train one model on N slices of each
//! batch and agree on every number after each step.
//!
//! * [`collective`]: the [`Collective`] trait and its reduction-order contract; [`SingleRank`].
//! * [`cpu_group`]: the CPU implementation, ranks as threads in one process.
//! * [`grad_sync`]: the bucketed gradient all-reduce; [`shard`]: bucket and shard arithmetic.
//! * [`amax`]: the per-step delayed-scaling update with one amax max-reduce for the model.
//! * [`zero`]: ZeRO-1, AdamW moments sharded over the ranks.
//! * [`launch`]: `fp8 train --world-size N` on the CPU: one thread per rank.
//! * [`env`] and [`rendezvous`]: torchrun-style launch settings and the TCP exchange that
//!   hands every rank the NCCL unique id.

pub mod amax;
pub mod collective;
pub mod cpu_group;
pub mod env;
pub mod grad_sync;
pub mod launch;
pub mod rendezvous;
pub mod shard;
pub mod zero;

pub use collective::{Collective, SingleRank, Wire};
pub use cpu_group::{AbortOnDrop, CpuCollective, cpu_group};
pub use launch::{DataParallel, Parallel, run_data_parallel};
pub use zero::Zero1AdamW;
