//! Products of a [`QMatrix`] with activation rows: a prompt's, each weight row read once for
//! all its activation tiles ([`QMatrix::rows_into`]), and a decode step's one row, four
//! streams a quarter of the matrix apart ([`QMatrix::matvec_tiles`]); several matrices that
//! share an input in one pass over the pool ([`QMatrix::products`]).

use super::activations::Activations;
use super::dispatch::{dot, dot_w4, dot_w4_nib, dot_w5};
use super::layout::{QMatrix, Scales, Values};
use super::packing::Packing;
use super::portable;
use super::scale::QK;
#[cfg(target_arch = "wasm32")]
use super::wasm;
use crate::cpu::dense::{Out, Post};
use crate::cpu::pool::{self, SharedOut};
use std::ops::Range;

impl QMatrix {
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
        // Part p's chunks of `chunk` rows are its items in the one pass.
        let chunk = if m == 1 { ONE_ROW_CHUNK } else { ROW_CHUNK };
        let rows: Vec<usize> = parts.iter().map(|(w, _)| w.rows).collect();
        let work = parts.iter().fold(0usize, |a, (w, _)| {
            a.saturating_add(m.saturating_mul(w.rows).saturating_mul(k))
        });
        pool::for_part_chunks(&rows, chunk, work, |p, c| {
            let (w, out) = &parts[p];
            let r = c.start * chunk..(c.end * chunk).min(w.rows);
            debug_assert!(w.group == 16 || w.group == QK);
            let sums = match (&w.offsets, w.group) {
                (None, _) => &[][..],
                (Some(_), 16) => &sums16[..],
                _ => &sums32[..],
            };
            if m == 1 && w.tiles_whole() {
                // Item c: tiles c·chunk/4.. of the whole matrix (the same count of items
                // as chunks of rows); the last one also takes the rows after them.
                let tiles = c.start * chunk / 4..c.end * chunk / 4;
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
        });
        ys
    }

    /// Whether a one-row product reads this matrix's scales and offsets where they are held
    /// (f32; in wasm Q5_0's f16 scales, which its kernel reads as they are: [`BlockScale`](super::scale::BlockScale));
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
    /// i + 2q, i + 3q for q = rows / 4, as [`for_row_tiles`](super::head::for_row_tiles) lays out a range; the range that
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
                Some(off) => v - crate::cpu::ops::dot(&off[..ng], &sums[..ng]),
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
                        v -= crate::cpu::ops::dot(off, &sums[(i + r) * ng..(i + r + 1) * ng]);
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

/// Weight rows per work item of the pool.
pub(super) const ROW_CHUNK: usize = 64;
/// Weight rows per work item of a one-row product (a decode step's; its items are tiles of
/// four rows over the whole matrix, [`QMatrix::matvec_tiles`], so an item's size sets no
/// stream's length): Gemma 3's output projection and down have 640 rows, 10 items of 64,
/// which left the team's ranges that shrink towards a job's end ([`super::team`](crate::cpu::team)) no small
/// ones to end with.
const ONE_ROW_CHUNK: usize = 16;

thread_local! {
    /// [`QMatrix::matvec_tiles`]'s converted scales and offsets, kept by each thread: a first
    /// version that allocated them per item decoded 6% slower on two threads (std's dlmalloc
    /// behind one lock in the threads build).
    static TILE_SCALES: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

#[cfg(test)]
mod tests {
    use super::super::decode::unpacker;
    use super::super::layout::ScaleLayout;
    use super::super::load::tests::{load_layer, quantized};
    use super::*;
    use crate::gguf::GgmlType;
    use candle_core::quantized::GgmlDType;

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
