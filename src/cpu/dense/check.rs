//! This build's dense kernels against the portable ones (part of the CPU's kernel check).

use super::dispatch;
use super::float::DenseMatrix;
use super::i8::{I8Kind, I8Matrix, I8_KC};
use super::tile::{TileI8, I8_PANEL};
use crate::cpu::isa::Isa;

/// This build's SIMD kernels against the portable ones, on small random products with row,
/// panel and width tails, int8 of both kinds across the k split (about 0.2 M multiply-adds):
/// the number of outputs compared, or what differed. The int8 kernels must agree exactly, the
/// float one to a few ulps of each sum's size. The package runs it (`checkKernels` in wasm)
/// when it loads a relaxed-SIMD build, whose instructions are only as good as the browser's
/// lowering of them.
pub fn check_kernels() -> Result<usize, String> {
    let mut rng = crate::rng::Rng::new(5);
    let mut compared = 0;
    for (m, n, k) in [(1, 1, 16), (3, 7, 40), (9, 13, 384), (5, 9, 2064)] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.spread()).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rng.spread()).collect();
        let d = DenseMatrix::pack(&w, n, k);
        let (a, b) = (
            d.matmul_with(Isa::best(), &x, m, None),
            d.matmul_with(Isa::Portable, &x, m, None),
        );
        for (i, (&a, &b)) in a.iter().zip(&b).enumerate() {
            let size: f32 = (0..k)
                .map(|c| (x[i / n * k + c] * w[i % n * k + c]).abs())
                .sum();
            if (a - b).abs() > 1e-6 * size {
                return Err(format!(
                    "f32 {m}×{n}×{k} output {i}: simd {a}, portable {b}"
                ));
            }
        }
        compared += a.len();
        let v: Vec<i8> = (0..n * k)
            .map(|_| (rng.spread() * 60.0).clamp(-128.0, 127.0) as i8)
            .collect();
        let scale: Vec<f32> = (0..n).map(|_| rng.spread().abs() * 0.01 + 1e-3).collect();
        let zero: Vec<f32> = (0..n).map(|j| (j % 5) as f32 - 2.0).collect();
        for kind in [I8Kind::Wide, I8Kind::Narrow] {
            let q = I8Matrix::pack_as(kind, &v, scale.clone(), zero.clone(), n, k);
            let (a, b) = (
                q.matmul_with(Isa::best(), &x, m, None),
                q.matmul_with(Isa::Portable, &x, m, None),
            );
            if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
                return Err(format!(
                    "int8 {kind:?} {m}×{n}×{k} output {i}: simd {}, portable {}",
                    a[i], b[i]
                ));
            }
            compared += a.len();
        }
    }
    // The int8 kernels themselves, sum for sum: 7-bit and 16-bit activations at their
    // extremes against random weights, every row count, up to the widest chunk.
    for k in [16, 48, 400, I8_KC] {
        let panel8: Vec<i8> = (0..I8_PANEL * k)
            .map(|_| (rng.spread() * 90.0).clamp(-128.0, 127.0) as i8)
            .collect();
        let panel16: Vec<i16> = panel8.iter().map(|&v| v.into()).collect();
        let x7: Vec<u8> = (0..4 * k)
            .map(|i| {
                if i % 7 == 0 {
                    127
                } else {
                    (rng.spread().abs() * 40.0).min(127.0) as u8
                }
            })
            .collect();
        let x16: Vec<i16> = (0..4 * k)
            .map(|i| {
                if i % 5 == 0 {
                    -32767
                } else {
                    (rng.spread() * 12000.0) as i16
                }
            })
            .collect();
        // Each row count both kernels take: this build's and the portable sums, equal.
        let mut same =
            |what: &str, mr: fn(Isa) -> usize, tile: &dyn Fn(Isa, usize, &mut TileI8)| {
                let (mut a, mut b) = ([[0i64; I8_PANEL]; 4], [[0i64; I8_PANEL]; 4]);
                for t in 1..=mr(Isa::best()).min(mr(Isa::Portable)) {
                    tile(Isa::best(), t, &mut a);
                    tile(Isa::Portable, t, &mut b);
                    if a[..t] != b[..t] {
                        return Err(format!(
                            "the {what} kernel, {t} rows × {k}: {:?} vs {:?}",
                            &a[..t],
                            &b[..t]
                        ));
                    }
                    compared += t * I8_PANEL;
                }
                Ok(())
            };
        same("7-bit", dispatch::mr_u7, &|isa, t, out| {
            dispatch::tile_u7(isa, t, &x7, k, k, &panel8, out)
        })?;
        same("16-bit", dispatch::mr_i8, &|isa, t, out| {
            dispatch::tile_i8(isa, t, &x16, k, k, &panel16, out)
        })?;
    }
    Ok(compared)
}
