//! Choosing the next token: greedy, temperature, top-k, top-p, min-p, repetition and
//! presence penalties, with a seeded RNG that gives the same text natively and in wasm.
//! Pure: works on full logits or on a short list of candidates (as a GPU top-k returns).

use crate::error::{Error, Result};
use crate::logits::top_k;
use crate::rng::Rng;

/// How to sample. `temperature == 0` is greedy.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SamplerConfig {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (0: none).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1: off).
    pub repetition_penalty: f32,
    /// Subtract from the logits of recent tokens (0: off).
    pub presence_penalty: f32,
    /// Subtract this × the number of times a token occurs among the recent ones (0: off).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    /// Same seed, same prompt, same options → same text.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding, no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Refuse options that make no sense, with the range that does.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(what));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!("temperature {} must be ≥ 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p {} must be in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p {} must be in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!(
                "repetition_penalty {} must be > 0",
                self.repetition_penalty
            ));
        }
        if !self.presence_penalty.is_finite() {
            return bad(format!(
                "presence_penalty {} must be finite",
                self.presence_penalty
            ));
        }
        if !self.frequency_penalty.is_finite() {
            return bad(format!(
                "frequency_penalty {} must be finite",
                self.frequency_penalty
            ));
        }
        Ok(())
    }
}

/// A sampler with its RNG state.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Self> {
        cfg.validate()?;
        let rng = Rng::new(cfg.seed);
        Ok(Self { cfg, rng })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Pick the next token from full logits; `history` is the sequence so far (for penalties).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        if self.cfg.temperature == 0.0 {
            return argmax(logits);
        }
        let k = if self.cfg.top_k == 0 {
            logits.len()
        } else {
            self.cfg.top_k.min(logits.len())
        };
        let cands = top_k(logits, k);
        self.sample_candidates(cands)
    }

    /// How many of the best logits [`Sampler::sample_top`] needs to decide exactly as
    /// [`Sampler::sample`] would on all of them, or `None` when it needs them all (top-k off
    /// or above `max`, or penalties that can raise a token). Penalties only lower the
    /// recent tokens, so the final top-k lies within the top k + (distinct recent tokens).
    pub fn candidates_needed(&self, history: &[u32], max: usize) -> Option<usize> {
        let (rep, pres, freq) = self.penalties();
        if rep < 1.0 || pres < 0.0 || freq < 0.0 {
            return None;
        }
        let extra = if self.penalties_off() {
            0
        } else {
            self.recent(history).len()
        };
        let base = if self.cfg.temperature == 0.0 {
            1
        } else if self.cfg.top_k == 0 {
            return None;
        } else {
            self.cfg.top_k
        };
        Some(base + extra).filter(|&k| k <= max)
    }

    /// Pick from the best `(id, logit)` of the full logits (at least
    /// [`Sampler::candidates_needed`] of them): the same token as [`Sampler::sample`].
    pub fn sample_top(&mut self, mut cands: Vec<(u32, f32)>, history: &[u32]) -> u32 {
        if !self.penalties_off() {
            let recent = self.recent(history);
            for c in &mut cands {
                if let Ok(i) = recent.binary_search_by_key(&c.0, |r| r.0) {
                    c.1 = self.penalised(c.1, recent[i].1);
                }
            }
        }
        self.sample_candidates(cands)
    }

    fn penalties(&self) -> (f32, f32, f32) {
        let c = &self.cfg;
        (
            c.repetition_penalty,
            c.presence_penalty,
            c.frequency_penalty,
        )
    }

    fn penalties_off(&self) -> bool {
        self.penalties() == (1.0, 0.0, 0.0)
    }

    /// A recent token's logit after the penalties, as llama.cpp applies them: repetition
    /// (divide a positive logit, multiply a negative one), then presence + count × frequency.
    fn penalised(&self, l: f32, count: u32) -> f32 {
        let (rep, pres, freq) = self.penalties();
        let l = if l > 0.0 { l / rep } else { l * rep };
        l - pres - freq * count as f32
    }

    /// The distinct ids the penalties look at, sorted, with how often each occurs.
    fn recent(&self, history: &[u32]) -> Vec<(u32, u32)> {
        let start = history.len().saturating_sub(self.cfg.penalty_last_n);
        let mut seen: Vec<u32> = history[start..].to_vec();
        seen.sort_unstable();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for id in seen {
            match out.last_mut() {
                Some(last) if last.0 == id => last.1 += 1,
                _ => out.push((id, 1)),
            }
        }
        out
    }

    /// Pick from candidates `(id, logit)` sorted or not (e.g. a GPU top-k).
    pub fn sample_candidates(&mut self, mut cands: Vec<(u32, f32)>) -> u32 {
        cands.retain(|c| c.1.is_finite());
        cands.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let Some(&(best, max)) = cands.first() else {
            return 0;
        };
        if self.cfg.temperature == 0.0 {
            return best;
        }
        if self.cfg.top_k > 0 {
            cands.truncate(self.cfg.top_k);
        }
        // Probabilities at temperature 1 decide the top-p / min-p cut, as llama.cpp does.
        let mut probs: Vec<f64> = cands.iter().map(|c| f64::from(c.1 - max).exp()).collect();
        let sum: f64 = probs.iter().sum();
        let mut keep = cands.len();
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p / sum;
                if acc >= f64::from(self.cfg.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        if self.cfg.min_p > 0.0 {
            let cut = f64::from(self.cfg.min_p); // relative to the top probability, exp(0) = 1
            keep = keep.min(probs.iter().take_while(|&&p| p >= cut).count().max(1));
        }
        cands.truncate(keep);
        let t = f64::from(self.cfg.temperature);
        probs = cands
            .iter()
            .map(|c| (f64::from(c.1 - max) / t).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (c, p) in cands.iter().zip(&probs) {
            r -= p;
            if r < 0.0 {
                return c.0;
            }
        }
        cands.last().map_or(best, |c| c.0)
    }

    fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        if self.penalties_off() {
            return;
        }
        for (id, count) in self.recent(history) {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = self.penalised(*l, count);
            }
        }
    }
}

/// Index of the largest logit (the lowest index among equals; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
        let mut l = vec![0.1, 3.0, -1.0, 2.9];
        assert_eq!(s.sample(&mut l, &[]), 1);
    }

    #[test]
    fn repetition_penalty_changes_greedy_choice() {
        let cfg = SamplerConfig {
            repetition_penalty: 2.0,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg).unwrap();
        let mut l = vec![0.1, 3.0, -1.0, 2.0];
        assert_eq!(s.sample(&mut l, &[1]), 3);
    }

    #[test]
    fn frequency_penalty_counts_occurrences_and_top_k_agrees() {
        let cfg = SamplerConfig {
            frequency_penalty: 0.6,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg).unwrap();
        // Token 1 twice: 3.0 − 2 × 0.6 = 1.8, above token 3's 2.0 − 0.6 = 1.4; three times:
        // 3.0 − 1.8 = 1.2, below it.
        let l = vec![0.1, 3.0, -1.0, 2.0];
        assert_eq!(s.sample(&mut l.clone(), &[1, 1, 3]), 1);
        assert_eq!(s.sample(&mut l.clone(), &[1, 1, 1, 3]), 3);
        let hist = [1, 1, 1, 3];
        let k = s.candidates_needed(&hist, 128).unwrap();
        let cands = crate::logits::top_k(&l, k);
        assert_eq!(s.sample_top(cands, &hist), 3);
    }

    #[test]
    fn same_seed_same_choices_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let cfg = SamplerConfig {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let run = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone()).unwrap();
            (0..50)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(&cfg), run(&cfg));
        let other = SamplerConfig {
            seed: 8,
            ..cfg.clone()
        };
        assert_ne!(run(&cfg), run(&other));
        let k1 = SamplerConfig { top_k: 1, ..cfg };
        let a = argmax(&logits);
        assert!(run(&k1).iter().all(|&t| t == a));
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // probabilities ≈ 0.64, 0.24, 0.09, 0.03
        let cands = vec![(0, 3.0), (1, 2.0), (2, 1.0), (3, 0.0)];
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        assert!((0..200).all(|_| s.sample_candidates(cands.clone()) == 0));
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.3,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        let picks: Vec<u32> = (0..400)
            .map(|_| s.sample_candidates(cands.clone()))
            .collect();
        assert!(picks.iter().all(|&t| t <= 1));
        assert!(picks.contains(&1));
    }

    #[test]
    fn bad_options_are_refused() {
        for cfg in [
            SamplerConfig {
                temperature: -1.0,
                ..Default::default()
            },
            SamplerConfig {
                top_p: 0.0,
                ..Default::default()
            },
            SamplerConfig {
                min_p: 2.0,
                ..Default::default()
            },
            SamplerConfig {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            SamplerConfig {
                temperature: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(matches!(Sampler::new(cfg), Err(Error::InvalidArgument(_))));
        }
    }

    #[test]
    fn rng_is_stable() {
        // Fixed values: a change of algorithm would change every seeded generation.
        let mut r = Rng::new(42);
        let v: Vec<u64> = (0..2).map(|_| r.next_u64() % 1000).collect();
        let mut r2 = Rng::new(42);
        assert_eq!(v, (0..2).map(|_| r2.next_u64() % 1000).collect::<Vec<_>>());
    }
}
