//! The dense kernel in plain Rust: the reference the SIMD kernels are tested against, and
//! the path where neither runs.

use super::{Tile, PANEL};

/// Rows per tile.
pub const MR: usize = 4;

/// `t ≤ MR` rows of `x` (stride `ldx`, `k` values each) times one panel (`k × 8`), each sum
/// in order of `k`.
pub fn tile(t: usize, x: &[f32], ldx: usize, k: usize, panel: &[f32], out: &mut Tile) {
    assert!((1..=MR).contains(&t));
    for (r, o) in out.iter_mut().enumerate().take(t) {
        let xr = &x[r * ldx..r * ldx + k];
        *o = [0.0; PANEL];
        for (&xv, w) in xr.iter().zip(panel.chunks_exact(PANEL)) {
            for (ol, &wl) in o.iter_mut().zip(w) {
                *ol += xv * wl;
            }
        }
    }
}
