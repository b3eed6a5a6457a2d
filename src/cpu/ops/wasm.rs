//! [`super::dots`]' eight lane sums with wasm simd128: two vectors of four.

use std::arch::wasm32::*;

/// The eight lane sums of each row of `a` with `b` (a multiple of 8 long; each row at
/// least as long).
#[inline(always)]
pub fn lanes8<const N: usize>(a: &[&[f32]; N], b: &[f32]) -> [[f32; 8]; N] {
    debug_assert!(b.len().is_multiple_of(8) && a.iter().all(|x| x.len() >= b.len()));
    let mut out = [[0f32; 8]; N];
    // SAFETY: every load is inside `b` or a row of `a` (as long); loads are unaligned.
    unsafe {
        let (mut lo, mut hi) = ([f32x4_splat(0.0); N], [f32x4_splat(0.0); N]);
        for c in (0..b.len()).step_by(8) {
            let y0 = v128_load(b.as_ptr().add(c).cast());
            let y1 = v128_load(b.as_ptr().add(c + 4).cast());
            for i in 0..N {
                let x = a[i].as_ptr().add(c);
                lo[i] = f32x4_add(lo[i], f32x4_mul(v128_load(x.cast()), y0));
                hi[i] = f32x4_add(hi[i], f32x4_mul(v128_load(x.add(4).cast()), y1));
            }
        }
        for i in 0..N {
            v128_store(out[i].as_mut_ptr().cast(), lo[i]);
            v128_store(out[i].as_mut_ptr().add(4).cast(), hi[i]);
        }
    }
    out
}
