//! What every layer does with a row of logits, in one leaf: which tokens a constraint's mask
//! allows, the `k` best, a softmax and a log-probability. The backends, the constraint code,
//! the sampler and the scorers all use these; this module imports nothing of the crate.

/// An output constraint's mask over the vocabulary: token `i` is allowed when bit `i % 32` of
/// word `i / 32` is set (a token past the mask's end is not).
pub type TokenMask = [u32];

/// Whether `mask` allows token `i`.
pub fn is_allowed(mask: &TokenMask, i: usize) -> bool {
    mask.get(i / 32).is_some_and(|w| (w >> (i % 32)) & 1 == 1)
}

/// The `k` largest `(id, logit)`, largest first (ties: the lower id first; NaN never counts).
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let c = logits.iter().enumerate().map(|(i, &v)| (i as u32, v));
    top_k_of(c.collect(), k)
}

/// [`top_k`] of `(index, value)` pairs (NaN values dropped): the `k` largest, largest first,
/// ties to the lower index.
pub fn top_k_of(mut c: Vec<(u32, f32)>, k: usize) -> Vec<(u32, f32)> {
    c.retain(|(_, v)| !v.is_nan());
    let k = k.min(c.len());
    let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k > 0 && k < c.len() {
        c.select_nth_unstable_by(k - 1, cmp);
        c.truncate(k);
    }
    c.sort_by(cmp);
    c
}

/// Probabilities from scores (f64, shifted by the maximum so no term overflows).
pub fn softmax(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// `log softmax(row)[id]` in f64.
pub fn log_prob(row: &[f32], id: u32) -> f64 {
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = row.iter().map(|&x| (f64::from(x) - m).exp()).sum();
    f64::from(row[id as usize]) - m - s.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_prob_is_a_log_softmax() {
        let row = [0.0f32, (2f32).ln()];
        assert!((log_prob(&row, 1) - (2.0f64 / 3.0).ln()).abs() < 1e-6);
    }

    #[test]
    fn top_k_breaks_ties_to_the_lower_id_and_drops_nan() {
        let l = [1.0, f32::NAN, 3.0, 3.0, -1.0];
        assert_eq!(top_k(&l, 3), vec![(2, 3.0), (3, 3.0), (0, 1.0)]);
        assert_eq!(top_k(&l, 9).len(), 4);
    }

    #[test]
    fn the_mask_reads_bit_i_of_word_i_over_32() {
        let mask = [0b101u32, 1 << 31];
        let allowed: Vec<usize> = (0..70).filter(|&i| is_allowed(&mask, i)).collect();
        assert_eq!(allowed, vec![0, 2, 63]);
    }
}
