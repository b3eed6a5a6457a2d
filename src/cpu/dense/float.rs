//! Float matrices (F32, F16 and BF16 files, held as f32) packed in panels, and their
//! products with a batch of activations.

use super::dispatch;
use super::plan::{for_each_tile, locate, Out, Plan};
use super::tile::{Tile, PANEL};
use crate::cpu::isa::Isa;

/// A `(rows, cols)` float matrix, packed in panels (see the module's comment).
pub struct DenseMatrix {
    panels: Vec<f32>,
    rows: usize,
    cols: usize,
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
        self.matmul_with(Isa::best(), x, m, bias)
    }

    /// [`Self::matmul`] on a chosen kernel. Each output is the sum over `k` of the
    /// products, then the bias added.
    pub fn matmul_with(&self, isa: Isa, x: &[f32], m: usize, bias: Option<&[f32]>) -> Vec<f32> {
        let mut ys = Self::products_with(isa, &[(self, Out::plain(bias))], x, m);
        ys.pop().unwrap_or_default()
    }

    /// Several matrices of the same width applied to the same `x (m × cols)`, each with its
    /// [`Out`], in one pass over the pool: `(m × rows)` per matrix, on the best kernel.
    pub fn products(parts: &[(&Self, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        Self::products_with(Isa::best(), parts, x, m)
    }

    /// [`Self::products`] on a chosen kernel.
    pub fn products_with(isa: Isa, parts: &[(&Self, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        let shapes: Vec<_> = parts.iter().map(|(d, o)| (d.rows, d.cols, *o)).collect();
        let (mut ys, plan) = Plan::new(&shapes, x, m, PANEL, "dense");
        let Some(plan) = plan else {
            return ys;
        };
        let (k, outs, starts) = (plan.k, plan.outs(&mut ys), &plan.starts);
        let work = plan.macs;
        let scratch: Tile = [[0.0; PANEL]; 8];
        for_each_tile(
            m,
            starts[parts.len()],
            PANEL * k * 4,
            dispatch::mr(isa),
            work,
            scratch,
            |tile, i, t, gp| {
                let (part, p) = locate(starts, gp);
                let (d, o) = &parts[part];
                let panel = &d.panels[p * PANEL * k..(p + 1) * PANEL * k];
                dispatch::tile(isa, t, &x[i * k..(i + t) * k], k, k, panel, tile);
                let (n, j0) = (d.rows, p * PANEL);
                let w = PANEL.min(n - j0);
                for (r, &sums) in tile.iter().enumerate().take(t) {
                    // SAFETY: for_each_tile visits each (row, panel) pair once, so this row's
                    // columns j0..j0 + w of this part's output are written here alone, and
                    // lie inside it, which outlives the pass.
                    let dst = unsafe { outs[part].part((i + r) * n + j0, w) };
                    o.store(dst, sums, i + r, j0, n);
                }
            },
            |i, t, gps| plan.gelu(&shapes, &outs, i..i + t, gps),
        );
        ys
    }
}
