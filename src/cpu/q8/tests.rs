//! The 8-bit path against an implementation that is not ours: candle's port of GGML's
//! reference code (its scalar `vec_dot_unopt`, `to_float` and the activations' `from_float`),
//! on random blocks of every kind.

use super::act::Q8Rows;
use super::kind::Kind;
use super::matrix::tests::{random_blocks, random_x};
use candle_core::quantized::k_quants::{
    BlockQ4K, BlockQ4_0, BlockQ5_0, BlockQ6K, BlockQ8_0, GgmlType,
};

/// `bytes` as candle's blocks of `T` (the same `repr(C)` layout as the file's).
fn as_blocks<T: GgmlType>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    assert_eq!(bytes.len() % size, 0);
    let mut v = vec![T::zeros(); bytes.len() / size];
    // SAFETY: candle's blocks are `repr(C)` structs of f16/f32 and integer arrays, every byte
    // pattern a valid value; the slice covers the vector's memory exactly.
    unsafe {
        std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), bytes.len())
            .copy_from_slice(bytes);
    }
    v
}

fn bytes_of<T>(v: &[T]) -> &[u8] {
    // SAFETY: plain-old-data blocks, read as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Candle's dequantized row and its dot with candle's own activations of `x`.
fn candle<T: GgmlType>(row: &[u8], x: &[f32]) -> (Vec<f32>, f32) {
    let w: Vec<T> = as_blocks(row);
    let mut out = vec![0f32; x.len()];
    T::to_float(&w, &mut out);
    let mut a = vec![T::VecDotType::zeros(); x.len() / T::VecDotType::BLCK_SIZE];
    T::VecDotType::from_float(x, &mut a);
    (out, T::vec_dot_unopt(x.len(), &w, &a))
}

#[test]
fn rows_and_dots_agree_with_candles_reference() {
    let (rows, cols) = (6, 1024);
    for kind in [Kind::Q4_0, Kind::Q5_0, Kind::Q8_0, Kind::Q4K, Kind::Q6K] {
        let w = random_blocks(kind, rows, cols, 21);
        let x = random_x(cols, 23);
        let act = Q8Rows::quantize(&x, 1, cols, kind.k_activations());
        let ours = w.matmul(&x, 1);
        let mut deq = vec![0f32; cols];
        for (j, &our) in ours.iter().enumerate() {
            let row = w.row_blocks(j);
            let (want_deq, want_dot) = match kind {
                Kind::Q4_0 => candle::<BlockQ4_0>(row, &x),
                Kind::Q5_0 => candle::<BlockQ5_0>(row, &x),
                Kind::Q8_0 => candle::<BlockQ8_0>(row, &x),
                Kind::Q4K => candle::<BlockQ4K>(row, &x),
                Kind::Q6K => candle::<BlockQ6K>(row, &x),
            };
            kind.dequantize(row, &mut deq);
            assert_eq!(
                deq.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want_deq.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{kind:?} row {j}: dequantized"
            );
            // The sums of integer products are exact in both; the float sums run in another
            // order, candle's Q8_0 activations round their scale to f16 (2⁻¹¹), and for the
            // K-quants candle's activations are Q8_K (a scale per 256 values, ours per 32):
            // there the two differ by the 8-bit rounding itself.
            let size: f32 = deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            let tol = if kind.k_activations() { 2e-2 } else { 2e-3 } * size;
            for got in [our, kind.dot(row, &act.row(0))] {
                assert!(
                    (got - want_dot).abs() <= tol,
                    "{kind:?} row {j}: {got} vs candle {want_dot}"
                );
            }
        }
    }
}

#[test]
fn activations_are_quantized_as_ggml_does() {
    let k = 1024;
    let mut x = random_x(k, 29);
    x[300] = 0.0;
    x[256..288].iter_mut().for_each(|v| *v = 0.0); // a block of zeros: scale 0
    x[700] = -3.5; // a block whose extreme is negative
    let ours = Q8Rows::quantize(&x, 1, k, false);
    let mut theirs = vec![BlockQ8_0::zeros(); k / 32];
    BlockQ8_0::from_float(&x, &mut theirs);
    for (b, t) in bytes_of(&theirs).chunks_exact(34).enumerate() {
        let q: Vec<i8> = t[2..].iter().map(|&v| v as i8).collect();
        assert_eq!(q, ours.q[32 * b..32 * (b + 1)], "Q8_0 block {b}");
        let d = half::f16::from_bits(u16::from_le_bytes([t[0], t[1]]));
        assert_eq!(
            d,
            half::f16::from_f32(ours.d[b]),
            "Q8_0 block {b}: the scale"
        );
    }
    // The two-level grid: every code within ±127, each 32 values' step the smallest that
    // holds them, and the sums of 16 codes exact.
    let two = Q8Rows::quantize(&x, 1, k, true);
    for j in 0..k / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let (unit, step) = (two.units[j / 8], two.steps[j]);
        assert!((1..=127).contains(&step));
        assert_eq!(two.d[j], unit * f32::from(step));
        assert!(amax / 127.0 <= two.d[j] * 1.000_001, "block {j}");
        assert!(
            step == 1 || amax / 127.0 > unit * f32::from(step - 1),
            "block {j}: a smaller step holds it"
        );
        for (&q, &v) in two.q[32 * j..32 * j + 32].iter().zip(xs) {
            assert!((f32::from(q) * two.d[j] - v).abs() <= 0.5 * two.d[j] * 1.000_01);
        }
    }
    for (s, qs) in two.bsums.iter().zip(two.q.chunks_exact(16)) {
        assert_eq!(i32::from(*s), qs.iter().map(|&v| i32::from(v)).sum::<i32>());
    }
}

/// `cargo test --release --lib q8::tests::speed -- --ignored --nocapture`: the 8-bit path
/// beside the exact one (int8/) on the same random blocks, in a Llama 3.2 1B layer's shapes,
/// one activation row (a decode step) and 64 (a prompt's chunk), on the pool's threads
/// (`CANDLE_NUM_THREADS`).
#[test]
#[ignore]
fn speed() {
    use crate::cpu::int8::QMatrix;
    use crate::gguf::{now, GgmlType};
    for (kind, ty, rows, cols) in [
        (Kind::Q4K, GgmlType::Q4_K, 8192, 2048),
        (Kind::Q6K, GgmlType::Q6_K, 2048, 8192),
        (Kind::Q8_0, GgmlType::Q8_0, 8192, 2048),
        (Kind::Q5_0, GgmlType::Q5_0, 8192, 2048),
    ] {
        let w = random_blocks(kind, rows, cols, 1);
        let bytes: Vec<u8> = (0..rows).flat_map(|r| w.row_blocks(r).to_vec()).collect();
        let q = now(QMatrix::load_with(&bytes, 0, rows, cols, ty, false))
            .unwrap()
            .unwrap();
        for m in [1usize, 64] {
            let x = random_x(m * cols, 2);
            let reps = if m == 1 { 200 } else { 10 };
            let time = |f: &dyn Fn() -> Vec<f32>| {
                f();
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    std::hint::black_box(f());
                }
                t.elapsed().as_secs_f64() / reps as f64
            };
            let fast = time(&|| w.matmul(&x, m));
            let exact = time(&|| q.matmul(&x, m));
            let gmacs = |s: f64| (rows * cols * m) as f64 / s / 1e9;
            let gbs = |s: f64, b: usize| b as f64 / s / 1e9;
            eprintln!(
                "{kind:?} {rows}×{cols} m={m}: 8-bit {:.3} ms ({:.1} GMAC/s, {:.1} GB/s of {} MB) | exact {:.3} ms ({:.1} GMAC/s) | exact / 8-bit time {:.2}",
                fast * 1e3, gmacs(fast), gbs(fast, w.bytes()), w.bytes() / 1_000_000,
                exact * 1e3, gmacs(exact), exact / fast
            );
        }
    }
}
