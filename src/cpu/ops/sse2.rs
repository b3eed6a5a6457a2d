//! [`super::dots`]' eight lane sums with SSE2, which every x86-64 has: two vectors of four.

use std::arch::x86_64::*;

/// The eight lane sums of each row of `a` with `b` (a multiple of 8 long; each row at
/// least as long).
#[inline(always)]
pub fn lanes8<const N: usize>(a: &[&[f32]; N], b: &[f32]) -> [[f32; 8]; N] {
    debug_assert!(b.len().is_multiple_of(8) && a.iter().all(|x| x.len() >= b.len()));
    let mut out = [[0f32; 8]; N];
    // SAFETY: SSE2 is part of x86-64; every load is inside `b` or a row of `a` (as long).
    unsafe {
        let (mut lo, mut hi) = ([_mm_setzero_ps(); N], [_mm_setzero_ps(); N]);
        for c in (0..b.len()).step_by(8) {
            let y0 = _mm_loadu_ps(b.as_ptr().add(c));
            let y1 = _mm_loadu_ps(b.as_ptr().add(c + 4));
            for i in 0..N {
                let x = a[i].as_ptr().add(c);
                lo[i] = _mm_add_ps(lo[i], _mm_mul_ps(_mm_loadu_ps(x), y0));
                hi[i] = _mm_add_ps(hi[i], _mm_mul_ps(_mm_loadu_ps(x.add(4)), y1));
            }
        }
        for i in 0..N {
            _mm_storeu_ps(out[i].as_mut_ptr(), lo[i]);
            _mm_storeu_ps(out[i].as_mut_ptr().add(4), hi[i]);
        }
    }
    out
}
