//! Our own matrix kernel for quantized weights, used on every target: int8 values with f32
//! scales in separate arrays, so a dot product never converts an f16 in software (wasm has
//! no f16 instructions), and a tile of 4 activation rows shares each loaded weight block.
//!
//! Weights: every quantized type is unpacked exactly to int8 values with f32 scales and,
//! where the type has minimums, offsets (`w = scale · q − offset`): Q4_0, Q4_1, Q5_0, Q5_1 and
//! Q8_0 with one scale per 32 values, the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with one
//! per 16 — about 1.3 bytes per weight instead of 0.6 for a 4-bit K-quant (Gemma 3 270M: +25
//! MB): the price of exact activations below.
//!
//! Activations are quantized to 16 bits per 32-value block (f32 scale), not to 8 bits as
//! llama.cpp and candle do: the kernel multiplies in i16 lanes anyway (`i32x4.dot_i16x8_s`,
//! `vpmaddwd`), so the finer grid costs nothing. With 8-bit activations the K-quant matmuls
//! were the only real error against the float64 reference (top-1 93%, |Δ logit| 0.17 mean);
//! with 16 bits the whole forward pass matches it to 0.001. Overflow: |x| ≤ 32 767,
//! |w| ≤ 128, so a 32-value block sums below 2^27 per lane.

use super::pool::{self, SharedOut};
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType};
use half::f16;

/// Activation block (one f32 scale per 32 values).
const QK: usize = 32;

/// A `rows × cols` matrix of int8 values, a scale per `group` values and, optionally, an
/// offset: `w = scale · q − offset`.
pub struct QMatrix {
    /// (rows × cols) int8 values, row-major.
    qs: Vec<i8>,
    /// One scale per group.
    scales: Vec<f32>,
    /// One offset per group (the minimums of Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), if any.
    offsets: Option<Vec<f32>>,
    /// 32 (the 32-value block types) or 16 (the K-quants).
    group: usize,
    pub rows: usize,
    pub cols: usize,
}

/// File blocks read per chunk while loading (a few hundred KB of scratch).
const LOAD_CHUNK_BLOCKS: usize = 4096;

impl QMatrix {
    /// The tensor types this kernel takes.
    pub fn takes(ty: GgmlType) -> bool {
        unpacker(ty).is_some()
    }

    /// (values per scale, has offsets) of a type this kernel takes.
    pub fn layout(ty: GgmlType) -> Option<(usize, bool)> {
        unpacker(ty).map(|u| (u.group, u.offsets))
    }

    /// Load a tensor of `ty` (a type [`QMatrix::takes`]) from the file, block by block.
    pub fn load(
        src: &dyn ByteSource,
        offset: u64,
        rows: usize,
        cols: usize,
        ty: GgmlType,
    ) -> Result<Self> {
        let Some(u) = unpacker(ty) else {
            return Err(Error::Backend(format!(
                "the int8 kernel does not take {ty}"
            )));
        };
        let (block, block_bytes) = (u.block, u.bytes);
        let group = u.group;
        if !cols.is_multiple_of(block) {
            return Err(Error::Backend(format!(
                "{ty} rows of {cols} are not whole blocks"
            )));
        }
        // Sizes were checked against the file, but wasm's usize is 32 bits.
        let n = rows.checked_mul(cols).ok_or_else(|| {
            Error::Backend(format!("a {rows} × {cols} matrix does not fit in memory"))
        })?;
        let n_blocks = n / block;
        let mut qs = vec![0i8; n];
        let mut scales = vec![0f32; n / group];
        let mut offsets = u.offsets.then(|| vec![0f32; n / group]);
        let mut no_offsets = vec![0f32; block / group];
        let mut buf = vec![0u8; LOAD_CHUNK_BLOCKS.min(n_blocks) * block_bytes];
        let mut b0 = 0;
        while b0 < n_blocks {
            let nb = LOAD_CHUNK_BLOCKS.min(n_blocks - b0);
            let chunk = &mut buf[..nb * block_bytes];
            src.read_at(offset + (b0 * block_bytes) as u64, chunk)?;
            for (i, blk) in chunk.chunks_exact(block_bytes).enumerate() {
                let b = b0 + i;
                let q = &mut qs[b * block..(b + 1) * block];
                let g = b * block / group..(b + 1) * block / group;
                let o = match offsets.as_mut() {
                    Some(o) => &mut o[g.clone()],
                    None => &mut no_offsets[..],
                };
                (u.unpack)(blk, q, &mut scales[g], o);
            }
            b0 += nb;
        }
        Ok(Self {
            qs,
            scales,
            offsets,
            group,
            rows,
            cols,
        })
    }

    /// Rows `ids`, dequantized and times `scale`.
    pub fn rows_f32(&self, ids: &[u32], scale: f32) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        for &id in ids {
            let r = id as usize;
            if r >= self.rows {
                return Err(Error::InvalidArgument(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    self.rows
                )));
            }
            let gpr = self.cols / self.group;
            for g in r * gpr..(r + 1) * gpr {
                let (s, o) = (self.scales[g], self.offsets.as_ref().map_or(0.0, |o| o[g]));
                let q = &self.qs[g * self.group..(g + 1) * self.group];
                out.extend(q.iter().map(|&q| (f32::from(q) * s - o) * scale));
            }
        }
        Ok(out)
    }

    /// `x (m × cols) @ selfᵀ → (m × rows)`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let sums = self.offsets.as_ref().map(|_| self.group);
        let act = Activations::quantize(x, m, self.cols, sums);
        // Computed as (rows × m), so that a range of weight rows owns one contiguous slice.
        let mut yt = vec![0f32; self.rows * m];
        let out = SharedOut::new(&mut yt);
        let n_chunks = self.rows.div_ceil(ROW_CHUNK);
        let work = m.saturating_mul(self.rows).saturating_mul(self.cols);
        pool::for_chunks(n_chunks, work, |chunks| {
            let r = chunks.start * ROW_CHUNK..(chunks.end * ROW_CHUNK).min(self.rows);
            // SAFETY: the chunk ranges are disjoint, so these row ranges of `yt`
            // (r.len() × m values from r.start × m) are disjoint and in bounds, and `yt`
            // outlives `for_chunks`, which returns only when all are done.
            let part = unsafe { out.part(r.start * m, r.len() * m) };
            self.rows_into(&act, r, part);
        });
        if m == 1 {
            return yt;
        }
        let mut y = vec![0f32; m * self.rows];
        for (j, row) in yt.chunks_exact(m).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                y[i * self.rows + j] = v;
            }
        }
        y
    }

    /// Output columns `rows` for all activation rows, into `out (rows.len() × m)`. Each
    /// weight row is read once and meets every activation tile while it is in cache.
    fn rows_into(&self, act: &Activations, rows: std::ops::Range<usize>, out: &mut [f32]) {
        let (k, m) = (self.cols, act.m);
        let (nb, ng) = (k / QK, k / self.group);
        for (jj, j) in rows.enumerate() {
            let w = &self.qs[j * k..(j + 1) * k];
            let ws = &self.scales[j * ng..(j + 1) * ng];
            let mut i = 0;
            while i < m {
                let t = (m - i).min(4);
                let mut acc = [0f32; 4];
                let (xq, xd) = (&act.q[i * k..(i + t) * k], &act.d[i * nb..(i + t) * nb]);
                if self.group == QK {
                    dot32(w, ws, xq, xd, k, t, &mut acc);
                } else {
                    dot16(w, ws, xq, xd, k, t, &mut acc);
                }
                if let Some(off) = &self.offsets {
                    // w = s·q − o: subtract o · Σx over each group (Σx from the quantized x).
                    let off = &off[j * ng..(j + 1) * ng];
                    for (r, a) in acc.iter_mut().enumerate().take(t) {
                        *a -= super::ops::dot(off, &act.group_sums[(i + r) * ng..(i + r + 1) * ng]);
                    }
                }
                out[jj * m + i..jj * m + i + t].copy_from_slice(&acc[..t]);
                i += t;
            }
        }
    }
}

/// Weight rows per work item of the pool.
const ROW_CHUNK: usize = 64;

/// (file block, its values, its scales, its offsets: empty-valued when the type has none).
type UnpackFn = fn(&[u8], &mut [i8], &mut [f32], &mut [f32]);

/// How one file block of a type becomes int8 values, scales and offsets.
struct Unpacker {
    /// Values and bytes per file block.
    block: usize,
    bytes: usize,
    /// Values per scale (and offset).
    group: usize,
    /// The type has minimums: offsets are stored.
    offsets: bool,
    unpack: UnpackFn,
}

fn unpacker(ty: GgmlType) -> Option<Unpacker> {
    let u = |block, bytes, group, offsets, unpack| {
        Some(Unpacker {
            block,
            bytes,
            group,
            offsets,
            unpack,
        })
    };
    match ty {
        GgmlType::Q4_0 => u(32, 18, 32, false, unpack_q4_0),
        GgmlType::Q4_1 => u(32, 20, 32, true, unpack_q4_1),
        GgmlType::Q5_0 => u(32, 22, 32, false, unpack_q5_0),
        GgmlType::Q5_1 => u(32, 24, 32, true, unpack_q5_1),
        GgmlType::Q8_0 => u(32, 34, 32, false, unpack_q8_0),
        GgmlType::Q2_K => u(256, 84, 16, true, unpack_q2_k),
        GgmlType::Q3_K => u(256, 110, 16, false, unpack_q3_k),
        GgmlType::Q4_K => u(256, 144, 16, true, unpack_q4_k),
        GgmlType::Q5_K => u(256, 176, 16, true, unpack_q5_k),
        GgmlType::Q6_K => u(256, 210, 16, false, unpack_q6_k),
        _ => None,
    }
}

fn f16_at(blk: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32()
}

fn unpack_q8_0(blk: &[u8], q: &mut [i8], s: &mut [f32], _: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    for (o, &v) in q.iter_mut().zip(&blk[2..34]) {
        *o = v as i8;
    }
}

/// Q4_0: f16 d, 16 bytes of nibbles (low nibbles are values 0..16); value = d·(q − 8).
fn unpack_q4_0(blk: &[u8], q: &mut [i8], s: &mut [f32], _: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    for j in 0..16 {
        q[j] = (blk[2 + j] & 0x0F) as i8 - 8;
        q[j + 16] = (blk[2 + j] >> 4) as i8 - 8;
    }
}

/// Q4_1: f16 d, f16 m, 16 bytes of nibbles; value = d·q + m.
fn unpack_q4_1(blk: &[u8], q: &mut [i8], s: &mut [f32], o: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    o[0] = -f16_at(blk, 2);
    for j in 0..16 {
        q[j] = (blk[4 + j] & 0x0F) as i8;
        q[j + 16] = (blk[4 + j] >> 4) as i8;
    }
}

/// The 5-bit values of Q5_0/Q5_1: 32 high bits `qh`, then 16 bytes of low nibbles.
fn five_bits(qh: u32, ql: &[u8], q: &mut [i8], minus: i8) {
    for j in 0..16 {
        let lo = (ql[j] & 0x0F) | ((((qh >> j) << 4) & 0x10) as u8);
        let hi = (ql[j] >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
        q[j] = lo as i8 - minus;
        q[j + 16] = hi as i8 - minus;
    }
}

/// Q5_0: f16 d, 32 high bits, 16 bytes of low nibbles; value j is `(low | high << 4) − 16`.
fn unpack_q5_0(blk: &[u8], q: &mut [i8], s: &mut [f32], _: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    five_bits(qh, &blk[6..22], q, 16);
}

/// Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of low nibbles; value = d·q + m.
fn unpack_q5_1(blk: &[u8], q: &mut [i8], s: &mut [f32], o: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    o[0] = -f16_at(blk, 2);
    let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
    five_bits(qh, &blk[8..24], q, 0);
}

/// The 6-bit (scale, min) pair of sub-block `j` of Q4_K/Q5_K's 12 packed bytes.
fn scale_min_k4(sc: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        (
            (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
            (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
        )
    }
}

/// Q4_K and Q5_K: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks of
/// 32, [Q5_K: 32 bytes of high bits,] 128 bytes of nibbles; value = d·sc·q − dmin·m.
fn unpack_k4(blk: &[u8], qh: Option<&[u8]>, qs: &[u8], q: &mut [i8], s: &mut [f32], o: &mut [f32]) {
    let d = f16_at(blk, 0);
    let dmin = f16_at(blk, 2);
    let sc = &blk[4..16];
    for c in 0..4 {
        // 64 values: the low nibbles of 32 bytes, then their high nibbles.
        for half in 0..2 {
            let sub = 2 * c + half;
            let (scv, mv) = scale_min_k4(sc, sub);
            for g in 0..2 {
                s[sub * 2 + g] = d * f32::from(scv);
                o[sub * 2 + g] = dmin * f32::from(mv);
            }
            for l in 0..32 {
                let byte = qs[32 * c + l];
                let low = if half == 0 { byte & 0xF } else { byte >> 4 };
                let high = qh.map_or(0, |h| ((h[l] >> sub) & 1) << 4);
                q[64 * c + 32 * half + l] = (low | high) as i8;
            }
        }
    }
}

fn unpack_q4_k(blk: &[u8], q: &mut [i8], s: &mut [f32], o: &mut [f32]) {
    unpack_k4(blk, None, &blk[16..144], q, s, o)
}

fn unpack_q5_k(blk: &[u8], q: &mut [i8], s: &mut [f32], o: &mut [f32]) {
    unpack_k4(blk, Some(&blk[16..48]), &blk[48..176], q, s, o)
}

/// Q2_K: 16 bytes of 4-bit (scale, min) pairs (one per 16 values), 64 bytes of 2-bit values,
/// f16 d, f16 dmin; value = d·sc·q − dmin·m.
fn unpack_q2_k(blk: &[u8], q: &mut [i8], s: &mut [f32], o: &mut [f32]) {
    let (sc, qs) = (&blk[0..16], &blk[16..80]);
    let d = f16_at(blk, 80);
    let dmin = f16_at(blk, 82);
    for (g, &b) in sc.iter().enumerate() {
        s[g] = d * f32::from(b & 0xF);
        o[g] = dmin * f32::from(b >> 4);
    }
    // Two halves of 128 values; in each, 4 shifts of the same 32 bytes.
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                q[128 * n + 32 * j + l] = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
            }
        }
    }
}

/// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of 6-bit scales (one
/// per 16 values, minus 32), f16 d; value = d·(sc − 32)·(q − (4 unless the mask bit is set)).
fn unpack_q3_k(blk: &[u8], q: &mut [i8], s: &mut [f32], _: &mut [f32]) {
    let (hm, qs, sc) = (&blk[0..32], &blk[32..96], &blk[96..108]);
    let d = f16_at(blk, 108);
    for (g, sv) in s.iter_mut().enumerate() {
        let low = if g < 8 { sc[g] & 0xF } else { sc[g - 8] >> 4 };
        let high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
        *sv = d * f32::from(((low | (high << 4)) as i8) - 32);
    }
    for n in 0..2 {
        for j in 0..4 {
            let bit = 4 * n + j;
            for l in 0..32 {
                let v = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
                let h = (hm[l] >> bit) & 1;
                q[128 * n + 32 * j + l] = v - if h == 1 { 0 } else { 4 };
            }
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one per
/// 16 values), f16 d; value = d·scale·(q − 32).
fn unpack_q6_k(blk: &[u8], q: &mut [i8], s: &mut [f32], _: &mut [f32]) {
    let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
    let d = f16_at(blk, 208);
    for (g, sv) in s.iter_mut().enumerate() {
        *sv = d * f32::from(sc[g] as i8);
    }
    for n in 0..2 {
        let (ql, qh, out) = (&ql[64 * n..], &qh[32 * n..], &mut q[128 * n..]);
        for l in 0..32 {
            let h = qh[l];
            out[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

/// Activation rows quantized to 16 bits per 32-value block: scale = max|x| / 32 767.
struct Activations {
    m: usize,
    q: Vec<i16>,
    d: Vec<f32>,
    /// Σx over each weight group (16 or 32 values), from the quantized values (scale · Σq),
    /// for weights with offsets.
    group_sums: Vec<f32>,
}

impl Activations {
    fn quantize(x: &[f32], m: usize, k: usize, sums: Option<usize>) -> Self {
        let mut q = vec![0i16; m * k];
        let mut d = vec![0f32; m * k / QK];
        for (b, (xs, qs)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = amax / 32767.0;
            let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
            d[b] = scale;
            for (o, &v) in qs.iter_mut().zip(xs) {
                *o = (v * inv).round() as i16;
            }
        }
        let group_sums = match sums {
            Some(n) => q
                .chunks_exact(n)
                .enumerate()
                .map(|(g, v)| v.iter().map(|&v| i32::from(v)).sum::<i32>() as f32 * d[g * n / QK])
                .collect(),
            None => Vec::new(),
        };
        Self {
            m,
            q,
            d,
            group_sums,
        }
    }
}

/// One weight row against `t ≤ 4` activation rows, one weight scale per 32 values.
fn dot32(w: &[i8], ws: &[f32], xq: &[i16], xd: &[f32], k: usize, t: usize, acc: &mut [f32; 4]) {
    simd::dot(w, ws, xq, xd, k, t, acc, false)
}

/// The same with one weight scale per 16 values.
fn dot16(w: &[i8], ws: &[f32], xq: &[i16], xd: &[f32], k: usize, t: usize, acc: &mut [f32; 4]) {
    simd::dot(w, ws, xq, xd, k, t, acc, true)
}

#[cfg(target_arch = "wasm32")]
mod simd {
    use super::QK;
    use std::arch::wasm32::*;

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn dot(
        w: &[i8],
        ws: &[f32],
        xq: &[i16],
        xd: &[f32],
        k: usize,
        t: usize,
        acc: &mut [f32; 4],
        g16: bool,
    ) {
        let nb = k / QK;
        assert!(
            w.len() >= k
                && xq.len() >= t * k
                && xd.len() >= t * nb
                && ws.len() >= if g16 { 2 * nb } else { nb }
        );
        let mut a = [f32x4_splat(0.0); 4];
        for b in 0..nb {
            // SAFETY: b < nb and the lengths were asserted above; v128_load is unaligned.
            unsafe {
                let wp = w.as_ptr().add(b * QK);
                let w0 = v128_load(wp.cast());
                let w1 = v128_load(wp.add(16).cast());
                let (wa, wb) = (i16x8_extend_low_i8x16(w0), i16x8_extend_high_i8x16(w0));
                let (wc, wd) = (i16x8_extend_low_i8x16(w1), i16x8_extend_high_i8x16(w1));
                for (r, ar) in a.iter_mut().enumerate().take(t) {
                    let xp = xq.as_ptr().add(r * k + b * QK);
                    let s0 = i32x4_add(
                        i32x4_dot_i16x8(wa, v128_load(xp.cast())),
                        i32x4_dot_i16x8(wb, v128_load(xp.add(8).cast())),
                    );
                    let s1 = i32x4_add(
                        i32x4_dot_i16x8(wc, v128_load(xp.add(16).cast())),
                        i32x4_dot_i16x8(wd, v128_load(xp.add(24).cast())),
                    );
                    let x = xd[r * nb + b];
                    if g16 {
                        let p0 = f32x4_mul(f32x4_convert_i32x4(s0), f32x4_splat(ws[2 * b] * x));
                        let p1 = f32x4_mul(f32x4_convert_i32x4(s1), f32x4_splat(ws[2 * b + 1] * x));
                        *ar = f32x4_add(*ar, f32x4_add(p0, p1));
                    } else {
                        let s = f32x4_convert_i32x4(i32x4_add(s0, s1));
                        *ar = f32x4_add(*ar, f32x4_mul(s, f32x4_splat(ws[b] * x)));
                    }
                }
            }
        }
        for (r, ar) in a.iter().enumerate().take(t) {
            acc[r] = (f32x4_extract_lane::<0>(*ar) + f32x4_extract_lane::<1>(*ar))
                + (f32x4_extract_lane::<2>(*ar) + f32x4_extract_lane::<3>(*ar));
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod simd {
    use super::QK;

    /// AVX2 when the CPU has it (the same i16 multiply-add as wasm's `dot_i16x8`), else
    /// portable Rust.
    #[allow(clippy::too_many_arguments)]
    pub fn dot(
        w: &[i8],
        ws: &[f32],
        xq: &[i16],
        xd: &[f32],
        k: usize,
        t: usize,
        acc: &mut [f32; 4],
        g16: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            if *AVX2.get_or_init(|| std::arch::is_x86_feature_detected!("avx2")) {
                // SAFETY: AVX2 is present (checked above).
                unsafe { dot_avx2(w, ws, xq, xd, k, t, acc, g16) };
                return;
            }
        }
        portable(w, ws, xq, xd, k, t, acc, g16)
    }

    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2")]
    unsafe fn dot_avx2(
        w: &[i8],
        ws: &[f32],
        xq: &[i16],
        xd: &[f32],
        k: usize,
        t: usize,
        acc: &mut [f32; 4],
        g16: bool,
    ) {
        use std::arch::x86_64::*;
        let nb = k / QK;
        assert!(
            w.len() >= k
                && xq.len() >= t * k
                && xd.len() >= t * nb
                && ws.len() >= if g16 { 2 * nb } else { nb }
        );
        let mut a = [_mm256_setzero_ps(); 4];
        for b in 0..nb {
            // SAFETY: b < nb and the lengths were asserted above; the loads are unaligned.
            unsafe {
                let wp = w.as_ptr().add(b * QK);
                let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp.cast()));
                let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp.add(16).cast()));
                for (r, ar) in a.iter_mut().enumerate().take(t) {
                    let xp = xq.as_ptr().add(r * k + b * QK);
                    let s0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(xp.cast()));
                    let s1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(xp.add(16).cast()));
                    let x = xd[r * nb + b];
                    if g16 {
                        let p0 =
                            _mm256_mul_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(ws[2 * b] * x));
                        let p1 = _mm256_mul_ps(
                            _mm256_cvtepi32_ps(s1),
                            _mm256_set1_ps(ws[2 * b + 1] * x),
                        );
                        *ar = _mm256_add_ps(*ar, _mm256_add_ps(p0, p1));
                    } else {
                        let s = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
                        *ar = _mm256_add_ps(*ar, _mm256_mul_ps(s, _mm256_set1_ps(ws[b] * x)));
                    }
                }
            }
        }
        for (r, ar) in a.iter().enumerate().take(t) {
            let mut l = [0f32; 8];
            // SAFETY: l has room for 8 f32.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), *ar) };
            acc[r] = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        }
    }

    /// Portable version: the reference the SIMD versions are tested against.
    #[allow(clippy::too_many_arguments)]
    pub fn portable(
        w: &[i8],
        ws: &[f32],
        xq: &[i16],
        xd: &[f32],
        k: usize,
        t: usize,
        acc: &mut [f32; 4],
        g16: bool,
    ) {
        let nb = k / QK;
        let group = if g16 { 16 } else { QK };
        for r in 0..t {
            let mut s = 0f32;
            for g in 0..k / group {
                let dot: i32 = w[g * group..(g + 1) * group]
                    .iter()
                    .zip(&xq[r * k + g * group..r * k + (g + 1) * group])
                    .map(|(&a, &x)| i32::from(a) * i32::from(x))
                    .sum();
                s += dot as f32 * (ws[g] * xd[r * nb + g * group / QK]);
            }
            acc[r] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn simd_equals_portable() {
        let mut rng = crate::sampler::Rng::new(9);
        let k = 128;
        let w: Vec<i8> = (0..k).map(|_| (rng.next_u64() % 255) as i8).collect();
        let ws: Vec<f32> = (0..k / 16).map(|_| rng.normal().abs()).collect();
        let xq: Vec<i16> = (0..4 * k)
            .map(|_| (rng.next_u64() % 65535) as u16 as i16)
            .collect();
        let xd: Vec<f32> = (0..4 * k / QK).map(|_| rng.normal().abs()).collect();
        for g16 in [false, true] {
            for t in 1..=4 {
                let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
                simd::dot(&w, &ws, &xq, &xd, k, t, &mut a, g16);
                simd::portable(&w, &ws, &xq, &xd, k, t, &mut b, g16);
                for r in 0..t {
                    assert!(
                        (a[r] - b[r]).abs() <= 1e-5 * b[r].abs().max(1.0),
                        "g16 {g16} t {t} row {r}: {} vs {}",
                        a[r],
                        b[r]
                    );
                }
            }
        }
    }

    /// Unpacking is exact (equal to candle's dequantization), and the product is near the
    /// exact one — much nearer than candle's with 8-bit activations.
    #[test]
    fn every_type_unpacks_exactly_and_multiplies_near_exactly() {
        let mut rng = crate::sampler::Rng::new(5);
        // The second shape is large enough for the thread pool and the (rows × m) transpose.
        for (rows, cols, m) in [(37, 512, 6), (333, 1024, 5)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
            let x: Vec<f32> = (0..m * cols).map(|_| rng.normal() * 3.0).collect();
            let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
            let xt = Tensor::from_vec(x.clone(), (m, cols), &Device::Cpu).unwrap();
            for (dt, ty) in [
                (GgmlDType::Q8_0, GgmlType::Q8_0),
                (GgmlDType::Q4_0, GgmlType::Q4_0),
                (GgmlDType::Q4_1, GgmlType::Q4_1),
                (GgmlDType::Q5_0, GgmlType::Q5_0),
                (GgmlDType::Q5_1, GgmlType::Q5_1),
                (GgmlDType::Q2K, GgmlType::Q2_K),
                (GgmlDType::Q3K, GgmlType::Q3_K),
                (GgmlDType::Q4K, GgmlType::Q4_K),
                (GgmlDType::Q5K, GgmlType::Q5_K),
                (GgmlDType::Q6K, GgmlType::Q6_K),
            ] {
                assert!(QMatrix::takes(ty));
                let q = QTensor::quantize(&wt, dt).unwrap();
                let bytes = q.data().unwrap().into_owned();
                let mat = QMatrix::load(&bytes, 0, rows, cols, ty).unwrap();
                let deq = q.dequantize(&Device::Cpu).unwrap();
                let ids: Vec<u32> = (0..rows as u32).collect();
                let mine_rows = mat.rows_f32(&ids, 1.0).unwrap();
                let want_rows = deq.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                for (a, b) in mine_rows.iter().zip(&want_rows) {
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                        "{ty}: unpacked {a} vs {b}"
                    );
                }
                let mine = mat.matmul(&x, m);
                let exact = xt
                    .matmul(&deq.t().unwrap())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                let candle = QMatMul::from_qtensor(q).unwrap().forward(&xt).unwrap();
                let candle = candle.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let err = |v: &[f32]| {
                    v.iter()
                        .zip(&exact)
                        .map(|(a, b)| (a - b).powi(2))
                        .sum::<f32>()
                };
                let scale: f32 = exact.iter().map(|v| v * v).sum();
                let (e_mine, e_candle) = (err(&mine) / scale, err(&candle) / scale);
                assert!(e_mine < 1e-8, "{ty}: NMSE {e_mine}");
                assert!(
                    e_mine < e_candle / 100.0,
                    "{ty}: ours {e_mine} vs candle {e_candle}"
                );
            }
        }
    }
}
