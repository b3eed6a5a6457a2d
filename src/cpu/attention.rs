//! Attention with a KV cache on the CPU. A sliding-window layer keeps a ring of `window`
//! slots; a global layer keeps one slot per context position. Each slot remembers its
//! absolute position, so visibility is decided by positions, never by slot order.

use super::dense::DenseMatrix;
use super::ops::{axpy, dot, exp_approx};
use super::pool::{self, SharedOut};
use super::Act;
use crate::backend::{AttnParams, KvRows};
use crate::error::{Error, Result};

/// Slots per allocation of a layer's cache: it grows with the positions it holds, in runs of
/// this many, not with the context it may reach (Gemma 3 270M at 4096: 39 MiB for every
/// conversation; a 192-token one now holds 7). A run is never moved or freed, so growing
/// copies nothing and leaves no hole in wasm memory, whose size never comes down.
const RUN_SLOTS: usize = 64;

/// One layer's cached keys and values, `n_slots` rows of `n_head_kv · head_dim`.
#[derive(Clone)]
pub struct KvCache {
    /// Keys and values of slots `i · RUN_SLOTS..`, allocated when one of them is first written.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
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
    fn key(&self, s: usize) -> &[f32] {
        let at = (s % RUN_SLOTS) * self.width;
        &self.k[s / RUN_SLOTS][at..at + self.width]
    }

    fn value(&self, s: usize) -> &[f32] {
        let at = (s % RUN_SLOTS) * self.width;
        &self.v[s / RUN_SLOTS][at..at + self.width]
    }

    /// Slot `s`'s key and value to write, its run allocated if it is not yet.
    fn slot_mut(&mut self, s: usize) -> (&mut [f32], &mut [f32]) {
        let run = s / RUN_SLOTS;
        while self.k.len() <= run {
            let first = self.k.len() * RUN_SLOTS;
            let len = RUN_SLOTS.min(self.pos.len() - first) * self.width;
            self.k.push(vec![0.0; len]);
            self.v.push(vec![0.0; len]);
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
            k.extend_from_slice(self.key(s));
            v.extend_from_slice(self.value(s));
        }
        Ok(KvRows { k, v, ..probe })
    }

    /// Put back what [`KvCache::save`] gave after `n_past` positions.
    pub fn load(&mut self, rows: &KvRows, n_past: usize) -> Result<()> {
        let used = rows.fit(self.pos.len(), self.width, n_past)?;
        self.clear();
        let w = self.width;
        for s in 0..used {
            let (k, v) = self.slot_mut(s);
            k.copy_from_slice(&rows.k[s * w..(s + 1) * w]);
            v.copy_from_slice(&rows.v[s * w..(s + 1) * w]);
            self.pos[s] = Some(rows.position(s, n_past));
        }
        Ok(())
    }

    fn write(&mut self, p: usize, k: &[f32], v: &[f32]) {
        let s = p % self.pos.len();
        let (ks, vs) = self.slot_mut(s);
        ks.copy_from_slice(k);
        vs.copy_from_slice(v);
        self.pos[s] = Some(p);
    }
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
    let out = attend_rows(q, k, v, kv, first, &vec![0; n_tok], p);
    let kv_w = kv.width;
    for (t, &p) in pos.iter().enumerate() {
        kv.write(
            p,
            &k.data[t * kv_w..(t + 1) * kv_w],
            &v.data[t * kv_w..(t + 1) * kv_w],
        );
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
    Ok(attend_rows(q, k, v, kv, first, &starts, p))
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

/// Row `t` of `q` is at position `first + t - starts[t]`; it sees the cached positions
/// before `first` and this call's rows `starts[t]..=t` (one run of consecutive positions
/// from `first`), causal and windowed.
fn attend_rows(
    q: &Act,
    k: &Act,
    v: &Act,
    kv: &KvCache,
    first: usize,
    starts: &[usize],
    p: AttnParams,
) -> Act {
    let n_tok = starts.len();
    let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_head_kv);
    let kv_w = n_kv * hd;
    let group = n_head / n_kv;
    let visible = |pq: usize, pk: usize| pk <= pq && pq - pk < p.window;
    // Cached keys visible to at least one query of this call, in slot order.
    let cached: Vec<(usize, usize)> = kv
        .pos
        .iter()
        .enumerate()
        .filter_map(|(s, pk)| pk.filter(|&pk| pk < first).map(|pk| (s, pk)))
        .collect();
    let mut out = vec![0f32; n_tok * n_head * hd];
    let shared = SharedOut::new(&mut out);
    // One work item per (row, head), each writing its own head's values of its own row. A
    // causal row's cost grows with `t`, so the items go in an order that pairs early rows
    // with late ones (0, n−1, 1, n−2, …): the pool's contiguous ranges then cost alike.
    let row_of = |i: usize| {
        if i.is_multiple_of(2) {
            i / 2
        } else {
            n_tok - 1 - i / 2
        }
    };
    let keys = cached.len() + n_tok.div_ceil(2);
    let work = (n_tok * n_head).saturating_mul(keys).saturating_mul(2 * hd);
    pool::for_chunks(n_tok * n_head, work, |items| {
        let mut scores: Vec<f32> = Vec::with_capacity(cached.len() + n_tok);
        for item in items {
            let (t, h) = (row_of(item / n_head), item % n_head);
            let b0 = starts[t];
            let pq = first + t - b0;
            let kh = h / group;
            let qv = &q.data[t * q.width + h * hd..t * q.width + (h + 1) * hd];
            scores.clear();
            // Cached slots first, then this call's rows of t's run up to t.
            for &(s, pk) in &cached {
                if visible(pq, pk) {
                    scores.push(dot(qv, &kv.key(s)[kh * hd..(kh + 1) * hd]) * p.scale);
                } else {
                    scores.push(f32::NEG_INFINITY);
                }
            }
            for j in b0..=t {
                if visible(pq, first + j - b0) {
                    scores.push(
                        dot(qv, &k.data[j * kv_w + kh * hd..j * kv_w + (kh + 1) * hd]) * p.scale,
                    );
                } else {
                    scores.push(f32::NEG_INFINITY);
                }
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            // SAFETY: item (t, h) alone writes head h's values of row t, inside `out`, which
            // outlives `for_chunks`.
            let o = unsafe { shared.part((t * n_head + h) * hd, hd) };
            for (i, &(s, _)) in cached.iter().enumerate() {
                let w = scores[i] * inv;
                if w != 0.0 {
                    axpy(o, w, &kv.value(s)[kh * hd..(kh + 1) * hd]);
                }
            }
            for j in b0..=t {
                let w = scores[cached.len() + j - b0] * inv;
                if w != 0.0 {
                    axpy(o, w, &v.data[j * kv_w + kh * hd..j * kv_w + (kh + 1) * hd]);
                }
            }
        }
    });
    Act {
        data: out,
        width: n_head * hd,
    }
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
            for row in scores.chunks_exact_mut(len) {
                let mut max = f32::NEG_INFINITY;
                for v in row.iter_mut() {
                    *v *= p.scale;
                    max = max.max(*v);
                }
                let mut sum = 0f32;
                for v in row.iter_mut() {
                    *v = exp_approx(*v - max);
                }
                for v in row.iter() {
                    sum += *v;
                }
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

    fn random(rng: &mut crate::sampler::Rng, n: usize, width: usize) -> Act {
        Act {
            data: (0..n * width).map(|_| rng.normal()).collect(),
            width,
        }
    }

    /// Branches after a prefix equal each branch run alone after that prefix, on a copy of
    /// the cache, bit for bit: grouped heads, a global layer and a sliding window whose ring
    /// has wrapped; and the cache is left as the prefix made it.
    #[test]
    fn branches_equal_each_branch_alone_after_the_prefix() {
        let mut rng = crate::sampler::Rng::new(7);
        for (window, slots, prefix) in [(usize::MAX, 64, 11), (6, 6, 13)] {
            let p = AttnParams {
                n_head: 4,
                n_head_kv: 2,
                head_dim: 8,
                scale: 0.3,
                window,
            };
            let (qw, kw) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
            let mut kv = KvCache::new(slots, kw);
            let pos: Vec<usize> = (0..prefix).collect();
            let (q, k, v) = (
                random(&mut rng, prefix, qw),
                random(&mut rng, prefix, kw),
                random(&mut rng, prefix, kw),
            );
            attend(&q, &k, &v, &mut kv, &pos, p).unwrap();
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

    /// The cache grows in runs as positions arrive: one position at a time over runs and a
    /// ring that wraps (150 slots, not a multiple of a run) reads what one call over all
    /// positions computes, and a saved and reloaded cache continues exactly as the original.
    #[test]
    fn a_cache_grown_run_by_run_reads_what_it_was_given() {
        let mut rng = crate::sampler::Rng::new(11);
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
                for (a, b) in got.data.iter().zip(&all.data[t * qw..(t + 1) * qw]) {
                    assert!((a - b).abs() < 1e-5, "window {window}, row {t}: {a} vs {b}");
                }
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
