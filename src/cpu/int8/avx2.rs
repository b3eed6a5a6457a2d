//! The int8 kernels with AVX2: the exact product on 16-bit activations (`vpmaddwd`, the same
//! multiply-add as wasm's `dot_i16x8`) and the 7-bit product of the LM head's filter
//! (`vpmaddubsw`: unsigned 7-bit activations times signed weights, pairs below 2¹⁵, so it
//! never saturates).

use super::scale::QK;
use std::arch::x86_64::*;

/// See [`super::portable::dot`].
///
/// # Safety
/// The CPU must have AVX2.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub unsafe fn dot(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    t: usize,
    acc: &mut [f32; 4],
    g16: bool,
) {
    super::portable::check_dot(w, ws, xq, xd, k, t, g16);
    // SAFETY: the lengths were checked; AVX2 is the caller's promise.
    unsafe { by_rows!(rows_x, t, g16, (w, ws, xq, xd, k, acc)) }
}

/// [`dot`] for `R` activation rows, the accumulators in registers.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rows_x<const R: usize, const G16: bool>(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    acc: &mut [f32; 4],
) {
    let nb = k / QK;
    let mut a = [_mm256_setzero_ps(); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for b in 0..nb {
        // SAFETY: b < nb and r < R ≤ t, within what `dot` asserted; the loads are unaligned.
        unsafe {
            let p = wp.add(b * QK);
            let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast()));
            let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16).cast()));
            for (r, ar) in a.iter_mut().enumerate() {
                let xb = xp.add(r * k + b * QK);
                let s0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(xb.cast()));
                let s1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(xb.add(16).cast()));
                let x = *xd.get_unchecked(r * nb + b);
                add_block::<G16>(ar, s0, s1, wsp, b, x);
            }
        }
    }
    for (o, ar) in acc.iter_mut().zip(&a) {
        // SAFETY: AVX2 (this function's feature).
        *o = unsafe { hsum(*ar) };
    }
}

/// See [`super::portable::dot_w4`]: each row's sum exactly as [`dot`] makes it for one
/// activation row.
///
/// # Safety
/// The CPU must have AVX2.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub unsafe fn dot_w4(
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
    super::portable::check_w4(w, ws, xq, xd, k, ld, sld, t, g16);
    // SAFETY: the lengths were checked; AVX2 is the caller's promise.
    unsafe { by_rows!(rows_w4, t, g16, (w, ws, xq, xd, k, ld, sld, out)) }
}

/// [`dot_w4`] for `R` rows, the accumulators in registers.
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_w4<const R: usize, const G16: bool>(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    out: &mut [f32; 4],
) {
    let nb = k / QK;
    let wld = sld;
    let mut a = [_mm256_setzero_ps(); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for b in 0..nb {
        // SAFETY: b < nb and r < R ≤ t, within what `check_w4` checked; loads are unaligned.
        unsafe {
            let x0 = _mm256_loadu_si256(xp.add(b * QK).cast());
            let x1 = _mm256_loadu_si256(xp.add(b * QK + 16).cast());
            let x = *xd.get_unchecked(b);
            for (r, ar) in a.iter_mut().enumerate() {
                let p = wp.add(r * ld + b * QK);
                let s0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast())), x0);
                let s1 =
                    _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16).cast())), x1);
                let wsr = wsp.add(r * wld);
                add_block::<G16>(ar, s0, s1, wsr, b, x);
            }
        }
    }
    for (o, ar) in out.iter_mut().zip(&a) {
        // SAFETY: AVX2 (this function's feature).
        *o = unsafe { hsum(*ar) };
    }
}

/// See [`super::portable::dot_u7`]: a block of 32 is one register, one `vpmaddubsw` and
/// one `vpmaddwd` (against ones) where the 16-bit product needs two of each.
///
/// # Safety
/// The CPU must have AVX2.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub unsafe fn dot_u7<S: super::scale::Scale>(
    w: &[i8],
    ws: &[S],
    xq: &[u8],
    k: usize,
    ld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    super::portable::check_u7(w, ws, xq, k, ld, t, g16);
    // SAFETY: the lengths were checked; AVX2 is the caller's promise.
    unsafe { by_rows!(rows_u7, t, g16, [_], (w, ws, xq, k, ld, out)) }
}

/// [`dot_u7`] for `R` rows, the accumulators in registers.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rows_u7<const R: usize, const G16: bool, S: super::scale::Scale>(
    w: &[i8],
    ws: &[S],
    xq: &[u8],
    k: usize,
    ld: usize,
    out: &mut [f32; 4],
) {
    let nb = k / QK;
    let wld = if G16 { ld / 16 } else { ld / QK };
    let ones = _mm256_set1_epi16(1);
    let mut a = [_mm256_setzero_ps(); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for b in 0..nb {
        // SAFETY: b < nb and r < R ≤ t, within what `check_u7` checked; loads are unaligned.
        unsafe {
            let xv = _mm256_loadu_si256(xp.add(b * QK).cast());
            for (r, ar) in a.iter_mut().enumerate() {
                let wv = _mm256_loadu_si256(wp.add(r * ld + b * QK).cast());
                let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(xv, wv), ones));
                let wsr = wsp.add(r * wld);
                let scale = if G16 {
                    _mm256_set_m128(
                        _mm_castsi128_ps(_mm_set1_epi32((*wsr.add(2 * b + 1)).bits() as i32)),
                        _mm_castsi128_ps(_mm_set1_epi32((*wsr.add(2 * b)).bits() as i32)),
                    )
                } else {
                    _mm256_castsi256_ps(_mm256_set1_epi32((*wsr.add(b)).bits() as i32))
                };
                *ar = _mm256_add_ps(*ar, _mm256_mul_ps(s, scale));
            }
        }
    }
    for (o, ar) in out.iter_mut().zip(&a) {
        // SAFETY: AVX2 (this function's feature).
        *o = unsafe { hsum(*ar) } * S::BACK;
    }
}

/// See [`super::portable::row_stats`]: per 32 values, q² by `vpmaddwd` on q widened to 16
/// bits, Σq by `vpmaddubsw` with ones, then scaled in f32.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn row_stats(q: &[i8], scales: &[f32], group: usize) -> (f32, f32) {
    let nb = q.len() / QK;
    assert!(
        q.len().is_multiple_of(QK)
            && scales.len() * group >= q.len()
            && (group == 16 || group == QK)
    );
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let (mut a2, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in 0..nb {
        // SAFETY: b < nb and the lengths were asserted; the load is unaligned.
        unsafe {
            let v = _mm256_loadu_si256(q.as_ptr().add(b * QK).cast());
            let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
            let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(v));
            // Lanes 0–3 from values 0–15, as `sum`'s: one scale per half with 16-value groups.
            let sq = _mm256_hadd_epi32(_mm256_madd_epi16(lo, lo), _mm256_madd_epi16(hi, hi));
            let sq = _mm256_permute4x64_epi64::<0b11_01_10_00>(sq);
            let sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);
            let sc = if group == 16 {
                _mm256_set_m128(_mm_set1_ps(scales[2 * b + 1]), _mm_set1_ps(scales[2 * b]))
            } else {
                _mm256_set1_ps(scales[b])
            };
            a2 = _mm256_add_ps(
                a2,
                _mm256_mul_ps(_mm256_cvtepi32_ps(sq), _mm256_mul_ps(sc, sc)),
            );
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_cvtepi32_ps(sum), sc));
        }
    }
    // SAFETY: AVX2 (this function's feature).
    let (s2, s1) = unsafe { (hsum(a2), hsum(a1)) };
    (super::portable::norm_up(f64::from(s2), q.len()), s1)
}

/// One block's integer sums `s0` (its values 0..16) and `s1` (16..32) into `acc`, times the
/// weight scale(s) at `ws[b]` (`ws[2b]`, `ws[2b + 1]` with `G16`) and the activation scale
/// `x`: the exact kernels' one way of adding a block, so their sums agree bit for bit.
///
/// # Safety
/// The CPU must have AVX2; `ws` must hold the block's scales.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn add_block<const G16: bool>(
    acc: &mut __m256,
    s0: __m256i,
    s1: __m256i,
    ws: *const f32,
    b: usize,
    x: f32,
) {
    // SAFETY: the caller's promise.
    unsafe {
        if G16 {
            let p0 = _mm256_mul_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(*ws.add(2 * b) * x));
            let p1 = _mm256_mul_ps(
                _mm256_cvtepi32_ps(s1),
                _mm256_set1_ps(*ws.add(2 * b + 1) * x),
            );
            *acc = _mm256_add_ps(*acc, _mm256_add_ps(p0, p1));
        } else {
            let s = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(s, _mm256_set1_ps(*ws.add(b) * x)));
        }
    }
}

/// The 8 lanes' sum, in a fixed order.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: l has room for 8 f32.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

/// See [`super::portable::unpack`]: a block's 32 values in one 32-byte store (the low
/// nibbles in the low lane, the high ones in the high lane).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn unpack(bytes: &[u8], out: &mut [i8], bias: i8) {
    let n = out.len() / QK;
    assert!(bytes.len() >= n * QK / 2);
    let (bp, op) = (bytes.as_ptr(), out.as_mut_ptr());
    let (low4, b) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(bias));
    for i in 0..n {
        // SAFETY: block i is inside what was asserted; loads and stores are unaligned.
        unsafe {
            let nib = _mm_loadu_si128(bp.add(i * QK / 2).cast());
            let both = _mm256_set_m128i(_mm_srli_epi16(nib, 4), nib);
            let v = _mm256_sub_epi8(_mm256_and_si256(both, low4), b);
            _mm256_storeu_si256(op.add(i * QK).cast(), v);
        }
    }
}

/// See [`super::portable::dot_w4_nib`]: a block's 16 bytes as two vectors of 16 codes (low
/// nibbles: values 0..16, high ones: 16..32), widened as [`dot_w4`] widens the unpacked
/// values, so the same sums.
///
/// # Safety
/// The CPU must have AVX2.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub unsafe fn dot_w4_nib(
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
    super::portable::check_w4_nib(w, ws, xq, xd, k, ld, sld, t, g16);
    // SAFETY: the lengths were checked; AVX2 is the caller's promise.
    unsafe {
        if bias == 0 {
            by_rows!(
                rows_w4_nib,
                t,
                g16,
                [false],
                (w, bias, ws, xq, xd, k, ld, sld, out)
            )
        } else {
            by_rows!(
                rows_w4_nib,
                t,
                g16,
                [true],
                (w, bias, ws, xq, xd, k, ld, sld, out)
            )
        }
    }
}

/// [`dot_w4_nib`] for `R` rows, the accumulators in registers; the bias subtracted when
/// `BIASED`.
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_w4_nib<const R: usize, const G16: bool, const BIASED: bool>(
    w: &[u8],
    bias: i8,
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    out: &mut [f32; 4],
) {
    let nb = k / QK;
    let wld = sld;
    let (low4, b) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(bias));
    let mut a = [_mm256_setzero_ps(); R];
    let (wp, wsp, xp) = (w.as_ptr(), ws.as_ptr(), xq.as_ptr());
    for blk in 0..nb {
        // SAFETY: blk < nb and r < R ≤ t, within what `check_w4_nib` checked; loads are
        // unaligned.
        unsafe {
            let x0 = _mm256_loadu_si256(xp.add(blk * QK).cast());
            let x1 = _mm256_loadu_si256(xp.add(blk * QK + 16).cast());
            let x = *xd.get_unchecked(blk);
            for (r, ar) in a.iter_mut().enumerate() {
                let nib = _mm_loadu_si128(wp.add((r * ld + blk * QK) / 2).cast());
                let mut lo = _mm_and_si128(nib, low4);
                let mut hi = _mm_and_si128(_mm_srli_epi16(nib, 4), low4);
                if BIASED {
                    (lo, hi) = (_mm_sub_epi8(lo, b), _mm_sub_epi8(hi, b));
                }
                let s0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(lo), x0);
                let s1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(hi), x1);
                let wsr = wsp.add(r * wld);
                add_block::<G16>(ar, s0, s1, wsr, blk, x);
            }
        }
    }
    for (o, ar) in out.iter_mut().zip(&a) {
        // SAFETY: AVX2 (this function's feature).
        *o = unsafe { hsum(*ar) };
    }
}
