//! A row's attention over its keys, a chunk of [`KEY_CHUNK`] positions at a time: the keys
//! a call's rows see in position order ([`Keys`]), each chunk's scores, exponentials and
//! weighted values ([`ChunkSums`]), and the fold of a chunk into the row's running sums
//! ([`fold`]), in key order whatever the split.

use super::kv::{widen, KvCache};
use crate::backend::AttnParams;
use crate::cpu::ops::{axpys, dot, dots, exp_approx, f16_to_f32, sum};
use crate::cpu::tensor::Act;
use std::ops::Range;

/// Positions of keys summed before they are folded into a row's running sums ([`fold`]).
/// Natively, one row over one KV head of 256 and four heads (Gemma 3 270M's layout), two
/// threads by chunks of 64: 160 keys in 22 µs, 512 in 63, 1 600 in 184 (split by heads or in
/// three passes by keys before: 28, 84, 228); one thread 1-4% slower than one pass over the
/// keys, a prompt's 256 rows over 1 600 keys 17% (54 ms, 46 before). Chunks of 32 took as
/// long on one thread and longer on two.
pub(super) const KEY_CHUNK: usize = 64;

/// Values [`Weighing`] converts and then sums into the outputs at once ([`axpys`]): 16 of
/// a head of 256 dimensions are 16 KiB as f32, in the first-level cache beside a decode
/// step's four outputs (1 KiB each; a prompt's block of 8 rows has 32 of them, which
/// `axpys` takes four at a time).
pub(super) const VALUES_AT_ONCE: usize = 16;

/// The keys a call's rows see: the cached positions before `first` (in position order) and
/// the call's own (`k`, `v` as f16), row `t` those of its branch up to itself.
pub(super) struct Keys<'a> {
    pub(super) kv: &'a KvCache,
    /// The cached keys before `first` as (slot, position), in position order (a ring that
    /// has wrapped holds them in another).
    pub(super) cached: Vec<(usize, usize)>,
    pub(super) k: &'a [u16],
    pub(super) v: &'a [u16],
    pub(super) first: usize,
    pub(super) starts: &'a [usize],
    /// Values a row of `k` and `v` (every KV head's).
    pub(super) kv_w: usize,
    /// A key at `pk` is visible from a query at `pq` when `pq − pk < window`.
    pub(super) window: usize,
}

impl<'a> Keys<'a> {
    pub(super) fn new(
        kv: &'a KvCache,
        k: &'a [u16],
        v: &'a [u16],
        first: usize,
        starts: &'a [usize],
        window: usize,
    ) -> Self {
        let mut cached: Vec<(usize, usize)> = (kv.pos.iter().enumerate())
            .filter_map(|(s, pk)| pk.filter(|&pk| pk < first).map(|pk| (s, pk)))
            .collect();
        // A ring holds them in runs of ascending positions (two after it wraps), which the
        // sort merges.
        cached.sort_by_key(|&(_, pk)| pk);
        Self {
            kv,
            cached,
            k,
            v,
            first,
            starts,
            kv_w: kv.width,
            window,
        }
    }

    /// The keys of row `t`'s list (its [`Keys::count`]: the cached ones, then its branch's
    /// rows up to its own, positions ascending) whose positions lie in `positions`.
    pub(super) fn in_positions(&self, t: usize, positions: Range<usize>) -> Range<usize> {
        let n = self.cached.len();
        let below = |p: usize| self.cached.partition_point(|&(_, pk)| pk < p);
        let (lo, hi) = (below(positions.start), below(positions.end));
        // The branch's rows: list index n + i holds position first + i.
        let own = self.count(t) - n;
        let at = |p: usize| p.saturating_sub(self.first).min(own);
        let (a, b) = (at(positions.start), at(positions.end));
        // A range of the call's rows lies above every cached position, so with some of them
        // the cached part (if any) runs to the end of the cached keys.
        let start = if lo < hi { lo } else { n + a };
        let end = if a < b { n + b } else { hi.max(start) };
        start..end
    }

    /// The chunks ([`KEY_CHUNK`] positions each) that rows `rows` of one branch have keys in:
    /// from the lowest key any of them sees (a sliding window's ring holds `window` positions
    /// before the call, and a prompt's later rows see fewer of them) to the highest query.
    /// A chunk below would sum to nothing for each of them, which [`fold`] skips.
    pub(super) fn chunks(&self, rows: Range<usize>) -> Range<usize> {
        let cached = self.cached.first().map_or(self.first, |&(_, pk)| pk);
        let seen = (rows.clone())
            .map(|t| (self.query_pos(t) + 1).saturating_sub(self.window))
            .min()
            .unwrap_or(0);
        let lowest = cached.max(seen);
        let highest = rows.map(|t| self.query_pos(t)).max().unwrap_or(lowest);
        lowest / KEY_CHUNK..highest.max(lowest) / KEY_CHUNK + 1
    }

    /// Whether row `t` sees a key at position `pk` (causal, windowed).
    pub(super) fn sees(&self, t: usize, pk: usize) -> bool {
        let pq = self.query_pos(t);
        pk <= pq && pq - pk < self.window
    }

    /// Position of row `t`'s query.
    pub(super) fn query_pos(&self, t: usize) -> usize {
        self.first + t - self.starts[t]
    }

    /// Keys row `t` sees, its own last.
    pub(super) fn count(&self, t: usize) -> usize {
        self.cached.len() + t - self.starts[t] + 1
    }

    /// Key `j` of row `t` for KV head `kh` (`hd` values): a cached slot (`j <
    /// cached.len()`) or the call's row `starts[t] + j − cached.len()`; its position, key and
    /// value.
    pub(super) fn at(
        &self,
        t: usize,
        kh: usize,
        hd: usize,
        j: usize,
    ) -> (usize, &'a [u16], &'a [u16]) {
        let at = kh * hd..(kh + 1) * hd;
        match self.cached.get(j) {
            Some(&(s, pk)) => (pk, &self.kv.key(s)[at.clone()], &self.kv.value(s)[at]),
            None => {
                let b0 = self.starts[t];
                let r = b0 + j - self.cached.len();
                let at = r * self.kv_w + kh * hd..r * self.kv_w + (kh + 1) * hd;
                (self.first + r - b0, &self.k[at.clone()], &self.v[at])
            }
        }
    }
}

/// Values summed into outputs by their weights, a few at a time ([`axpys`]): each value
/// converted to f32 once, then up to [`VALUES_AT_ONCE`] of them weighed into every output
/// with the outputs' values held in registers across them. A key every output weighs at
/// zero is left out by the callers; one only some do adds `0 · v = ±0` to the others, which
/// changes nothing: an output starts at +0 and a sum of finite terms from +0 is never −0 (f16
/// values are finite), so each output is the sum of its nonzero terms in key order, whichever
/// keys share its batch.
pub(super) struct Weighing {
    /// The values taken so far, as f32, one after another.
    pub(super) values: Vec<f32>,
    /// Their weights, one per output, value after value.
    pub(super) weights: Vec<f32>,
}

impl Weighing {
    pub(super) const fn new() -> Self {
        Self {
            values: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// `value` with one weight for each of `outs` (rows as long as it, one after another);
    /// every [`VALUES_AT_ONCE`] values, summed into them.
    pub(super) fn add(
        &mut self,
        outs: &mut [f32],
        value: &[u16],
        weights: impl Iterator<Item = f32>,
    ) {
        self.values.extend(value.iter().map(|&h| f16_to_f32(h)));
        self.weights.extend(weights);
        if self.values.len() >= VALUES_AT_ONCE * value.len() {
            self.finish(outs, value.len());
        }
    }

    /// The values taken so far (each `width` long), summed into `outs`.
    pub(super) fn finish(&mut self, outs: &mut [f32], width: usize) {
        if let Some(m) = outs.len().checked_div(width) {
            axpys(outs, m, &self.weights, &self.values);
        }
        self.values.clear();
        self.weights.clear();
    }
}

/// Row `t`'s scores `q_h · key × scale` for the heads `heads`, each to `put(i, score)` (`i`:
/// the head's place in `heads`): four heads at a time ([`dots`]), each the [`dot`] it would
/// be alone.
pub(super) fn scores_of(
    q: &Act,
    t: usize,
    heads: Range<usize>,
    hd: usize,
    key: &[f32],
    scale: f32,
    mut put: impl FnMut(usize, f32),
) {
    let qv = |h: usize| &q.data[t * q.width + h * hd..t * q.width + (h + 1) * hd];
    let mut h = heads.start;
    while h + 4 <= heads.end {
        let four = dots([qv(h), qv(h + 1), qv(h + 2), qv(h + 3)], key);
        for (i, s) in four.into_iter().enumerate() {
            put(h + i - heads.start, s * scale);
        }
        h += 4;
    }
    for h in h..heads.end {
        put(h - heads.start, dot(qv(h), key) * scale);
    }
}

/// A head's scores (of a chunk of keys) into their exponentials less their maximum, in place
/// ([`exp_approx`], a key it does not see exactly 0): that maximum (−∞ where it sees none)
/// and their [`sum`] (in eight lanes). Every exponential at once, then the sum, so that the
/// exponentials vectorise (libm's is a call per value: in Chromium a 1 600-token prompt took
/// 3% longer).
pub(super) fn exps(head: &mut [f32]) -> (f32, f32) {
    // The maximum in eight lanes (`f32::max`'s NaN rule kept it one value at a time): the
    // same in any order, a NaN passed over as `f32::max` does.
    let mut top = [f32::NEG_INFINITY; 8];
    for c in head.chunks(8) {
        for (t, &s) in top.iter_mut().zip(c) {
            *t = if s > *t { s } else { *t };
        }
    }
    let max = top.into_iter().fold(f32::NEG_INFINITY, f32::max);
    for s in head.iter_mut() {
        *s = if *s == f32::NEG_INFINITY {
            0.0
        } else {
            exp_approx(*s - max)
        };
    }
    (max, sum(head))
}

/// A work item's sums over one chunk of keys ([`ChunkSums::sum_chunk`]) and its scratch.
pub(super) struct ChunkSums {
    /// The chunk's scores, then their exponentials: (row, head) x's for the key at the
    /// chunk's first position + i at `x · KEY_CHUNK + i`.
    pub(super) scores: Vec<f32>,
    /// A key as f32.
    pub(super) key: Vec<f32>,
    pub(super) weighing: Weighing,
    /// Each (row, head)'s largest score in the chunk, Σ exp(score − it), and (at `x · hd`)
    /// Σ exp(score − it) · value.
    pub(super) max: Vec<f32>,
    pub(super) sum: Vec<f32>,
    pub(super) out: Vec<f32>,
}

impl ChunkSums {
    pub(super) const fn new() -> Self {
        Self {
            scores: Vec::new(),
            key: Vec::new(),
            weighing: Weighing::new(),
            max: Vec::new(),
            sum: Vec::new(),
            out: Vec::new(),
        }
    }

    /// The keys at positions `c · KEY_CHUNK..(c + 1) · KEY_CHUNK` (chunk c) of rows `rows`
    /// (consecutive, of one branch: they list the same keys, each row those up to its own)
    /// for KV head `kh`'s heads: (row r, head i) at x = r · group + i. A key is converted
    /// once for all of them. A row's sums depend only on the positions and values of the
    /// keys it sees, not on the rows and heads beside it nor on which call and cache slots
    /// held the keys: each score has the slot of its key's position in the chunk (a key not
    /// held or not seen −∞, so 0 once exponentiated), the sum adds those slots in its eight
    /// lanes, and the values are weighed in position order ([`Weighing`]: each output's
    /// terms in order, whichever outputs share a batch).
    pub(super) fn sum_chunk(
        &mut self,
        q: &Act,
        keys: &Keys,
        p: AttnParams,
        rows: Range<usize>,
        kh: usize,
        c: usize,
    ) {
        let (hd, group) = (p.head_dim, p.n_head / p.n_head_kv);
        let heads = kh * group..(kh + 1) * group;
        let m = rows.len() * group;
        let last = rows.end - 1;
        let first = c * KEY_CHUNK;
        let js = keys.in_positions(last, first..first + KEY_CHUNK);
        self.scores.clear();
        self.scores.resize(m * KEY_CHUNK, f32::NEG_INFINITY);
        self.key.resize(hd, 0.0);
        for j in js.clone() {
            let (pk, key, _) = keys.at(last, kh, hd, j);
            let mut converted = false;
            for (r, t) in rows.clone().enumerate() {
                if j >= keys.count(t) || !keys.sees(t, pk) {
                    continue;
                }
                if !converted {
                    widen(&mut self.key, key);
                    converted = true;
                }
                let scores = &mut self.scores;
                scores_of(q, t, heads.clone(), hd, &self.key, p.scale, |i, s| {
                    scores[(r * group + i) * KEY_CHUNK + pk - first] = s;
                });
            }
        }
        self.max.clear();
        self.sum.clear();
        for x in 0..m {
            let (max, sum) = exps(&mut self.scores[x * KEY_CHUNK..(x + 1) * KEY_CHUNK]);
            self.max.push(max);
            self.sum.push(sum);
        }
        self.out.clear();
        self.out.resize(m * hd, 0.0);
        let weights = &self.scores;
        for j in js {
            let (pk, _, value) = keys.at(last, kh, hd, j);
            let at = pk - first;
            if (0..m).all(|x| weights[x * KEY_CHUNK + at] == 0.0) {
                continue;
            }
            let weights = (0..m).map(|x| weights[x * KEY_CHUNK + at]);
            self.weighing.add(&mut self.out, value, weights);
        }
        self.weighing.finish(&mut self.out, hd);
    }
}

/// A (row, head)'s running sums over the chunks of its keys so far: their largest score,
/// Σ exp(score − it) and Σ exp(score − it) · value (`out`).
pub(super) struct Running<'a> {
    pub(super) max: &'a mut f32,
    pub(super) sum: &'a mut f32,
    pub(super) out: &'a mut [f32],
}

/// Fold a chunk's sums (its largest score, Σ exp, Σ exp · value) into `run`, the smaller
/// maximum's scaled to the larger ([`exp_approx`]): `run` times e^(its max − the chunk's)
/// plus the chunk's where the chunk's is larger, else `run` plus the chunk's times
/// e^(the chunk's max − run's). A chunk whose keys the row does not see (sum 0) changes
/// nothing; the first one is taken as it is. Every split folds a row's chunks in key order
/// through here.
pub(super) fn fold(run: Running, max: f32, sum: f32, out: &[f32]) {
    if sum == 0.0 {
        return;
    }
    if *run.sum == 0.0 {
        *run.max = max;
        *run.sum = sum;
        run.out.copy_from_slice(out);
    } else if max <= *run.max {
        let b = exp_approx(max - *run.max);
        *run.sum += sum * b;
        for (o, &v) in run.out.iter_mut().zip(out) {
            *o += v * b;
        }
    } else {
        let a = exp_approx(*run.max - max);
        *run.max = max;
        *run.sum = *run.sum * a + sum;
        for (o, &v) in run.out.iter_mut().zip(out) {
            *o = *o * a + v;
        }
    }
}

/// `run`'s output: its weighted values over its sum (as a softmax's weights, one over their
/// sum).
pub(super) fn finish_into(dst: &mut [f32], sum: f32, out: &[f32]) {
    let inv = 1.0 / sum;
    for (d, &o) in dst.iter_mut().zip(out) {
        *d = o * inv;
    }
}
