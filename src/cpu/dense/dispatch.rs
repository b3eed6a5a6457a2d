//! Which dense kernel multiplies: this build's for the instruction set [`Isa`] names (wasm's
//! simd128, x86-64's AVX2 + FMA), or the portable reference for any other. The products
//! take the [`Isa`] (their `*_with` forms: the tests and the kernel check compare the two).

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::portable;
use super::tile::{Tile, TileI8};
#[cfg(target_arch = "wasm32")]
use super::wasm;
use crate::cpu::isa::Isa;

/// Rows per float tile.
pub fn mr(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::MR,
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::MR,
        _ => portable::MR,
    }
}

/// `t` rows of `x` times one float panel.
pub fn tile(isa: Isa, t: usize, x: &[f32], ldx: usize, k: usize, panel: &[f32], out: &mut Tile) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::tile(t, x, ldx, k, panel, out),
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::tile(t, x, ldx, k, panel, out),
        _ => portable::tile(t, x, ldx, k, panel, out),
    }
}

/// Rows per `Wide` int8 tile.
pub fn mr_i8(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::MR_I8,
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::MR_I8,
        _ => portable::MR_I8,
    }
}

/// The `Wide` int8 kernel: wasm's `i32x4.dot_i16x8_s`, AVX2's `vpmaddwd`, or the portable one.
pub fn tile_i8(
    isa: Isa,
    t: usize,
    x: &[i16],
    ldx: usize,
    k: usize,
    panel: &[i16],
    out: &mut TileI8,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::tile_i8(t, x, ldx, k, panel, out),
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::tile_i8(t, x, ldx, k, panel, out),
        _ => portable::tile_i8(t, x, ldx, k, panel, out),
    }
}

/// Rows per `Narrow` int8 tile.
pub fn mr_u7(isa: Isa) -> usize {
    match isa {
        #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
        Isa::RelaxedSimd => wasm::MR_U7,
        _ => portable::MR_U7,
    }
}

/// The `Narrow` int8 kernel: relaxed SIMD's `i32x4.relaxed_dot_i8x16_i7x16_add_s` in the
/// relaxed wasm builds, else the portable one.
pub fn tile_u7(isa: Isa, t: usize, x: &[u8], ldx: usize, k: usize, panel: &[i8], out: &mut TileI8) {
    match isa {
        #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
        Isa::RelaxedSimd => wasm::tile_u7(t, x, ldx, k, panel, out),
        _ => portable::tile_u7(t, x, ldx, k, panel, out),
    }
}
