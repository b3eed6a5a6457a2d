//! Activation rows quantized to 8 bits. For the 32-value weight types GGML's `Q8_0`: a scale
//! per 32 values, `x ≈ d·q`, `d = max|x| / 127`, kept in f32. For the K-quants a scale per 32
//! values too, in two levels, so that the kernels keep llama.cpp's integer sums: a unit `D`
//! per 256 values (the largest 32-value scale over 127) and an integer `s_j` (1 … 127) per 32,
//! `d_j = D·s_j ≥ max|x_j| / 127`; and the exact sums of each 16 codes.
//!
//! Not llama.cpp's `Q8_K` (one scale per 256): on Gemma 3 270M, whose feed-forward outputs
//! have outliers, it left the logits farther from the float64 reference than llama.cpp's
//! own (mean |Δ| 0.172 against 0.157, top-1 95% against 96%): one large value coarsened the
//! grid of 255 others. With a scale per 32: 0.090, 96%.

/// `m` rows of `k` values.
pub struct Q8Rows {
    pub m: usize,
    pub k: usize,
    pub q: Vec<i8>,
    /// A scale per 32 values (`D·s_j` for the K-quants' rows).
    pub d: Vec<f32>,
    /// The K-quants' rows: `D` per 256 values, `s_j` per 32, and Σq of each 16 codes;
    /// else empty.
    pub units: Vec<f32>,
    pub steps: Vec<i16>,
    pub bsums: Vec<i16>,
}

/// One row of a [`Q8Rows`].
pub struct ActRow<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub units: &'a [f32],
    pub steps: &'a [i16],
    pub bsums: &'a [i16],
}

impl Q8Rows {
    /// `x` (`m × k`, `k` a multiple of 32) quantized; for the K-quants (`k_quants`, `k` a
    /// multiple of 256) in two levels and with the sums of each 16 codes.
    pub fn quantize(x: &[f32], m: usize, k: usize, k_quants: bool) -> Self {
        debug_assert!(x.len() == m * k && k.is_multiple_of(if k_quants { 256 } else { 32 }));
        let mut q = vec![0i8; m * k];
        let mut d = vec![0f32; m * k / 32];
        let (mut units, mut steps, mut bsums) = (Vec::new(), Vec::new(), Vec::new());
        if k_quants {
            units = vec![0f32; m * k / 256];
            steps = vec![0i16; m * k / 32];
            for (b, (xs, qs)) in x.chunks_exact(256).zip(q.chunks_exact_mut(256)).enumerate() {
                units[b] = quantize_256(
                    xs,
                    qs,
                    &mut steps[8 * b..8 * b + 8],
                    &mut d[8 * b..8 * b + 8],
                );
            }
            bsums = q
                .chunks_exact(16)
                .map(|qs| qs.iter().map(|&v| i16::from(v)).sum())
                .collect();
        } else {
            for ((xs, qs), d) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).zip(&mut d) {
                *d = quantize_32(xs, qs);
            }
        }
        Q8Rows {
            m,
            k,
            q,
            d,
            units,
            steps,
            bsums,
        }
    }

    pub fn row(&self, i: usize) -> ActRow<'_> {
        let k = self.k;
        ActRow {
            q: &self.q[i * k..(i + 1) * k],
            d: &self.d[i * k / 32..(i + 1) * k / 32],
            units: part(&self.units, i, k / 256),
            steps: part(&self.steps, i, k / 32),
            bsums: part(&self.bsums, i, k / 16),
        }
    }
}

/// Row `i`'s `n` values of `v`, or nothing where `v` is empty.
fn part<T>(v: &[T], i: usize, n: usize) -> &[T] {
    if v.is_empty() {
        v
    } else {
        &v[i * n..(i + 1) * n]
    }
}

/// GGML's `quantize_row_q8_0` for one block (its scale kept in f32).
fn quantize_32(xs: &[f32], qs: &mut [i8]) -> f32 {
    let amax = xs.iter().fold(0f32, |a, &x| a.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &x) in qs.iter_mut().zip(xs) {
        *q = (x * id).round() as i8;
    }
    d
}

/// 256 values on the two-level grid: returns `D`, writes each 32's `s_j` and `D·s_j`.
fn quantize_256(xs: &[f32], qs: &mut [i8], steps: &mut [i16], d: &mut [f32]) -> f32 {
    let amax: Vec<f32> = xs
        .chunks_exact(32)
        .map(|c| c.iter().fold(0f32, |a, &x| a.max(x.abs())))
        .collect();
    let top = amax.iter().fold(0f32, |a, &v| a.max(v));
    let unit = top / (127.0 * 127.0);
    for j in 0..8 {
        // The smallest step whose grid still holds the 32 values (codes within ±127): the
        // rounding up keeps the codes in range, and a zero block still gets step 1.
        let s = if unit > 0.0 && unit.is_finite() {
            ((amax[j] / 127.0 / unit).ceil() as i16).clamp(1, 127)
        } else {
            1
        };
        let dj = unit * f32::from(s);
        steps[j] = s;
        d[j] = dj;
        let id = if dj > 0.0 && dj.is_finite() {
            1.0 / dj
        } else {
            0.0
        };
        for (q, &x) in qs[32 * j..32 * j + 32].iter_mut().zip(&xs[32 * j..]) {
            *q = ((x * id).round() as i32).clamp(-127, 127) as i8;
        }
    }
    unit
}
