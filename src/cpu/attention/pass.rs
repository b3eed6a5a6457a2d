//! A call's attention over the pool's threads: how its work items divide the (row, KV head)
//! pairs ([`Split`]), the decode and prompt passes over the cache ([`attend`]) and the
//! branches after it ([`attend_branches`]).

use super::chunks::{finish_into, fold, ChunkSums, Keys, Running};
use super::kv::{to_f16, KvCache};
use crate::backend::AttnParams;
use crate::cpu::pool::{self, SharedOut};
use crate::cpu::tensor::Act;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::ops::Range;

/// How a call's work items divide the attention of each (row, KV head). Either way every
/// (row, head) sums its keys a chunk of [`KEY_CHUNK`] at a time and folds the chunks in key
/// order ([`fold`]), so every split gives the same values, bit for bit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Split {
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

/// Rows of a branch per work item of a prompt's attention ([`Split::Rows`]): each key and
/// value converted once for all of them, not once a row. Natively on one thread, a prompt of
/// 1 600 rows over one KV head of 256 and four heads: 412 ms a global layer with one row an
/// item, 360 with 8 (4: 362, 16: 368); 128 rows 2.70 → 2.24 ms.
const ROW_BLOCK: usize = 8;

/// The split for `n_tok` rows: one item per (block of rows, KV head), unless the rows and KV
/// heads are fewer than the threads (a decode step): then by chunks of keys.
pub(super) fn split(n_tok: usize, p: AttnParams) -> Split {
    let threads = pool::threads();
    if n_tok * p.n_head_kv >= threads {
        // Blocks of rows, at least four items a thread where the rows are there for them.
        let rows = (n_tok * p.n_head_kv / (4 * threads)).clamp(1, ROW_BLOCK);
        Split::Rows { rows }
    } else {
        Split::Chunks
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

pub(super) fn check_shapes(
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
/// from `first`, keys `k` and values `v` as f16), causal and windowed.
///
/// The heads that share a KV head (grouped-query attention) go together: each key and value
/// is converted to f32 once for all of them, then every head takes the f32 [`dot`] and the
/// weighted sum ([`Weighing`]) as with an f32 cache (its values bit for bit what those give
/// on the rounded keys and values), a chunk of keys at a time ([`ChunkSums`], [`fold`]).
/// The work items divide this as `how` says, or as [`split`] chooses: every split gives the
/// same values, bit for bit.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_rows(
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
pub(super) fn by_rows(
    q: &Act,
    keys: &Keys,
    p: AttnParams,
    block: usize,
    work: usize,
    out: &mut [f32],
) {
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
