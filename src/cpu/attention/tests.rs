//! Attention against float64 references and against itself: every split and every call
//! pattern bit for bit.

use super::kv::*;
use super::pass::*;
use crate::backend::AttnParams;
use crate::cpu::tensor::Act;

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
                    let want: f64 = (0..=t).map(|j| e[j] / sum * vr[j * kw + kh * 16 + d]).sum();
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
