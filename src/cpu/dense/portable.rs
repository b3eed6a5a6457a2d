//! The dense kernel in plain Rust: the reference the SIMD kernels are tested against, and
//! the path where neither runs.

use super::tile::{Tile, TileI8, PANEL};

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

/// Rows of activations per int8 tile.
pub const MR_I8: usize = 2;

/// `t ≤ MR_I8` rows of 16-bit activations (stride `ldx`) times one int8 panel (4 weight rows,
/// 8 values of each, widened to i16) over `k` values (a multiple of 8): the exact sums.
pub fn tile_i8(t: usize, x: &[i16], ldx: usize, k: usize, panel: &[i16], out: &mut TileI8) {
    assert!((1..=MR_I8).contains(&t));
    tile_int::<8, _, _>(t, x, ldx, k, panel, out);
}

/// Rows of activations per `Narrow` int8 tile.
pub const MR_U7: usize = 2;

/// `t ≤ MR_U7` rows of 7-bit activations (stride `ldx`) times one int8 panel (4 weight rows,
/// 16 values of each per step, as stored) over `k` values (a multiple of 16): the exact sums.
pub fn tile_u7(t: usize, x: &[u8], ldx: usize, k: usize, panel: &[i8], out: &mut TileI8) {
    assert!((1..=MR_U7).contains(&t));
    tile_int::<16, _, _>(t, x, ldx, k, panel, out);
}

/// `t` rows of integer activations times one int8 panel whose 4 weight rows take `STEP`
/// values each per step, over `k` values (a multiple of `STEP`): the exact sums.
fn tile_int<const STEP: usize, X: Copy + Into<i32>, W: Copy + Into<i32>>(
    t: usize,
    x: &[X],
    ldx: usize,
    k: usize,
    panel: &[W],
    out: &mut TileI8,
) {
    use super::tile::I8_PANEL;
    assert!(k.is_multiple_of(STEP));
    for (i, o) in out.iter_mut().enumerate().take(t) {
        let xr = &x[i * ldx..i * ldx + k];
        *o = [0; I8_PANEL];
        for (xc, wc) in xr
            .chunks_exact(STEP)
            .zip(panel.chunks_exact(STEP * I8_PANEL))
        {
            for (or, wr) in o.iter_mut().zip(wc.chunks_exact(STEP)) {
                let s: i32 = xc
                    .iter()
                    .zip(wr)
                    .map(|(&a, &b)| a.into() * Into::<i32>::into(b))
                    .sum();
                *or += i64::from(s);
            }
        }
    }
}
