//! [`super::dots`]' eight lane sums in plain Rust: the reference.

/// The eight lane sums in plain Rust: every build's definition (the others are held to it
/// bit for bit), and the lanes of builds without SSE2 or simd128.
#[inline(always)]
pub fn lanes8<const N: usize>(a: &[&[f32]; N], b: &[f32]) -> [[f32; 8]; N] {
    let mut out = [[0f32; 8]; N];
    for (c, y) in b.chunks_exact(8).enumerate() {
        for (acc, x) in out.iter_mut().zip(a) {
            let x = &x[c * 8..c * 8 + 8];
            for l in 0..8 {
                acc[l] += x[l] * y[l];
            }
        }
    }
    out
}
