//! Element-wise kernels of the CPU backend. Loops keep 8 independent accumulators so LLVM
//! vectorises them (SSE/AVX natively, simd128 in wasm) without reassociating floats.

/// Dot product with 8 lanes.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, ra) = a.split_at(a.len() / 8 * 8);
    let (cb, rb) = b.split_at(ca.len());
    for (x, y) in ca.chunks_exact(8).zip(cb.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y += a * x`.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
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

/// GELU, tanh approximation (as Gemma and llama.cpp use).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/π)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

/// NeoX rotary embedding: within each head, element i pairs with i + head_dim/2.
pub fn rope_neox(x: &mut [f32], width: usize, pos: &[usize], head_dim: usize, base: f32) {
    let half = head_dim / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| f64::from(base).powf(-2.0 * i as f64 / head_dim as f64))
        .collect();
    let mut cs = vec![(0f32, 0f32); half];
    for (row, &p) in x.chunks_exact_mut(width).zip(pos) {
        for (c, f) in cs.iter_mut().zip(&inv) {
            let (s, co) = (p as f64 * f).sin_cos();
            *c = (co as f32, s as f32);
        }
        for h in row.chunks_exact_mut(head_dim) {
            let (a, b) = h.split_at_mut(half);
            for ((ai, bi), &(c, s)) in a.iter_mut().zip(b.iter_mut()).zip(&cs) {
                let (x0, x1) = (*ai, *bi);
                *ai = x0 * c - x1 * s;
                *bi = x0 * s + x1 * c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 5) as f32).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-3);
    }

    #[test]
    fn rope_at_zero_is_identity_and_keeps_norm() {
        let mut x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let orig = x.clone();
        rope_neox(&mut x, 16, &[0], 8, 10000.0);
        assert_eq!(x, orig);
        rope_neox(&mut x, 16, &[7], 8, 10000.0);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() / n0 < 1e-5);
    }
}
