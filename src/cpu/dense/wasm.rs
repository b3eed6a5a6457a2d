//! The dense kernel in wasm SIMD (simd128): 4 rows × one panel of 8 columns, two `v128`
//! accumulators per row. Wasm has no FMA without relaxed SIMD, so a multiply and an add; 8
//! accumulators, 2 weight vectors and a broadcast stay within the 16 registers V8 maps
//! v128 to on x86-64 (6 rows spill and run at half speed).

use super::{Tile, PANEL};
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
