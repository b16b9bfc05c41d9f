//! Text generation with a [`LlamaModel`]: the prompt fills the key/value cache in one pass, then
//! one token per step; greedy at temperature 0, otherwise temperature and nucleus (top-p)
//! sampling from a seeded generator.

use super::ends::argmax;
use super::llama::LlamaModel;
use crate::data::SplitMix64;
use crate::error::{Error, Result};

/// How the next token is chosen from the logits.
#[derive(Clone, Debug)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    rng: SplitMix64,
}

impl Sampler {
    /// `temperature` 0 is greedy (ties: the lowest id); `top_p` in (0, 1] keeps the smallest set
    /// of most likely tokens whose probability reaches it.
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Result<Self> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(Error::InvalidSetting {
                setting: "temperature",
                value: temperature.to_string(),
                reason: "must be a finite number >= 0".into(),
            });
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Error::InvalidSetting {
                setting: "top-p",
                value: top_p.to_string(),
                reason: "must be in (0, 1]".into(),
            });
        }
        Ok(Sampler {
            temperature,
            top_p,
            rng: SplitMix64::new(seed),
        })
    }

    /// The next token from one row of logits.
    pub fn next(&mut self, logits: &[f32]) -> u32 {
        if self.temperature == 0.0 {
            return argmax(logits);
        }
        // Softmax of logits / T in f64, most likely first.
        let t = f64::from(self.temperature);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((f64::from(l) - f64::from(max)) / t).exp()))
            .collect();
        let total: f64 = probs.iter().map(|p| p.1).sum();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let (mut kept, mut mass) = (0, 0.0);
        for p in &probs {
            kept += 1;
            mass += p.1 / total;
            if mass >= f64::from(self.top_p) {
                break;
            }
        }
        let kept = &probs[..kept];
        let kept_total: f64 = kept.iter().map(|p| p.1).sum();
        let mut u = f64::from(self.rng.next_f32()) * kept_total;
        for p in kept {
            if u < p.1 {
                return p.0;
            }
            u -= p.1;
        }
        kept[kept.len() - 1].0
    }
}

impl LlamaModel {
    /// Up to `max_new` tokens after `prompt` (non-empty), stopping after any of `stop`; each new
    /// token goes to `on_token` as it comes. Returns the new tokens (the prompt excluded).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        stop: &[u32],
        on_token: &mut dyn FnMut(u32) -> Result<()>,
    ) -> Result<Vec<u32>> {
        if prompt.is_empty() {
            return Err(Error::InvalidSetting {
                setting: "prompt",
                value: String::new(),
                reason: "the prompt has no tokens".into(),
            });
        }
        let vocab = self.vocab();
        let mut cache = self.new_cache();
        let mut logits = self.forward_cached(prompt, &mut cache)?;
        let mut out = Vec::with_capacity(max_new);
        while out.len() < max_new {
            let next = sampler.next(&logits[logits.len() - vocab..]);
            out.push(next);
            on_token(next)?;
            if stop.contains(&next) || out.len() == max_new {
                break;
            }
            logits = self.forward_cached(&[next], &mut cache)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top_p_and_seeds() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        assert_eq!(Sampler::new(0.0, 1.0, 1).unwrap().next(&logits), 1);
        // top-p this small keeps only the most likely token whatever the temperature.
        let mut narrow = Sampler::new(5.0, 1e-6, 1).unwrap();
        assert!((0..50).all(|_| narrow.next(&logits) == 1));
        // A hot sampler over all tokens visits several; the same seed repeats the same draws.
        let draws = |seed| {
            let mut s = Sampler::new(10.0, 1.0, seed).unwrap();
            (0..64).map(|_| s.next(&logits)).collect::<Vec<_>>()
        };
        let a = draws(7);
        assert_eq!(a, draws(7));
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() >= 3, "{a:?}");
        assert!(Sampler::new(-1.0, 1.0, 0).is_err());
        assert!(Sampler::new(1.0, 0.0, 0).is_err());
        assert!(Sampler::new(1.0, 1.5, 0).is_err());
    }
}
