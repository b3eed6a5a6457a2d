//! The dense kernel with AVX2 and FMA (x86-64, detected at run time): 8 rows × one panel of
//! 8 columns, one `__m256` accumulator per row.

use super::{Tile, PANEL};
use std::arch::x86_64::*;

/// Rows per tile.
pub const MR: usize = 8;

/// Whether this CPU has the instructions (std caches the answer).
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
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
