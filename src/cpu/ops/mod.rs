//! Element-wise kernels of the CPU backend. Loops keep 8 independent accumulators so LLVM
//! vectorises them (SSE/AVX natively, simd128 in wasm) without reassociating floats; the dot
//! product has them written out, one file per instruction set (`sse2.rs`, `wasm.rs`,
//! `portable.rs`), each held to the portable one bit for bit ([`check_kernels`]).

mod portable;
#[cfg(target_arch = "x86_64")]
mod sse2;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm;

/// Dot product with 8 lanes: lane `l` sums `a[i] · b[i]` for `i ≡ l (mod 8)` in order, the
/// lanes then added as `((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))` and the remainder after
/// them, one product at a time ([`dot_reference`], in the tests). `a` and `b` are as long.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dots([a], b)[0]
}

/// [`dot`] of each of the rows `a` with `b` (all as long as `b`), bit for bit, the rows'
/// sums interleaved. The eight lanes are two vectors of four written out (SSE2, which every
/// x86-64 has, or simd128): LLVM vectorised the scalar loop with shuffles between the
/// lanes, at half the rate.
#[inline]
pub fn dots<const N: usize>(a: [&[f32]; N], b: &[f32]) -> [f32; N] {
    dots_with(a, b, lanes8)
}

/// [`dots`] on `lanes`' eight lane sums (this build's, or the portable ones).
#[inline(always)]
fn dots_with<const N: usize>(
    a: [&[f32]; N],
    b: &[f32],
    lanes: impl Fn(&[&[f32]; N], &[f32]) -> [[f32; 8]; N],
) -> [f32; N] {
    assert!(a.iter().all(|x| x.len() == b.len()), "dots: lengths differ");
    let m = b.len() / 8 * 8;
    let lanes = lanes(&a, &b[..m]);
    let mut out = [0f32; N];
    for ((o, acc), x) in out.iter_mut().zip(&lanes).zip(&a) {
        let mut s = fold_lanes(acc);
        for (x, y) in x[m..].iter().zip(&b[m..]) {
            s += x * y;
        }
        *o = s;
    }
    out
}

/// Eight lane sums added as `((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))`: [`dots`]' and
/// [`sum`]'s order.
#[inline(always)]
fn fold_lanes(acc: &[f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The sum of `x` in eight lanes as [`dots`] adds its products (lane `l` sums `x[i]` for
/// `i ≡ l (mod 8)` in order, the lanes folded, then the remainder one at a time): a sum one
/// value after another waits ~4 cycles on each add; these vectorise.
#[inline]
pub fn sum(x: &[f32]) -> f32 {
    let whole = x.len() / 8 * 8;
    let mut lanes = [0f32; 8];
    for c in x[..whole].chunks_exact(8) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    x[whole..].iter().fold(fold_lanes(&lanes), |s, &v| s + v)
}

/// This build's eight lane sums: the instruction set's file where every build of the target
/// has it (SSE2 is part of x86-64, simd128 of every kerze wasm build: no run-time check, so
/// no [`super::Isa`] needed here), else the portable one.
#[inline(always)]
fn lanes8<const N: usize>(a: &[&[f32]; N], b: &[f32]) -> [[f32; 8]; N] {
    #[cfg(target_arch = "x86_64")]
    return sse2::lanes8(a, b);
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return wasm::lanes8(a, b);
    #[allow(unreachable_code)]
    portable::lanes8(a, b)
}

/// This build's [`dots`] against the portable one, bit for bit, on random rows of lengths
/// with and without a remainder of eight, one row and four: the number of outputs compared,
/// or what differed. Part of [`super::check_kernels`], which the package runs in the browser.
pub fn check_kernels() -> Result<usize, String> {
    let mut rng = crate::rng::Rng::new(3);
    let mut compared = 0;
    for n in [0, 1, 7, 8, 13, 64, 256, 261] {
        let rows: Vec<Vec<f32>> = (0..4)
            .map(|_| (0..n).map(|_| rng.spread() * 3.0).collect())
            .collect();
        let b: Vec<f32> = (0..n).map(|_| rng.spread()).collect();
        let a = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
        let (got, want) = (dots(a, &b), dots_with(a, &b, portable::lanes8));
        let (one, one_want) = (dots([a[2]], &b), dots_with([a[2]], &b, portable::lanes8));
        for (i, (g, w)) in got
            .iter()
            .chain(&one)
            .zip(want.iter().chain(&one_want))
            .enumerate()
        {
            if g.to_bits() != w.to_bits() {
                return Err(format!(
                    "dots of {n} values, output {i}: simd {g}, portable {w}"
                ));
            }
        }
        compared += 5;
    }
    Ok(compared)
}

/// Each row of `x`, weighed, into each of the `m` rows of `y` (one after another), the rows
/// of `x` in order: `y[i] += w[k·m + i] · x[k]` for k = 0, 1, … (`x` holds its rows one
/// after another, each as long as a row of `y`), each term a product and then a sum, so
/// every value is the one that adding the rows one at a time gives, bit for bit. Eight
/// values of up to four outputs stay in registers over the rows instead of being loaded and
/// stored once a row: attention's weighted sum of values, where those loads and stores were
/// a third of the time.
#[inline]
pub fn axpys(y: &mut [f32], m: usize, w: &[f32], x: &[f32]) {
    if m == 0 {
        return;
    }
    let n = y.len() / m;
    let rows = w.len() / m;
    assert!(
        y.len() == m * n && w.len() == rows * m && x.len() == rows * n,
        "axpys: shapes differ"
    );
    if n == 0 {
        return;
    }
    let mut i = 0;
    while i < m {
        let y = &mut y[i * n..];
        let take = match m - i {
            4.. => axpys_tile::<4>(y, n, w, m, i, x),
            2 | 3 => axpys_tile::<2>(y, n, w, m, i, x),
            _ => axpys_tile::<1>(y, n, w, m, i, x),
        };
        i += take;
    }
}

/// [`axpys`] into the first `M` rows of `y` (each `n` values), the outputs `i0..i0 + M` of
/// the weights' rows of `m`; returns `M`.
#[inline(always)]
fn axpys_tile<const M: usize>(
    y: &mut [f32],
    n: usize,
    w: &[f32],
    m: usize,
    i0: usize,
    x: &[f32],
) -> usize {
    const ROWS: usize = 16;
    let whole = n / 8 * 8;
    // ROWS rows at a time, each weight set out four times (a vector to multiply by, not a
    // broadcast at every eight values).
    let mut splat = [[[0f32; 4]; M]; ROWS];
    for (x, w) in x.chunks(ROWS * n).zip(w.chunks(ROWS * m)) {
        let c = x.len() / n;
        for (s, w) in splat.iter_mut().zip(w.chunks_exact(m)) {
            *s = std::array::from_fn(|i| [w[i0 + i]; 4]);
        }
        for d in (0..whole).step_by(8) {
            let mut acc = [[0f32; 8]; M];
            for (a, y) in acc.iter_mut().zip(y.chunks_exact(n)) {
                a.copy_from_slice(&y[d..d + 8]);
            }
            for (x, w) in x.chunks_exact(n).zip(&splat[..c]) {
                let x = &x[d..d + 8];
                for (a, wi) in acc.iter_mut().zip(w) {
                    for l in 0..8 {
                        a[l] += wi[l % 4] * x[l];
                    }
                }
            }
            for (a, y) in acc.iter().zip(y.chunks_exact_mut(n)) {
                y[d..d + 8].copy_from_slice(a);
            }
        }
        for d in whole..n {
            for (i, y) in y.chunks_exact_mut(n).take(M).enumerate() {
                for (x, w) in x.chunks_exact(n).zip(w.chunks_exact(m)) {
                    y[d] += w[i0 + i] * x[d];
                }
            }
        }
    }
    M
}

/// An f16's value × 2⁻¹¹², exactly, for every finite f16, normal or subnormal: its sign
/// extended and its exponent and mantissa shifted into an f32's places, with the three bits
/// above its exponent cleared (two integer operations; the f16's exponent bias is the f32's
/// less 112). Times [`F16_UNSCALE`] it is the f16's value.
#[inline(always)]
pub fn f16_scaled(h: u16) -> f32 {
    f32::from_bits(((h as i16 as i32) << 13) as u32 & 0x8FFF_E000)
}

/// 2¹¹²: [`f16_scaled`] times this is the f16's value.
pub const F16_UNSCALE: f32 = f32::from_bits(0x7780_0000);

/// A finite f16 as f32.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    f16_scaled(h) * F16_UNSCALE
}

/// `x` rounded to the nearest f16 (ties to even), beyond its range the largest finite one of
/// the same sign, never an infinity (a NaN stays one, which [`f16_to_f32`] does not read).
/// Branch-free, so that a row of them vectorises (`half` calls out natively and branches in
/// wasm): a normal f16 rounds by adding half an f16 unit less one (plus the odd bit) below
/// the 13 bits it drops; a subnormal one by adding 0.5, whose unit is the f16's 2⁻²⁴.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.clamp(-65504.0, 65504.0).to_bits();
    let sign = (bits >> 16) & 0x8000;
    let a = bits & 0x7FFF_FFFF;
    let normal = (a.wrapping_add(0xC800_0FFF) + ((a >> 13) & 1)) >> 13;
    let subnormal = (f32::from_bits(a) + 0.5)
        .to_bits()
        .wrapping_sub(0x3F00_0000);
    let h = if a > 0x7F80_0000 {
        0x7E00
    } else if a < 0x3880_0000 {
        subnormal
    } else {
        normal
    };
    (h | sign) as u16
}

pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// RMS norm of every group of `w.len()` values, times `w`.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    for g in x.chunks_exact_mut(w.len()) {
        let ss = dot(g, g) / w.len() as f32;
        let r = 1.0 / (ss + eps).sqrt();
        for (v, wi) in g.iter_mut().zip(w) {
            *v = *v * r * wi;
        }
    }
}

/// GELU, tanh approximation (as Gemma and llama.cpp use): `x/2 · (1 + tanh u)`, computed as
/// `x · σ(2u) = x / (1 + e^−2u)`, the same function without `1 + tanh u`'s cancellation
/// for negative x, and through [`exp_approx`] so that a row of it vectorises (libm's tanh
/// is a call per value: 6% of a decode step).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/π)
    x / (1.0 + exp_approx(-2.0 * (C * (x + 0.044_715 * x * x * x))))
}

/// LayerNorm of one row: `(x − mean) / sqrt(var + eps) · w + b`, the sums in f64.
pub fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let inv = 1.0 / (var + f64::from(eps)).sqrt();
    for ((v, &wi), &bi) in x.iter_mut().zip(w).zip(b) {
        *v = ((f64::from(*v) - mean) * inv) as f32 * wi + bi;
    }
}

/// GELU in its exact form, `x · Φ(x) = x/2 · (1 + erf(x/√2))` (BERT).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// erf to about 2e-7 absolute (Abramowitz & Stegun 7.1.26): below f32's resolution of the
/// `1 + erf` it feeds.
#[inline]
pub fn erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    let y = 1.0 - poly * exp_approx(-x * x);
    y.copysign(x)
}

/// `e^x` to 2 ulps for x in [−87, 88] (below, e^−87; above, e^88), without branches or
/// calls, so a loop over a slice vectorises (wasm has no exp instruction, and libm's is a
/// call per value). Cody–Waite reduction to `r` in [−ln 2/2, ln 2/2], a degree-6 polynomial
/// (Cephes' expf coefficients), then 2ⁿ through the exponent bits. The encoder's softmax and
/// GELU and the decoders' attention softmax and GELU (tanh form) use it; SiLU keeps
/// `f32::exp` (natively no faster through this).
#[inline]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer in f32.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_65;
    let p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// SiLU, `x·σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// cos/sin of each pair's angle (`theta[i]` per position) at each of `pos`, in f64 then
/// rounded: `pos.len()` rows of `theta.len()`.
pub fn rope_table(pos: &[usize], theta: &[f64]) -> Vec<(f32, f32)> {
    let mut cs = Vec::with_capacity(pos.len() * theta.len());
    for &p in pos {
        for f in theta {
            let (s, c) = (p as f64 * f).sin_cos();
            cs.push((c as f32, s as f32));
        }
    }
    cs
}

/// Rotary embedding of each `rope.head_dim` group of every row (NeoX or normal pairs), row
/// `t` turned by row `t` of `cs` ([`rope_table`] of the rows' positions).
pub fn rope(x: &mut [f32], width: usize, cs: &[(f32, f32)], rope: &crate::backend::Rope) {
    let (head_dim, half) = (rope.head_dim, rope.head_dim / 2);
    for (row, cs) in x.chunks_exact_mut(width).zip(cs.chunks_exact(half)) {
        for h in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if rope.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * c - x1 * s;
                h[b] = x0 * s + x1 * c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite f16 reads as `half` reads it; f32 → f16 rounds as `half` does within
    /// range (every f16's neighbourhood and ties, a stride through all floats) and gives the
    /// largest finite f16 beyond it; a NaN stays a NaN.
    #[test]
    fn f16_conversions_agree_with_half() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h);
            if want.is_finite() {
                assert_eq!(f16_to_f32(h).to_bits(), want.to_f32().to_bits(), "{h:#06x}");
                // Its neighbours in f32 and the ties halfway to the next f16.
                let b = want.to_f32().to_bits();
                for x in (b.saturating_sub(2)..=b.saturating_add(2)).chain([b + 0x1000, b | 0xFFF])
                {
                    let x = f32::from_bits(x);
                    if x.is_nan() {
                        continue;
                    }
                    let want = half::f16::from_f32(x.clamp(-65504.0, 65504.0)).to_bits();
                    assert_eq!(f32_to_f16(x), want, "{x:e} ({:#010x})", x.to_bits());
                }
            }
        }
        for bits in (0..=u32::MAX).step_by(4093) {
            let x = f32::from_bits(bits);
            if x.is_nan() {
                assert!(half::f16::from_bits(f32_to_f16(x)).is_nan());
                continue;
            }
            let want = half::f16::from_f32(x.clamp(-65504.0, 65504.0)).to_bits();
            assert_eq!(f32_to_f16(x), want, "{x:e} ({bits:#010x})");
        }
        assert_eq!(f32_to_f16(1e6), half::f16::MAX.to_bits());
        assert_eq!(f32_to_f16(f32::INFINITY), half::f16::MAX.to_bits());
        assert_eq!(f32_to_f16(f32::NEG_INFINITY), half::f16::MIN.to_bits());
    }

    /// `dot` as its documentation defines it, one lane at a time.
    fn dot_reference(a: &[f32], b: &[f32]) -> f32 {
        let m = a.len() / 8 * 8;
        let mut acc = [0f32; 8];
        for i in 0..m {
            acc[i % 8] += a[i] * b[i];
        }
        let mut s =
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for i in m..a.len() {
            s += a[i] * b[i];
        }
        s
    }

    /// `sum` adds as `dot` does (its products by one are exact), bit for bit.
    #[test]
    fn sum_is_dot_with_ones() {
        let mut rng = crate::rng::Rng::new(5);
        for n in [0, 1, 7, 8, 9, 64, 261] {
            let x: Vec<f32> = (0..n).map(|_| rng.spread() * 3.0).collect();
            let ones = vec![1f32; n];
            assert_eq!(
                sum(&x).to_bits(),
                dot_reference(&x, &ones).to_bits(),
                "{n} values"
            );
        }
    }

    /// `dots` gives each row's `dot`, and `dot` its definition, bit for bit: lengths with and
    /// without a remainder of eight, one row and four; this build's `dots` is the portable one.
    #[test]
    fn dots_are_each_rows_dot() {
        assert_eq!(check_kernels(), Ok(40));
        let mut rng = crate::rng::Rng::new(3);
        for n in [0, 1, 7, 8, 13, 64, 256, 261] {
            let rows: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..n).map(|_| rng.normal() * 3.0).collect())
                .collect();
            let b: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let four = dots([&rows[0][..], &rows[1], &rows[2], &rows[3]], &b);
            for (row, got) in rows.iter().zip(four) {
                assert_eq!(got.to_bits(), dot(row, &b).to_bits(), "n {n}");
                assert_eq!(got.to_bits(), dot_reference(row, &b).to_bits(), "n {n}");
            }
            assert_eq!(
                dots([&rows[2][..]], &b)[0].to_bits(),
                dot(&rows[2], &b).to_bits()
            );
        }
    }

    /// `y += a·x`, one value at a time.
    fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi += a * xi;
        }
    }

    /// `axpys` is `axpy` row after row, bit for bit: one output to nine (tiles of four, two
    /// and one), lengths with and without a remainder of eight, no rows to twenty, some
    /// weights zero.
    #[test]
    fn axpys_are_axpy_row_after_row() {
        let mut rng = crate::rng::Rng::new(11);
        for m in 1..=9 {
            for n in [0, 1, 5, 8, 13, 64, 261] {
                for c in [0, 1, 3, 16, 20] {
                    let x: Vec<f32> = (0..c * n).map(|_| rng.spread() * 4.0).collect();
                    let w: Vec<f32> = (0..c * m)
                        .map(|i| if i % 7 == 3 { 0.0 } else { rng.spread() })
                        .collect();
                    let start: Vec<Vec<f32>> = (0..m)
                        .map(|_| (0..n).map(|_| rng.spread()).collect())
                        .collect();
                    let mut want = start.clone();
                    for (k, row) in x.chunks_exact(n.max(1)).take(c).enumerate() {
                        for (i, y) in want.iter_mut().enumerate() {
                            axpy(y, w[k * m + i], row);
                        }
                    }
                    let mut got: Vec<f32> = start.concat();
                    axpys(&mut got, m, &w, &x);
                    for (g, w) in got.iter().zip(want.iter().flatten()) {
                        assert_eq!(g.to_bits(), w.to_bits(), "m {m}, n {n}, rows {c}");
                    }
                }
            }
        }
    }

    #[test]
    fn exp_and_gelu_match_f64() {
        let mut worst = 0f64;
        for i in -870_000..=880_000 {
            let x = i as f32 * 1e-4;
            let want = f64::from(x).exp();
            let got = f64::from(exp_approx(x));
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "exp_approx relative error {worst}");
        assert!(exp_approx(-1000.0) > 0.0 && exp_approx(-1000.0) < 1e-37);
        assert!(exp_approx(1000.0).is_finite());
        for i in -20_000..=20_000 {
            let x = i as f32 * 5e-4;
            let xd = f64::from(x);
            let want = 0.5 * xd * (1.0 + libm_erf(xd / std::f64::consts::SQRT_2));
            let got = f64::from(gelu_erf(x));
            assert!(
                (got - want).abs() < 3e-7 * xd.abs().max(1.0),
                "gelu({x}): {got} vs {want}"
            );
        }
    }

    /// GELU (tanh form) within 2e-7 · max(1, |x|) of its f64 definition, and relatively
    /// within 2e-5 of it wherever the value is above 1e-30 (towards x = −10, e^−2u magnifies
    /// the f32 rounding of u itself by 2|u|; in f32 the `1 + tanh u` form is 5e-4 off at
    /// x = −4 and 30% at −5); 0 stays 0, and the far tails go to x and to 0.
    #[test]
    fn gelu_tanh_matches_f64() {
        let (mut worst_abs, mut worst_rel) = (0f64, 0f64);
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4;
            let xd = f64::from(x);
            let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044_715 * xd * xd * xd);
            // x/2 · (1 + tanh u), with 1 + tanh u = 2 / (1 + e^−2u): f64's own 1 + tanh u
            // cancels for negative x too.
            let want = xd / (1.0 + (-2.0 * u).exp());
            let got = f64::from(gelu_tanh(x));
            worst_abs = worst_abs.max((got - want).abs() / xd.abs().max(1.0));
            if want.abs() > 1e-30 {
                worst_rel = worst_rel.max(((got - want) / want).abs());
            }
        }
        assert!(worst_abs < 2e-7, "gelu_tanh absolute error {worst_abs}");
        assert!(worst_rel < 2e-5, "gelu_tanh relative error {worst_rel}");
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(gelu_tanh(50.0), 50.0);
        assert!(gelu_tanh(-50.0).abs() < 1e-30);
    }

    /// erf in f64 by its Taylor series (|x| ≤ 3) or the continued fraction of erfc beyond.
    fn libm_erf(x: f64) -> f64 {
        if x.abs() > 3.0 {
            let a = x.abs();
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (a + f);
            }
            let erfc = (-a * a).exp() / (a + f) / std::f64::consts::PI.sqrt();
            return (1.0 - erfc).copysign(x);
        }
        let (mut term, mut sum) = (x, x);
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 5) as f32).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-3);
    }

    #[test]
    fn rope_at_zero_is_identity_and_keeps_norm() {
        for neox in [true, false] {
            let r = crate::backend::Rope::new(8, 10000.0, 1.0, Some(&[1.0, 2.0, 1.5, 8.0]), neox);
            let mut x: Vec<f32> = (0..16).map(|i| i as f32).collect();
            let orig = x.clone();
            rope(&mut x, 16, &rope_table(&[0], &r.theta), &r);
            assert_eq!(x, orig);
            rope(&mut x, 16, &rope_table(&[7], &r.theta), &r);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() / n0 < 1e-5);
            // Pair 0 turns by 7 radians; which element is its partner is the mode.
            let (a, b) = if neox { (0, 4) } else { (0, 1) };
            let (s, c) = 7f64.sin_cos();
            let want = orig[a] * c as f32 - orig[b] * s as f32;
            assert!((x[a] - want).abs() < 1e-5, "{neox}");
        }
    }
}
