//! Deterministic parameter initialization from a seed (SplitMix64 + Box-Muller):
//! the same seed gives the same model on every machine, with no dependency.

/// SplitMix64: a tiny, well-mixed 64-bit generator.
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: 53 random bits, never 0 (Box-Muller takes its log).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// A standard normal sample.
    pub(crate) fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// The seed of sub-module `index` of a module seeded with `seed`.
pub(crate) fn child_seed(seed: u64, index: u64) -> u64 {
    SplitMix64::new(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

thread_local! {
    /// Set while a model whose every parameter a checkpoint is about to overwrite is built
    /// ([`without_draws`]): drawing 1.2e9 normal samples for a 1B model takes over a minute.
    static SKIP_DRAWS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// Set while a model whose linear weights are all about to become frozen FP8 codes is built
    /// ([`with_deferred_linear_weights`]): they get no f32 storage at all.
    static DEFER_WEIGHTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `build` with every [`super::Linear`] made with an empty placeholder weight (on this
/// thread), except high-precision layers such as the head. Only for weights that are all
/// replaced right after by frozen FP8 codes.
pub(crate) fn with_deferred_linear_weights<T>(build: impl FnOnce() -> T) -> T {
    let before = DEFER_WEIGHTS.with(|s| s.replace(true));
    let out = build();
    DEFER_WEIGHTS.with(|s| s.set(before));
    out
}

/// Runs `build` with weights allocated as usual even inside [`with_deferred_linear_weights`].
pub(crate) fn not_deferring<T>(build: impl FnOnce() -> T) -> T {
    let before = DEFER_WEIGHTS.with(|s| s.replace(false));
    let out = build();
    DEFER_WEIGHTS.with(|s| s.set(before));
    out
}

/// Whether linear weights are deferred ([`with_deferred_linear_weights`]).
pub(crate) fn deferring_weights() -> bool {
    DEFER_WEIGHTS.with(|s| s.get())
}

/// Runs `build` with [`normal`] returning zeros instead of drawing (on this thread). Only for
/// parameters that are all replaced right after, e.g. by a checkpoint load.
pub(crate) fn without_draws<T>(build: impl FnOnce() -> T) -> T {
    let before = SKIP_DRAWS.with(|s| s.replace(true));
    let out = build();
    SKIP_DRAWS.with(|s| s.set(before));
    out
}

/// `n` samples of a normal distribution with standard deviation `std` (zeros inside
/// [`without_draws`]).
pub(crate) fn normal(seed: u64, n: usize, std: f64) -> Vec<f32> {
    if SKIP_DRAWS.with(|s| s.get()) {
        return vec![0.0; n];
    }
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| (rng.normal() * std) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_draws_gives_zeros_only_inside() {
        let drawn = normal(3, 8, 1.0);
        assert!(drawn.iter().any(|v| *v != 0.0));
        assert_eq!(without_draws(|| normal(3, 8, 1.0)), vec![0.0; 8]);
        assert_eq!(normal(3, 8, 1.0), drawn);
    }
}
