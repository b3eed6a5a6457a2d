//! Our own matrix kernel for quantized weights, used on every target: int8 values with f32
//! scales in separate arrays, so a dot product never converts an f16 in software (wasm has
//! no f16 instructions), and a tile of 4 activation rows shares each loaded weight block.
//!
//! Weights: every quantized type is unpacked exactly to int8 values with f32 scales and,
//! where the type has minimums, offsets (`w = scale · q − offset`): Q4_0, Q4_1, Q5_0, Q5_1 and
//! Q8_0 with one scale per 32 values, as Q4_K and Q5_K (their sub-blocks of 32), Q2_K, Q3_K
//! and Q6_K with one per 16. The 4-bit types (Q4_0, Q4_1, Q4_K) keep their codes packed in
//! memory, 16 bytes per 32 values (Q4_K 0.75 bytes per weight with its f32 scales and
//! offsets, not 1.25): a decode step's kernel widens the nibbles to 16 bits itself, a
//! prompt's unpacks each weight row to int8 once for all its activation rows; less memory
//! and less to read per token, the same sums bit for bit. In wasm, Q5_0 (Gemma 3's and
//! Qwen2's fallback for rows K-quants cannot split) keeps its codes three to a 16-bit lane
//! ([`Packing::Fives`]: 0.67 bytes a value), which a kernel takes apart with one mask or
//! shift per 8 values, as int8 takes one widening; natively it stays int8 (the file's bit
//! planes cost 41% more instructions per Gemma 3 270M decode step there, and native memory
//! is not the tab's). Q5_1 and Q5_K stay int8. Two exceptions to f32 scales, each where a
//! kernel reads the file's f16 with a shift or two instead of converting it ([`Scales::F16`]):
//! a Q8_0 LM head where the build has the head's filter ([`Scale`]), and in wasm Q5_0 in the
//! five-bit layout ([`BlockScale`]; 0.69 bytes a value with its scales, not 0.79). A third in
//! wasm: the K-quants keep their scales and offsets as the file codes them, a unit a block
//! and a byte a group ([`Scales::Coded`]), made f32 a span of rows at a time before a
//! product (Q4_K 0.59 bytes a value, not 0.75; Q6_K 1.08, not 1.25).
//!
//! Activations are quantized to 16 bits per 32-value block (f32 scale), not to 8 bits as
//! llama.cpp and candle do: the kernel multiplies in i16 lanes anyway (`i32x4.dot_i16x8_s`,
//! `vpmaddwd`), so the finer grid costs nothing. With 8-bit activations the K-quant matmuls
//! were the only real error against the float64 reference (top-1 93%, |Δ logit| 0.17 mean);
//! with 16 bits the whole forward pass matches it to 0.001. Overflow: |x| ≤ 32 767,
//! |w| ≤ 128, so a 32-value block sums below 2^27 per lane.

#[macro_use]
mod macros;

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod decode;
mod dispatch;
mod layout;
mod load;
mod packing;
mod portable;
mod scale;
#[cfg(target_arch = "wasm32")]
mod wasm;

use super::dense::{Out, Post};
use super::pool::{self, SharedOut};
use crate::logits::{is_allowed, TokenMask};
use activations::Activations;
use decode::f16_bits_to_f32;
pub use dispatch::has_fast_u7;
use dispatch::{
    dot, dot_u7, dot_w4, dot_w4_nib, dot_w5, expand_codes, five_bits, pack_fives, quantize_block,
    row_stats, unpack,
};
pub use layout::QMatrix;
use layout::{Scales, Values};
use packing::Packing;
use scale::QK;
pub use scale::{BlockScale, Scale};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

impl QMatrix {
    /// Each row's `(‖w‖, Σw)`, taken at load for a head ([`QMatrix::load_with`]) or else at
    /// the first call; `None` with offsets (the filter does not take them).
    fn head_stats(&self) -> Option<&[(f32, f32)]> {
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

    /// `x (m × cols) @ selfᵀ → (m × rows)`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut ys = Self::products(&[(self, Out::plain(None))], x, m);
        ys.pop().unwrap_or_default()
    }

    /// `x (m × cols) @ wᵀ` for every part `(w, out)` (all of `x`'s width), each `(m × rows)`
    /// and finished by its `out` (bias, GELU, residual): an attention block's q, k and v, or
    /// a feed-forward's gate and up. `x` is quantized once, and all the parts' rows go in one
    /// pass over the pool, each value finished and stored where it belongs while its tile is
    /// in registers, so nothing serial follows the pass. A value is the same, bit for bit,
    /// whichever parts share the call.
    pub fn products(parts: &[(&QMatrix, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        let Some((first, _)) = parts.first() else {
            return Vec::new();
        };
        let k = first.cols;
        assert!(
            parts.iter().all(|(w, _)| w.cols == k) && x.len() == m * k,
            "QMatrix::products: every part takes x's width"
        );
        for (w, out) in parts {
            assert!(
                m.checked_mul(w.rows).is_some(),
                "QMatrix::products: output size"
            );
            let n = m * w.rows;
            assert!(
                out.bias.is_none_or(|b| b.len() == w.rows)
                    && match out.post {
                        Post::Add(r) => r.len() == n,
                        _ => true,
                    },
                "QMatrix::products: a bias or residual of the wrong size"
            );
        }
        let act = Activations::quantize(x, m, k);
        // Σx per weight group, for the parts whose weights have offsets (16 or 32 values).
        let sums_of = |group: usize| {
            if parts
                .iter()
                .any(|(w, _)| w.offsets.is_some() && w.group == group)
            {
                act.group_sums(group)
            } else {
                Vec::new()
            }
        };
        let (sums16, sums32) = (sums_of(16), sums_of(QK));
        // What the five-bit codes' sums exceed the values' by, for the one-row kernel.
        let corr = if m == 1
            && parts
                .iter()
                .any(|(w, _)| matches!(w.values, Values::Packed(Packing::Fives, _)))
        {
            portable::fives_corrections(&act.q, k)
        } else {
            Vec::new()
        };
        let mut ys: Vec<Vec<f32>> = parts.iter().map(|(w, _)| vec![0f32; m * w.rows]).collect();
        let outs: Vec<SharedOut> = ys.iter_mut().map(|y| SharedOut::new(y)).collect();
        // Part p's chunks of `chunk` rows are the pass's items firsts[p]..firsts[p + 1].
        let chunk = if m == 1 { ONE_ROW_CHUNK } else { ROW_CHUNK };
        let mut firsts = vec![0usize];
        for (w, _) in parts {
            firsts.push(firsts[firsts.len() - 1] + w.rows.div_ceil(chunk));
        }
        let work = parts.iter().fold(0usize, |a, (w, _)| {
            a.saturating_add(m.saturating_mul(w.rows).saturating_mul(k))
        });
        pool::for_chunks(firsts[parts.len()], work, |items| {
            for (p, (w, out)) in parts.iter().enumerate() {
                let c = items.start.max(firsts[p])..items.end.min(firsts[p + 1]);
                if c.is_empty() {
                    continue;
                }
                let r = (c.start - firsts[p]) * chunk..((c.end - firsts[p]) * chunk).min(w.rows);
                debug_assert!(w.group == 16 || w.group == QK);
                let sums = match (&w.offsets, w.group) {
                    (None, _) => &[][..],
                    (Some(_), 16) => &sums16[..],
                    _ => &sums32[..],
                };
                if m == 1 && w.tiles_whole() {
                    // Item c: tiles c·chunk/4.. of the whole matrix (the same count of items
                    // as chunks of rows); the last one also takes the rows after them.
                    let tiles = c.start - firsts[p]..c.end - firsts[p];
                    let tiles = tiles.start * chunk / 4..tiles.end * chunk / 4;
                    // SAFETY: the item ranges are disjoint, so are these tiles and their rows
                    // (the rows after the quarters go to the one range containing index q),
                    // and part p's output outlives `for_chunks`, which returns only when all
                    // are done.
                    unsafe { w.matvec_tiles(&act, sums, &corr, tiles, &outs[p], out) };
                } else {
                    // SAFETY: outs[p] is part p's m × rows output, which outlives
                    // `for_chunks`, and these rows are this item's alone.
                    unsafe { w.rows_into(&act, sums, r, &outs[p], out) };
                }
            }
        });
        ys
    }

    /// Whether a one-row product reads this matrix's scales and offsets where they are held
    /// (f32; in wasm Q5_0's f16 scales, which its kernel reads as they are: [`BlockScale`]);
    /// else those of a tile's rows are converted into f32 first ([`QMatrix::matvec_tiles`]).
    fn scales_in_place(&self) -> bool {
        let scales = match (&self.scales, &self.values) {
            (Scales::F32(_), _) => true,
            #[cfg(target_arch = "wasm32")]
            (Scales::F16 { .. }, Values::Packed(Packing::Fives, _)) => true,
            _ => false,
        };
        scales && matches!(self.offsets, None | Some(Scales::F32(_)))
    }

    /// Whether a one-row product's items are tiles of the whole matrix
    /// ([`QMatrix::matvec_tiles`]): where its scales are read in place, and where its kernel
    /// takes them converted a tile at a time (all but the five-bit one, which takes them only
    /// as its rows lie: Q5_0 with f16 scales natively, which no load makes, goes row by row
    /// through [`QMatrix::rows_into`]).
    fn tiles_whole(&self) -> bool {
        self.scales_in_place() || !matches!(self.values, Values::Packed(Packing::Fives, _))
    }

    /// Rows j, j + apart, … (t of them) of a product with one activation row (its five-bit
    /// corrections `corr` where the values are in that layout) into `acc`; their scales are
    /// `converted` (with the distance from one row's to the next's, in groups: ng · apart
    /// where they lie as the rows do; the five-bit kernel takes only that) or, without them,
    /// read in place ([`QMatrix::scales_in_place`]).
    #[allow(clippy::too_many_arguments)]
    fn dot_tile(
        &self,
        act: &Activations,
        corr: &[i32],
        j: usize,
        apart: usize,
        t: usize,
        converted: Option<(&[f32], usize)>,
        acc: &mut [f32; 4],
    ) {
        let (n, group) = (self.cols, self.group);
        let (ng, g16) = (n / group, group != QK);
        let (xq, xd) = (&act.q, &act.d);
        let (ws, sld) = match (converted, &self.scales) {
            (Some(c), _) => c,
            (None, Scales::F32(s)) => (&s[j * ng..], apart * ng),
            // Q5_0 in wasm: the five-bit kernel reads the file's f16 scales as they are.
            #[cfg(target_arch = "wasm32")]
            (None, Scales::F16 { bits, .. }) => {
                if let Values::Packed(Packing::Fives, bytes) = &self.values {
                    let w = &bytes[j * Packing::Fives.row_bytes(n)..];
                    return wasm::dot_w5(w, &bits[j * ng..], xq, xd, corr, n, apart, t, acc);
                }
                // Not reached: only Q5_0's kernel reads f16 scales in place.
                *acc = [f32::NAN; 4];
                return;
            }
            // Not reached: [`QMatrix::scales_in_place`] says these are converted first.
            (None, _) => {
                *acc = [f32::NAN; 4];
                return;
            }
        };
        match &self.values {
            Values::Int8(qs) => dot_w4(&qs[j * n..], ws, xq, xd, n, apart * n, sld, t, acc, g16),
            Values::Packed(Packing::Fives, bytes) if sld == apart * ng => {
                let w = &bytes[j * Packing::Fives.row_bytes(n)..];
                dot_w5(w, ws, xq, xd, corr, n, apart, t, acc)
            }
            // Not reached: the five-bit kernel's scales lie as its rows do
            // ([`QMatrix::tiles_whole`]).
            Values::Packed(Packing::Fives, _) => *acc = [f32::NAN; 4],
            Values::Packed(Packing::Nibbles { bias }, bytes) => {
                let w = &bytes[j * n / 2..];
                dot_w4_nib(w, *bias, ws, xq, xd, n, apart * n, sld, t, acc, g16)
            }
        }
    }

    /// Tiles `tiles` of a product with one activation row over all of this matrix's rows,
    /// finished by `out` and stored into `y`, the whole output: tile i is rows i, i + q,
    /// i + 2q, i + 3q for q = rows / 4, as [`for_row_tiles`] lays out a range; the range that
    /// contains index q (past the quarters' tiles) takes the rows after 4q: when there are
    /// such rows, rows is not a multiple of 4, nor of an item's rows, so a part's items hold
    /// more than q tiles. Scales and offsets are read in place
    /// ([`QMatrix::scales_in_place`]) or those of these tiles' rows converted first (each
    /// quarter's run of rows after the one before; not the five-bit kernel's:
    /// [`QMatrix::tiles_whole`]). Each row's sum is [`QMatrix::rows_into`]'s for one
    /// activation row, bit for bit: a row's sum does not depend on the rows beside it in a
    /// tile, nor on where its scales lie. The pool's items are tiles rather than rows
    /// because four streams a quarter of a small range apart read slower than a quarter of
    /// the matrix apart (Chromium, Gemma 3's gate and up split as the pool splits them, run on
    /// one thread: 1.3-1.5× the time with ranges of 256 rows).
    ///
    /// # Safety
    /// `y` is this product's output (rows values), outlives the call, and no other thread
    /// writes these tiles' rows meanwhile.
    unsafe fn matvec_tiles(
        &self,
        act: &Activations,
        sums: &[f32],
        corr: &[i32],
        tiles: Range<usize>,
        y: &SharedOut,
        out: &Out,
    ) {
        debug_assert!(self.tiles_whole());
        let ng = self.cols / self.group;
        let q = self.rows / 4;
        let in_place = self.scales_in_place();
        // Row j's finished output, its offsets `off` (w = s·q − o: subtract o · Σx over each
        // group, as `rows_into` does).
        let finish = |j: usize, v: f32, off: Option<&[f32]>| {
            let v = match off {
                Some(off) => v - super::ops::dot(&off[..ng], &sums[..ng]),
                None => v,
            };
            // SAFETY: j < rows, this tile's alone (the caller's promise).
            unsafe { y.set(j, out.finish(v, 0, j, self.rows)) };
        };
        // The groups of the rows `first + k · q + ..n` for k < runs, one run after
        // another, converted into `buf`.
        let convert = |scales: &Scales, first: usize, n: usize, runs: usize, buf: &mut Vec<f32>| {
            buf.clear();
            for k in 0..runs {
                let r = first + k * q;
                scales.extend_groups(r * ng..(r + n) * ng, buf);
            }
        };
        // Buffers of this thread's: an item per 64 rows would allocate, and the threads
        // build's allocator is shared.
        TILE_SCALES.with_borrow_mut(|(ws, offs)| {
            let mut acc = [0f32; 4];
            let run = tiles.start.min(q)..tiles.end.min(q);
            if !run.is_empty() {
                let n = run.len();
                if !in_place {
                    convert(&self.scales, run.start, n, 4, ws);
                    if let Some(o) = &self.offsets {
                        convert(o, run.start, n, 4, offs);
                    }
                }
                for i in run.clone() {
                    let c = i - run.start;
                    let converted = (!in_place).then(|| (&ws[c * ng..], n * ng));
                    self.dot_tile(act, corr, i, q, 4, converted, &mut acc);
                    for (k, &v) in acc.iter().enumerate() {
                        let j = k * q + i;
                        let off = match &self.offsets {
                            None => None,
                            Some(Scales::F32(o)) if in_place => Some(&o[j * ng..]),
                            Some(_) => Some(&offs[(k * n + c) * ng..]),
                        };
                        finish(j, v, off);
                    }
                }
            }
            if tiles.contains(&q) {
                let t = self.rows - 4 * q;
                if t > 0 {
                    convert(&self.scales, 4 * q, t, 1, ws);
                    if let Some(o) = &self.offsets {
                        convert(o, 4 * q, t, 1, offs);
                    }
                    self.dot_tile(act, corr, 4 * q, 1, t, Some((ws, ng)), &mut acc);
                    for (k, &v) in acc[..t].iter().enumerate() {
                        let off = self.offsets.as_ref().map(|_| &offs[k * ng..]);
                        finish(4 * q + k, v, off);
                    }
                }
            }
        });
    }

    /// Output columns `rows` for all activation rows, finished by `out` and stored into `y`
    /// (the product's `m × self.rows`). Each weight row is read once and meets every
    /// activation tile while it is in cache.
    ///
    /// # Safety
    /// `y` must hold at least `act.m × self.rows` values and outlive the call, and no other
    /// thread may write or read columns `rows` of it meanwhile.
    unsafe fn rows_into(
        &self,
        act: &Activations,
        sums: &[f32],
        rows: Range<usize>,
        y: &SharedOut,
        out: &Out,
    ) {
        let (k, m, n) = (self.cols, act.m, self.rows);
        let (nb, ng) = (k / QK, k / self.group);
        let (mut scratch, mut buf, mut obuf) = (self.scratch(), Vec::new(), Vec::new());
        for j in rows {
            let w = self.row(j, &mut scratch);
            let ws = self.row_scales(j, &mut buf);
            let off = self.row_offsets(j, &mut obuf);
            let mut i = 0;
            while i < m {
                let t = (m - i).min(4);
                let mut acc = [0f32; 4];
                let (xq, xd) = (&act.q[i * k..(i + t) * k], &act.d[i * nb..(i + t) * nb]);
                dot(w, ws, xq, xd, k, t, &mut acc, self.group != QK);
                for (r, &a) in acc.iter().enumerate().take(t) {
                    let mut v = a;
                    if !off.is_empty() {
                        // w = s·q − o: subtract o · Σx over each group (Σx from the quantized x).
                        v -= super::ops::dot(off, &sums[(i + r) * ng..(i + r + 1) * ng]);
                    }
                    // SAFETY: (i + r, j) lies inside y's m × n, and column j is this call's
                    // alone (the function's contract).
                    unsafe { y.set((i + r) * n + j, out.finish(v, i + r, j, n)) };
                }
                i += t;
            }
        }
    }
}

impl QMatrix {
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
    fn top_k_filtered(
        &self,
        x: &[f32],
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Option<Vec<(u32, f32)>> {
        let Values::Int8(qs) = &self.values else {
            return None;
        };
        // The filter's kernel reads f32 scales, or f16 ones as non-negative ([`Scale`]).
        let scales_read = match &self.scales {
            Scales::F32(_) => true,
            Scales::F16 { signed, .. } => !signed,
            Scales::Coded { .. } => false,
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
        // buffer zeroed each step decoded as fast), the cause not found (README, e96f8bc).
        let mut y = HEAD_SUMS.with_borrow_mut(std::mem::take);
        y.resize(self.rows, 0.0);
        let out = SharedOut::new(&mut y);
        let n_chunks = self.rows.div_ceil(ROW_CHUNK);
        pool::for_chunks(n_chunks, self.rows.saturating_mul(n) / 2, |chunks| {
            let r = chunks.start * ROW_CHUNK..(chunks.end * ROW_CHUNK).min(self.rows);
            // SAFETY: the chunk ranges are disjoint, so these ranges of `y` are disjoint and
            // in bounds, and `y` outlives `for_chunks`, which returns only when all are done.
            let part = unsafe { out.part(r.start, r.len()) };
            let ng = n / group;
            for_row_tiles(r.clone(), part, |j, apart, t, acc| {
                let (w, g16) = (&qs[j * n..], group != QK);
                match &self.scales {
                    Scales::F32(s) => dot_u7(w, &s[j * ng..], xq, n, apart * n, t, acc, g16),
                    Scales::F16 { bits, .. } => {
                        dot_u7(w, &bits[j * ng..], xq, n, apart * n, t, acc, g16)
                    }
                    // `top_k_filtered` declines them (a NaN would make it fall back too).
                    Scales::Coded { .. } => *acc = [f32::NAN; 4],
                }
            });
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

/// Weight rows per work item of the pool.
const ROW_CHUNK: usize = 64;
/// Weight rows per work item of a one-row product (a decode step's; its items are tiles of
/// four rows over the whole matrix, [`QMatrix::matvec_tiles`], so an item's size sets no
/// stream's length): Gemma 3's output projection and down have 640 rows, 10 items of 64,
/// which left the team's ranges that shrink towards a job's end ([`super::team`]) no small
/// ones to end with.
const ONE_ROW_CHUNK: usize = 16;

thread_local! {
    /// [`QMatrix::matvec_tiles`]'s converted scales and offsets.
    static TILE_SCALES: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    /// The LM head filter's sums, then upper bounds, one per row ([`QMatrix::products_u7`]),
    /// kept by the calling thread from one decode step to the next.
    static HEAD_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows `r` of a product with one activation row, their outputs `part`, in tiles of up to 4
/// rows: first row `i` of each quarter of `r` together (four memory streams, which one core
/// reads nearly twice as fast as one: Gemma 3's head natively in 13.4 ms instead of 23), then
/// the rows after the quarters. `tile(first row, rows between the tile's rows, count, out)`.
fn for_row_tiles(
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

/// This build's int8 kernels against the portable ones, and the LM head's filter against
/// the whole product (a few hundred thousand multiply-adds): the number of outputs compared,
/// or what differed. The 16- and 7-bit products must agree to a few ulps of their sums' size
/// (the SIMD versions add in another order), the row statistics likewise and the filter's
/// top-k exactly, ties included.
pub fn check_kernels() -> Result<usize, String> {
    // `n` 16-bit activations, every fifth at −32 767, and a scale per 32.
    fn activations16(rng: &mut crate::rng::Rng, n: usize) -> (Vec<i16>, Vec<f32>) {
        let x16 = (0..n)
            .map(|i| {
                if i % 5 == 0 {
                    -32767
                } else {
                    (rng.spread() * 9000.0) as i16
                }
            })
            .collect();
        let xd = (0..n / QK).map(|_| rng.spread().abs() * 1e-4).collect();
        (x16, xd)
    }
    let mut rng = crate::rng::Rng::new(11);
    let mut compared = 0;
    let close = |what: &str, a: f32, b: f32, size: f32| {
        if (a - b).abs() <= 1e-5 * size.max(f32::MIN_POSITIVE) {
            Ok(())
        } else {
            Err(format!("int8 {what}: simd {a}, portable {b} (size {size})"))
        }
    };
    // Coded scales ([`Scales::Coded`]): this build's expansion is the portable one, bit for
    // bit, for both block sizes, every code, units of both signs (subnormal and zero f16s
    // among them), and a length that ends mid-block (left as it was).
    for per in [8, 16] {
        let n = 37 * per + per / 2;
        let codes: Vec<i8> = (0..n).map(|i| (i as u8).wrapping_mul(37) as i8).collect();
        let units: Vec<f32> = (0..n / per)
            .map(|b| match b {
                0 => 0.0,
                1 => -0.0,
                _ => f16_bits_to_f32(rng.next_u64() as u16 & 0xFBFF),
            })
            .collect();
        let (mut a, mut b) = (vec![7.0f32; n], vec![7.0f32; n]);
        expand_codes(&units, &codes, per, &mut a);
        portable::expand_codes(&units, &codes, per, &mut b);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if bits(&a) != bits(&b) || a[n - 1] != 7.0 {
            return Err(format!("int8 coded scales, {per} a unit: {a:?} vs {b:?}"));
        }
        compared += n;
    }
    // Packed codes, every bit pattern likely among 7 blocks, with each packed type's bias.
    for bias in [0, 8] {
        let p = Packing::Nibbles { bias };
        let bytes: Vec<u8> = (0..p.row_bytes(7 * QK))
            .map(|_| rng.next_u64() as u8)
            .collect();
        let (mut a, mut b) = (vec![0i8; 7 * QK], vec![1i8; 7 * QK]);
        unpack(&bytes, &mut a, p);
        portable::unpack(&bytes, &mut b, bias);
        if a != b {
            return Err(format!("int8 unpack, {p:?}: {a:?} vs {b:?}"));
        }
        compared += a.len();
    }
    // Q5_0/Q5_1's 5-bit values: random high bits and nibbles, all bits set and none.
    for i in 0..64 {
        let qh = match i {
            0 => 0,
            1 => u32::MAX,
            _ => rng.next_u64() as u32,
        };
        let ql: [u8; 16] = std::array::from_fn(|_| rng.next_u64() as u8);
        for centred in [true, false] {
            let (mut a, mut b) = ([0i8; 32], [1i8; 32]);
            five_bits(qh, &ql, &mut a, centred);
            portable::five_bits(qh, &ql, &mut b, centred);
            if a != b {
                return Err(format!("int8 five_bits {qh:#x} {ql:?}: {a:?} vs {b:?}"));
            }
            compared += a.len();
        }
    }
    // Activation blocks: normal values at many sizes, halves exactly (a block whose largest
    // value is 32 767 has scale 1), random bit patterns (NaN, ±∞, subnormals), zeros.
    for i in 0i32..96 {
        let xs: [f32; QK] = std::array::from_fn(|j| match i % 4 {
            0 => rng.normal() * 10f32.powi(i / 4 % 13 - 6),
            1 if j == 0 => 32767.0,
            1 => (rng.next_u64() % 65_536) as f32 / 2.0 - 16_384.0,
            2 => f32::from_bits(rng.next_u64() as u32),
            _ if i == 3 => 0.0,
            _ => [f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-45, -0.0, 3.0][(j + i as usize) % 6],
        });
        let (mut a, mut b) = ([0i16; QK], [1i16; QK]);
        let (da, db) = (
            quantize_block(&xs, &mut a),
            portable::quantize_block(&xs, &mut b),
        );
        if a != b || da.to_bits() != db.to_bits() {
            return Err(format!(
                "int8 quantize_block {xs:?}: {da} {a:?} vs {db} {b:?}"
            ));
        }
        compared += a.len();
    }
    // The five-bit layout: rows of 1, 2, 3 and 20 blocks (every tail of a unit), values at
    // both ends, packed and unpacked by this build's kernels and the portable ones (this
    // build's last row first, so that a byte written past a row's end would show in the next
    // row or past the last); then products of up to 4 rows, 1 and 3 rows apart, against the
    // int8 kernel on the same values, bit for bit (this build's against this build's,
    // portable against portable).
    for k in [32, 64, 96, 640] {
        let rows = 10;
        let q: Vec<i8> = (0..rows * k)
            .map(|i| match i % 13 {
                0 => -16,
                1 => 15,
                _ => (rng.next_u64() % 32) as i8 - 16,
            })
            .collect();
        let rb = Packing::Fives.row_bytes(k);
        let (mut pa, mut pb) = (vec![0u8; rows * rb + 64], vec![1u8; rows * rb]);
        for r in (0..rows).rev() {
            let row = &q[r * k..(r + 1) * k];
            pack_fives(row, &mut pa[r * rb..(r + 1) * rb]);
            portable::pack_fives(row, &mut pb[r * rb..(r + 1) * rb]);
        }
        if pa[..rows * rb] != pb || pa[rows * rb..].iter().any(|&b| b != 0) {
            return Err(format!("int8 pack_fives, {k} values: {pa:?} vs {pb:?}"));
        }
        let (mut ua, mut ub) = (vec![0i8; k], vec![1i8; k]);
        for r in 0..rows {
            unpack(&pa[r * rb..], &mut ua, Packing::Fives);
            portable::unpack_fives(&pa[r * rb..], &mut ub);
            if ua[..] != q[r * k..(r + 1) * k] || ub != ua {
                return Err(format!("int8 unpack_fives, {k} values: {ua:?} vs {ub:?}"));
            }
            compared += k;
        }
        let ws: Vec<f32> = (0..rows * k / QK)
            .map(|_| rng.spread().abs() * 0.01)
            .collect();
        let (x16, xd) = activations16(&mut rng, k);
        let corr = portable::fives_corrections(&x16, k);
        for apart in [1, 3] {
            for t in (1..=4).filter(|t| (t - 1) * apart < rows) {
                let (ld, sld) = (apart * k, apart * k / QK);
                let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
                for simd in [true, false] {
                    if simd {
                        dot_w4(&q, &ws, &x16, &xd, k, ld, sld, t, &mut a, false);
                        dot_w5(&pa, &ws, &x16, &xd, &corr, k, apart, t, &mut b);
                    } else {
                        portable::dot_w4(&q, &ws, &x16, &xd, k, ld, sld, t, &mut a, false);
                        portable::dot_w5(&pa, &ws, &x16, &xd, &corr, k, apart, t, &mut b);
                    }
                    for r in 0..t {
                        if a[r].to_bits() != b[r].to_bits() {
                            return Err(format!(
                                "int8 five-bit rows, simd {simd}, {t} rows × {k}, {apart} \
                                 apart: {} vs {}",
                                b[r], a[r]
                            ));
                        }
                    }
                    compared += t;
                }
            }
        }
        // The five-bit kernel on the file's f16 scales (both signs, subnormal ones too)
        // gives what it gives on them as f32, bit for bit.
        #[cfg(target_arch = "wasm32")]
        {
            let wh: Vec<u16> = (0..rows * k / QK)
                .map(|i| match i % 7 {
                    0 => 0x8001,
                    1 => 0x03FF,
                    _ => (rng.next_u64() as u16) & 0xBFFF,
                })
                .collect();
            let wf: Vec<f32> = wh.iter().map(|&h| f16_bits_to_f32(h)).collect();
            for apart in [1, 3] {
                for t in (1..=4).filter(|t| (t - 1) * apart < rows) {
                    let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
                    wasm::dot_w5(&pa, &wh, &x16, &xd, &corr, k, apart, t, &mut a);
                    wasm::dot_w5(&pa, &wf, &x16, &xd, &corr, k, apart, t, &mut b);
                    if a[..t]
                        .iter()
                        .zip(&b)
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        return Err(format!(
                            "int8 five-bit rows on f16 scales, {t} rows × {k}: {a:?} vs {b:?}"
                        ));
                    }
                    compared += t;
                }
            }
        }
    }
    for k in [32, 96, 640] {
        // Weights at both extremes, 7-bit codes at 0 and 127, 16-bit values at ±32 767.
        let w: Vec<i8> = (0..4 * 3 * k)
            .map(|i| match i % 11 {
                0 => -128,
                1 => 127,
                _ => (rng.spread() * 50.0).clamp(-128.0, 127.0) as i8,
            })
            .collect();
        let ws: Vec<f32> = (0..w.len() / 16)
            .map(|_| rng.spread().abs() * 0.01)
            .collect();
        let wh: Vec<u16> = (0..w.len() / QK)
            .map(|i| match i % 9 {
                0 => 0x03FF,
                1 => 0,
                2 => 0x7BFF,
                3 => 1,
                _ => 0x1800 + (rng.next_u64() % 0x1800) as u16,
            })
            .collect();
        let wh32: Vec<f32> = wh.iter().map(|&h| h.value()).collect();
        let x7: Vec<u8> = (0..k)
            .map(|i| {
                if i % 3 == 0 {
                    127
                } else {
                    (rng.next_u64() % 128) as u8
                }
            })
            .collect();
        let (x16, xd) = activations16(&mut rng, 4 * k);
        for g16 in [false, true] {
            let group = if g16 { 16 } else { QK };
            for t in 1..=4 {
                let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
                dot(&w, &ws, &x16, &xd, k, t, &mut a, g16);
                portable::dot(&w, &ws, &x16, &xd, k, t, &mut b, g16);
                for r in 0..t {
                    let size: f32 = (0..k)
                        .map(|i| {
                            (f32::from(w[i])
                                * ws[i / group]
                                * f32::from(x16[r * k + i])
                                * xd[r * (k / QK) + i / QK])
                                .abs()
                        })
                        .sum();
                    close(
                        &format!("16-bit, {t} rows × {k}, g16 {g16}"),
                        a[r],
                        b[r],
                        size,
                    )?;
                }
                for ld in [k, 3 * k] {
                    if t > 1 && (t - 1) * ld + k > w.len() {
                        continue;
                    }
                    // Scales as the rows lie, and closer (a tile's converted alone).
                    for sld in [ld / group, k / group + 1] {
                        // Rows far apart on one activation row: each row's sum bit for bit.
                        dot_w4(&w, &ws, &x16, &xd, k, ld, sld, t, &mut a, g16);
                        for r in 0..t {
                            let mut one = [0f32; 4];
                            dot(&w[r * ld..], &ws[r * sld..], &x16, &xd, k, 1, &mut one, g16);
                            if a[r].to_bits() != one[0].to_bits() {
                                return Err(format!(
                                "int8 rows apart, {t} rows × {k} at {ld}, scales {sld}, g16 {g16}: {} vs {}",
                                a[r], one[0]
                            ));
                            }
                        }
                        // The same on packed codes: the rows' unpacked sums, bit for bit.
                        for bias in [0, 8] {
                            let wn: Vec<u8> = w.iter().step_by(2).map(|&v| v as u8).collect();
                            let mut wi = vec![0i8; wn.len() * 2];
                            portable::unpack(&wn, &mut wi, bias);
                            // This build's kernel, then the portable one (each against its own
                            // int8 kernel).
                            for simd in [true, false] {
                                if simd {
                                    dot_w4(&wi, &ws, &x16, &xd, k, ld, sld, t, &mut a, g16);
                                    dot_w4_nib(
                                        &wn, bias, &ws, &x16, &xd, k, ld, sld, t, &mut b, g16,
                                    );
                                } else {
                                    portable::dot_w4(
                                        &wi, &ws, &x16, &xd, k, ld, sld, t, &mut a, g16,
                                    );
                                    portable::dot_w4_nib(
                                        &wn, bias, &ws, &x16, &xd, k, ld, sld, t, &mut b, g16,
                                    );
                                }
                                for r in 0..t {
                                    if a[r].to_bits() != b[r].to_bits() {
                                        return Err(format!(
                                            "int8 packed rows, simd {simd}, {t} rows × {k} at \
                                         {ld}, scales {sld}, g16 {g16}, bias {bias}: {} vs {}",
                                            b[r], a[r]
                                        ));
                                    }
                                }
                                compared += t;
                            }
                        }
                    }
                    dot_u7(&w, &ws, &x7, k, ld, t, &mut a, g16);
                    portable::dot_u7(&w, &ws, &x7, k, ld, t, &mut b, g16);
                    for r in 0..t {
                        let size: f32 = (0..k)
                            .map(|i| {
                                (f32::from(w[r * ld + i])
                                    * ws[(r * ld + i) / group]
                                    * f32::from(x7[i]))
                                .abs()
                            })
                            .sum();
                        close(
                            &format!("7-bit, {t} rows × {k} at {ld}, g16 {g16}"),
                            a[r],
                            b[r],
                            size,
                        )?;
                    }
                    if !g16 {
                        // f16 scales (normal, subnormal, zero, the largest): the sums of the
                        // kernel on them as f32, bit for bit.
                        dot_u7(&w, &wh, &x7, k, ld, t, &mut b, false);
                        dot_u7(&w, &wh32, &x7, k, ld, t, &mut a, false);
                        for r in 0..t {
                            if a[r].to_bits() != b[r].to_bits() {
                                return Err(format!(
                                    "int8 7-bit on f16 scales, {t} rows × {k} at {ld}: {} vs {}",
                                    b[r], a[r]
                                ));
                            }
                        }
                        compared += t;
                    }
                }
                compared += 3 * t;
            }
            let (a, b) = (
                row_stats(&w[..k], &ws[..k / group], group),
                portable::row_stats(&w[..k], &ws[..k / group], group),
            );
            let l1: f32 = (0..k)
                .map(|i| (f32::from(w[i]) * ws[i / group]).abs())
                .sum();
            close("row norm", a.0, b.0, b.0)?;
            close("row sum", a.1, b.1, l1)?;
            compared += 2;
        }
    }
    // The filter: the top-k of a matrix with tied and nearly tied rows, with and without a
    // mask, equal to the top-k of the whole product.
    let (rows, cols) = (700, 64);
    let mut qs: Vec<i8> = (0..rows * cols)
        .map(|_| (rng.spread() * 40.0).clamp(-127.0, 127.0) as i8)
        .collect();
    let mut scales: Vec<f32> = (0..rows * cols / QK)
        .map(|_| 0.01 + rng.spread().abs() * 0.002)
        .collect();
    for r in (0..rows).step_by(7) {
        // Row r + 1 equals row r (an exact tie), row r + 2 differs in one value (a near one).
        let (a, b) = qs.split_at_mut((r + 1) * cols);
        b[..cols].copy_from_slice(&a[r * cols..]);
        b[cols..2 * cols].copy_from_slice(&a[r * cols..]);
        b[cols] = b[cols].saturating_add(1);
        let s = scales[r * cols / QK..(r + 1) * cols / QK].to_vec();
        scales[(r + 1) * cols / QK..(r + 2) * cols / QK].copy_from_slice(&s);
        scales[(r + 2) * cols / QK..(r + 3) * cols / QK].copy_from_slice(&s);
    }
    let m = QMatrix::from_parts(qs, scales, QK, rows, cols);
    let mask: Vec<u32> = (0..rows.div_ceil(32))
        .map(|_| rng.next_u64() as u32)
        .collect();
    for trial in 0..4 {
        // One large value among small ones: the row's 7-bit grid is coarse.
        let x: Vec<f32> = (0..cols)
            .map(|i| if i == trial * 9 { 40.0 } else { rng.spread() })
            .collect();
        for k in [1, 3, 40, rows + 1] {
            for allowed in [None, Some(&mask[..])] {
                let got = m.top_k_filtered(&x, k, allowed);
                let want = exact_top_k(&m, &x, k, allowed);
                if got.as_ref() != Some(&want) {
                    return Err(format!(
                        "the LM head filter, k {k}, mask {}: {:?} vs {:?}",
                        allowed.is_some(),
                        got.map(|g| g.into_iter().take(5).collect::<Vec<_>>()),
                        &want[..want.len().min(5)]
                    ));
                }
                compared += want.len();
            }
        }
    }
    Ok(compared)
}

/// The top-k of the whole product (all logits), masked as `Backend::top_k_masked` masks.
fn exact_top_k(m: &QMatrix, x: &[f32], k: usize, allowed: Option<&TokenMask>) -> Vec<(u32, f32)> {
    let mut y = m.matmul(x, 1);
    let ok = |i: usize| allowed.is_none_or(|a| is_allowed(a, i));
    for (i, v) in y.iter_mut().enumerate() {
        if !ok(i) {
            *v = f32::NEG_INFINITY;
        }
    }
    let mut top = crate::logits::top_k(&y, k);
    top.retain(|&(i, _)| ok(i as usize));
    top
}

#[cfg(test)]
mod tests {
    use super::decode::unpacker;
    use super::layout::ScaleLayout;
    use super::load::tests::{load_layer, quantized};
    use super::*;
    use crate::gguf::{now, GgmlType, SyncReads};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    #[test]
    fn the_kernel_check_passes() {
        assert!(check_kernels().expect("the int8 kernels agree") > 100);
    }

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

    /// Parts that share a call (with and without offsets, groups of 16 and 32, each with its
    /// own bias, GELU or residual) give, bit for bit, what each row of `x` gives alone through
    /// the one-row kernel, finished as a separate pass would: whether the rows run 1 to 4 to
    /// a tile, in one work item or several, and whoever else is in the pass.
    #[test]
    fn parts_in_one_pass_equal_each_row_alone() {
        let mut rng = crate::rng::Rng::new(11);
        let cols = 512;
        let types = [
            (GgmlDType::Q4K, GgmlType::Q4_K, 300),
            (GgmlDType::Q2K, GgmlType::Q2_K, 70),
            (GgmlDType::Q8_0, GgmlType::Q8_0, 129),
        ];
        let mats: Vec<QMatrix> = types
            .iter()
            .map(|&(dt, ty, rows)| {
                let bytes = quantized(&mut rng, rows, cols, dt);
                QMatrix::load(&bytes, 0, rows, cols, ty).unwrap()
            })
            .collect();
        for m in [1, 2, 5, 9] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.normal() * 2.0).collect();
            let bias: Vec<f32> = (0..mats[1].rows).map(|_| rng.normal()).collect();
            let res: Vec<f32> = (0..m * mats[2].rows).map(|_| rng.normal()).collect();
            let outs = [
                Out::plain(None),
                Out {
                    bias: Some(&bias),
                    post: Post::Gelu,
                },
                Out {
                    bias: None,
                    post: Post::Add(&res),
                },
            ];
            let parts: Vec<_> = mats.iter().zip(outs).collect();
            let got = QMatrix::products(&parts, &x, m);
            assert_eq!(got.len(), 3);
            for (p, (mat, out)) in parts.iter().enumerate() {
                assert_eq!(got[p].len(), m * mat.rows);
                let alone = QMatrix::products(&parts[p..=p], &x, m);
                assert_eq!(alone[0], got[p], "part {p} alone, m {m}");
                for i in 0..m {
                    let row = mat.matmul(&x[i * cols..(i + 1) * cols], 1);
                    for (j, &v) in row.iter().enumerate() {
                        let want = out.finish(v, i, j, mat.rows);
                        assert_eq!(
                            got[p][i * mat.rows + j].to_bits(),
                            want.to_bits(),
                            "part {p}, m {m}, ({i}, {j})"
                        );
                    }
                }
            }
        }
    }

    /// A one-row product over the whole matrix's tiles (`matvec_tiles`), its tiles split
    /// into ranges at any points (the pool's items; a range starting or ending at index q,
    /// past the quarters' tiles), gives each row's finished value of the product row by row
    /// (`rows_into`, the prompt's path), bit for bit, and
    /// every row is written by exactly one range: with and without offsets, packed and int8
    /// values, every count of rows after the quarters (0-3), fewer rows than a tile, a bias
    /// and a residual.
    #[test]
    fn a_one_row_product_in_any_tile_ranges_equals_the_row_layout() {
        let mut rng = crate::rng::Rng::new(17);
        let cols = 256;
        for (dt, ty) in [
            (GgmlDType::Q4_1, GgmlType::Q4_1),
            (GgmlDType::Q4K, GgmlType::Q4_K),
            (GgmlDType::Q6K, GgmlType::Q6_K),
            (GgmlDType::Q5_0, GgmlType::Q5_0),
            (GgmlDType::Q8_0, GgmlType::Q8_0),
        ] {
            for rows in [3, 4, 66, 129, 130, 131, 192] {
                let bytes = quantized(&mut rng, rows, cols, dt);
                let x: Vec<f32> = (0..cols).map(|_| rng.normal() * 2.0).collect();
                let act = Activations::quantize(&x, 1, cols);
                let bias: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
                let res: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
                let u = unpacker(ty).unwrap();
                // Scales read in place, and converted a tile at a time (the wasm build's
                // K-quants; a layout a type has not falls back to f32).
                let layouts = [
                    ScaleLayout::F32,
                    ScaleLayout::Coded,
                    ScaleLayout::F16 { signed: true },
                ];
                for (int8, layout) in [true, false]
                    .into_iter()
                    .flat_map(|i| layouts.map(|l| (i, l)))
                {
                    if !int8 && u.pack.is_none() {
                        continue;
                    }
                    let m = load_layer(&bytes, rows, cols, ty, int8, layout);
                    if !m.tiles_whole() {
                        // Q5_0's f16 scales natively, which no load makes: `products` takes
                        // them row by row (`rows_into`, the reference here).
                        continue;
                    }
                    let sums = act.group_sums(m.group);
                    let corr = if matches!(m.values, Values::Packed(Packing::Fives, _)) {
                        portable::fives_corrections(&act.q, cols)
                    } else {
                        Vec::new()
                    };
                    for out in [
                        Out::plain(Some(&bias)),
                        Out {
                            bias: None,
                            post: Post::Add(&res),
                        },
                    ] {
                        // Row by row, as a prompt's rows go.
                        let mut want = vec![0f32; rows];
                        let y = SharedOut::new(&mut want);
                        // SAFETY: `want` is the whole output and outlives the call.
                        unsafe { m.rows_into(&act, &sums, 0..rows, &y, &out) };
                        let n_tiles = rows.div_ceil(ONE_ROW_CHUNK) * ONE_ROW_CHUNK / 4;
                        let q = rows / 4;
                        for cuts in [
                            vec![],
                            vec![1],
                            vec![q.min(n_tiles)],
                            vec![q.saturating_sub(1), q + 1],
                            vec![3, 7, q / 2, q],
                        ] {
                            let mut cuts: Vec<usize> =
                                cuts.into_iter().filter(|&c| c <= n_tiles).collect();
                            cuts.push(n_tiles);
                            cuts.sort_unstable();
                            // Each range into a buffer of its own: every row is written by
                            // exactly one of them.
                            let mut got = vec![f32::NAN; rows];
                            let mut start = 0;
                            for end in cuts {
                                let mut mine = vec![f32::NAN; rows];
                                let y = SharedOut::new(&mut mine);
                                // SAFETY: `mine` is the whole output and outlives the call.
                                unsafe { m.matvec_tiles(&act, &sums, &corr, start..end, &y, &out) };
                                for (g, v) in got.iter_mut().zip(mine) {
                                    if !v.is_nan() {
                                        assert!(
                                            g.is_nan(),
                                            "{ty} {layout:?}, {rows} rows: a row written twice"
                                        );
                                        *g = v;
                                    }
                                }
                                start = end;
                            }
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&got), bits(&want), "{ty}, int8 {int8}, {rows} rows");
                        }
                    }
                }
            }
        }
    }
}
