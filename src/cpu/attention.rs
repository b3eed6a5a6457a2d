//! Attention with a KV cache on the CPU. A sliding-window layer keeps a ring of `window`
//! slots; a global layer keeps one slot per context position. Each slot remembers its
//! absolute position, so visibility is decided by positions, never by slot order, and so is
//! the order of every sum: a row's scores, weights and weighted values go by its keys'
//! positions, a chunk of [`KEY_CHUNK`] positions at a time ([`ChunkSums`], [`fold`]).
//!
//! Keys and values are held as f16, as llama.cpp holds them: half the memory (Gemma 3 270M:
//! 18 KiB a position instead of 36 over its 18 layers; 19.5 MiB less at 4096 positions, where
//! its sliding-window layers keep 512). A call's own rows are
//! rounded to f16 too before they are attended, so that a position reads the same key
//! whether it came in this call or an earlier one: a prompt gives the same values fed in
//! any chunks, restored from a saved prefix or not. Against the float64 reference this
//! moves Gemma 3's logits by ~0.001 (the gate is 0.01 mean, 0.05 max).

use std::cell::RefCell;
use std::ops::Range;

use super::dense::DenseMatrix;
use super::ops::{axpys, dot, dots, exp_approx, f16_to_f32, f32_to_f16, sum};
use super::pool::{self, SharedOut};
use super::Act;
use crate::backend::{AttnParams, KvRows};
use crate::error::{Error, Result};

/// Slots per allocation of a layer's cache: it grows with the positions it holds, in runs of
/// this many, not with the context it may reach (Gemma 3 270M at 4096: 39 MiB for every
/// conversation; a 192-token one now holds 7). A run is never moved or freed, so growing
/// copies nothing and leaves no hole in wasm memory, whose size never comes down.
const RUN_SLOTS: usize = 64;

/// One layer's cached keys and values, `n_slots` rows of `n_head_kv · head_dim` f16 bits.
#[derive(Clone)]
pub struct KvCache {
    /// Keys and values of slots `i · RUN_SLOTS..`, allocated when one of them is first written.
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
    /// Absolute position held by each slot (None: empty).
    pos: Vec<Option<usize>>,
    width: usize,
}

impl KvCache {
    pub fn new(n_slots: usize, width: usize) -> Self {
        Self {
            k: Vec::new(),
            v: Vec::new(),
            pos: vec![None; n_slots],
            width,
        }
    }

    pub fn clear(&mut self) {
        self.pos.iter_mut().for_each(|p| *p = None);
    }

    /// Slot `s`'s key: a slot that holds a position (`pos[s]` is `Some`) was written.
    fn key(&self, s: usize) -> &[u16] {
        let at = (s % RUN_SLOTS) * self.width;
        &self.k[s / RUN_SLOTS][at..at + self.width]
    }

    fn value(&self, s: usize) -> &[u16] {
        let at = (s % RUN_SLOTS) * self.width;
        &self.v[s / RUN_SLOTS][at..at + self.width]
    }

    /// Slot `s`'s key and value to write, its run allocated if it is not yet.
    fn slot_mut(&mut self, s: usize) -> (&mut [u16], &mut [u16]) {
        let run = s / RUN_SLOTS;
        while self.k.len() <= run {
            let first = self.k.len() * RUN_SLOTS;
            let len = RUN_SLOTS.min(self.pos.len() - first) * self.width;
            self.k.push(vec![0; len]);
            self.v.push(vec![0; len]);
        }
        let at = (s % RUN_SLOTS) * self.width;
        (
            &mut self.k[run][at..at + self.width],
            &mut self.v[run][at..at + self.width],
        )
    }

    /// Slots allocated (a multiple of `RUN_SLOTS`, or every slot).
    #[cfg(test)]
    fn allocated_slots(&self) -> usize {
        self.k.iter().map(Vec::len).sum::<usize>() / self.width.max(1)
    }

    /// The slots holding positions below `n_past` (all of them once a ring wrapped).
    pub fn save(&self, n_past: usize) -> Result<KvRows> {
        let n_slots = self.pos.len();
        let used = n_past.min(n_slots);
        let probe = KvRows {
            n_slots,
            width: self.width,
            k: Vec::new(),
            v: Vec::new(),
        };
        if (0..used).any(|s| self.pos[s] != Some(probe.position(s, n_past))) {
            return Err(Error::Backend(format!(
                "the KV cache does not hold exactly {n_past} positions"
            )));
        }
        let (mut k, mut v) = (
            Vec::with_capacity(used * self.width),
            Vec::with_capacity(used * self.width),
        );
        for s in 0..used {
            k.extend(self.key(s).iter().map(|&h| f16_to_f32(h)));
            v.extend(self.value(s).iter().map(|&h| f16_to_f32(h)));
        }
        Ok(KvRows { k, v, ..probe })
    }

    /// Put back what [`KvCache::save`] gave after `n_past` positions (f32 rows, as every
    /// backend saves them: the values this cache saved come back exactly).
    pub fn load(&mut self, rows: &KvRows, n_past: usize) -> Result<()> {
        let used = rows.fit(self.pos.len(), self.width, n_past)?;
        self.clear();
        let w = self.width;
        let (mut k, mut v) = (vec![0; w], vec![0; w]);
        for s in 0..used {
            round_into(&mut k, &rows.k[s * w..(s + 1) * w]);
            round_into(&mut v, &rows.v[s * w..(s + 1) * w]);
            self.write_slot(s, &k, &v, rows.position(s, n_past));
        }
        Ok(())
    }

    fn write_slot(&mut self, s: usize, k: &[u16], v: &[u16], p: usize) {
        let (ks, vs) = self.slot_mut(s);
        ks.copy_from_slice(k);
        vs.copy_from_slice(v);
        self.pos[s] = Some(p);
    }
}

/// How a call's work items divide the attention of each (row, KV head). Either way every
/// (row, head) sums its keys a chunk of [`KEY_CHUNK`] at a time and folds the chunks in key
/// order ([`fold`]), so every split gives the same values, bit for bit.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Split {
    /// One item per (block of `rows` consecutive rows of a branch, KV head): all of their
    /// keys, each key and value converted once for the block's rows and the group's heads.
    Rows { rows: usize },
    /// One item per (row, KV head, chunk of keys), whose sums are kept and folded after the
    /// pass: a decode step on several threads, whose rows and KV heads are fewer than the
    /// threads. Each key and value is still converted once for the group's heads (Gemma 3
    /// 270M's one KV head serves four: split by heads, every item converted all of them, and
    /// a second thread took little off attention).
    Chunks,
}

/// Positions of keys summed before they are folded into a row's running sums ([`fold`]).
/// Natively, one row over one KV head of 256 and four heads (Gemma 3 270M's layout), two
/// threads by chunks of 64: 160 keys in 22 µs, 512 in 63, 1 600 in 184 (split by heads or in
/// three passes by keys before: 28, 84, 228); one thread 1-4% slower than one pass over the
/// keys, a prompt's 256 rows over 1 600 keys 17% (54 ms, 46 before). Chunks of 32 took as
/// long on one thread and longer on two.
const KEY_CHUNK: usize = 64;

/// Values [`Weighing`] converts and then sums into the outputs at once ([`axpys`]): 16 of
/// a head of 256 dimensions are 16 KiB as f32, in the first-level cache beside a decode
/// step's four outputs (1 KiB each; a prompt's block of 8 rows has 32 of them, which
/// `axpys` takes four at a time).
const VALUES_AT_ONCE: usize = 16;

/// Rows of a branch per work item of a prompt's attention ([`Split::Rows`]): each key and
/// value converted once for all of them, not once a row. Natively on one thread, a prompt of
/// 1 600 rows over one KV head of 256 and four heads: 412 ms a global layer with one row an
/// item, 360 with 8 (4: 362, 16: 368); 128 rows 2.70 → 2.24 ms.
const ROW_BLOCK: usize = 8;

/// The split for `n_tok` rows: one item per (block of rows, KV head), unless the rows and KV
/// heads are fewer than the threads (a decode step): then by chunks of keys.
fn split(n_tok: usize, p: AttnParams) -> Split {
    let threads = pool::threads();
    if n_tok * p.n_head_kv >= threads {
        // Blocks of rows, at least four items a thread where the rows are there for them.
        let rows = (n_tok * p.n_head_kv / (4 * threads)).clamp(1, ROW_BLOCK);
        Split::Rows { rows }
    } else {
        Split::Chunks
    }
}

/// `src` as the cache holds it, into `dst` (as long).
fn round_into(dst: &mut [u16], src: &[f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(x);
    }
}

/// A call's keys or values as the cache holds them.
fn to_f16(a: &Act) -> Vec<u16> {
    let mut out = vec![0; a.data.len()];
    round_into(&mut out, &a.data);
    out
}

/// Attend `q` (rows at `pos`) over the cache plus the new `k`, `v`, then store them.
pub fn attend(
    q: &Act,
    k: &Act,
    v: &Act,
    kv: &mut KvCache,
    pos: &[usize],
    p: AttnParams,
) -> Result<Act> {
    let n_tok = pos.len();
    check_shapes(q, k, v, kv, n_tok, p)?;
    if let Some(t) = (1..n_tok).find(|&t| pos[t] != pos[t - 1] + 1) {
        return Err(Error::Backend(format!(
            "attention: positions not consecutive at row {t}"
        )));
    }
    let first = pos.first().copied().unwrap_or(0);
    let (k, v) = (to_f16(k), to_f16(v));
    let out = attend_rows(q, &k, &v, kv, first, &vec![0; n_tok], p, None);
    let kv_w = kv.width;
    let n_slots = kv.pos.len();
    for (t, &p) in pos.iter().enumerate() {
        let row = t * kv_w..(t + 1) * kv_w;
        kv.write_slot(p % n_slots, &k[row.clone()], &v[row], p);
    }
    Ok(out)
}

/// Branches after the cache: consecutive runs of `lens` rows, each at positions `first..`
/// (every branch continues the same cached prefix). A row sees the cache's positions before
/// `first` and the earlier rows of its own branch; nothing enters the cache, so the prefix
/// serves every branch, and the next call.
pub fn attend_branches(
    q: &Act,
    k: &Act,
    v: &Act,
    kv: &KvCache,
    first: usize,
    lens: &[usize],
    p: AttnParams,
) -> Result<Act> {
    let starts = crate::backend::branch_starts(lens);
    check_shapes(q, k, v, kv, starts.len(), p)?;
    Ok(attend_rows(
        q,
        &to_f16(k),
        &to_f16(v),
        kv,
        first,
        &starts,
        p,
        None,
    ))
}

fn check_shapes(
    q: &Act,
    k: &Act,
    v: &Act,
    kv: &KvCache,
    n_tok: usize,
    p: AttnParams,
) -> Result<()> {
    let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_head_kv);
    let kv_w = n_kv * hd;
    if q.width != n_head * hd || k.width != kv_w || v.width != kv_w || kv.width != kv_w {
        return Err(Error::Backend(
            "attention: widths disagree with the head layout".into(),
        ));
    }
    if q.n_tok() != n_tok
        || k.n_tok() != n_tok
        || v.n_tok() != n_tok
        || n_kv == 0
        || n_head % n_kv != 0
    {
        return Err(Error::Backend("attention: row counts disagree".into()));
    }
    Ok(())
}

/// The keys a call's rows see: the cached positions before `first` (in position order) and
/// the call's own (`k`, `v` as f16), row `t` those of its branch up to itself.
struct Keys<'a> {
    kv: &'a KvCache,
    /// The cached keys before `first` as (slot, position), in position order (a ring that
    /// has wrapped holds them in another).
    cached: Vec<(usize, usize)>,
    k: &'a [u16],
    v: &'a [u16],
    first: usize,
    starts: &'a [usize],
    /// Values a row of `k` and `v` (every KV head's).
    kv_w: usize,
    /// A key at `pk` is visible from a query at `pq` when `pq − pk < window`.
    window: usize,
}

impl<'a> Keys<'a> {
    fn new(
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
    fn in_positions(&self, t: usize, positions: Range<usize>) -> Range<usize> {
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
    fn chunks(&self, rows: Range<usize>) -> Range<usize> {
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
    fn sees(&self, t: usize, pk: usize) -> bool {
        let pq = self.query_pos(t);
        pk <= pq && pq - pk < self.window
    }

    /// Position of row `t`'s query.
    fn query_pos(&self, t: usize) -> usize {
        self.first + t - self.starts[t]
    }

    /// Keys row `t` sees, its own last.
    fn count(&self, t: usize) -> usize {
        self.cached.len() + t - self.starts[t] + 1
    }

    /// Key `j` of row `t` for KV head `kh` (`hd` values): a cached slot (`j <
    /// cached.len()`) or the call's row `starts[t] + j − cached.len()`; its position, key and
    /// value.
    fn at(&self, t: usize, kh: usize, hd: usize, j: usize) -> (usize, &'a [u16], &'a [u16]) {
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

/// `row` (f32) from the f16 `bits`.
fn widen(row: &mut [f32], bits: &[u16]) {
    for (d, &x) in row.iter_mut().zip(bits) {
        *d = f16_to_f32(x);
    }
}

/// Values summed into outputs by their weights, a few at a time ([`axpys`]): each value
/// converted to f32 once, then up to [`VALUES_AT_ONCE`] of them weighed into every output
/// with the outputs' values held in registers across them. A key every output weighs at
/// zero is left out by the callers; one only some do adds `0 · v = ±0` to the others, which
/// changes nothing: an output starts at +0 and a sum of finite terms from +0 is never −0 (f16
/// values are finite), so each output is the sum of its nonzero terms in key order, whichever
/// keys share its batch.
struct Weighing {
    /// The values taken so far, as f32, one after another.
    values: Vec<f32>,
    /// Their weights, one per output, value after value.
    weights: Vec<f32>,
}

impl Weighing {
    const fn new() -> Self {
        Self {
            values: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// `value` with one weight for each of `outs` (rows as long as it, one after another);
    /// every [`VALUES_AT_ONCE`] values, summed into them.
    fn add(&mut self, outs: &mut [f32], value: &[u16], weights: impl Iterator<Item = f32>) {
        self.values.extend(value.iter().map(|&h| f16_to_f32(h)));
        self.weights.extend(weights);
        if self.values.len() >= VALUES_AT_ONCE * value.len() {
            self.finish(outs, value.len());
        }
    }

    /// The values taken so far (each `width` long), summed into `outs`.
    fn finish(&mut self, outs: &mut [f32], width: usize) {
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
fn scores_of(
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
fn exps(head: &mut [f32]) -> (f32, f32) {
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
struct ChunkSums {
    /// The chunk's scores, then their exponentials: (row, head) x's for the key at the
    /// chunk's first position + i at `x · KEY_CHUNK + i`.
    scores: Vec<f32>,
    /// A key as f32.
    key: Vec<f32>,
    weighing: Weighing,
    /// Each (row, head)'s largest score in the chunk, Σ exp(score − it), and (at `x · hd`)
    /// Σ exp(score − it) · value.
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

impl ChunkSums {
    const fn new() -> Self {
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
    fn sum_chunk(
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
struct Running<'a> {
    max: &'a mut f32,
    sum: &'a mut f32,
    out: &'a mut [f32],
}

/// Fold a chunk's sums (its largest score, Σ exp, Σ exp · value) into `run`, the smaller
/// maximum's scaled to the larger ([`exp_approx`]): `run` times e^(its max − the chunk's)
/// plus the chunk's where the chunk's is larger, else `run` plus the chunk's times
/// e^(the chunk's max − run's). A chunk whose keys the row does not see (sum 0) changes
/// nothing; the first one is taken as it is. Every split folds a row's chunks in key order
/// through here.
fn fold(run: Running, max: f32, sum: f32, out: &[f32]) {
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
fn finish_into(dst: &mut [f32], sum: f32, out: &[f32]) {
    let inv = 1.0 / sum;
    for (d, &o) in dst.iter_mut().zip(out) {
        *d = o * inv;
    }
}

/// Row `t` of `q` is at position `first + t - starts[t]`; it sees the cached positions
/// before `first` and this call's rows `starts[t]..=t` (one run of consecutive positions
/// from `first`, keys `k` and values `v` as f16), causal and windowed.
///
/// The heads that share a KV head (grouped-query attention) go together: each key and value
/// is converted to f32 once for all of them, then every head takes the f32 [`dot`] and the
/// weighted sum ([`Weighing`]) as with an f32 cache (its values bit for bit what those give
/// on the rounded keys and values), a chunk of keys at a time ([`ChunkSums`], [`fold`]).
/// The work items divide this as `how` says, or as [`split`] chooses: every split gives the
/// same values, bit for bit.
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    q: &Act,
    k: &[u16],
    v: &[u16],
    kv: &KvCache,
    first: usize,
    starts: &[usize],
    p: AttnParams,
    how: Option<Split>,
) -> Act {
    let keys = Keys::new(kv, k, v, first, starts, p.window);
    let n_tok = starts.len();
    let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_head_kv);
    let group = n_head / n_kv;
    let mut out = vec![0f32; n_tok * n_head * hd];
    let mean_keys = keys.cached.len() + n_tok.div_ceil(2);
    let work = (n_tok * n_head)
        .saturating_mul(mean_keys)
        .saturating_mul(2 * hd);
    match how.unwrap_or_else(|| split(n_tok, p)) {
        Split::Rows { rows } => by_rows(q, &keys, p, rows.max(1), work, &mut out),
        Split::Chunks => {
            // Every row's chunks (lowest key to the highest query's position), those a row
            // has no keys in summing to nothing.
            let chunks = keys.chunks(0..n_tok);
            let n_chunks = chunks.len();
            // Item (t, kh, c)'s sums at `(item · group + i) · (hd + 2)`: the largest score,
            // Σ exp, then Σ exp · value.
            let per = hd + 2;
            let mut sums = vec![0f32; n_tok * n_kv * n_chunks * group * per];
            let shared = SharedOut::new(&mut sums);
            pool::for_chunks(n_tok * n_kv * n_chunks, work, |items| {
                SCRATCH.with_borrow_mut(|Scratch { chunk: cs, .. }| {
                    for item in items {
                        let (unit, c) = (item / n_chunks, item % n_chunks);
                        let (t, kh) = (unit / n_kv, unit % n_kv);
                        cs.sum_chunk(q, &keys, p, t..t + 1, kh, chunks.start + c);
                        // SAFETY: item's sums are its alone, inside `sums`, which outlives
                        // `for_chunks`.
                        let dst = unsafe { shared.part(item * group * per, group * per) };
                        for (i, d) in dst.chunks_exact_mut(per).enumerate() {
                            d[0] = cs.max[i];
                            d[1] = cs.sum[i];
                            d[2..].copy_from_slice(&cs.out[i * hd..(i + 1) * hd]);
                        }
                    }
                });
            });
            // Each (row, head)'s chunks folded in key order.
            let shared = SharedOut::new(&mut out);
            let work = (n_tok * n_head).saturating_mul(n_chunks * 2 * hd);
            pool::for_chunks(n_tok * n_head, work, |items| {
                let mut acc = vec![0f32; hd];
                for item in items {
                    let (t, h) = (item / n_head, item % n_head);
                    let (kh, i) = (h / group, h % group);
                    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0);
                    // As `by_rows` starts a row: what a row that sees no key ends with alike.
                    acc.fill(0.0);
                    for c in 0..n_chunks {
                        let at = (((t * n_kv + kh) * n_chunks + c) * group + i) * per;
                        let s = &sums[at..at + per];
                        let run = Running {
                            max: &mut max,
                            sum: &mut sum,
                            out: &mut acc,
                        };
                        fold(run, s[0], s[1], &s[2..]);
                    }
                    // SAFETY: (t, h)'s values are this item's alone, inside `out`, which
                    // outlives `for_chunks`.
                    finish_into(unsafe { shared.part(item * hd, hd) }, sum, &acc);
                }
            });
        }
    }
    Act {
        data: out,
        width: n_head * hd,
    }
}

/// [`attend_rows`] split by rows ([`Split::Rows`]): one item per (block of at most `block`
/// consecutive rows of one branch, KV head), folding its chunks as it goes.
fn by_rows(q: &Act, keys: &Keys, p: AttnParams, block: usize, work: usize, out: &mut [f32]) {
    let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_head_kv);
    let group = n_head / n_kv;
    let starts = keys.starts;
    let n_tok = starts.len();
    // Blocks of at most `block` consecutive rows of one branch (they see the same keys, up
    // to their own). A causal block's cost grows with its rows, so the blocks go in an order
    // that pairs early ones with late ones (0, n−1, 1, n−2, …): the pool's contiguous ranges
    // then cost alike.
    let mut blocks: Vec<Range<usize>> = Vec::new();
    for t in 0..n_tok {
        match blocks.last_mut() {
            Some(b) if b.len() < block && starts[t] == starts[b.start] => b.end = t + 1,
            _ => blocks.push(t..t + 1),
        }
    }
    let n_blocks = blocks.len();
    let block_of = |i: usize| {
        if i.is_multiple_of(2) {
            blocks[i / 2].clone()
        } else {
            blocks[n_blocks - 1 - i / 2].clone()
        }
    };
    let shared = SharedOut::new(out);
    pool::for_chunks(n_blocks * n_kv, work, |items| {
        SCRATCH.with_borrow_mut(|scratch| {
            let Scratch {
                chunk: cs,
                max,
                sum,
                out: acc,
            } = scratch;
            for item in items {
                let (rows, kh) = (block_of(item / n_kv), item % n_kv);
                let m = rows.len() * group;
                max.clear();
                max.resize(m, f32::NEG_INFINITY);
                sum.clear();
                sum.resize(m, 0f32);
                acc.clear();
                acc.resize(m * hd, 0f32);
                for c in keys.chunks(rows.clone()) {
                    cs.sum_chunk(q, keys, p, rows.clone(), kh, c);
                    for (x, a) in acc.chunks_exact_mut(hd).enumerate() {
                        let run = Running {
                            max: &mut max[x],
                            sum: &mut sum[x],
                            out: a,
                        };
                        fold(run, cs.max[x], cs.sum[x], &cs.out[x * hd..(x + 1) * hd]);
                    }
                }
                for (r, t) in rows.enumerate() {
                    for i in 0..group {
                        let x = r * group + i;
                        let at = (t * n_head + kh * group + i) * hd;
                        // SAFETY: item (block, kh) alone writes its heads' values of its rows,
                        // inside `out`, which outlives `for_chunks`.
                        let dst = unsafe { shared.part(at, hd) };
                        finish_into(dst, sum[x], &acc[x * hd..(x + 1) * hd]);
                    }
                }
            }
        });
    });
}

/// A thread's scratch for attention's work items: a chunk's sums, and a block's running sums
/// ([`by_rows`]: each (row, head)'s largest score, sum and weighted values).
struct Scratch {
    chunk: ChunkSums,
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

thread_local! {
    /// Kept by each thread: the threads build's allocator is one for all threads, and a
    /// decode step's attention allocating its scratch in every item took 1.6× the time on two
    /// threads (Chromium).
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            chunk: ChunkSums::new(),
            max: Vec::new(),
            sum: Vec::new(),
            out: Vec::new(),
        })
    };
}

/// Bidirectional attention within each of the consecutive sequences of `lens` rows (an
/// encoder's packed batch: no padding, no cache): every query sees every key of its own
/// sequence.
pub fn attend_packed(q: &Act, k: &Act, v: &Act, lens: &[usize], p: AttnParams) -> Result<Act> {
    let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_head_kv);
    let kv_w = n_kv * hd;
    let n_tok: usize = lens.iter().sum();
    if q.width != n_head * hd
        || k.width != kv_w
        || v.width != kv_w
        || n_kv == 0
        || n_head % n_kv != 0
    {
        return Err(Error::Backend(
            "attention: widths disagree with the head layout".into(),
        ));
    }
    if q.n_tok() != n_tok || k.n_tok() != n_tok || v.n_tok() != n_tok {
        return Err(Error::Backend(
            "attention: the sequences' lengths disagree with the rows".into(),
        ));
    }
    let group = n_head / n_kv;
    let width = n_head * hd;
    let mut out = vec![0f32; n_tok * width];
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |s, &len| {
            *s += len;
            Some(*s - len)
        })
        .collect();
    // One work item per (sequence, head): S = Q·Kᵀ and O = softmax(S)·V as two products on
    // the dense kernel (K and Vᵀ packed as its weights), each item writing its own head's
    // columns of its own rows.
    let shared = SharedOut::new(&mut out);
    let work = lens.iter().fold(0usize, |w, &l| {
        w.saturating_add(l.saturating_mul(l) * hd * 2 * n_head)
    });
    pool::for_chunks(lens.len() * n_head, work, |items| {
        for item in items {
            let (s, h) = (item / n_head, item % n_head);
            let (start, len, kh) = (starts[s], lens[s], h / group);
            fn rows(a: &Act, start: usize, len: usize) -> &[f32] {
                &a.data[start * a.width..(start + len) * a.width]
            }
            let keys = DenseMatrix::pack_strided(&rows(k, start, len)[kh * hd..], len, hd, kv_w, 1);
            let values_t =
                DenseMatrix::pack_strided(&rows(v, start, len)[kh * hd..], hd, len, 1, kv_w);
            let mut qh = Vec::with_capacity(len * hd);
            for row in rows(q, start, len).chunks_exact(q.width) {
                qh.extend_from_slice(&row[h * hd..(h + 1) * hd]);
            }
            let mut scores = keys.matmul(&qh, len, None); // (len × len)

            // Each row's softmax: the decoder's exponentials and sum ([`exps`]), divided.
            for row in scores.chunks_exact_mut(len) {
                for v in row.iter_mut() {
                    *v *= p.scale;
                }
                let (_, sum) = exps(row);
                let inv = 1.0 / sum;
                for v in row.iter_mut() {
                    *v *= inv;
                }
            }
            let o = values_t.matmul(&scores, len, None); // (len × hd)
            for (t, row) in o.chunks_exact(hd).enumerate() {
                // SAFETY: item (s, h) alone writes head h's columns of sequence s's rows,
                // inside `out`, which outlives `for_chunks`.
                let dst = unsafe { shared.part((start + t) * width + h * hd, hd) };
                dst.copy_from_slice(row);
            }
        }
    });
    Ok(Act { data: out, width })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(rng: &mut crate::rng::Rng, n: usize, width: usize) -> Act {
        Act {
            data: (0..n * width).map(|_| rng.normal()).collect(),
            width,
        }
    }

    /// A cache of `slots` holding positions `0..prefix`, as a prompt of random rows left it.
    fn prefilled(rng: &mut crate::rng::Rng, p: AttnParams, slots: usize, prefix: usize) -> KvCache {
        let (qw, kw) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
        let mut kv = KvCache::new(slots, kw);
        let pos: Vec<usize> = (0..prefix).collect();
        let (q, k, v) = (
            random(rng, prefix, qw),
            random(rng, prefix, kw),
            random(rng, prefix, kw),
        );
        attend(&q, &k, &v, &mut kv, &pos, p).unwrap();
        kv
    }

    /// Branches after a prefix equal each branch run alone after that prefix, on a copy of
    /// the cache, bit for bit: grouped heads, a global layer and a sliding window whose ring
    /// has wrapped; and the cache is left as the prefix made it.
    #[test]
    fn branches_equal_each_branch_alone_after_the_prefix() {
        let mut rng = crate::rng::Rng::new(7);
        for (window, slots, prefix) in [(usize::MAX, 64, 11), (6, 6, 13)] {
            let p = AttnParams {
                n_head: 4,
                n_head_kv: 2,
                head_dim: 8,
                scale: 0.3,
                window,
            };
            let (qw, kw) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
            let kv = prefilled(&mut rng, p, slots, prefix);
            let lens = [3, 1, 5, 2];
            let n: usize = lens.iter().sum();
            let (q, k, v) = (
                random(&mut rng, n, qw),
                random(&mut rng, n, kw),
                random(&mut rng, n, kw),
            );
            let before = kv.clone();
            let got = attend_branches(&q, &k, &v, &kv, prefix, &lens, p).unwrap();
            assert_eq!(kv.pos, before.pos, "the cache is untouched");
            let mut at = 0;
            for len in lens {
                let rows = |a: &Act, w: usize| Act {
                    data: a.data[at * w..(at + len) * w].to_vec(),
                    width: w,
                };
                let pos: Vec<usize> = (prefix..prefix + len).collect();
                let alone = attend(
                    &rows(&q, qw),
                    &rows(&k, kw),
                    &rows(&v, kw),
                    &mut before.clone(),
                    &pos,
                    p,
                )
                .unwrap();
                assert_eq!(
                    alone.data,
                    got.data[at * qw..(at + len) * qw],
                    "window {window}, branch at row {at}"
                );
                at += len;
            }
        }
    }

    /// Every split gives what one row and one pass give, bit for bit: blocks of rows that
    /// end inside a branch and at its end, and the split by chunks of keys (folded after the
    /// pass); a ring that has wrapped (keys outside some rows' windows but not others'), one
    /// and two KV heads, one row and several, branches after the cache.
    #[test]
    fn every_split_gives_one_rows_values() {
        let mut rng = crate::rng::Rng::new(17);
        for (window, slots, prefix, n_kv, head_dim) in [
            (usize::MAX, 256, 150, 1, 16),
            (12, 12, 40, 2, 16),
            (40, 40, 100, 2, 16),
            (usize::MAX, 256, 71, 2, 80),
            // A window across a chunk's edge; heads of 12 (no multiple of eight).
            (12, 12, 70, 2, 12),
        ] {
            let p = AttnParams {
                n_head: 4,
                n_head_kv: n_kv,
                head_dim,
                scale: 0.3,
                window,
            };
            let (qw, kw) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
            let kv = prefilled(&mut rng, p, slots, prefix);
            for lens in [&[1][..], &[3], &[21], &[2, 1, 3], &[5, 12, 1, 9]] {
                let n: usize = lens.iter().sum();
                let (q, k, v) = (
                    random(&mut rng, n, qw),
                    to_f16(&random(&mut rng, n, kw)),
                    to_f16(&random(&mut rng, n, kw)),
                );
                let starts = crate::backend::branch_starts(lens);
                let with = |how| attend_rows(&q, &k, &v, &kv, prefix, &starts, p, Some(how)).data;
                let one = with(Split::Rows { rows: 1 });
                assert!(one.iter().all(|x| x.is_finite()));
                let rows = |rows| Split::Rows { rows };
                for how in [rows(3), rows(5), rows(8), Split::Chunks] {
                    assert_eq!(
                        one,
                        with(how),
                        "window {window}, {n_kv} KV heads, {lens:?}: {how:?}"
                    );
                }
            }
        }
    }

    /// Against attention written out in f64 over the keys and values rounded to f16 (what
    /// the cache holds): grouped heads (1, 2, 3 and 6 to a KV head), a prompt of several rows
    /// and then single rows after it, one pass and split by chunks of keys; the splits give
    /// the same values bit for bit, and the cache holds 2 bytes a value.
    #[test]
    fn attention_over_f16_keys_and_values_matches_f64() {
        let mut rng = crate::rng::Rng::new(5);
        for (n_head, n_kv) in [(2, 2), (4, 2), (6, 2), (6, 1)] {
            let p = AttnParams {
                n_head,
                n_head_kv: n_kv,
                head_dim: 16,
                scale: 0.25,
                window: usize::MAX,
            };
            let (qw, kw) = (n_head * 16, n_kv * 16);
            let n = 9;
            let (q, k, v) = (
                random(&mut rng, n, qw),
                random(&mut rng, n, kw),
                random(&mut rng, n, kw),
            );
            let rounded = |a: &Act| -> Vec<f64> {
                a.data
                    .iter()
                    .map(|&x| f64::from(half::f16::from_f32(x).to_f32()))
                    .collect()
            };
            let (kr, vr) = (rounded(&k), rounded(&v));
            let mut kv = KvCache::new(64, kw);
            // Rows 0..6 as one call, then 6, 7, 8 one at a time.
            let mut got = attend(
                &Act {
                    data: q.data[..6 * qw].to_vec(),
                    width: qw,
                },
                &Act {
                    data: k.data[..6 * kw].to_vec(),
                    width: kw,
                },
                &Act {
                    data: v.data[..6 * kw].to_vec(),
                    width: kw,
                },
                &mut kv,
                &(0..6).collect::<Vec<_>>(),
                p,
            )
            .unwrap()
            .data;
            for t in 6..n {
                let row = |a: &Act, w: usize| Act {
                    data: a.data[t * w..(t + 1) * w].to_vec(),
                    width: w,
                };
                let (qt, kt, vt) = (row(&q, qw), row(&k, kw), row(&v, kw));
                let (k16, v16) = (to_f16(&kt), to_f16(&vt));
                let with = |how| attend_rows(&qt, &k16, &v16, &kv, t, &[0], p, Some(how));
                let one = with(Split::Rows { rows: 1 });
                let chunks = with(Split::Chunks);
                assert_eq!(one.data, chunks.data, "{n_head}/{n_kv}: by chunks of keys");
                got.extend(attend(&qt, &kt, &vt, &mut kv, &[t], p).unwrap().data);
            }
            assert_eq!(kv.k.iter().map(|r| r.len() * 2).sum::<usize>(), 64 * kw * 2);
            for t in 0..n {
                for h in 0..n_head {
                    let kh = h / (n_head / n_kv);
                    let qv = &q.data[t * qw + h * 16..t * qw + (h + 1) * 16];
                    let s: Vec<f64> = (0..=t)
                        .map(|j| {
                            (0..16)
                                .map(|d| f64::from(qv[d]) * kr[j * kw + kh * 16 + d])
                                .sum::<f64>()
                                * 0.25
                        })
                        .collect();
                    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for d in 0..16 {
                        let want: f64 =
                            (0..=t).map(|j| e[j] / sum * vr[j * kw + kh * 16 + d]).sum();
                        let g = f64::from(got[t * qw + h * 16 + d]);
                        assert!(
                            (g - want).abs() < 2e-6 * (1.0 + want.abs()),
                            "{n_head}/{n_kv} heads, row {t}, head {h}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The cache grows in runs as positions arrive: one position at a time over runs and a
    /// ring that wraps (150 slots, not a multiple of a run) reads what one call over all
    /// positions computes, bit for bit (a row's sums follow its keys' positions, not the
    /// slots or the call that held them), and a saved and reloaded cache continues exactly
    /// as the original.
    #[test]
    fn a_cache_grown_run_by_run_reads_what_it_was_given() {
        let mut rng = crate::rng::Rng::new(11);
        for (window, slots, n) in [(usize::MAX, 300, 200), (150, 150, 400)] {
            let p = AttnParams {
                n_head: 2,
                n_head_kv: 1,
                head_dim: 8,
                scale: 0.35,
                window,
            };
            let (qw, kw) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
            let (q, k, v) = (
                random(&mut rng, n, qw),
                random(&mut rng, n, kw),
                random(&mut rng, n, kw),
            );
            let pos: Vec<usize> = (0..n).collect();
            let all = attend(&q, &k, &v, &mut KvCache::new(slots, kw), &pos, p).unwrap();
            let row = |a: &Act, t: usize| Act {
                data: a.data[t * a.width..(t + 1) * a.width].to_vec(),
                width: a.width,
            };
            let mut kv = KvCache::new(slots, kw);
            assert_eq!(kv.allocated_slots(), 0);
            let mut saved = None;
            for t in 0..n {
                let got = attend(&row(&q, t), &row(&k, t), &row(&v, t), &mut kv, &[t], p).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got.data),
                    bits(&all.data[t * qw..(t + 1) * qw]),
                    "window {window}, row {t}"
                );
                let held = (t + 1).min(slots);
                let runs = held.div_ceil(RUN_SLOTS);
                assert_eq!(
                    kv.allocated_slots(),
                    (runs * RUN_SLOTS).min(slots),
                    "row {t}"
                );
                if t == n / 2 {
                    saved = Some((kv.save(t + 1).unwrap(), kv.clone()));
                }
            }
            // Reloaded at n/2 + 1 positions, a fresh cache continues bit for bit as the kept one.
            let (rows, mut kept) = saved.unwrap();
            let mut fresh = KvCache::new(slots, kw);
            fresh.load(&rows, n / 2 + 1).unwrap();
            for t in n / 2 + 1..n {
                let a = attend(&row(&q, t), &row(&k, t), &row(&v, t), &mut kept, &[t], p).unwrap();
                let b = attend(&row(&q, t), &row(&k, t), &row(&v, t), &mut fresh, &[t], p).unwrap();
                assert_eq!(a.data, b.data, "window {window}, row {t} after reload");
            }
        }
    }
}
