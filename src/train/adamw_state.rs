//! What AdamW carries from step to step, and what a checkpoint holds of it: the
//! step count and each parameter's moments (wherever the optimizer keeps them
//! while it runs: host vectors, or device arenas, `train::adamw_arena`).

/// First and second moments of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Moments {
    /// The parameter's name.
    pub name: String,
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// First moment (mean of gradients).
    pub m: Vec<f32>,
    /// Second moment (mean of squared gradients).
    pub v: Vec<f32>,
}

/// Everything a checkpoint needs to continue the optimizer exactly.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdamWState {
    /// Steps taken (the `t` of the bias correction).
    pub step: u64,
    /// One entry per parameter, in the module's visiting order; empty before the first step.
    pub moments: Vec<Moments>,
}
