//! The scoring math, backend-free: labels ranked by score, cosine similarity → softmax,
//! centroids, and the few-shot logistic regression.

use super::call::Scored;
use crate::logits::softmax;

/// Labels with their scores, best first (ties keep the labels' order).
pub fn ranked(names: &[&str], scores: &[f64]) -> Vec<Scored> {
    let mut out: Vec<Scored> = names
        .iter()
        .zip(scores)
        .map(|(l, &s)| Scored {
            label: (*l).to_string(),
            score: s,
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// Scores of a unit text vector against unit label vectors: softmax(cos / temperature).
pub fn by_similarity(text: &[f32], labels: &[Vec<f32>], temperature: f64) -> Vec<f64> {
    let logits: Vec<f64> = labels.iter().map(|l| dot(text, l) / temperature).collect();
    softmax(&logits)
}

/// The normalised mean of unit vectors.
pub fn centroid(vectors: &[&[f32]]) -> Vec<f32> {
    let d = vectors.first().map_or(0, |v| v.len());
    let mut acc = vec![0f64; d];
    for v in vectors {
        for (a, &x) in acc.iter_mut().zip(v.iter()) {
            *a += f64::from(x);
        }
    }
    let n = acc.iter().map(|x| x * x).sum::<f64>().sqrt();
    acc.iter()
        .map(|x| if n > 0.0 { (x / n) as f32 } else { 0.0 })
        .collect()
}

/// A multinomial logistic regression: `softmax(W x + b)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Logistic {
    /// `(classes, dim)`, row-major.
    pub w: Vec<f64>,
    pub b: Vec<f64>,
    pub dim: usize,
}

/// Training constants (the Python twin in `tests/classify/reference.py` uses the same).
pub const LOGISTIC_STEPS: usize = 300;
pub const LOGISTIC_RATE: f64 = 2.0;
pub const LOGISTIC_L2: f64 = 1e-3;

impl Logistic {
    /// Train on `(vector, class)` pairs by full-batch gradient descent on the mean
    /// cross-entropy plus `L2/2 · |W|²` from zero weights: deterministic, and on unit vectors
    /// (curvature ≤ 1/2) a step of 2 is stable.
    pub fn train(examples: &[(&[f32], usize)], classes: usize) -> Self {
        let dim = examples.first().map_or(0, |(v, _)| v.len());
        let mut w = vec![0f64; classes * dim];
        let mut b = vec![0f64; classes];
        let n = examples.len().max(1) as f64;
        let mut gw = vec![0f64; classes * dim];
        let mut gb = vec![0f64; classes];
        for _ in 0..LOGISTIC_STEPS {
            gw.iter_mut().for_each(|g| *g = 0.0);
            gb.iter_mut().for_each(|g| *g = 0.0);
            for &(x, y) in examples {
                let p = softmax(&logits(&w, &b, dim, x));
                for c in 0..classes {
                    let d = p[c] - f64::from(u8::from(c == y));
                    gb[c] += d;
                    for (g, &xi) in gw[c * dim..(c + 1) * dim].iter_mut().zip(x) {
                        *g += d * f64::from(xi);
                    }
                }
            }
            for (wi, gi) in w.iter_mut().zip(&gw) {
                *wi -= LOGISTIC_RATE * (gi / n + LOGISTIC_L2 * *wi);
            }
            for (bi, gi) in b.iter_mut().zip(&gb) {
                *bi -= LOGISTIC_RATE * gi / n;
            }
        }
        Self { w, b, dim }
    }

    pub fn predict(&self, x: &[f32]) -> Vec<f64> {
        softmax(&logits(&self.w, &self.b, self.dim, x))
    }
}

fn logits(w: &[f64], b: &[f64], dim: usize, x: &[f32]) -> Vec<f64> {
    b.iter()
        .enumerate()
        .map(|(c, bc)| {
            bc + w[c * dim..(c + 1) * dim]
                .iter()
                .zip(x)
                .map(|(wi, &xi)| wi * f64::from(xi))
                .sum::<f64>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_ranks() {
        let p = softmax(&[1.0, 3.0, 2.0]);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let r = ranked(&["a", "b", "c"], &p);
        assert_eq!(
            r.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(),
            ["b", "c", "a"]
        );
    }

    #[test]
    fn logistic_separates_two_clusters() {
        let a = [1.0f32, 0.0];
        let b = [0.0f32, 1.0];
        let m = Logistic::train(&[(&a, 0), (&b, 1)], 2);
        assert!(m.predict(&a)[0] > 0.9);
        assert!(m.predict(&b)[1] > 0.9);
    }
}
