//! This build's int8 kernel for each operation, behind wrappers that take the portable
//! kernel's arguments, chosen by the CPU's one [`Isa`] (as the dense and ops families are): in
//! wasm the simd128 one (the 7-bit product and the row statistics only where the build has
//! relaxed SIMD); natively the AVX2 one where the operation has one and the CPU has AVX2;
//! else the portable one. Also whether this build has the fast 7-bit kernel the LM head's
//! filter needs ([`has_fast_u7`]). `check_kernels` (check.rs) compares each with the
//! portable kernel.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::packing::Packing;
use super::portable;
use super::scale::{Scale, QK};
#[cfg(target_arch = "wasm32")]
use super::wasm;
use crate::cpu::isa::Isa;

/// [`portable::expand_codes`] on this build's kernel.
#[inline(always)]
pub(super) fn expand_codes(units: &[f32], codes: &[i8], per: usize, out: &mut [f32]) {
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::expand_codes(units, codes, per, out),
        _ => portable::expand_codes(units, codes, per, out),
    }
}

/// [`portable::pack_fives`] on this build's kernel.
#[inline(always)]
pub(super) fn pack_fives(q: &[i8], out: &mut [u8]) {
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::pack_fives(q, out),
        _ => portable::pack_fives(q, out),
    }
}

/// [`portable::five_bits`] on this build's kernel.
#[inline(always)]
pub(super) fn five_bits(qh: u32, ql: &[u8; 16], q: &mut [i8; 32], centred: bool) {
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::five_bits(qh, ql, q, centred),
        _ => portable::five_bits(qh, ql, q, centred),
    }
}

/// [`portable::quantize_block`] on this build's kernel (a decode step quantizes ~80 000
/// values on the calling thread, between the pool's jobs).
#[inline(always)]
pub(super) fn quantize_block(xs: &[f32; QK], qs: &mut [i16; QK]) -> f32 {
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::quantize_block(xs, qs),
        _ => portable::quantize_block(xs, qs),
    }
}

/// [`portable::unpack`] (or [`portable::unpack_fives`]: one row) on this build's kernel.
#[inline(always)]
pub(super) fn unpack(bytes: &[u8], out: &mut [i8], p: Packing) {
    match (p, Isa::best()) {
        #[cfg(target_arch = "wasm32")]
        (Packing::Fives, Isa::Simd128 | Isa::RelaxedSimd) => wasm::unpack_fives(bytes, out),
        (Packing::Fives, _) => portable::unpack_fives(bytes, out),
        #[cfg(target_arch = "wasm32")]
        (Packing::Nibbles { bias }, Isa::Simd128 | Isa::RelaxedSimd) => {
            wasm::unpack(bytes, out, bias)
        }
        // SAFETY: the CPU has AVX2 (Isa::Avx2 is only chosen where it does).
        #[cfg(target_arch = "x86_64")]
        (Packing::Nibbles { bias }, Isa::Avx2) => unsafe { avx2::unpack(bytes, out, bias) },
        (Packing::Nibbles { bias }, _) => portable::unpack(bytes, out, bias),
    }
}

/// [`portable::dot_w5`] on this build's kernel; natively (where Q5_0 stays int8:
/// [`keeps_int8`](super::load::keeps_int8), so only the tests come here) the rows unpacked
/// for this build's [`dot_w4`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dot_w5(
    w: &[u8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    corr: &[i32],
    k: usize,
    apart: usize,
    t: usize,
    out: &mut [f32; 4],
) {
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::dot_w5(w, ws, xq, xd, corr, k, apart, t, out),
        _ => {
            portable::check_w5(w, ws, xq, xd, corr, k, apart, t);
            let unpack = |b: &[u8], q: &mut [i8]| unpack(b, q, Packing::Fives);
            portable::dot_w5_unpacked(w, ws, k, apart, t, out, unpack, |q, ws, acc| {
                dot_w4(q, ws, xq, xd, k, k, k / QK, 1, acc, false)
            })
        }
    }
}

/// [`portable::dot_w4_nib`] on this build's kernel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dot_w4_nib(
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
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => {
            wasm::dot_w4_nib(w, bias, ws, xq, xd, k, ld, sld, t, out, g16)
        }
        // SAFETY: the CPU has AVX2 (Isa::Avx2 is only chosen where it does).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_w4_nib(w, bias, ws, xq, xd, k, ld, sld, t, out, g16) },
        _ => portable::dot_w4_nib(w, bias, ws, xq, xd, k, ld, sld, t, out, g16),
    }
}

/// [`portable::dot`] on this build's kernel: simd128 in wasm, AVX2 where the CPU has it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dot(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    t: usize,
    acc: &mut [f32; 4],
    g16: bool,
) {
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::dot(w, ws, xq, xd, k, t, acc, g16),
        // SAFETY: the CPU has AVX2 (Isa::Avx2 is only chosen where it does).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot(w, ws, xq, xd, k, t, acc, g16) },
        _ => portable::dot(w, ws, xq, xd, k, t, acc, g16),
    }
}

/// [`portable::dot_w4`] on this build's kernel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dot_w4(
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
    match Isa::best() {
        #[cfg(target_arch = "wasm32")]
        Isa::Simd128 | Isa::RelaxedSimd => wasm::dot_w4(w, ws, xq, xd, k, ld, sld, t, out, g16),
        // SAFETY: the CPU has AVX2 (Isa::Avx2 is only chosen where it does).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_w4(w, ws, xq, xd, k, ld, sld, t, out, g16) },
        _ => portable::dot_w4(w, ws, xq, xd, k, ld, sld, t, out, g16),
    }
}

/// Whether this build has a 7-bit kernel faster than the 16-bit one, which the LM head's
/// filter needs to pay: relaxed SIMD in wasm, AVX2 natively.
pub fn has_fast_u7() -> bool {
    matches!(Isa::best(), Isa::RelaxedSimd | Isa::Avx2)
}

/// [`portable::row_stats`], vectorised with AVX2 where the CPU has it (the baseline x86-64
/// target widens int8 slowly).
pub(super) fn row_stats(q: &[i8], scales: &[f32], group: usize) -> (f32, f32) {
    match Isa::best() {
        #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
        Isa::RelaxedSimd => wasm::row_stats(q, scales, group),
        // SAFETY: the CPU has AVX2 (Isa::Avx2 is only chosen where it does).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::row_stats(q, scales, group) },
        _ => portable::row_stats(q, scales, group),
    }
}

/// [`portable::dot_u7`] on this build's kernel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dot_u7<S: Scale>(
    w: &[i8],
    ws: &[S],
    xq: &[u8],
    k: usize,
    ld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    match Isa::best() {
        #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
        Isa::RelaxedSimd => wasm::dot_u7(w, ws, xq, k, ld, t, out, g16),
        // SAFETY: the CPU has AVX2 (Isa::Avx2 is only chosen where it does).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::dot_u7(w, ws, xq, k, ld, t, out, g16) },
        _ => portable::dot_u7(w, ws, xq, k, ld, t, out, g16),
    }
}
