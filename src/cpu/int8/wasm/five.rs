//! The five-bit rows in wasm SIMD (Q5_0 kept packed in wasm): unpacking and packing the
//! codes, and their product with 16-bit activations.

use super::super::scale::{BlockScale, QK};
use super::hsum;
use std::arch::wasm32::*;

/// See [`super::super::portable::five_bits`]: 16 values a vector, each lane's high bit picked out
/// of `qh` by a byte shuffle (the byte holding it) and a bit mask.
#[inline(always)]
pub fn five_bits(qh: u32, ql: &[u8; 16], q: &mut [i8; 32], centred: bool) {
    let bits = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    let h = u32x4_splat(qh);
    // 0xFF where the value's high bit is set: qh's bytes 0 and 1 for values 0..16, 2 and 3
    // for 16..32.
    let set = |h: v128| i8x16_eq(v128_and(h, bits), bits);
    #[rustfmt::skip]
    let set_lo = set(i8x16_shuffle::<0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1>(h, h));
    #[rustfmt::skip]
    let set_hi = set(i8x16_shuffle::<2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3>(h, h));
    // Centred (v − 16): the low nibble under 0xF0 where the bit is clear; else under 0x10
    // where it is set.
    let high = |set: v128| {
        if centred {
            v128_andnot(u8x16_splat(0xF0), set)
        } else {
            v128_and(set, u8x16_splat(0x10))
        }
    };
    // SAFETY: 16 bytes read and 32 written, the arrays' sizes; loads and stores are unaligned.
    unsafe {
        let l = v128_load(ql.as_ptr().cast());
        let o = q.as_mut_ptr();
        v128_store(
            o.cast(),
            v128_or(v128_and(l, u8x16_splat(0x0F)), high(set_lo)),
        );
        v128_store(o.add(16).cast(), v128_or(u8x16_shr(l, 4), high(set_hi)));
    }
}

/// Group `G` (0..12) of the five-bit unit at `p` ([`super::super::portable::pack_fives`]): its
/// field of vector `G / 3`, eight 16-bit codes (value + 16).
///
/// # Safety
/// `p` must point at a unit holding group `G` (its vector `G / 3`).
#[inline(always)]
unsafe fn five_codes<const G: usize>(p: *const u8) -> v128 {
    // SAFETY: vector G / 3 of the unit, the caller's promise; loads are unaligned.
    let v = unsafe { v128_load(p.add(16 * (G / 3)).cast()) };
    match G % 3 {
        0 => v128_and(v, u16x8_splat(0x1F)),
        1 => v128_and(u16x8_shr(v, 5), u16x8_splat(0x1F)),
        // Bit 15 is clear.
        _ => u16x8_shr(v, 10),
    }
}

/// See [`super::super::portable::unpack_fives`]: each pair of groups narrowed to one 16-byte store.
pub fn unpack_fives(bytes: &[u8], out: &mut [i8]) {
    use super::super::portable::{fives_row_bytes, FIVES_UNIT, FIVES_UNIT_BYTES};
    let n = out.len();
    assert!(n.is_multiple_of(QK) && bytes.len() >= fives_row_bytes(n));
    for u in 0..n.div_ceil(FIVES_UNIT) {
        let blocks = (n - u * FIVES_UNIT) / QK;
        // SAFETY: unit u's vectors that hold its first `blocks` blocks' groups are inside
        // `bytes` (asserted: `fives_row_bytes`), and those blocks' values inside `out`.
        unsafe {
            let (p, o) = (
                bytes.as_ptr().add(u * FIVES_UNIT_BYTES),
                out.as_mut_ptr().add(u * FIVES_UNIT),
            );
            unpack_pair::<0, 1>(p, o);
            unpack_pair::<2, 3>(p, o);
            if blocks > 1 {
                unpack_pair::<4, 5>(p, o);
                unpack_pair::<6, 7>(p, o);
            }
            if blocks > 2 {
                unpack_pair::<8, 9>(p, o);
                unpack_pair::<10, 11>(p, o);
            }
        }
    }
}

/// Groups `A` and `A + 1 = B` of the unit at `p` as 16 int8 values at `o + 8A`.
///
/// # Safety
/// `p` must point at a unit holding groups `A` and `B`, and `o + 8A..o + 8A + 16` be
/// writable.
#[inline(always)]
unsafe fn unpack_pair<const A: usize, const B: usize>(p: *const u8, o: *mut i8) {
    // SAFETY: the caller's promise; stores are unaligned.
    unsafe {
        let codes = u8x16_narrow_i16x8(five_codes::<A>(p), five_codes::<B>(p));
        v128_store(o.add(8 * A).cast(), i8x16_sub(codes, i8x16_splat(16)));
    }
}

/// See [`super::super::portable::dot_w5`]: per block, the codes' products in two sums (fields 0
/// and 2 as they are; field 1 masked in place, so times 32, and shifted down once per block:
/// an integer multiple of 32, so exactly), less `corr`: the lanes [`dot_w4`] makes from the
/// int8 values, then its block sums, so the same sums bit for bit. One mask or shift per 8
/// codes, as int8 takes one widening.
///
/// The scales are f32, or the file's f16 ([`BlockScale`]: two integer operations a block
/// and row more, beside the SIMD ones, for half the bytes).
#[allow(clippy::too_many_arguments)]
pub fn dot_w5<S: BlockScale>(
    w: &[u8],
    ws: &[S],
    xq: &[i16],
    xd: &[f32],
    corr: &[i32],
    k: usize,
    apart: usize,
    t: usize,
    out: &mut [f32; 4],
) {
    super::super::portable::check_w5(w, ws, xq, xd, corr, k, apart, t);
    let c = (w, ws, xq, xd, corr);
    // SAFETY: the lengths were checked.
    unsafe {
        match t {
            4 => rows_w5::<4, S>(c, k, apart, out),
            3 => rows_w5::<3, S>(c, k, apart, out),
            2 => rows_w5::<2, S>(c, k, apart, out),
            _ => rows_w5::<1, S>(c, k, apart, out),
        }
    }
}

/// [`dot_w5`]'s weights, scales, activations, their scales and corrections.
type W5<'a, S> = (&'a [u8], &'a [S], &'a [i16], &'a [f32], &'a [i32]);

/// [`dot_w5`] for `R` rows, the accumulators in registers: a unit (three blocks) at a time,
/// each block's groups and fields known at compile time. Groups are const generics: with the
/// group index known only at run time LLVM kept a division and a `br_table` per group, and the
/// kernel ran 3× slower than int8's (Node, 2048 × 640 rows in cache); with constants 91 µs
/// against int8's 93. No software prefetch: touching each row four tiles ahead with a plain
/// load per 64 bytes slowed one thread 39.1 → 38.6 tok/s and two 58.2 → 55.2 in Chromium.
#[inline(always)]
unsafe fn rows_w5<const R: usize, S: BlockScale>(
    c: W5<S>,
    k: usize,
    apart: usize,
    out: &mut [f32; 4],
) {
    let nb = k / QK;
    let (ldb, lds) = (
        apart * super::super::portable::fives_row_bytes(k),
        apart * nb,
    );
    let mut a = [f32x4_splat(0.0); R];
    for u in 0..nb.div_ceil(3) {
        let blk = 3 * u;
        // SAFETY: unit u's blocks below nb are inside what `check_w5` checked.
        unsafe {
            block_w5::<R, 0, 1, 2, 3, S>(&mut a, c, u, blk, ldb, lds);
            if blk + 1 < nb {
                block_w5::<R, 4, 5, 6, 7, S>(&mut a, c, u, blk + 1, ldb, lds);
            }
            if blk + 2 < nb {
                block_w5::<R, 8, 9, 10, 11, S>(&mut a, c, u, blk + 2, ldb, lds);
            }
        }
    }
    for (o, ar) in out.iter_mut().zip(&a) {
        *o = hsum(*ar);
    }
}

/// Block `blk` (groups `G0..=G3` of unit `u`) of `R` rows (`ldb` bytes and `lds` scales
/// apart) into their accumulators.
///
/// # Safety
/// Unit `u` of every row, the block's scales, activations and corrections must be in bounds.
#[inline(always)]
unsafe fn block_w5<
    const R: usize,
    const G0: usize,
    const G1: usize,
    const G2: usize,
    const G3: usize,
    S: BlockScale,
>(
    a: &mut [v128; R],
    (w, ws, xq, xd, corr): W5<S>,
    u: usize,
    blk: usize,
    ldb: usize,
    lds: usize,
) {
    // SAFETY: the caller's promise; loads are unaligned.
    unsafe {
        let xb = xq.as_ptr().add(blk * QK);
        let (x0, x1) = (v128_load(xb.cast()), v128_load(xb.add(8).cast()));
        let (x2, x3) = (v128_load(xb.add(16).cast()), v128_load(xb.add(24).cast()));
        // The activation scale times the weight scales' power of two, once for the R rows.
        let x = *xd.get_unchecked(blk) * S::X;
        let cb = v128_load(corr.as_ptr().add(4 * blk).cast());
        for (r, ar) in a.iter_mut().enumerate() {
            let p = w
                .as_ptr()
                .add(r * ldb + u * super::super::portable::FIVES_UNIT_BYTES);
            let mut sums = [i32x4_splat(0); 2];
            group_w5::<G0>(p, x0, &mut sums);
            group_w5::<G1>(p, x1, &mut sums);
            group_w5::<G2>(p, x2, &mut sums);
            group_w5::<G3>(p, x3, &mut sums);
            let s = i32x4_sub(i32x4_add(sums[0], i32x4_shr(sums[1], 5)), cb);
            // add_block's product, on the scale as the kernel reads it.
            let wx = ws.get_unchecked(r * lds + blk).over_x() * x;
            *ar = f32x4_add(*ar, f32x4_mul(f32x4_convert_i32x4(s), f32x4_splat(wx)));
        }
    }
}

/// Group `G`'s products with `x` into `sums`: fields 0 and 2 into `sums[0]`, field 1
/// (masked in place: its codes times 32) into `sums[1]`.
///
/// # Safety
/// `p` must point at a unit holding group `G` (its vector `G / 3`).
#[inline(always)]
unsafe fn group_w5<const G: usize>(p: *const u8, x: v128, sums: &mut [v128; 2]) {
    // SAFETY: vector G / 3 of the unit, the caller's promise; loads are unaligned.
    let v = unsafe { v128_load(p.add(16 * (G / 3)).cast()) };
    match G % 3 {
        0 => sums[0] = i32x4_add(sums[0], i32x4_dot_i16x8(v128_and(v, u16x8_splat(0x1F)), x)),
        1 => {
            sums[1] = i32x4_add(
                sums[1],
                i32x4_dot_i16x8(v128_and(v, u16x8_splat(0x1F << 5)), x),
            )
        }
        // Bit 15 is clear.
        _ => sums[0] = i32x4_add(sums[0], i32x4_dot_i16x8(u16x8_shr(v, 10), x)),
    }
}

/// See [`super::super::portable::pack_fives`]: two groups a 16-byte load, widened, made codes and
/// shifted into their field.
pub fn pack_fives(q: &[i8], out: &mut [u8]) {
    use super::super::portable::{fives_row_bytes, FIVES_UNIT, FIVES_UNIT_BYTES};
    let n = q.len();
    assert!(n.is_multiple_of(QK) && out.len() >= fives_row_bytes(n));
    for u in 0..n.div_ceil(FIVES_UNIT) {
        let blocks = (n - u * FIVES_UNIT) / QK;
        // SAFETY: the unit's first `blocks` blocks of values are inside `q` and its bytes
        // inside `out` (asserted); loads and stores are unaligned.
        unsafe {
            let src = q.as_ptr().add(u * FIVES_UNIT);
            let mut lanes = [i16x8_splat(0); 4];
            pack_pair::<0, 1>(src, &mut lanes);
            pack_pair::<2, 3>(src, &mut lanes);
            if blocks > 1 {
                pack_pair::<4, 5>(src, &mut lanes);
                pack_pair::<6, 7>(src, &mut lanes);
            }
            if blocks > 2 {
                pack_pair::<8, 9>(src, &mut lanes);
                pack_pair::<10, 11>(src, &mut lanes);
            }
            // The vectors the unit's groups fill: a last unit of one or two blocks is
            // shorter (`fives_row_bytes`).
            let dst = out.as_mut_ptr().add(u * FIVES_UNIT_BYTES);
            let vectors = fives_row_bytes(blocks.min(3) * QK) / 16;
            for (i, l) in lanes.into_iter().enumerate().take(vectors) {
                v128_store(dst.add(16 * i).cast(), l);
            }
        }
    }
}

/// Groups `A` and `A + 1 = B` (16 values at `src + 8A`) into their fields of `lanes`.
///
/// # Safety
/// `src + 8A..src + 8A + 16` must be readable.
#[inline(always)]
unsafe fn pack_pair<const A: usize, const B: usize>(src: *const i8, lanes: &mut [v128; 4]) {
    // SAFETY: the caller's promise; loads are unaligned.
    let v = unsafe { v128_load(src.add(8 * A).cast()) };
    pack_group::<A>(i16x8_extend_low_i8x16(v), lanes);
    pack_group::<B>(i16x8_extend_high_i8x16(v), lanes);
}

/// Group `G`'s eight values (16-bit) as codes into field `G % 3` of `lanes[G / 3]`.
#[inline(always)]
fn pack_group<const G: usize>(wide: v128, lanes: &mut [v128; 4]) {
    let code = v128_and(i16x8_add(wide, i16x8_splat(16)), i16x8_splat(0x1F));
    let f = match G % 3 {
        0 => code,
        1 => i16x8_shl(code, 5),
        _ => i16x8_shl(code, 10),
    };
    lanes[G / 3] = v128_or(lanes[G / 3], f);
}
