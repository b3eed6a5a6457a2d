//! The dense kernel in wasm SIMD (simd128): 4 rows × one panel of 8 columns, two `v128`
//! accumulators per row. Wasm has no FMA without relaxed SIMD, so a multiply and an add; 8
//! accumulators, 2 weight vectors and a broadcast stay within the 16 registers V8 maps
//! v128 to on x86-64 (6 rows spill and run at half speed).

use super::tile::{Tile, TileI8, PANEL};
use core::arch::wasm32::*;

/// Rows per tile.
pub const MR: usize = 4;

/// `t ≤ MR` rows of `x` (stride `ldx`, `k` values each) times one panel (`k × 8`).
pub fn tile(t: usize, x: &[f32], ldx: usize, k: usize, panel: &[f32], out: &mut Tile) {
    assert!((1..=MR).contains(&t) && x.len() >= (t - 1) * ldx + k && panel.len() >= PANEL * k);
    // SAFETY: the assert bounds every read below: rows r < t at r·ldx + kk < x.len(), and the
    // panel's 8 values at kk·8 < 8k ≤ panel.len(). v128_load has no alignment requirement.
    unsafe {
        match t {
            4 => rows::<4>(x.as_ptr(), ldx, k, panel.as_ptr(), out),
            3 => rows::<3>(x.as_ptr(), ldx, k, panel.as_ptr(), out),
            2 => rows::<2>(x.as_ptr(), ldx, k, panel.as_ptr(), out),
            _ => rows::<1>(x.as_ptr(), ldx, k, panel.as_ptr(), out),
        }
    }
}

#[inline(always)]
unsafe fn rows<const R: usize>(x: *const f32, ldx: usize, k: usize, p: *const f32, out: &mut Tile) {
    let mut acc = [[f32x4_splat(0.0); 2]; R];
    for kk in 0..k {
        let w0 = v128_load(p.add(kk * PANEL) as *const v128);
        let w1 = v128_load(p.add(kk * PANEL + 4) as *const v128);
        for (r, a) in acc.iter_mut().enumerate() {
            let xr = v128_load32_splat(x.add(r * ldx + kk) as *const u32);
            a[0] = f32x4_add(a[0], f32x4_mul(xr, w0));
            a[1] = f32x4_add(a[1], f32x4_mul(xr, w1));
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        v128_store(o.as_mut_ptr() as *mut v128, a[0]);
        v128_store(o.as_mut_ptr().add(4) as *mut v128, a[1]);
    }
}

/// Rows of activations per int8 tile (times [`super::tile::I8_PANEL`] weight rows).
pub const MR_I8: usize = 2;

/// `t ≤ MR_I8` rows of 16-bit activations (stride `ldx`) times one int8 panel (4 weight rows,
/// 8 values of each per 64 bytes, widened to i16) over `k ≤ I8_KC` values (a multiple of 8): the exact sums
/// (each i32 lane holds k/4 products of at most 2¹⁵ · 2⁷, below 2³¹ for k ≤ 2048). Each 8 weights widen to i16 and meet 8 activations in one `i32x4.dot_i16x8_s`.
pub fn tile_i8(t: usize, x: &[i16], ldx: usize, k: usize, panel: &[i16], out: &mut TileI8) {
    let dot = |w, x, acc| i32x4_add(acc, i32x4_dot_i16x8(x, w));
    tile_int::<8, _, _>(t, MR_I8, x, ldx, k, panel, out, dot);
}

/// `t ≤ mr` rows (at most 2) of activations times one int8 panel through [`rows_int`], after
/// checking every bound its reads need.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile_int<const STEP: usize, X, W>(
    t: usize,
    mr: usize,
    x: &[X],
    ldx: usize,
    k: usize,
    panel: &[W],
    out: &mut TileI8,
    dot: impl Fn(v128, v128, v128) -> v128,
) {
    use super::tile::I8_PANEL;
    assert!(
        (1..=mr.min(2)).contains(&t)
            && STEP * size_of::<X>() == 16
            && STEP * size_of::<W>() == 16
            && k.is_multiple_of(STEP)
            && x.len() >= (t - 1) * ldx + k
            && panel.len() >= I8_PANEL * k
    );
    // SAFETY: the assert bounds every read: activation rows r < t at r·ldx + STEP·c + STEP ≤
    // x.len(), the panel's 4·STEP values at 4·STEP·c + 4·STEP ≤ 4k ≤ panel.len() (16 bytes a
    // load either way); v128_load needs no alignment.
    unsafe {
        match t {
            2 => rows_int::<2, STEP, _, _>(x.as_ptr(), ldx, k, panel.as_ptr(), out, dot),
            _ => rows_int::<1, STEP, _, _>(x.as_ptr(), ldx, k, panel.as_ptr(), out, dot),
        }
    }
}

/// `R` rows of activations (`X`, stride `ldx`) times one int8 panel: per step, `STEP`
/// values of each of its 4 weight rows (`W`, 16 bytes each) meet a row's next 16 bytes in
/// `dot(w, x, acc)`, four accumulators per row; each accumulator's lanes summed at the end.
#[inline(always)]
unsafe fn rows_int<const R: usize, const STEP: usize, X, W>(
    x: *const X,
    ldx: usize,
    k: usize,
    p: *const W,
    out: &mut TileI8,
    dot: impl Fn(v128, v128, v128) -> v128,
) {
    let mut acc = [[i32x4_splat(0); 4]; R];
    for c in 0..k / STEP {
        let w = [
            v128_load(p.add(c * 4 * STEP) as *const v128),
            v128_load(p.add((c * 4 + 1) * STEP) as *const v128),
            v128_load(p.add((c * 4 + 2) * STEP) as *const v128),
            v128_load(p.add((c * 4 + 3) * STEP) as *const v128),
        ];
        for (i, a) in acc.iter_mut().enumerate() {
            let xv = v128_load(x.add(i * ldx + c * STEP) as *const v128);
            for (ar, wr) in a.iter_mut().zip(&w) {
                *ar = dot(*wr, xv, *ar);
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        for (or, ar) in o.iter_mut().zip(a) {
            *or = i64::from(i32x4_extract_lane::<0>(*ar))
                + i64::from(i32x4_extract_lane::<1>(*ar))
                + i64::from(i32x4_extract_lane::<2>(*ar))
                + i64::from(i32x4_extract_lane::<3>(*ar));
        }
    }
}

/// Rows of activations per `Narrow` int8 tile (times [`super::tile::I8_PANEL`] weight rows).
#[cfg(target_feature = "relaxed-simd")]
pub const MR_U7: usize = 2;

/// `t ≤ MR_U7` rows of 7-bit activations (0..=127, stride `ldx`) times one int8 panel (4
/// weight rows, 16 values of each per 64 bytes, as stored) over `k ≤ I8_KC` values (a
/// multiple of 16): the exact sums. Each 16 weights meet 16 activations in one
/// `i32x4.relaxed_dot_i8x16_i7x16_add_s` (exact: the activations are its 7-bit operand).
#[cfg(target_feature = "relaxed-simd")]
pub fn tile_u7(t: usize, x: &[u8], ldx: usize, k: usize, panel: &[i8], out: &mut TileI8) {
    let dot = |w, x, acc| i32x4_relaxed_dot_i8x16_i7x16_add(w, x, acc);
    tile_int::<16, _, _>(t, MR_U7, x, ldx, k, panel, out, dot);
}
