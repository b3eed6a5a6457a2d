//! GGML's file blocks as int8 values, scales and offsets: each type's block layout
//! ([`Unpacker`], [`unpacker`]), the decoders (`unpack_q4_0` … `unpack_q6_k`), and the 4- and
//! 5-bit types' packed forms (`pack_q4_0`, `pack_q4_1`, `pack_q4_k`, [`fives`]). A decoder
//! takes whole chunks of blocks ([`blocks`]); what a matrix keeps is the load's choice.

use super::dispatch::{five_bits, pack_fives};
use super::packing::Packing;
use super::scale::QK;
use crate::gguf::GgmlType;

/// (whole file blocks, their values, their scales, their offsets: empty when the type has
/// none).
pub(super) type UnpackFn = fn(&[u8], &mut [i8], &mut [f32], &mut [f32]);

/// [`UnpackFn`] with the values packed ([`Packing`]) instead of unpacked, for a chunk of
/// whole rows of the given length.
pub(super) type PackFn = fn(&[u8], &mut [u8], &mut [f32], &mut [f32], usize);

/// `f` (one file block of `BYTES` → `OUT` outputs: `BLOCK` int8 values, or the packed
/// codes of a 4-bit type; a scale per `GROUP` values, offsets if the type has them: `o` not
/// empty) over every block of `chunk`, inlined in the loop: the load's hot loop is then one
/// small function per type, which the browser's optimizing tier takes at once, with no call
/// per block.
#[inline(always)]
fn blocks<T, const BLOCK: usize, const BYTES: usize, const GROUP: usize, const OUT: usize>(
    chunk: &[u8],
    q: &mut [T],
    s: &mut [f32],
    o: &mut [f32],
    f: impl Fn(&[u8], &mut [T], &mut [f32], &mut [f32]),
) {
    let per = BLOCK / GROUP;
    let each = chunk
        .chunks_exact(BYTES)
        .zip(q.chunks_exact_mut(OUT))
        .zip(s.chunks_exact_mut(per));
    if o.is_empty() {
        for ((blk, q), s) in each {
            f(blk, q, s, &mut []);
        }
    } else {
        for (((blk, q), s), o) in each.zip(o.chunks_exact_mut(per)) {
            f(blk, q, s, o);
        }
    }
}

/// Q5_0 into the five-bit layout ([`Packing::Fives`]): each row of the chunk (`cols`
/// values, `cols / 32` file blocks of `BYTES`) unpacked to int8 block by block by `f` (as
/// [`blocks`] does for the int8 layout), then packed.
fn fives<const BYTES: usize>(
    chunk: &[u8],
    out: &mut [u8],
    s: &mut [f32],
    o: &mut [f32],
    cols: usize,
    f: impl Fn(&[u8], &mut [i8], &mut [f32], &mut [f32]),
) {
    let nb = cols / QK;
    let rb = Packing::Fives.row_bytes(cols);
    let mut q = vec![0i8; cols];
    let rows = chunk.chunks_exact(nb * BYTES).zip(out.chunks_exact_mut(rb));
    for (r, (blk, dst)) in rows.enumerate() {
        let o = if o.is_empty() {
            &mut [][..]
        } else {
            &mut o[r * nb..(r + 1) * nb]
        };
        blocks::<i8, QK, BYTES, QK, QK>(blk, &mut q, &mut s[r * nb..(r + 1) * nb], o, &f);
        pack_fives(&q, dst);
    }
}

/// How a type's file blocks become int8 values, scales and offsets (`unpack` takes whole
/// chunks of blocks: [`blocks`]).
pub(super) struct Unpacker {
    /// Values and bytes per file block.
    pub(super) block: usize,
    pub(super) bytes: usize,
    /// Values per scale (and offset).
    pub(super) group: usize,
    /// The type has minimums: offsets are stored.
    pub(super) offsets: bool,
    pub(super) unpack: UnpackFn,
    /// The 4-bit types: their packed layout and how whole chunks of file blocks become it
    /// ([`blocks`]).
    pub(super) pack: Option<(Packing, PackFn)>,
    /// Each block's scale is the file's f16 in its first two bytes: `Some(true)` where it is
    /// non-negative as llama.cpp writes it (Q8_0: the block's largest |value| / 127), `Some
    /// (false)` where it may not be (Q4_0 and Q5_0 keep the sign of the block's extreme
    /// value, so half their scales are negative).
    pub(super) f16_scale: Option<bool>,
    /// The K-quants: each group's scale is the block's f16 `d` (the first function reads
    /// it) times an integer code, each offset the block's `dmin` (the second) times one
    /// ([`Scales::Coded`](super::layout::Scales::Coded)).
    pub(super) units: Option<(UnitFn, UnitFn)>,
}

/// A K-quant block's unit (its f16 `d` or `dmin`) as f32.
pub(super) type UnitFn = fn(&[u8]) -> f32;

pub(super) fn unpacker(ty: GgmlType) -> Option<Unpacker> {
    macro_rules! u {
        ($block:literal, $bytes:literal, $group:literal, $offsets:literal, $f:ident) => {
            u!($block, $bytes, $group, $offsets, $f, None)
        };
        // Kept packed: 4-bit codes less `$bias`, made by `$p`.
        ($block:literal, $bytes:literal, $group:literal, $offsets:literal, $f:ident,
         $p:ident, $bias:literal) => {{
            const OUT: usize = $block / 2;
            let packing = Packing::Nibbles { bias: $bias };
            let pack: PackFn =
                |c, q, s, o, _| blocks::<u8, $block, $bytes, $group, OUT>(c, q, s, o, $p);
            u!($block, $bytes, $group, $offsets, $f, Some((packing, pack)))
        }};
        ($block:literal, $bytes:literal, $group:literal, $offsets:literal, $f:ident, $pack:expr) => {
            Some(Unpacker {
                block: $block,
                bytes: $bytes,
                group: $group,
                offsets: $offsets,
                unpack: |c, q, s, o| blocks::<i8, $block, $bytes, $group, $block>(c, q, s, o, $f),
                pack: $pack,
                f16_scale: None,
                units: None,
            })
        };
    }
    let u = match ty {
        GgmlType::Q4_0 => u!(32, 18, 32, false, unpack_q4_0, pack_q4_0, 8),
        GgmlType::Q4_1 => u!(32, 20, 32, true, unpack_q4_1, pack_q4_1, 0),
        GgmlType::Q5_0 => u!(
            32,
            22,
            32,
            false,
            unpack_q5_0,
            Some((Packing::Fives, |c, q, s, o, cols| {
                fives::<22>(c, q, s, o, cols, unpack_q5_0)
            }))
        ),
        GgmlType::Q5_1 => u!(32, 24, 32, true, unpack_q5_1),
        GgmlType::Q8_0 => u!(32, 34, 32, false, unpack_q8_0),
        GgmlType::Q2_K => u!(256, 84, 16, true, unpack_q2_k),
        GgmlType::Q3_K => u!(256, 110, 16, false, unpack_q3_k),
        GgmlType::Q4_K => u!(256, 144, 32, true, unpack_q4_k, pack_q4_k, 0),
        GgmlType::Q5_K => u!(256, 176, 32, true, unpack_q5_k),
        GgmlType::Q6_K => u!(256, 210, 16, false, unpack_q6_k),
        _ => None,
    };
    u.map(|u| Unpacker {
        f16_scale: match ty {
            GgmlType::Q8_0 => Some(true),
            GgmlType::Q4_0 | GgmlType::Q5_0 => Some(false),
            _ => None,
        },
        units: match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => Some((k4_d, k4_dmin)),
            GgmlType::Q2_K => Some((q2_k_d, q2_k_dmin)),
            GgmlType::Q3_K => Some((q3_k_d, no_unit)),
            GgmlType::Q6_K => Some((q6_k_d, no_unit)),
            _ => None,
        },
        ..u
    })
}

/// The K-quants' block units (`d`, `dmin`), which their unpackers and the coded layout's
/// units ([`Unpacker::units`]) read alike.
fn k4_d(blk: &[u8]) -> f32 {
    f16_at(blk, 0)
}

fn k4_dmin(blk: &[u8]) -> f32 {
    f16_at(blk, 2)
}

fn q2_k_d(blk: &[u8]) -> f32 {
    f16_at(blk, 80)
}

fn q2_k_dmin(blk: &[u8]) -> f32 {
    f16_at(blk, 82)
}

fn q3_k_d(blk: &[u8]) -> f32 {
    f16_at(blk, 108)
}

fn q6_k_d(blk: &[u8]) -> f32 {
    f16_at(blk, 208)
}

/// The unit of a layout that takes none (f32 and f16 values, a type without offsets): a
/// NaN, which no coded value would match ([`code_of`](super::layout::code_of)), were it ever asked.
pub(super) fn no_unit(_: &[u8]) -> f32 {
    f32::NAN
}

fn f16_at(blk: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]))
}

/// An f16 as f32, exactly as `half` converts it: the loader converts one per block (7
/// million for Gemma 3 270M), where `half` calls out to a runtime-dispatched function
/// natively and takes a branchy software path in wasm. A finite one is
/// [`crate::cpu::ops::f16_to_f32`] (normal and subnormal alike, a few branch-free
/// operations); infinities and NaNs (a quiet NaN with the payload, as `half` gives) keep an
/// all-ones exponent.
#[inline(always)]
pub(super) fn f16_bits_to_f32(h: u16) -> f32 {
    if h & 0x7FFF < 0x7C00 {
        return crate::cpu::ops::f16_to_f32(h);
    }
    let sign = u32::from(h & 0x8000) << 16;
    let man = u32::from(h & 0x3FF) << 13;
    f32::from_bits(sign | 0x7F80_0000 | man | if man != 0 { 0x0040_0000 } else { 0 })
}

/// Q8_0: f16 d, 32 signed bytes; value = d·q. (Fixed-size views: one 32-byte copy.)
fn unpack_q8_0(blk: &[u8], q: &mut [i8], s: &mut [f32], _: &mut [f32]) {
    let (Some(blk), Some(q)) = (blk.first_chunk::<34>(), q.first_chunk_mut::<32>()) else {
        return;
    };
    s[0] = f16_at(blk, 0);
    for (o, &v) in q.iter_mut().zip(&blk[2..]) {
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

/// Q5_0: f16 d, 32 high bits, 16 bytes of low nibbles; value j is `(low | high << 4) − 16`.
fn unpack_q5_0(blk: &[u8], q: &mut [i8], s: &mut [f32], _: &mut [f32]) {
    let (Some(blk), Some(q)) = (blk.first_chunk::<22>(), q.first_chunk_mut::<32>()) else {
        return;
    };
    s[0] = f16_at(blk, 0);
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    let Some(ql) = blk[6..].first_chunk::<16>() else {
        return;
    };
    five_bits(qh, ql, q, true);
}

/// Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of low nibbles; value = d·q + m.
fn unpack_q5_1(blk: &[u8], q: &mut [i8], s: &mut [f32], o: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    o[0] = -f16_at(blk, 2);
    let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
    let (Some(ql), Some(q)) = (blk[8..].first_chunk::<16>(), q.first_chunk_mut::<32>()) else {
        return;
    };
    five_bits(qh, ql, q, false);
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
    k4_scales(blk, s, o);
    for c in 0..4 {
        // 64 values: the low nibbles of 32 bytes, then their high nibbles.
        for half in 0..2 {
            let sub = 2 * c + half;
            for l in 0..32 {
                let byte = qs[32 * c + l];
                let low = if half == 0 { byte & 0xF } else { byte >> 4 };
                let high = qh.map_or(0, |h| ((h[l] >> sub) & 1) << 4);
                q[64 * c + 32 * half + l] = (low | high) as i8;
            }
        }
    }
}

/// Q4_K and Q5_K's scale and offset of each sub-block of 32: `d·sc` and `dmin·m`.
fn k4_scales(blk: &[u8], s: &mut [f32], o: &mut [f32]) {
    let d = k4_d(blk);
    let dmin = k4_dmin(blk);
    for sub in 0..8 {
        let (scv, mv) = scale_min_k4(&blk[4..16], sub);
        s[sub] = d * f32::from(scv);
        o[sub] = dmin * f32::from(mv);
    }
}

/// Q4_K into the packed layout ([`Packing`]): each sub-block of 32 (the low or high nibbles
/// of 32 bytes) as 16 bytes of nibble pairs.
fn pack_q4_k(blk: &[u8], out: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    k4_scales(blk, s, o);
    for (c, q) in blk[16..144].chunks_exact(32).enumerate() {
        let (a, b) = q.split_at(16);
        for half in 0..2 {
            let ob = &mut out[(2 * c + half) * 16..(2 * c + half + 1) * 16];
            for l in 0..16 {
                ob[l] = if half == 0 {
                    (a[l] & 0xF) | (b[l] << 4)
                } else {
                    (a[l] >> 4) | (b[l] & 0xF0)
                };
            }
        }
    }
}

/// Q4_0, packed: the file's own 16 bytes of nibbles.
fn pack_q4_0(blk: &[u8], q: &mut [u8], s: &mut [f32], _: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    q.copy_from_slice(&blk[2..18]);
}

fn pack_q4_1(blk: &[u8], q: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    s[0] = f16_at(blk, 0);
    o[0] = -f16_at(blk, 2);
    q.copy_from_slice(&blk[4..20]);
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
    let d = q2_k_d(blk);
    let dmin = q2_k_dmin(blk);
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
    let d = q3_k_d(blk);
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
    let d = q6_k_d(blk);
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

#[cfg(test)]
mod tests {
    use super::super::layout::QMatrix;
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};
    use half::f16;

    /// Every f16, NaN payloads included, converts to the f32 `half` gives, bit for bit.
    #[test]
    fn f16_conversion_is_halfs_for_every_value() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_bits_to_f32(h).to_bits(), want, "f16 {h:#06x}");
        }
    }

    /// Unpacking is exact (equal to candle's dequantization), and the product is near the
    /// exact one — much nearer than candle's with 8-bit activations.
    #[test]
    fn every_type_unpacks_exactly_and_multiplies_near_exactly() {
        let mut rng = crate::rng::Rng::new(5);
        // The second shape is large enough for the thread pool;
        // the third is a decode step's (one activation row, rows from four places at once).
        for (rows, cols, m) in [(37, 512, 6), (333, 1024, 5), (333, 1024, 1)] {
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
