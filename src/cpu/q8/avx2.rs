//! The 8-bit path's x86 kernels: a tile of `N` weight rows (the file's blocks, decoded in
//! registers) and `R` activation rows: several weight rows with four activation rows (a
//! prompt: each weight block decoded once for the four, each activation block loaded from
//! L2 once for the weight rows; a prompt's tail: one weight row with fewer), or four weight
//! rows with one (a decode step: four independent sums, the rows a quarter of the matrix
//! apart: four memory streams, which one core reads faster than one).
//!
//! Two builds of the same kernels ([`kernels!`]): AVX2, where `vpmaddubsw` multiplies
//! unsigned weight codes (or |w|) by signed activations in pairs and `vpmaddwd` sums the
//! pairs (times the sub-block scales for the K-quants); and AVX-512 VNNI on 256-bit
//! registers, where `vpdpbusd` and `vpdpwssd` do the same sums and add them in one
//! instruction. Pairs never saturate: |pair| ≤ 2·63·127 for Q4_K and Q6_K's unsigned codes,
//! and ≤ 2·128·127 only for Q8_0's |w| = 128, which a GGML Q8_0 block never holds (its codes
//! are −127 … 127).

use super::act::ActRow;
use super::kind::Kind;

/// Whether the CPU has AVX-512 VNNI (with VL and BW), for the second build.
pub fn has_vnni() -> bool {
    use std::sync::OnceLock;
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    })
}

/// `acc[i · t + r] = weight row i · rows[r]` for a tile of `n` weight rows (each `rb` bytes,
/// row i at `i · stride` in `w`) and `t` activation rows: 1 × 1 … 4, 4 × 1 or 4 × 4.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and every activation row must be a weight row's
/// width in `kind`'s activation blocks.
#[allow(clippy::too_many_arguments)]
pub unsafe fn dot_tile(
    kind: Kind,
    w: &[u8],
    rb: usize,
    stride: usize,
    n: usize,
    rows: &[ActRow; 4],
    t: usize,
    acc: &mut [f32; 16],
) {
    let nb = rb / kind.block_bytes();
    assert!(
        (n == 1 && (1..=4).contains(&t) || n == 4 && (t == 1 || t == 4))
            && stride >= rb
            && w.len() >= (n - 1) * stride + rb,
        "q8::dot_tile: a tile of {n} × {t}"
    );
    for r in rows.iter().take(t) {
        assert!(
            r.q.len() == nb * kind.block_len()
                && r.d.len() == nb * kind.block_len() / 32
                && (!kind.k_activations()
                    || r.bsums.len() == nb * 16 && r.steps.len() == nb * 8 && r.units.len() == nb),
            "q8::dot_tile: an activation row of another width"
        );
    }
    // SAFETY: the shapes were checked; AVX2, FMA and F16C are the caller's promise, VNNI
    // was detected.
    unsafe {
        if has_vnni() {
            vnni::tile(kind, w, rb, stride, n, rows, t, acc)
        } else {
            avx2::tile(kind, w, rb, stride, n, rows, t, acc)
        }
    }
}

/// The kernels for one instruction set: `$feat` the target features, `$dot4(acc, u8, i8)`
/// adding the sums of four products into i32 lanes, `$dot2(acc, i16, i16)` those of two,
/// `$high5(qh)` Q5_0's fifth bits as the bytes its values take from them (0xF0 where clear).
macro_rules! kernels {
    ($name:ident, $feat:literal, $dot4:ident, $dot2:ident, $high5:ident) => {
        mod $name {
            use super::super::act::ActRow;
            use super::super::kind::Kind;
            use std::arch::x86_64::*;

            /// See [`super::dot_tile`] (its checks done).
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn tile(
                kind: Kind,
                w: &[u8],
                rb: usize,
                stride: usize,
                n: usize,
                rows: &[ActRow; 4],
                t: usize,
                acc: &mut [f32; 16],
            ) {
                // SAFETY: the caller's checks (dot_tile).
                unsafe {
                    match (kind, n, t) {
                        (Kind::Q4K, 4, 1) => q4k::<4, 1>(w, rb, stride, rows, acc),
                        (Kind::Q4K, 4, _) => q4k::<4, 4>(w, rb, stride, rows, acc),
                        (Kind::Q4K, _, 1) => q4k::<1, 1>(w, rb, stride, rows, acc),
                        (Kind::Q4K, _, 2) => q4k::<1, 2>(w, rb, stride, rows, acc),
                        (Kind::Q4K, _, 3) => q4k::<1, 3>(w, rb, stride, rows, acc),
                        (Kind::Q4K, _, _) => q4k::<1, 4>(w, rb, stride, rows, acc),
                        (Kind::Q6K, 4, 1) => q6k::<4, 1>(w, rb, stride, rows, acc),
                        (Kind::Q6K, 4, _) => q6k::<4, 4>(w, rb, stride, rows, acc),
                        (Kind::Q6K, _, 1) => q6k::<1, 1>(w, rb, stride, rows, acc),
                        (Kind::Q6K, _, 2) => q6k::<1, 2>(w, rb, stride, rows, acc),
                        (Kind::Q6K, _, 3) => q6k::<1, 3>(w, rb, stride, rows, acc),
                        (Kind::Q6K, _, _) => q6k::<1, 4>(w, rb, stride, rows, acc),
                        (_, 4, 1) => q32::<4, 1>(kind, w, rb, stride, rows, acc),
                        (_, 4, _) => q32::<4, 4>(kind, w, rb, stride, rows, acc),
                        (_, _, 1) => q32::<1, 1>(kind, w, rb, stride, rows, acc),
                        (_, _, 2) => q32::<1, 2>(kind, w, rb, stride, rows, acc),
                        (_, _, 3) => q32::<1, 3>(kind, w, rb, stride, rows, acc),
                        (_, _, _) => q32::<1, 4>(kind, w, rb, stride, rows, acc),
                    }
                }
            }

            #[target_feature(enable = $feat)]
            #[inline]
            fn dot4(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
                super::$dot4(acc, a, b)
            }

            #[target_feature(enable = $feat)]
            #[inline]
            fn dot2(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
                super::$dot2(acc, a, b)
            }

            /// The two f16 at `p` (4 bytes), as f32. Both lanes are asked for: with one,
            /// LLVM loaded the half into whatever register was free (`vpinsrw` keeps the
            /// rest), the accumulator's, chaining each block to the previous block's sum.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn f16x2(p: *const u8) -> (f32, f32) {
                // SAFETY: the caller's block holds four bytes at p.
                let v = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
                    p.cast::<i32>().read_unaligned()
                }));
                (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
            }

            #[target_feature(enable = $feat)]
            #[inline]
            fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
            }

            /// The 32 nibbles at `q` as bytes: the low ones first (values 0 … 15), then the
            /// high.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn nibbles(q: *const u8, low: __m256i) -> __m256i {
                // SAFETY: the caller's block holds 16 bytes at q.
                let v = unsafe { _mm_loadu_si128(q.cast()) };
                _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low)
            }

            /// A mask that broadcasts i16 element `e` of each 128-bit lane.
            #[target_feature(enable = $feat)]
            #[inline]
            fn lane(e: usize) -> __m256i {
                _mm256_set1_epi16(i16::from_le_bytes([(2 * e) as u8, (2 * e + 1) as u8]))
            }

            /// A mask that spreads byte `i` over the low 8 bytes and byte `i + 1` over the
            /// high 8.
            #[target_feature(enable = $feat)]
            #[inline]
            fn pair(i: usize) -> __m128i {
                _mm_set_epi64x(
                    i64::from_le_bytes([(i + 1) as u8; 8]),
                    i64::from_le_bytes([i as u8; 8]),
                )
            }

            /// A 32-value block's signed values: Q8_0's bytes, Q4_0's nibbles − 8, Q5_0's
            /// five bits − 16 (the fifth bit clear: the value is n − 16 < 0, i.e. n | 0xF0).
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn values32(kind: Kind, p: *const u8, low: __m256i) -> __m256i {
                // SAFETY: the caller's block of `kind` is at p.
                unsafe {
                    match kind {
                        Kind::Q8_0 => _mm256_loadu_si256(p.add(2).cast()),
                        Kind::Q4_0 => _mm256_sub_epi8(nibbles(p.add(2), low), _mm256_set1_epi8(8)),
                        _ => {
                            let hi = super::$high5(p.add(2).cast::<u32>().read_unaligned());
                            _mm256_or_si256(nibbles(p.add(6), low), hi)
                        }
                    }
                }
            }

            /// Q4_0, Q5_0 and Q8_0 on `Q8_0` activations.
            #[target_feature(enable = $feat)]
            unsafe fn q32<const N: usize, const R: usize>(
                kind: Kind,
                w: &[u8],
                rb: usize,
                stride: usize,
                rows: &[ActRow; 4],
                acc: &mut [f32; 16],
            ) {
                let bb = kind.block_bytes();
                let nb = rb / bb;
                let mut a = [[_mm256_setzero_ps(); R]; N];
                let low = _mm256_set1_epi8(0xF);
                for b in 0..nb {
                    // SAFETY: block b lies inside each row of w; the activation rows hold nb
                    // blocks (dot_tile's check).
                    unsafe {
                        let mut xs = [_mm256_setzero_si256(); R];
                        for (r, x) in xs.iter_mut().enumerate() {
                            *x = _mm256_loadu_si256(rows[r].q.as_ptr().add(32 * b).cast());
                        }
                        for i in 0..N {
                            let p = w.as_ptr().add(i * stride + b * bb);
                            let v = values32(kind, p, low);
                            let av = _mm256_sign_epi8(v, v);
                            let (d, _) = f16x2(p);
                            for r in 0..R {
                                let s =
                                    dot4(_mm256_setzero_si256(), av, _mm256_sign_epi8(xs[r], v));
                                let d = _mm256_set1_ps(d * *rows[r].d.get_unchecked(b));
                                a[i][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), a[i][r]);
                            }
                        }
                    }
                }
                for i in 0..N {
                    for r in 0..R {
                        acc[i * R + r] = hsum(a[i][r]);
                    }
                }
            }

            /// Q4_K on the two-level grid: `D·(d·Σ_j (sc_j·s_j)·Σ q·x − dmin·Σ_j (m_j·s_j)·Σx_j)`,
            /// the products' scales `sc_j·s_j ≤ 63·127` in i16 lanes, sums in i32 (a lane takes
            /// at most 8 · 2 · 15 · 127 · 8001 < 2³¹ a block).
            #[target_feature(enable = $feat)]
            unsafe fn q4k<const N: usize, const R: usize>(
                w: &[u8],
                rb: usize,
                stride: usize,
                rows: &[ActRow; 4],
                acc: &mut [f32; 16],
            ) {
                const K1: u32 = 0x3f3f_3f3f;
                const K2: u32 = 0x0f0f_0f0f;
                const K3: u32 = 0x0303_0303;
                let nb = rb / 144;
                let mut a = [[_mm256_setzero_ps(); R]; N];
                let low = _mm256_set1_epi8(0xF);
                for b in 0..nb {
                    // SAFETY: block b lies inside each row of w; the activation rows hold nb
                    // blocks (dot_tile's check).
                    unsafe {
                        // Each activation row's unit, steps (both lanes) and sums of 32 codes.
                        let mut unit = [0f32; R];
                        let mut steps = [_mm256_setzero_si256(); R];
                        let mut sx = [_mm_setzero_si128(); R];
                        for r in 0..R {
                            unit[r] = *rows[r].units.get_unchecked(b);
                            steps[r] = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                rows[r].steps.as_ptr().add(8 * b).cast(),
                            ));
                            let bs = rows[r].bsums.as_ptr().add(16 * b);
                            sx[r] = _mm_hadd_epi16(
                                _mm_loadu_si128(bs.cast()),
                                _mm_loadu_si128(bs.add(8).cast()),
                            );
                        }
                        for i in 0..N {
                            let p = w.as_ptr().add(i * stride + b * 144);
                            let (d, dmin) = f16x2(p);
                            let s = p.add(4).cast::<u32>();
                            let (u0, u1, u2) = (
                                s.read_unaligned(),
                                s.add(1).read_unaligned(),
                                s.add(2).read_unaligned(),
                            );
                            // GGML's unpacking of the twelve scale bytes: sc0..7, then m0..7.
                            let u3 = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
                            let m_lo = u1 & K1;
                            let u1 = (u2 & K2) | (((u0 >> 6) & K3) << 4);
                            let u0 = u0 & K1;
                            let sm = _mm256_cvtepu8_epi16(_mm_set_epi32(
                                u3 as i32,
                                m_lo as i32,
                                u1 as i32,
                                u0 as i32,
                            ));
                            let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
                            let mn = _mm256_extracti128_si256(sm, 1);
                            let mut scs = [_mm256_setzero_si256(); R];
                            for r in 0..R {
                                scs[r] = _mm256_mullo_epi16(sc, steps[r]);
                                // − dmin · D · Σ_j (m_j·s_j)·Σx_j
                                let ms = _mm_mullo_epi16(mn, _mm256_castsi256_si128(steps[r]));
                                let m = _mm_cvtepi32_ps(_mm_madd_epi16(ms, sx[r]));
                                let m = _mm256_zextps128_ps256(m);
                                a[i][r] =
                                    _mm256_fnmadd_ps(_mm256_set1_ps(dmin * unit[r]), m, a[i][r]);
                            }
                            let mut sumi = [_mm256_setzero_si256(); R];
                            for c in 0..4 {
                                let q4 = _mm256_loadu_si256(p.add(16 + 32 * c).cast());
                                let lo = _mm256_and_si256(q4, low);
                                let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low);
                                for r in 0..R {
                                    let x = rows[r].q.as_ptr().add(256 * b + 64 * c);
                                    let s_lo = _mm256_shuffle_epi8(scs[r], lane(2 * c));
                                    let s_hi = _mm256_shuffle_epi8(scs[r], lane(2 * c + 1));
                                    let si = dot2(
                                        sumi[r],
                                        _mm256_maddubs_epi16(lo, _mm256_loadu_si256(x.cast())),
                                        s_lo,
                                    );
                                    sumi[r] = dot2(
                                        si,
                                        _mm256_maddubs_epi16(
                                            hi,
                                            _mm256_loadu_si256(x.add(32).cast()),
                                        ),
                                        s_hi,
                                    );
                                }
                            }
                            for r in 0..R {
                                a[i][r] = _mm256_fmadd_ps(
                                    _mm256_set1_ps(d * unit[r]),
                                    _mm256_cvtepi32_ps(sumi[r]),
                                    a[i][r],
                                );
                            }
                        }
                    }
                }
                for i in 0..N {
                    for r in 0..R {
                        acc[i * R + r] = hsum(a[i][r]);
                    }
                }
            }

            /// Q6_K on the two-level grid: `D·d·Σ_j (sc_j·s_(j/2))·Σ q·x` over its sub-blocks of
            /// 16, the codes unsigned (0 … 63) in the products and the 32 they exceed the values
            /// by taken off through the activation sums. A lane takes at most
            /// 4 · 2 · 63 · 127 · 2 · 128 · 127 < 2³¹ a half block, which is summed in f32.
            #[target_feature(enable = $feat)]
            unsafe fn q6k<const N: usize, const R: usize>(
                w: &[u8],
                rb: usize,
                stride: usize,
                rows: &[ActRow; 4],
                acc: &mut [f32; 16],
            ) {
                let nb = rb / 210;
                let mut a = [[_mm256_setzero_ps(); R]; N];
                let (m4, m2) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
                for b in 0..nb {
                    // SAFETY: block b lies inside each row of w; the activation rows hold nb
                    // blocks (dot_tile's check).
                    unsafe {
                        let mut unit = [0f32; R];
                        // Each 32 values' step in both i16 halves of its i32 lane: the steps of
                        // the 16 sub-blocks of 16, in order.
                        let mut pairs = [_mm256_setzero_si256(); R];
                        for r in 0..R {
                            unit[r] = *rows[r].units.get_unchecked(b);
                            let s = _mm256_cvtepu16_epi32(_mm_loadu_si128(
                                rows[r].steps.as_ptr().add(8 * b).cast(),
                            ));
                            pairs[r] = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
                        }
                        for i in 0..N {
                            let p = w.as_ptr().add(i * stride + b * 210);
                            let (_, d) = f16x2(p.add(206));
                            let sc8 = _mm_loadu_si128(p.add(192).cast());
                            let sc16 = _mm256_cvtepi8_epi16(sc8);
                            for r in 0..R {
                                // − 32 · D · d · Σ_j (sc_j·s_(j/2))·Σx_j
                                let bs =
                                    _mm256_loadu_si256(rows[r].bsums.as_ptr().add(16 * b).cast());
                                let m = _mm256_madd_epi16(_mm256_mullo_epi16(sc16, pairs[r]), bs);
                                a[i][r] = _mm256_fnmadd_ps(
                                    _mm256_set1_ps(32.0 * d * unit[r]),
                                    _mm256_cvtepi32_ps(m),
                                    a[i][r],
                                );
                            }
                            for h in 0..2 {
                                let ql0 = _mm256_loadu_si256(p.add(64 * h).cast());
                                let ql1 = _mm256_loadu_si256(p.add(64 * h + 32).cast());
                                let qh = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
                                let q = [
                                    _mm256_or_si256(
                                        _mm256_and_si256(ql0, m4),
                                        _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                                    ),
                                    _mm256_or_si256(
                                        _mm256_and_si256(ql1, m4),
                                        _mm256_slli_epi16(
                                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                                            4,
                                        ),
                                    ),
                                    _mm256_or_si256(
                                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                        _mm256_slli_epi16(
                                            _mm256_and_si256(_mm256_srli_epi16(qh, 4), m2),
                                            4,
                                        ),
                                    ),
                                    _mm256_or_si256(
                                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                        _mm256_slli_epi16(
                                            _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2),
                                            4,
                                        ),
                                    ),
                                ];
                                let mut sumi = [_mm256_setzero_si256(); R];
                                for (k, qk) in q.iter().enumerate() {
                                    let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                                        sc8,
                                        pair(8 * h + 2 * k),
                                    ));
                                    for r in 0..R {
                                        let step = _mm256_set1_epi16(
                                            *rows[r].steps.get_unchecked(8 * b + 4 * h + k),
                                        );
                                        let x = rows[r].q.as_ptr().add(256 * b + 128 * h + 32 * k);
                                        let pr =
                                            _mm256_maddubs_epi16(*qk, _mm256_loadu_si256(x.cast()));
                                        sumi[r] = dot2(sumi[r], pr, _mm256_mullo_epi16(s, step));
                                    }
                                }
                                for r in 0..R {
                                    a[i][r] = _mm256_fmadd_ps(
                                        _mm256_set1_ps(d * unit[r]),
                                        _mm256_cvtepi32_ps(sumi[r]),
                                        a[i][r],
                                    );
                                }
                            }
                        }
                    }
                }
                for i in 0..N {
                    for r in 0..R {
                        acc[i * R + r] = hsum(a[i][r]);
                    }
                }
            }
        }
    };
}

use std::arch::x86_64::*;

#[inline(always)]
fn avx2_dot4(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: called only inside the AVX2 kernels (target features avx2).
    unsafe {
        _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)),
        )
    }
}

#[inline(always)]
fn avx2_dot2(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: called only inside the AVX2 kernels.
    unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
}

#[inline(always)]
fn vnni_dot4(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: called only inside the VNNI kernels (target features avx512vnni, avx512vl).
    unsafe { _mm256_dpbusd_epi32(acc, a, b) }
}

#[inline(always)]
fn vnni_dot2(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: called only inside the VNNI kernels.
    unsafe { _mm256_dpwssd_epi32(acc, a, b) }
}

/// Q5_0's fifth bits (GGML's bit plane `bits`, bit i for value i) as the high bits of its
/// centred values: 0xF0 in byte i where bit i is clear (the value is n − 16 < 0), else 0.
/// AVX2 spreads each byte of the plane over eight lanes and compares.
#[inline(always)]
fn avx2_high5(bits: u32) -> __m256i {
    // SAFETY: called only inside the AVX2 kernels.
    unsafe {
        let shuf = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        let set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
        _mm256_andnot_si256(set, _mm256_set1_epi8(0xF0u8 as i8))
    }
}

/// [`avx2_high5`] as one masked move: the plane is the mask (AVX-512BW's byte masks). The
/// Q5_0 decode product went only from 17.2 to 18.3 GMAC/s on one thread (8192 × 2048, q8's
/// `speed`; the exact path's int8 rows: 28): the bit plane was not what held it back.
#[inline(always)]
fn vnni_high5(bits: u32) -> __m256i {
    // SAFETY: called only inside the VNNI kernels (target features avx512bw, avx512vl).
    unsafe { _mm256_maskz_set1_epi8(!bits, 0xF0u8 as i8) }
}

kernels!(avx2, "avx2,fma,f16c", avx2_dot4, avx2_dot2, avx2_high5);
kernels!(
    vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    vnni_dot4,
    vnni_dot2,
    vnni_high5
);
