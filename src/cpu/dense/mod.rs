//! Float matrices (F32, F16 and BF16 files, held as f32) and their product with a batch of
//! activations: the encoder's layers and any float matrix of a decoder.
//!
//! The matrix is packed at load into panels of [`PANEL`] output rows, interleaved along the
//! input: `panel[kk][l]` is row `8·p + l`, column `kk`. A kernel then reads 8 outputs' weights
//! with one or two vector loads and multiplies them by one broadcast activation, keeping
//! `MR × 8` sums in registers for the whole of `k`: every weight read serves `MR` rows and
//! every activation read 8 columns. One kernel per instruction set, each tested against the
//! portable one (`wasm.rs`, `avx2.rs`, `portable.rs`); work is split over the backend's
//! threads in blocks of rows and panels (`pool.rs`).

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;
#[cfg(target_arch = "wasm32")]
mod wasm;

use super::pool::{self, SharedOut};

/// Output rows per panel.
pub const PANEL: usize = 8;
/// A kernel's result: up to 8 rows of one panel's 8 columns.
pub type Tile = [[f32; PANEL]; 8];

/// Activation rows per work item.
const ROW_BLOCK: usize = 64;
/// Bytes of panels per work item: the block stays in L2 while each row tile (≤ 8 × k
/// values, in L1) meets all of it.
const PANEL_BLOCK_BYTES: usize = 64 << 10;

/// A `(rows, cols)` float matrix, packed in panels (see the module's comment).
pub struct DenseMatrix {
    panels: Vec<f32>,
    rows: usize,
    cols: usize,
}

/// Which kernel multiplies: the best this build and CPU have, or the portable reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// wasm simd128 or x86-64 AVX2 + FMA.
    Simd,
    Portable,
}

impl Kernel {
    /// The SIMD kernel when this build and CPU have one.
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            return Kernel::Simd;
        }
        #[cfg(target_arch = "wasm32")]
        return Kernel::Simd;
        #[allow(unreachable_code)]
        Kernel::Portable
    }

    fn mr(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Simd => avx2::MR,
            #[cfg(target_arch = "wasm32")]
            Kernel::Simd => wasm::MR,
            _ => portable::MR,
        }
    }

    fn tile(self, t: usize, x: &[f32], ldx: usize, k: usize, panel: &[f32], out: &mut Tile) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Simd => avx2::tile(t, x, ldx, k, panel, out),
            #[cfg(target_arch = "wasm32")]
            Kernel::Simd => wasm::tile(t, x, ldx, k, panel, out),
            _ => portable::tile(t, x, ldx, k, panel, out),
        }
    }
}

impl DenseMatrix {
    /// Packs `data`, `rows` rows of `cols` values, row-major. `rows · cols` must be
    /// `data.len()` (the loader checks shapes before this).
    pub fn pack(data: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "dense matrix shape");
        Self::pack_strided(data, rows, cols, cols, 1)
    }

    /// Packs the matrix whose value `(r, c)` is `data[r · row_stride + c · col_stride]`: a
    /// head's keys inside packed activations, or their transpose.
    pub fn pack_strided(
        data: &[f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        let n_panels = rows.div_ceil(PANEL);
        let mut panels = vec![0f32; n_panels * PANEL * cols];
        for (p, dst) in panels.chunks_exact_mut(PANEL * cols).enumerate() {
            for l in 0..PANEL.min(rows - p * PANEL) {
                let r = (p * PANEL + l) * row_stride;
                for (kk, d) in dst.chunks_exact_mut(PANEL).enumerate() {
                    d[l] = data[r + kk * col_stride];
                }
            }
        }
        Self { panels, rows, cols }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `j`, appended to `out`.
    pub fn row_into(&self, j: usize, out: &mut Vec<f32>) {
        let (p, l) = (j / PANEL, j % PANEL);
        let panel = &self.panels[p * PANEL * self.cols..(p + 1) * PANEL * self.cols];
        out.extend(panel.chunks_exact(PANEL).map(|w| w[l]));
    }

    /// `x (m × cols) · selfᵀ (+ bias) → (m × rows)`, on the best kernel.
    pub fn matmul(&self, x: &[f32], m: usize, bias: Option<&[f32]>) -> Vec<f32> {
        self.matmul_with(Kernel::best(), x, m, bias)
    }

    /// [`Self::matmul`] on a chosen kernel. Each output is the sum over `k` of the
    /// products, then the bias added.
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
    ) -> Vec<f32> {
        let (n, k) = (self.rows, self.cols);
        assert_eq!(x.len(), m * k, "dense matmul: input shape");
        if let Some(b) = bias {
            assert_eq!(b.len(), n, "dense matmul: bias length");
        }
        let mut y = vec![0f32; m * n];
        if m == 0 || n == 0 {
            return y;
        }
        let n_panels = n.div_ceil(PANEL);
        let per_block = (PANEL_BLOCK_BYTES / (PANEL * k.max(1) * 4)).clamp(1, n_panels);
        let (row_blocks, panel_blocks) = (m.div_ceil(ROW_BLOCK), n_panels.div_ceil(per_block));
        let out = SharedOut::new(&mut y);
        let mr = kernel.mr();
        let work = m.saturating_mul(n).saturating_mul(k);
        pool::for_chunks(row_blocks * panel_blocks, work, |items| {
            let mut tile: Tile = [[0.0; PANEL]; 8];
            for item in items {
                let (rb, pb) = (item / panel_blocks, item % panel_blocks);
                let rows = rb * ROW_BLOCK..((rb + 1) * ROW_BLOCK).min(m);
                let panels = pb * per_block..((pb + 1) * per_block).min(n_panels);
                let mut i = rows.start;
                while i < rows.end {
                    let t = (rows.end - i).min(mr);
                    let xt = &x[i * k..(i + t) * k];
                    for p in panels.clone() {
                        let panel = &self.panels[p * PANEL * k..(p + 1) * PANEL * k];
                        kernel.tile(t, xt, k, k, panel, &mut tile);
                        let (j0, w) = (p * PANEL, PANEL.min(n - p * PANEL));
                        for (r, sums) in tile.iter().enumerate().take(t) {
                            // SAFETY: items are disjoint (row block, panel block) pairs, so
                            // this row's columns j0..j0 + w are written by this item alone,
                            // and lie inside `y`, which outlives `for_chunks`.
                            let dst = unsafe { out.part((i + r) * n + j0, w) };
                            match bias {
                                Some(b) => {
                                    for ((d, &s), &bj) in dst.iter_mut().zip(sums).zip(&b[j0..]) {
                                        *d = s + bj;
                                    }
                                }
                                None => dst.copy_from_slice(&sums[..w]),
                            }
                        }
                    }
                    i += t;
                }
            }
        });
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(rng: &mut crate::sampler::Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.normal()).collect()
    }

    /// The plain definition, in f64.
    fn reference(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<f64> {
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
        let mut rng = crate::sampler::Rng::new(11);
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
                let portable = d.matmul_with(Kernel::Portable, &x, m, bias);
                let best = d.matmul_with(Kernel::best(), &x, m, bias);
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
}
