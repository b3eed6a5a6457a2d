//! The dense kernel with AVX2 and FMA (x86-64, detected at run time): 8 rows × one panel of
//! 8 columns, one `__m256` accumulator per row.

use super::tile::{Tile, TileI8, PANEL};
use crate::cpu::isa::Isa;
use std::arch::x86_64::*;

/// Rows per tile.
pub const MR: usize = 8;

/// Whether this CPU has the instructions (the CPU's one check: [`Isa::avx2`]).
fn available() -> bool {
    Isa::avx2()
}

/// `t ≤ MR` rows of `x` (stride `ldx`, `k` values each) times one panel (`k × 8`).
/// Call only when [`available`].
pub fn tile(t: usize, x: &[f32], ldx: usize, k: usize, panel: &[f32], out: &mut Tile) {
    assert!(available());
    assert!((1..=MR).contains(&t) && x.len() >= (t - 1) * ldx + k && panel.len() >= PANEL * k);
    // SAFETY: the CPU has AVX2 and FMA (asserted), and the assert above bounds every read:
    // rows r < t at r·ldx + kk < x.len(), the panel's 8 values at kk·8 < 8k ≤ panel.len().
    unsafe {
        let (x, p) = (x.as_ptr(), panel.as_ptr());
        match t {
            8 => rows::<8>(x, ldx, k, p, out),
            7 => rows::<7>(x, ldx, k, p, out),
            6 => rows::<6>(x, ldx, k, p, out),
            5 => rows::<5>(x, ldx, k, p, out),
            4 => rows::<4>(x, ldx, k, p, out),
            3 => rows::<3>(x, ldx, k, p, out),
            2 => rows::<2>(x, ldx, k, p, out),
            _ => rows::<1>(x, ldx, k, p, out),
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rows<const R: usize>(x: *const f32, ldx: usize, k: usize, p: *const f32, out: &mut Tile) {
    let mut acc = [_mm256_setzero_ps(); R];
    for kk in 0..k {
        let w = _mm256_loadu_ps(p.add(kk * PANEL));
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&*x.add(r * ldx + kk)), w, *a);
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        _mm256_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// Rows of activations per int8 tile.
pub const MR_I8: usize = 4;

/// `t ≤ MR_I8` rows of 16-bit activations (stride `ldx`) times one int8 panel (4 weight rows,
/// 8 values of each, widened to i16) over `k ≤ 2048` values (a multiple of 8): the exact sums.
/// The panel's 32 values fill two registers of 16 i16 (rows 0 and 1, rows 2 and 3); the
/// 8 activations, broadcast to both halves, meet them in `vpmaddwd`. Call only when
/// [`available`].
pub fn tile_i8(t: usize, x: &[i16], ldx: usize, k: usize, panel: &[i16], out: &mut TileI8) {
    use super::tile::I8_PANEL;
    assert!(available());
    assert!(
        (1..=MR_I8).contains(&t)
            && k.is_multiple_of(8)
            && x.len() >= (t - 1) * ldx + k
            && panel.len() >= I8_PANEL * k
    );
    // SAFETY: AVX2 is present (asserted); the assert above bounds every read: activation rows
    // r < t at r·ldx + 8c + 8 ≤ x.len(), the panel's 32 values at 32c + 32 ≤ 4k ≤ panel.len().
    unsafe {
        let (x, p) = (x.as_ptr(), panel.as_ptr());
        match t {
            4 => rows_i8::<4>(x, ldx, k, p, out),
            3 => rows_i8::<3>(x, ldx, k, p, out),
            2 => rows_i8::<2>(x, ldx, k, p, out),
            _ => rows_i8::<1>(x, ldx, k, p, out),
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rows_i8<const R: usize>(
    x: *const i16,
    ldx: usize,
    k: usize,
    p: *const i16,
    out: &mut TileI8,
) {
    let mut acc = [[_mm256_setzero_si256(); 2]; R];
    for c in 0..k / 8 {
        let w01 = _mm256_loadu_si256(p.add(c * 32) as *const __m256i);
        let w23 = _mm256_loadu_si256(p.add(c * 32 + 16) as *const __m256i);
        for (i, a) in acc.iter_mut().enumerate() {
            let xv = _mm_loadu_si128(x.add(i * ldx + c * 8) as *const __m128i);
            let xx = _mm256_broadcastsi128_si256(xv);
            a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(xx, w01));
            a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(xx, w23));
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        let mut lanes = [[0i32; 8]; 2];
        _mm256_storeu_si256(lanes[0].as_mut_ptr() as *mut __m256i, a[0]);
        _mm256_storeu_si256(lanes[1].as_mut_ptr() as *mut __m256i, a[1]);
        for (h, l) in lanes.iter().enumerate() {
            o[2 * h] = l[..4].iter().map(|&v| i64::from(v)).sum();
            o[2 * h + 1] = l[4..].iter().map(|&v| i64::from(v)).sum();
        }
    }
}
