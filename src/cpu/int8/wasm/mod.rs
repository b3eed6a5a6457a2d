//! The int8 kernels in wasm SIMD: the exact product on 16-bit activations (simd128's
//! `i32x4.dot_i16x8_s`) and, in the relaxed-SIMD build, the 7-bit product the LM head's
//! filter runs on (`i32x4.relaxed_dot_i8x16_i7x16_add_s`).

mod five;

pub use five::{dot_w5, five_bits, pack_fives, unpack_fives};

use super::scale::QK;
use std::arch::wasm32::*;

/// See [`super::portable::dot`].
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
    super::portable::check_dot(w, ws, xq, xd, k, t, g16);
    // SAFETY: the lengths were checked.
    unsafe { by_rows!(rows_x, t, g16, (w, ws, xq, xd, k, acc)) }
}

/// One block's integer sums `s0` (its values 0..16) and `s1` (16..32) into `acc`, times the
/// weight scale(s) at `ws[b]` (`ws[2b]`, `ws[2b + 1]` with `G16`) and the activation scale
/// `x`: the exact kernels' one way of adding a block, so their sums agree bit for bit.
///
/// # Safety
/// `ws` must hold the block's scales.
#[inline(always)]
unsafe fn add_block<const G16: bool>(
    acc: &mut v128,
    s0: v128,
    s1: v128,
    ws: *const f32,
    b: usize,
    x: f32,
) {
    // SAFETY: the caller's promise.
    unsafe {
        if G16 {
            let p0 = f32x4_mul(f32x4_convert_i32x4(s0), f32x4_splat(*ws.add(2 * b) * x));
            let p1 = f32x4_mul(f32x4_convert_i32x4(s1), f32x4_splat(*ws.add(2 * b + 1) * x));
            *acc = f32x4_add(*acc, f32x4_add(p0, p1));
        } else {
            let s = f32x4_convert_i32x4(i32x4_add(s0, s1));
            *acc = f32x4_add(*acc, f32x4_mul(s, f32x4_splat(*ws.add(b) * x)));
        }
    }
}

/// The 4 lanes' sum, in a fixed order.
#[inline(always)]
pub(super) fn hsum(v: v128) -> f32 {
    (f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v))
        + (f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v))
}

/// [`dot`] for `R` activation rows, the accumulators in registers (with a runtime count
/// they may live in linear memory: prefill in Chromium went from 124 to 146 tok/s with this
/// and one scale per 32 values for Q4_K). The weights widen from one 16-byte load and two
/// extends: `i16x8.load8x8_s` per 8 weights was no quicker (37.8 → 37.1 tok/s, 5 pairs).
#[inline(always)]
unsafe fn rows_x<const R: usize, const G16: bool>(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    acc: &mut [f32; 4],
) {
    let nb = k / QK;
    let mut a = [f32x4_splat(0.0); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for b in 0..nb {
        // SAFETY: b < nb and r < R ≤ t, within what `dot` asserted; v128_load is unaligned.
        unsafe {
            let p = wp.add(b * QK);
            let (w0, w1) = (v128_load(p.cast()), v128_load(p.add(16).cast()));
            let (wa, wb) = (i16x8_extend_low_i8x16(w0), i16x8_extend_high_i8x16(w0));
            let (wc, wd) = (i16x8_extend_low_i8x16(w1), i16x8_extend_high_i8x16(w1));
            for (r, ar) in a.iter_mut().enumerate() {
                let xb = xp.add(r * k + b * QK);
                let s0 = i32x4_add(
                    i32x4_dot_i16x8(wa, v128_load(xb.cast())),
                    i32x4_dot_i16x8(wb, v128_load(xb.add(8).cast())),
                );
                let s1 = i32x4_add(
                    i32x4_dot_i16x8(wc, v128_load(xb.add(16).cast())),
                    i32x4_dot_i16x8(wd, v128_load(xb.add(24).cast())),
                );
                let x = *xd.get_unchecked(r * nb + b);
                add_block::<G16>(ar, s0, s1, wsp, b, x);
            }
        }
    }
    for (o, ar) in acc.iter_mut().zip(&a) {
        *o = hsum(*ar);
    }
}

/// See [`super::portable::dot_w4`]: each row's sum exactly as [`dot`] makes it for one
/// activation row.
#[allow(clippy::too_many_arguments)]
pub fn dot_w4(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    super::portable::check_w4(w, ws, xq, xd, k, ld, sld, t, g16);
    // SAFETY: the lengths were checked.
    unsafe { by_rows!(rows_w4, t, g16, (w, ws, xq, xd, k, ld, sld, out)) }
}

/// [`dot_w4`] for `R` rows, the accumulators in registers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_w4<const R: usize, const G16: bool>(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    out: &mut [f32; 4],
) {
    let nb = k / QK;
    let wld = sld;
    let mut a = [f32x4_splat(0.0); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for b in 0..nb {
        // SAFETY: b < nb and r < R ≤ t, within what `check_w4` checked; loads are unaligned.
        unsafe {
            let xb = xp.add(b * QK);
            let (x0, x1) = (v128_load(xb.cast()), v128_load(xb.add(8).cast()));
            let (x2, x3) = (v128_load(xb.add(16).cast()), v128_load(xb.add(24).cast()));
            let x = *xd.get_unchecked(b);
            for (r, ar) in a.iter_mut().enumerate() {
                let p = wp.add(r * ld + b * QK);
                let (w0, w1) = (v128_load(p.cast()), v128_load(p.add(16).cast()));
                let s0 = i32x4_add(
                    i32x4_dot_i16x8(i16x8_extend_low_i8x16(w0), x0),
                    i32x4_dot_i16x8(i16x8_extend_high_i8x16(w0), x1),
                );
                let s1 = i32x4_add(
                    i32x4_dot_i16x8(i16x8_extend_low_i8x16(w1), x2),
                    i32x4_dot_i16x8(i16x8_extend_high_i8x16(w1), x3),
                );
                let wsr = wsp.add(r * wld);
                add_block::<G16>(ar, s0, s1, wsr, b, x);
            }
        }
    }
    for (o, ar) in out.iter_mut().zip(&a) {
        *o = hsum(*ar);
    }
}

/// See [`super::portable::dot_u7`]: one `i32x4.relaxed_dot_i8x16_i7x16_add_s` per 16
/// products. The activations are the 7-bit operand, where the instruction is deterministic
/// and exact.
#[cfg(target_feature = "relaxed-simd")]
#[allow(clippy::too_many_arguments)]
pub fn dot_u7<S: super::scale::Scale>(
    w: &[i8],
    ws: &[S],
    xq: &[u8],
    k: usize,
    ld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    super::portable::check_u7(w, ws, xq, k, ld, t, g16);
    // SAFETY: the lengths were checked.
    unsafe { by_rows!(rows_u7, t, g16, [_], (w, ws, xq, k, ld, out)) }
}

/// [`dot_u7`] for `R` rows, the accumulators in registers.
#[cfg(target_feature = "relaxed-simd")]
#[inline(always)]
unsafe fn rows_u7<const R: usize, const G16: bool, S: super::scale::Scale>(
    w: &[i8],
    ws: &[S],
    xq: &[u8],
    k: usize,
    ld: usize,
    out: &mut [f32; 4],
) {
    let nb = k / QK;
    let wld = if G16 { ld / 16 } else { ld / QK };
    let zero = i32x4_splat(0);
    let mut a = [f32x4_splat(0.0); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for b in 0..nb {
        // SAFETY: b < nb and r < R ≤ t, within what `check_u7` checked; loads are unaligned.
        unsafe {
            let (x0, x1) = (
                v128_load(xp.add(b * QK).cast()),
                v128_load(xp.add(b * QK + 16).cast()),
            );
            for (r, ar) in a.iter_mut().enumerate() {
                let p = wp.add(r * ld + b * QK);
                let (w0, w1) = (v128_load(p.cast()), v128_load(p.add(16).cast()));
                let wsr = wsp.add(r * wld);
                if G16 {
                    let s0 = i32x4_relaxed_dot_i8x16_i7x16_add(w0, x0, zero);
                    let s1 = i32x4_relaxed_dot_i8x16_i7x16_add(w1, x1, zero);
                    let p0 = f32x4_mul(
                        f32x4_convert_i32x4(s0),
                        i32x4_splat((*wsr.add(2 * b)).bits() as i32),
                    );
                    let p1 = f32x4_mul(
                        f32x4_convert_i32x4(s1),
                        i32x4_splat((*wsr.add(2 * b + 1)).bits() as i32),
                    );
                    *ar = f32x4_add(*ar, f32x4_add(p0, p1));
                } else {
                    let s = i32x4_relaxed_dot_i8x16_i7x16_add(w0, x0, zero);
                    let s = f32x4_convert_i32x4(i32x4_relaxed_dot_i8x16_i7x16_add(w1, x1, s));
                    // Fused or not, as the browser lowers it: one rounding or two, either
                    // within the filter's bound (`top_k_filtered` allows two per block). One
                    // instruction fewer a block and row: Node, 6 alternating pairs, decode
                    // 49.4 → 50.5 tok/s at medians, 5 pairs of 6 quicker.
                    *ar = f32x4_relaxed_madd(s, i32x4_splat((*wsr.add(b)).bits() as i32), *ar);
                }
            }
        }
    }
    for (o, ar) in out.iter_mut().zip(&a) {
        *o = hsum(*ar) * S::BACK;
    }
}

/// See [`super::portable::row_stats`]: per 16 values, q² by `i32x4.dot_i16x8_s` on q widened
/// to 16 bits and Σq by two pairwise widening adds, then scaled in f32.
#[cfg(target_feature = "relaxed-simd")]
pub fn row_stats(q: &[i8], scales: &[f32], group: usize) -> (f32, f32) {
    assert!(
        q.len().is_multiple_of(16)
            && scales.len() * group >= q.len()
            && (group == 16 || group == QK)
    );
    let (mut a2, mut a1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    for h in 0..q.len() / 16 {
        // SAFETY: h < len / 16 (asserted); v128_load is unaligned.
        let v = unsafe { v128_load(q.as_ptr().add(h * 16).cast()) };
        let (lo, hi) = (i16x8_extend_low_i8x16(v), i16x8_extend_high_i8x16(v));
        let sq = i32x4_add(i32x4_dot_i16x8(lo, lo), i32x4_dot_i16x8(hi, hi));
        let sum = i32x4_extadd_pairwise_i16x8(i16x8_extadd_pairwise_i8x16(v));
        let sc = f32x4_splat(scales[h * 16 / group]);
        a2 = f32x4_add(a2, f32x4_mul(f32x4_convert_i32x4(sq), f32x4_mul(sc, sc)));
        a1 = f32x4_add(a1, f32x4_mul(f32x4_convert_i32x4(sum), sc));
    }
    (
        super::portable::norm_up(f64::from(hsum(a2)), q.len()),
        hsum(a1),
    )
}

/// See [`super::portable::quantize_block`]: the same scale and values, bit for bit. The
/// largest |x| is taken on the bits as integers, NaN lanes zeroed first (non-negative floats
/// order as their bits do): a float max (`f32x4_pmax`) became relaxed SIMD's max in the
/// relaxed build, whose NaN is the browser's choice, and gave NaN where `f32::max` skips it. The
/// rounding is `round_to_i16`'s (truncate, then one up or down by the exact remainder), its
/// step taken after the narrowing to 16 bits, with saturation: a step up happens only where
/// the truncation is ≥ 0 and one down only where it is ≤ 0, so that is the same clamp.
#[inline(always)]
pub fn quantize_block(xs: &[f32; QK], qs: &mut [i16; QK]) -> f32 {
    let x = xs.as_ptr().cast::<v128>();
    // SAFETY: eight 16-byte loads cover the 32 values; loads are unaligned.
    let v: [v128; 8] = std::array::from_fn(|i| unsafe { v128_load(x.add(i)) });
    let m = v.iter().fold(u32x4_splat(0), |m, &v| {
        u32x4_max(m, v128_and(f32x4_abs(v), f32x4_eq(v, v)))
    });
    let m = u32x4_max(m, i32x4_shuffle::<2, 3, 0, 1>(m, m));
    let m = u32x4_max(m, i32x4_shuffle::<1, 0, 3, 2>(m, m));
    let amax = f32::from_bits(u32x4_extract_lane::<0>(m));
    let scale = amax / 32767.0;
    let inv = f32x4_splat(if scale != 0.0 { 1.0 / scale } else { 0.0 });
    // (truncated, −1 where it goes up, −1 where it goes down) of 4 values.
    let round = |v: v128| {
        let t = f32x4_mul(v, inv);
        let ti = i32x4_trunc_sat_f32x4(t);
        let f = f32x4_sub(t, f32x4_convert_i32x4(ti));
        (
            ti,
            f32x4_ge(f, f32x4_splat(0.5)),
            f32x4_le(f, f32x4_splat(-0.5)),
        )
    };
    let q = qs.as_mut_ptr().cast::<v128>();
    for j in 0..4 {
        let (t0, u0, d0) = round(v[2 * j]);
        let (t1, u1, d1) = round(v[2 * j + 1]);
        let n = i16x8_narrow_i32x4(t0, t1);
        let r = i16x8_add_sat(
            i16x8_sub_sat(n, i16x8_narrow_i32x4(u0, u1)),
            i16x8_narrow_i32x4(d0, d1),
        );
        // SAFETY: j < 4: four 16-byte stores cover the 32 outputs; stores are unaligned.
        unsafe { v128_store(q.add(j), r) };
    }
    scale
}

/// See [`super::portable::unpack`]: a block's 32 values in two 16-byte stores.
#[inline(always)]
pub fn unpack(bytes: &[u8], out: &mut [i8], bias: i8) {
    let n = out.len() / QK;
    assert!(bytes.len() >= n * QK / 2);
    let (bp, op) = (bytes.as_ptr(), out.as_mut_ptr());
    let (low4, b) = (u8x16_splat(0x0F), i8x16_splat(bias));
    for i in 0..n {
        // SAFETY: block i is inside what was asserted; loads and stores are unaligned.
        unsafe {
            let nib = v128_load(bp.add(i * QK / 2).cast());
            let o = op.add(i * QK);
            v128_store(o.cast(), i8x16_sub(v128_and(nib, low4), b));
            v128_store(o.add(16).cast(), i8x16_sub(u8x16_shr(nib, 4), b));
        }
    }
}

/// See [`super::portable::dot_w4_nib`]: a block's 16 bytes widened straight to four 16-bit
/// vectors (zero-extended bytes, their low nibbles masked and their high ones shifted
/// down): the lanes [`dot_w4`] makes from the unpacked values, so the same sums.
#[allow(clippy::too_many_arguments)]
pub fn dot_w4_nib(
    w: &[u8],
    bias: i8,
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    super::portable::check_w4_nib(w, ws, xq, xd, k, ld, sld, t, g16);
    // SAFETY: the lengths were checked.
    unsafe {
        if bias == 0 {
            by_rows!(
                rows_w4_nib,
                t,
                g16,
                [false],
                (w, bias, ws, xq, xd, k, ld, sld, out)
            )
        } else {
            by_rows!(
                rows_w4_nib,
                t,
                g16,
                [true],
                (w, bias, ws, xq, xd, k, ld, sld, out)
            )
        }
    }
}

/// [`dot_w4_nib`] for `R` rows, the accumulators in registers; the bias subtracted when
/// `BIASED`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_w4_nib<const R: usize, const G16: bool, const BIASED: bool>(
    w: &[u8],
    bias: i8,
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    out: &mut [f32; 4],
) {
    let nb = k / QK;
    let wld = sld;
    let (low4, b) = (i16x8_splat(0x0F), i16x8_splat(bias.into()));
    let mut a = [f32x4_splat(0.0); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for blk in 0..nb {
        // SAFETY: blk < nb and r < R ≤ t, within what `check_w4_nib` checked; loads are
        // unaligned.
        unsafe {
            let xb = xp.add(blk * QK);
            let (x0, x1) = (v128_load(xb.cast()), v128_load(xb.add(8).cast()));
            let (x2, x3) = (v128_load(xb.add(16).cast()), v128_load(xb.add(24).cast()));
            let x = *xd.get_unchecked(blk);
            for (r, ar) in a.iter_mut().enumerate() {
                let nib = v128_load(wp.add((r * ld + blk * QK) / 2).cast());
                let (lo, hi) = (u16x8_extend_low_u8x16(nib), u16x8_extend_high_u8x16(nib));
                // Values 0..8, 8..16, 16..24, 24..32.
                let (mut wa, mut wb) = (v128_and(lo, low4), v128_and(hi, low4));
                let (mut wc, mut wd) = (u16x8_shr(lo, 4), u16x8_shr(hi, 4));
                if BIASED {
                    (wa, wb) = (i16x8_sub(wa, b), i16x8_sub(wb, b));
                    (wc, wd) = (i16x8_sub(wc, b), i16x8_sub(wd, b));
                }
                let s0 = i32x4_add(i32x4_dot_i16x8(wa, x0), i32x4_dot_i16x8(wb, x1));
                let s1 = i32x4_add(i32x4_dot_i16x8(wc, x2), i32x4_dot_i16x8(wd, x3));
                let wsr = wsp.add(r * wld);
                add_block::<G16>(ar, s0, s1, wsr, blk, x);
            }
        }
    }
    for (o, ar) in out.iter_mut().zip(&a) {
        *o = hsum(*ar);
    }
}

/// See [`super::portable::expand_codes`]: eight codes a 64-bit load (a block of Q4_K's), or
/// sixteen a 128-bit one (Q6_K's), widened to four lanes, converted and multiplied by the
/// unit's splat (the same product per value); the compiler leaves the scalar loop scalar,
/// four instructions a value where this takes about 1.2.
pub fn expand_codes(units: &[f32], codes: &[i8], per: usize, out: &mut [f32]) {
    let n = codes.len().min(out.len()) / per * per;
    if per != 8 && per != 16 || units.len() < n / per {
        return super::portable::expand_codes(units, codes, per, out);
    }
    let (cp, op) = (codes.as_ptr(), out.as_mut_ptr());
    // SAFETY: every block read and written lies below n, inside `codes` and `out`, and its
    // unit inside `units` (checked); loads and stores are unaligned.
    unsafe {
        let store = |o: *mut f32, w: v128, u: v128| {
            let lo = f32x4_convert_i32x4(i32x4_extend_low_i16x8(w));
            let hi = f32x4_convert_i32x4(i32x4_extend_high_i16x8(w));
            v128_store(o.cast(), f32x4_mul(lo, u));
            v128_store(o.add(4).cast(), f32x4_mul(hi, u));
        };
        for (b, &unit) in units[..n / per].iter().enumerate() {
            let (c, o, u) = (cp.add(b * per), op.add(b * per), f32x4_splat(unit));
            if per == 8 {
                let w = v128_load64_zero(c.cast());
                store(o, i16x8_extend_low_i8x16(w), u);
            } else {
                let w = v128_load(c.cast());
                store(o, i16x8_extend_low_i8x16(w), u);
                store(o.add(8), i16x8_extend_high_i8x16(w), u);
            }
        }
    }
}
