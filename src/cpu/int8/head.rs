//! The LM head's filter: the top-k of a [`QMatrix`] times one activation row without the
//! whole exact product ([`QMatrix::top_k`]): every row on 7-bit activations at about twice
//! the rate, then the exact kernel on the rows that may be among the k largest.

use super::activations::Activations;
use super::dispatch::{dot, dot_u7, has_fast_u7, row_stats};
use super::layout::{QMatrix, Scales, Values};
use super::products::ROW_CHUNK;
use super::scale::QK;
use crate::cpu::pool::{self, SharedOut};
use crate::logits::{is_allowed, TokenMask};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

impl QMatrix {
    /// Each row's `(‖w‖, Σw)`, taken at load for a head ([`QMatrix::load_with`]) or else at
    /// the first call; `None` with offsets (the filter does not take them).
    pub(super) fn head_stats(&self) -> Option<&[(f32, f32)]> {
        let Values::Int8(qs) = &self.values else {
            return None;
        };
        if self.offsets.is_some() {
            return None;
        }
        let stats = self.stats.get_or_init(|| {
            let mut stats = vec![(0f32, 0f32); self.rows];
            let out = SharedOut::new(&mut stats);
            pool::for_chunks(self.rows, qs.len(), |rows| {
                let mut buf = Vec::new();
                for r in rows {
                    let st = row_stats(
                        &qs[r * self.cols..(r + 1) * self.cols],
                        self.row_scales(r, &mut buf),
                        self.group,
                    );
                    // SAFETY: each row is one item's alone, inside `stats`, which outlives
                    // `for_chunks`.
                    unsafe { out.set(r, st) };
                }
            });
            stats
        });
        Some(stats)
    }

    /// The `k` largest of `x @ selfᵀ` for one row `x` among the rows `allowed` marks (bit
    /// `i % 32` of word `i / 32`; all rows without it): the same `(row, value)` pairs as
    /// [`crate::logits::top_k`] of [`QMatrix::matmul`], bit for bit, ties to the lower row.
    /// `None` where this build has no fast 7-bit kernel, the matrix has offsets, or `x` or a
    /// product is not finite: the caller runs the whole product.
    ///
    /// A filter pass runs every row on `x` quantized to 7 bits over its range (codes 0..=127,
    /// a zero point and a scale), at about twice the rate of the 16-bit product. Its distance
    /// from the exact product is at most `‖w_r‖ · ‖x₇ − x₁₆‖` (Cauchy–Schwarz, both quantized
    /// activations known) plus both sums' rounding. Only the rows whose upper bound reaches
    /// the k-th largest lower bound can be among the k largest; those run the exact kernel,
    /// the one [`QMatrix::matmul`] runs, on the same 16-bit activations.
    pub fn top_k(
        &self,
        x: &[f32],
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Option<Vec<(u32, f32)>> {
        if !has_fast_u7() {
            return None;
        }
        self.top_k_filtered(x, k, allowed)
    }

    /// [`QMatrix::top_k`] on whichever 7-bit kernel this build has (the tests run the
    /// filter on the portable one too).
    pub(super) fn top_k_filtered(
        &self,
        x: &[f32],
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Option<Vec<(u32, f32)>> {
        let Values::Int8(qs) = &self.values else {
            return None;
        };
        // The filter's kernel reads f32 scales, or f16 ones as non-negative ([`Scale`]);
        // coded ones are made f32 a span of rows at a time ([`QMatrix::products_u7`]).
        let scales_read = match &self.scales {
            Scales::F32(_) | Scales::Coded { .. } => true,
            Scales::F16 { signed, .. } => !signed,
        };
        if !scales_read
            || self.offsets.is_some()
            || !self.cols.is_multiple_of(QK)
            || x.len() != self.cols
            || k == 0
        {
            return None;
        }
        let n = self.cols;
        let x7 = Row7::quantize(x)?;
        let act = Activations::quantize(x, 1, n);
        // ‖x₇ − x₁₆‖ and ‖x₁₆‖ in f64, where the dequantized values are exact.
        let (mut e2, mut n16) = (0f64, 0f64);
        for (i, &q) in x7.q.iter().enumerate() {
            let a = x7.scale * (f64::from(q) - x7.zero);
            let c = f64::from(act.q[i]) * f64::from(act.d[i / QK]);
            e2 += (a - c) * (a - c);
            n16 += c * c;
        }
        // The exact sum rounds each block's product and adds k/32 of them in f32: it is
        // within (k/32 + 8) · 2⁻²³ · Σ|w·x₁₆| ≤ … · ‖w‖·‖x₁₆‖ of its real value. The filter's
        // sum is over the codes (before the zero point comes off), Σ|w·x| ≤ ‖w‖ · √k · 127 ·
        // scale, and each row's Σw (for the zero point) is an f32. Twice that, and 2⁻²⁰ for
        // the norms' own rounding.
        let round = (n as f64 / QK as f64 + 8.0) * 2f64.powi(-22);
        let per_norm = (e2.sqrt() + round * ((n as f64).sqrt() * 127.0 * x7.scale + n16.sqrt()))
            * (1.0 + 2f64.powi(-20));
        let stats = self.head_stats()?;
        let ok = |i: usize| allowed.is_none_or(|a| is_allowed(a, i));
        // Over the pool, with each work item's rows while their sums are in cache: each row's
        // estimate and bound in f64 from its 7-bit product, then its upper bound stored over
        // its sum (rounded to the nearest f32, which keeps the order: `upper ≥ t` implies
        // `f32(upper) ≥ f32(t)`, so the second pass takes every row the exact test takes and
        // at most a few ties more), and the item's k largest lower bounds among the allowed
        // rows (the k-th largest of all is the k-th largest of the items' k largest) and how
        // many rows are allowed.
        let bounds = Mutex::new((Vec::new(), 0usize));
        let finite = AtomicBool::new(true);
        let (scale, zero) = (x7.scale, x7.zero);
        let uppers = self.products_u7(qs, &x7.q, |rows, sums| {
            let st = &stats[rows.clone()];
            // NaN as soon as an estimate or bound is not finite (checked once per item).
            let mut check = 0f64;
            let mut bound = |(&(norm, sum), c): (&(f32, f32), &mut f32)| {
                let v = scale * (f64::from(*c) - zero * f64::from(sum));
                let b = f64::from(norm) * per_norm;
                check += (v + b) * 0.0;
                *c = (v + b) as f32;
                v - b
            };
            let (mut lower, mut n_ok) = (Vec::new(), 0);
            if let (None, 1) = (allowed, k) {
                // Greedy decoding's case, without a test per row.
                let best = st
                    .iter()
                    .zip(sums.iter_mut())
                    .map(&mut bound)
                    .fold(f64::NEG_INFINITY, larger);
                lower.push(best);
                n_ok = rows.len();
            } else {
                let mut best = f64::NEG_INFINITY;
                // The k-th largest lower bound kept so far: one at or below it cannot change
                // the k largest, so it is not kept (sampling's top-k would otherwise keep and
                // select among every row).
                let mut floor = f64::NEG_INFINITY;
                for (i, pair) in rows.clone().zip(st.iter().zip(sums.iter_mut())) {
                    let lo = bound(pair);
                    if ok(i) {
                        n_ok += 1;
                        if k == 1 {
                            best = larger(best, lo);
                        } else if lo > floor {
                            lower.push(lo);
                            if lower.len() == 2 * k {
                                floor = keep_largest(&mut lower, k);
                            }
                        }
                    }
                }
                if k == 1 {
                    lower.push(best);
                } else if lower.len() > k {
                    keep_largest(&mut lower, k);
                }
            }
            if !check.is_finite() {
                finite.store(false, Relaxed);
                return;
            }
            let mut all = bounds.lock().unwrap_or_else(|e| e.into_inner());
            all.0.extend(lower);
            all.1 += n_ok;
        });
        if !finite.load(Relaxed) {
            HEAD_SUMS.with_borrow_mut(|b| *b = uppers);
            return None;
        }
        let (mut lower, n_ok) = bounds.into_inner().unwrap_or_else(|e| e.into_inner());
        let threshold = if n_ok <= k || lower.len() < k {
            f64::NEG_INFINITY
        } else {
            keep_largest(&mut lower, k)
        } as f32;
        // The exact products of the rows that may be among the k largest, over the pool.
        let cands = Mutex::new(Vec::new());
        let n_chunks = self.rows.div_ceil(ROW_CHUNK);
        pool::for_chunks(n_chunks, self.rows.saturating_mul(8), |chunks| {
            let (mut mine, mut buf) = (Vec::new(), Vec::new());
            let rows = chunks.start * ROW_CHUNK..(chunks.end * ROW_CHUNK).min(self.rows);
            for (i, &u) in rows.clone().zip(&uppers[rows]) {
                if u >= threshold && ok(i) {
                    let mut acc = [0f32; 4];
                    let (w, ws) = (&qs[i * n..(i + 1) * n], self.row_scales(i, &mut buf));
                    dot(w, ws, &act.q, &act.d, n, 1, &mut acc, self.group != QK);
                    mine.push((i as u32, acc[0]));
                }
            }
            cands.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
        });
        let cands = cands.into_inner().unwrap_or_else(|e| e.into_inner());
        HEAD_SUMS.with_borrow_mut(|b| *b = uppers);
        Some(crate::logits::top_k_of(cands, k))
    }

    /// `Σ_g scale_g · Σ q·code` of every row against one row of 7-bit codes, over the pool
    /// (four memory streams per work item: [`for_row_tiles`]); `then` sees each work item's
    /// rows and their sums while they are in cache, and may overwrite the sums.
    fn products_u7(
        &self,
        qs: &[i8],
        xq: &[u8],
        then: impl Fn(Range<usize>, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let (n, group) = (self.cols, self.group);
        // The last call's buffer (`top_k_filtered` hands it back): every row is written below,
        // so only rows it lacks are zeroed. A fresh vector each decode step (1 MB for Gemma 3)
        // cost the wasm threads build 7% of its two-thread decode; not its zeroing (the kept
        // buffer zeroed each step decoded as fast), the cause not found (commit e96f8bc).
        let mut y = HEAD_SUMS.with_borrow_mut(std::mem::take);
        y.resize(self.rows, 0.0);
        let out = SharedOut::new(&mut y);
        let n_chunks = self.rows.div_ceil(ROW_CHUNK);
        pool::for_chunks(n_chunks, self.rows.saturating_mul(n) / 2, |chunks| {
            let r = chunks.start * ROW_CHUNK..(chunks.end * ROW_CHUNK).min(self.rows);
            // SAFETY: the chunk ranges are disjoint, so these ranges of `y` are disjoint and
            // in bounds, and `y` outlives `for_chunks`, which returns only when all are done.
            let part = unsafe { out.part(r.start, r.len()) };
            let (ng, g16) = (n / group, group != QK);
            match &self.scales {
                Scales::F32(s) => for_row_tiles(r.clone(), part, |j, apart, t, acc| {
                    dot_u7(&qs[j * n..], &s[j * ng..], xq, n, apart * n, t, acc, g16)
                }),
                Scales::F16 { bits, .. } => for_row_tiles(r.clone(), part, |j, apart, t, acc| {
                    dot_u7(&qs[j * n..], &bits[j * ng..], xq, n, apart * n, t, acc, g16)
                }),
                // A K-quant head in wasm (Llama 3's tied Q6_K embeddings: 45 MB less of the
                // 1B shape's tab than f32 scales): its scales made f32 a span of rows at a
                // time, as the layers' products make them, each span's rows in four streams.
                Scales::Coded { .. } => HEAD_SCALES.with_borrow_mut(|buf| {
                    let mut s0 = r.start;
                    while s0 < r.end {
                        let span = s0..(s0 + ROW_CHUNK).min(r.end);
                        let ws = self.scales.groups(span.start * ng..span.end * ng, buf);
                        let out = &mut part[span.start - r.start..span.end - r.start];
                        for_row_tiles(span.clone(), out, |j, apart, t, acc| {
                            let w = &qs[j * n..];
                            dot_u7(
                                w,
                                &ws[(j - span.start) * ng..],
                                xq,
                                n,
                                apart * n,
                                t,
                                acc,
                                g16,
                            )
                        });
                        s0 = span.end;
                    }
                }),
            }
            then(r, part);
        });
        y
    }
}

/// `a.max(b)` for an `a` that is not NaN, without a call: wasm's `f64.max` returns NaN for
/// a NaN operand where `f64::max` returns the other, so there `max` is a library call.
#[inline(always)]
fn larger(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// Keep the `k` (≥ 1, ≤ `v.len()`) largest of `v`, in no order; returns the smallest kept.
fn keep_largest(v: &mut Vec<f64>, k: usize) -> f64 {
    let kth = *v.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a)).1;
    v.truncate(k);
    kth
}

/// One activation row as 7-bit codes for the LM head's filter: `x ≈ scale · (q − zero)`
/// with `q` in 0..=127 over the row's range stretched to hold 0.
struct Row7 {
    q: Vec<u8>,
    zero: f64,
    scale: f64,
}

impl Row7 {
    /// `None` when `x` holds NaN or ±∞.
    fn quantize(x: &[f32]) -> Option<Self> {
        let mut lo = 0f32;
        let mut hi = 0f32;
        for &v in x {
            if !v.is_finite() {
                return None;
            }
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if hi - lo == 0.0 {
            return Some(Row7 {
                q: vec![0; x.len()],
                zero: 0.0,
                scale: 0.0,
            });
        }
        let inv = 127.0 / (hi - lo);
        let zero = (-lo * inv).round().clamp(0.0, 127.0);
        let q = x
            .iter()
            .map(|&v| (v * inv + zero).round().clamp(0.0, 127.0) as u8)
            .collect();
        Some(Row7 {
            q,
            zero: f64::from(zero),
            scale: f64::from(hi - lo) / 127.0,
        })
    }
}

thread_local! {
    /// A span of a coded head's scales as f32 ([`QMatrix::products_u7`]), kept by each
    /// thread (as the layers' products keep theirs: an allocation per item takes the
    /// allocator's one lock in the threads build).
    static HEAD_SCALES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

thread_local! {
    /// The LM head filter's sums, then upper bounds, one per row ([`QMatrix::products_u7`]),
    /// kept by the calling thread from one decode step to the next.
    static HEAD_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows `r` of a product with one activation row, their outputs `part`, in tiles of up to 4
/// rows: first row `i` of each quarter of `r` together (four memory streams, which one core
/// reads nearly twice as fast as one: Gemma 3's head natively in 13.4 ms instead of 23), then
/// the rows after the quarters. `tile(first row, rows between the tile's rows, count, out)`.
pub(super) fn for_row_tiles(
    r: std::ops::Range<usize>,
    part: &mut [f32],
    mut tile: impl FnMut(usize, usize, usize, &mut [f32; 4]),
) {
    let quarter = r.len() / 4;
    let mut acc = [0f32; 4];
    for i in 0..quarter {
        tile(r.start + i, quarter, 4, &mut acc);
        for (q, &v) in acc.iter().enumerate() {
            part[q * quarter + i] = v;
        }
    }
    let mut j = r.start + 4 * quarter;
    while j < r.end {
        let t = (r.end - j).min(4);
        tile(j, 1, t, &mut acc);
        part[j - r.start..j - r.start + t].copy_from_slice(&acc[..t]);
        j += t;
    }
}

#[cfg(test)]
mod tests {
    use super::super::check::exact_top_k;
    use super::super::layout::{ScaleLayout, Scales};
    use super::*;
    use crate::gguf::{now, GgmlType, SyncReads};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// The LM head's filter gives the top-k of the whole product, bit for bit and in the
    /// same order, on candle-quantized Q8_0 and Q6_K matrices (one scale per 32 and per 16
    /// values) with tied and nearly tied rows, activations with outliers, with and without a
    /// mask; a matrix with offsets or a non-finite activation falls back (`None`).
    #[test]
    fn the_head_filter_equals_the_exact_top_k() {
        let mut rng = crate::rng::Rng::new(21);
        let (rows, cols) = (3001, 256);
        let mut w: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * 0.05).collect();
        for r in (0..rows - 2).step_by(13) {
            let (a, b) = w.split_at_mut((r + 1) * cols);
            b[..cols].copy_from_slice(&a[r * cols..]);
            b[cols..2 * cols].copy_from_slice(&a[r * cols..]);
            b[cols + 5] += 1e-3;
        }
        let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        let mut checked = 0;
        for (dt, ty) in [
            (GgmlDType::Q8_0, GgmlType::Q8_0),
            (GgmlDType::Q6K, GgmlType::Q6_K),
        ] {
            let q = QTensor::quantize(&wt, dt).unwrap();
            let bytes = q.data().unwrap().into_owned();
            // As a head, the statistics are taken during the load; they equal those a
            // matrix takes at its first filter.
            let m = crate::gguf::now(QMatrix::load_with(&bytes, 0, rows, cols, ty, true))
                .unwrap()
                .unwrap();
            assert_eq!(m.stats.get().is_some(), has_fast_u7());
            let plain = QMatrix::load(&bytes, 0, rows, cols, ty).unwrap();
            assert!(plain.stats.get().is_none());
            assert_eq!(m.head_stats(), plain.head_stats());
            // A Q8_0 head keeps the file's f16 scales where the filter runs; every product
            // is the f32-scaled matrix's, bit for bit.
            assert_eq!(
                matches!(m.scales, Scales::F16 { .. }),
                ty == GgmlType::Q8_0 && has_fast_u7(),
                "{ty}"
            );
            assert!(matches!(plain.scales, Scales::F32(_)));
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            // A K-quant head as wasm keeps it: its scales coded as the file codes them
            // (made f32 a span of rows at a time by the filter): the same top-k, bit for bit.
            let coded = (ty == GgmlType::Q6_K).then(|| {
                let c = now(QMatrix::load_as(
                    &SyncReads(&bytes),
                    0,
                    rows,
                    cols,
                    ty,
                    true,
                    true,
                    ScaleLayout::Coded,
                ))
                .unwrap()
                .unwrap();
                assert!(matches!(c.scales, Scales::Coded { .. }));
                c
            });
            let x: Vec<f32> = (0..3 * cols).map(|_| rng.normal()).collect();
            for m_rows in [1, 3] {
                assert_eq!(
                    bits(m.matmul(&x[..m_rows * cols], m_rows)),
                    bits(plain.matmul(&x[..m_rows * cols], m_rows)),
                    "{ty}, {m_rows} rows"
                );
            }
            let ids = [0, 7, rows as u32 - 1];
            assert_eq!(
                bits(m.rows_f32(&ids, 0.5).unwrap()),
                bits(plain.rows_f32(&ids, 0.5).unwrap())
            );
            for seed in 0..12 {
                let mut x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
                // Outliers, as in Gemma 3's final hidden state (|x| up to ~10× its rms).
                for o in 0..(seed % 4) {
                    x[(seed * 31 + o * 57) % cols] *= 12.0;
                }
                let mask: Vec<u32> = (0..rows.div_ceil(32))
                    .map(|i| {
                        if seed % 3 == 0 {
                            0
                        } else {
                            rng.next_u64() as u32 | (i as u32 & 1)
                        }
                    })
                    .collect();
                for k in [1, 2, 10, 40, 128] {
                    for allowed in [None, Some(&mask[..])] {
                        let got = m.top_k_filtered(&x, k, allowed).expect("the filter runs");
                        let want = exact_top_k(&m, &x, k, allowed);
                        if let Some(c) = &coded {
                            let got = c.top_k_filtered(&x, k, allowed).expect("it runs coded");
                            assert_eq!(got, want, "coded {ty} seed {seed} k {k}");
                        }
                        assert_eq!(
                            got,
                            want,
                            "{ty} seed {seed} k {k} mask {}",
                            allowed.is_some()
                        );
                        checked += want.len();
                    }
                }
            }
            let mut bad = vec![0.5f32; cols];
            bad[3] = f32::NAN;
            assert!(m.top_k_filtered(&bad, 5, None).is_none());
        }
        assert!(checked > 3000);
        let q = QTensor::quantize(&wt, GgmlDType::Q4K).unwrap();
        let bytes = q.data().unwrap().into_owned();
        // Int8 values, so that the offsets alone decline.
        let m = now(QMatrix::load_as(
            &SyncReads(&bytes),
            0,
            rows,
            cols,
            GgmlType::Q4_K,
            true,
            true,
            ScaleLayout::F32,
        ))
        .unwrap()
        .unwrap();
        assert!(!m.is_packed() && m.top_k_filtered(&vec![0.5; cols], 5, None).is_none());
    }
}
