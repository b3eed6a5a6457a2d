//! The dense kernels against a float64 reference and each other.

use super::check::check_kernels;
use super::float::DenseMatrix;
use super::i8::{I8Kind, I8Matrix};
use crate::cpu::isa::Isa;

fn random(rng: &mut crate::rng::Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

/// The plain definition, in f64.
fn reference(x: &[f32], w: &[f32], b: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut y = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|kk| f64::from(x[i * k + kk]) * f64::from(w[j * k + kk]))
                .sum();
            y[i * n + j] = s + b.map_or(0.0, |b| f64::from(b[j]));
        }
    }
    y
}

/// Every kernel, on shapes with row tails, panel tails and work split over the pool,
/// agrees with the f64 definition to f32 rounding; the portable kernel and the SIMD
/// kernel agree to a few ulps of the sum's magnitude.
#[test]
fn kernels_equal_the_definition() {
    let mut rng = crate::rng::Rng::new(11);
    for (m, n, k) in [
        (1, 1, 1),
        (3, 13, 7),
        (9, 8, 32),
        (67, 389, 384),
        (130, 64, 1536),
    ] {
        let (x, w, b) = (
            random(&mut rng, m * k),
            random(&mut rng, n * k),
            random(&mut rng, n),
        );
        let d = DenseMatrix::pack(&w, n, k);
        for bias in [None, Some(&b[..])] {
            let want = reference(&x, &w, bias, m, n, k);
            let tol = 1e-5 * (k as f64).sqrt() * 4.0;
            let portable = d.matmul_with(Isa::Portable, &x, m, bias);
            let best = d.matmul_with(Isa::best(), &x, m, bias);
            for ((&p, &s), &r) in portable.iter().zip(&best).zip(&want) {
                assert!(
                    (f64::from(p) - r).abs() < tol,
                    "portable {p} vs {r} ({m}×{n}×{k})"
                );
                assert!(
                    (f64::from(s) - r).abs() < tol,
                    "simd {s} vs {r} ({m}×{n}×{k})"
                );
            }
        }
        let mut row = Vec::new();
        d.row_into(n - 1, &mut row);
        assert_eq!(row, w[(n - 1) * k..]);
    }
}

/// The check the package runs on a relaxed-SIMD build passes here (AVX2 or portable
/// against portable).
#[test]
fn the_kernel_check_passes() {
    assert!(check_kernels().expect("the kernels agree") > 552);
}

/// The int8 product of each kind equals the dequantized weights' f64 product to within
/// what rounding the activations allows (`Wide`: 16 bits of the row's largest value;
/// `Narrow`: half a step, the row's range / 127, per value), on every kernel and across
/// the k split (k > 2048), with extreme values (every activation at its row's maximum,
/// weights at −128) that would overflow i32 sums in one pass, and widths that are not a
/// multiple of 16; the kernels agree exactly; rows dequantize as defined.
#[test]
fn int8_kernels_equal_the_dequantized_product() {
    let mut rng = crate::rng::Rng::new(3);
    for kind in [I8Kind::Wide, I8Kind::Narrow] {
        for (m, n, k, extreme) in [
            (1, 1, 8, false),
            (3, 7, 40, false),
            (67, 130, 384, false),
            (5, 6, 4104, true),
        ] {
            let v: Vec<i8> = (0..n * k)
                .map(|i| {
                    if extreme {
                        -128
                    } else {
                        (i * 37 % 256) as u8 as i8
                    }
                })
                .collect();
            let scale: Vec<f32> = (0..n).map(|_| rng.normal().abs() * 0.01 + 1e-3).collect();
            let zero: Vec<f32> = (0..n).map(|j| (j % 5) as f32 - 2.0).collect();
            let x: Vec<f32> = (0..m * k)
                .map(|_| if extreme { 3.0 } else { rng.normal() })
                .collect();
            let b = random(&mut rng, n);
            let q = I8Matrix::pack_as(kind, &v, scale.clone(), zero.clone(), n, k);
            assert_eq!(q.kind(), kind);
            let best = q.matmul_with(Isa::best(), &x, m, Some(&b));
            let portable = q.matmul_with(Isa::Portable, &x, m, Some(&b));
            assert_eq!(best, portable, "{kind:?} {m}×{n}×{k}");
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                let (lo, hi) = xr.iter().fold((0f64, 0f64), |(l, h), &v| {
                    (l.min(v.into()), h.max(v.into()))
                });
                for j in 0..n {
                    let w = |c: usize| {
                        (f64::from(v[j * k + c]) - f64::from(zero[j])) * f64::from(scale[j])
                    };
                    let exact: f64 =
                        (0..k).map(|c| f64::from(xr[c]) * w(c)).sum::<f64>() + f64::from(b[j]);
                    let size: f64 = (0..k).map(|c| (f64::from(xr[c]) * w(c)).abs()).sum();
                    let weights: f64 = (0..k).map(|c| w(c).abs()).sum();
                    let bound = match kind {
                        I8Kind::Wide => 1e-4 * size + 1e-5,
                        I8Kind::Narrow => {
                            weights * (hi - lo) / 127.0 / 2.0 * 1.001 + 1e-6 * size + 1e-4
                        }
                    };
                    let got = f64::from(best[i * n + j]);
                    assert!(
                        (got - exact).abs() <= bound,
                        "{kind:?} {m}×{n}×{k} ({i}, {j}): {got} vs {exact}"
                    );
                }
            }
            let mut row = Vec::new();
            q.row_into(n - 1, &mut row);
            let want: Vec<f32> = v[(n - 1) * k..]
                .iter()
                .map(|&q| (f32::from(q) - zero[n - 1]) * scale[n - 1])
                .collect();
            assert_eq!(row, want, "{kind:?}");
        }
    }
}
