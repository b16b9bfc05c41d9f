//! SplitMix64 (Steele, Lea & Flood 2014): a 64-bit counter passed through a
//! mixing function. One u64 of state, so it goes into a checkpoint as is;
//! every seed (zero included) gives a full-period stream of 2^64 outputs that
//! passes BigCrush, plenty for sampling training data.

use serde::{Deserialize, Serialize};

/// Added to the state at every draw (2^64 / golden ratio, odd).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The generator; its state is public so checkpoints can save and restore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitMix64 {
    /// The counter; the next output is `mix(state + GAMMA)`.
    pub state: u64,
}

impl SplitMix64 {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Output `i` (from 0) of the stream of `seed`, without drawing the ones before it: the
    /// counter jumps to `seed + i * GAMMA` (counter-based draws, e.g. a dropout mask computed
    /// per element on a GPU).
    pub fn nth(seed: u64, i: u64) -> u64 {
        SplitMix64 {
            state: seed.wrapping_add(i.wrapping_mul(GAMMA)),
        }
        .next_u64()
    }

    /// Uniform in `0..n` without modulo bias (Lemire's multiply-and-reject); `n = 0` gives 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Products whose low half falls under 2^64 mod n are rejected so every bucket gets the same count.
        let threshold = n.wrapping_neg() % n;
        loop {
            let product = (self.next_u64() as u128) * (n as u128);
            if (product as u64) >= threshold {
                return (product >> 64) as u64;
            }
        }
    }

    /// Uniform in `[0, 1)` with 24 random bits (every value a multiple of 2^-24).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// A generator for another purpose, independent of this one's future draws.
    pub fn fork(&mut self) -> SplitMix64 {
        SplitMix64::new(self.next_u64())
    }
}

/// Where a training stream stands: its RNG and the batches drawn so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataStream {
    /// Draws the next batch.
    pub rng: SplitMix64,
    /// Batches handed out so far.
    pub batches: u64,
}

impl DataStream {
    /// The start of the stream fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        DataStream {
            rng: SplitMix64::new(seed),
            batches: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_reference_outputs() {
        // First outputs for seed 1234567 from the reference C implementation (Vigna's splitmix64.c).
        let mut rng = SplitMix64::new(1234567);
        let expected = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for e in expected {
            assert_eq!(rng.next_u64(), e);
        }
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut rng = SplitMix64::new(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[rng.below(10) as usize] += 1;
        }
        // Each bucket expects 10000 with a standard deviation of ~95: 6 sigma.
        assert!(counts.iter().all(|&c| (9_430..=10_570).contains(&c)), "{counts:?}");
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
        let big = u64::MAX - 3;
        assert!((0..1000).all(|_| rng.below(big) < big));
    }

    #[test]
    fn f32_in_unit_interval_and_state_round_trips() {
        let mut rng = SplitMix64::new(0);
        assert!((0..10_000).map(|_| rng.next_f32()).all(|x| (0.0..1.0).contains(&x)));
        let stream = DataStream { rng, batches: 42 };
        let json = serde_json::to_string(&stream).unwrap();
        let mut back: DataStream = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stream);
        assert_eq!(back.rng.next_u64(), rng.next_u64());
    }
}
