//! The delayed-scaling settings `fp8 recipe replay` and `fp8 train` take: history
//! length, how the history reduces to one amax, and the margin.

use clap::{Args, ValueEnum};
use fp8_engine::scaling::{AmaxComputeAlgo, DelayedScaling};

/// How the delayed recipe reduces the amax history.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Algo {
    /// The largest amax of the window.
    Max,
    /// The amax of the step that just ran.
    MostRecent,
}

/// Delayed-scaling settings; any left out keep the recipe's default (1024, max, 0).
#[derive(Args, Clone, Debug, Default)]
pub struct DelayedArgs {
    /// Amax history length, current step included (1 to 1048576; default 1024).
    #[arg(long, value_name = "N")]
    pub history_len: Option<usize>,
    /// How the history becomes one amax (default max).
    #[arg(long, value_enum)]
    pub algo: Option<Algo>,
    /// Headroom in binades: scale = fp8_max * 2^-M / amax (0 to 8; default 0).
    #[arg(long, value_name = "M", allow_hyphen_values = true)]
    pub margin: Option<i32>,
}

impl DelayedArgs {
    /// Whether any setting was given.
    pub fn any(&self) -> bool {
        self.history_len.is_some() || self.algo.is_some() || self.margin.is_some()
    }

    /// `base` with the given settings replaced (not validated).
    pub fn apply(&self, base: &DelayedScaling) -> DelayedScaling {
        DelayedScaling {
            margin: self.margin.unwrap_or(base.margin),
            amax_history_len: self.history_len.unwrap_or(base.amax_history_len),
            amax_compute_algo: match self.algo {
                Some(Algo::Max) => AmaxComputeAlgo::Max,
                Some(Algo::MostRecent) => AmaxComputeAlgo::MostRecent,
                None => base.amax_compute_algo,
            },
            ..base.clone()
        }
    }
}
