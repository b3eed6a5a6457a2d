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
use std::ops::Range;

/// Output rows per panel.
pub const PANEL: usize = 8;
/// A kernel's result: up to 8 rows of one panel's 8 columns.
pub type Tile = [[f32; PANEL]; 8];
/// Weight rows per int8 panel.
pub const I8_PANEL: usize = 4;
/// An int8 kernel's result: up to 4 activation rows × one panel's 4 weight rows, exact.
pub type TileI8 = [[i64; I8_PANEL]; 4];
/// Values of `k` per int8 kernel call, so that its i32 lanes cannot overflow.
const I8_KC: usize = 2048;

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

/// The instruction set of [`Kernel::best`] and [`I8Kind::best`] (`EngineInfo::simd`).
pub fn simd_name() -> &'static str {
    if cfg!(all(target_arch = "wasm32", target_feature = "relaxed-simd")) {
        "relaxed-simd"
    } else if cfg!(target_arch = "wasm32") {
        "simd128"
    } else if Kernel::best() == Kernel::Simd {
        "avx2"
    } else {
        "portable"
    }
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

    fn mr_i8(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Simd => avx2::MR_I8,
            #[cfg(target_arch = "wasm32")]
            Kernel::Simd => wasm::MR_I8,
            _ => portable::MR_I8,
        }
    }

    /// The int8 kernel: wasm's `i32x4.dot_i16x8_s`, AVX2's `vpmaddwd`, or the portable one.
    fn tile_i8(self, t: usize, x: &[i16], ldx: usize, k: usize, panel: &[i16], out: &mut TileI8) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Simd => avx2::tile_i8(t, x, ldx, k, panel, out),
            #[cfg(target_arch = "wasm32")]
            Kernel::Simd => wasm::tile_i8(t, x, ldx, k, panel, out),
            _ => portable::tile_i8(t, x, ldx, k, panel, out),
        }
    }

    fn mr_u7(self) -> usize {
        #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
        if self == Kernel::Simd {
            return wasm::MR_U7;
        }
        portable::MR_U7
    }

    /// The `Narrow` int8 kernel: relaxed SIMD's `i32x4.relaxed_dot_i8x16_i7x16_add_s` in the
    /// relaxed wasm builds, else the portable one.
    fn tile_u7(self, t: usize, x: &[u8], ldx: usize, k: usize, panel: &[i8], out: &mut TileI8) {
        #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
        if self == Kernel::Simd {
            return wasm::tile_u7(t, x, ldx, k, panel, out);
        }
        portable::tile_u7(t, x, ldx, k, panel, out)
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
        let mut ys = Self::products_with(kernel, &[(self, Out::plain(bias))], x, m);
        ys.pop().unwrap_or_default()
    }

    /// Several matrices of the same width applied to the same `x (m × cols)`, each with its
    /// [`Out`], in one pass over the pool: `(m × rows)` per matrix, on the best kernel.
    pub fn products(parts: &[(&Self, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        Self::products_with(Kernel::best(), parts, x, m)
    }

    /// [`Self::products`] on a chosen kernel.
    pub fn products_with(
        kernel: Kernel,
        parts: &[(&Self, Out)],
        x: &[f32],
        m: usize,
    ) -> Vec<Vec<f32>> {
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
            kernel.mr(),
            work,
            scratch,
            |tile, i, t, gp| {
                let (part, p) = locate(starts, gp);
                let (d, o) = &parts[part];
                let panel = &d.panels[p * PANEL * k..(p + 1) * PANEL * k];
                kernel.tile(t, &x[i * k..(i + t) * k], k, k, panel, tile);
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

/// What becomes of a product's output `s` (row `i`, column `j`) before it is stored: the
/// bias added to the finished sum, then `post`.
#[derive(Clone, Copy)]
pub struct Out<'a> {
    pub bias: Option<&'a [f32]>,
    pub post: Post<'a>,
}

/// What follows the bias in the same pass, so that no serial pass over the output is left.
#[derive(Clone, Copy)]
pub enum Post<'a> {
    None,
    /// GELU, exact (erf) form (BERT's feed-forward).
    Gelu,
    /// Plus the same element of a residual of the output's shape `(m × rows)`.
    Add(&'a [f32]),
}

impl<'a> Out<'a> {
    /// The bias (if any) and nothing after it.
    pub fn plain(bias: Option<&'a [f32]>) -> Self {
        Self {
            bias,
            post: Post::None,
        }
    }

    /// Stores a tile row's sums `v` (columns `j0..j0 + dst.len()` of row `i` of an `n`-column
    /// output) with the bias and a residual added; a GELU follows in `Plan::gelu`.
    #[inline]
    pub fn store<const W: usize>(
        &self,
        dst: &mut [f32],
        mut v: [f32; W],
        i: usize,
        j0: usize,
        n: usize,
    ) {
        let w = dst.len();
        if let Some(b) = self.bias {
            for (v, &b) in v.iter_mut().zip(&b[j0..j0 + w]) {
                *v += b;
            }
        }
        match self.post {
            // GELU comes once the row's block of panels is done (`Plan::gelu`): over a
            // row's run of outputs it vectorises, over a tile's 4 or 8 it did not (the int8
            // product ran 20% slower in V8 with it here).
            Post::None | Post::Gelu => {}
            Post::Add(r) => {
                for (v, &r) in v.iter_mut().zip(&r[i * n + j0..i * n + j0 + w]) {
                    *v += r;
                }
            }
        }
        dst.copy_from_slice(&v[..w]);
    }

    /// The stored value of output `(i, j)` of an `n`-column product whose sum is `s`: the
    /// same arithmetic, in the same order, as the bias, GELU or add as separate passes.
    #[inline]
    pub fn finish(&self, s: f32, i: usize, j: usize, n: usize) -> f32 {
        let v = match self.bias {
            Some(b) => s + b[j],
            None => s,
        };
        match self.post {
            Post::None => v,
            Post::Gelu => super::ops::gelu_erf(v),
            Post::Add(r) => v + r[i * n + j],
        }
    }
}

/// What a multi-part product sets up before its pass: the shared width `k`, the
/// multiply-adds, and each part's first global panel (`panel` rows each; the total at the
/// end).
struct Plan {
    k: usize,
    macs: usize,
    panel: usize,
    starts: Vec<usize>,
}

impl Plan {
    /// Zeroed outputs (`m × rows` per part `(rows, cols, out)`), and the plan, or `None` when
    /// there is nothing to compute. Asserts the shapes (the CPU backend checks them first and
    /// returns typed errors): one width, `x` of `m` rows of it, biases and residuals that fit.
    fn new(
        parts: &[(usize, usize, Out)],
        x: &[f32],
        m: usize,
        panel: usize,
        what: &str,
    ) -> (Vec<Vec<f32>>, Option<Self>) {
        let k = parts.first().map_or(0, |p| p.1);
        assert!(parts.iter().all(|p| p.1 == k), "{what}: parts of one width");
        assert_eq!(x.len(), m * k, "{what} matmul: input shape");
        for &(n, _, o) in parts {
            if let Some(b) = o.bias {
                assert_eq!(b.len(), n, "{what} matmul: bias length");
            }
            if let Post::Add(r) = o.post {
                assert_eq!(r.len(), m * n, "{what} matmul: residual shape");
            }
        }
        let ys: Vec<Vec<f32>> = parts.iter().map(|p| vec![0f32; m * p.0]).collect();
        let n_all: usize = parts.iter().map(|p| p.0).sum();
        if m == 0 || n_all == 0 {
            return (ys, None);
        }
        let mut starts = vec![0];
        for p in parts {
            starts.push(starts[starts.len() - 1] + p.0.div_ceil(panel));
        }
        let macs = m.saturating_mul(n_all).saturating_mul(k);
        (
            ys,
            Some(Self {
                k,
                macs,
                panel,
                starts,
            }),
        )
    }

    /// The workers' pointers to `ys` (which must then outlive the pass, unresized).
    fn outs(&self, ys: &mut [Vec<f32>]) -> Vec<SharedOut> {
        ys.iter_mut().map(|y| SharedOut::new(y)).collect()
    }

    /// GELU on the finished outputs of rows `rows` in global panels `gps`, for each part
    /// whose post is [`Post::Gelu`].
    fn gelu(
        &self,
        parts: &[(usize, usize, Out)],
        outs: &[SharedOut],
        rows: Range<usize>,
        gps: Range<usize>,
    ) {
        let starts = &self.starts;
        for (q, &(n, _, o)) in parts.iter().enumerate() {
            let (p0, p1) = (gps.start.max(starts[q]), gps.end.min(starts[q + 1]));
            if !matches!(o.post, Post::Gelu) || p0 >= p1 {
                continue;
            }
            let panel = self.panel;
            let (j0, j1) = ((p0 - starts[q]) * panel, ((p1 - starts[q]) * panel).min(n));
            for r in rows.clone() {
                // SAFETY: these outputs (rows `rows`, the columns of panels `gps`) belong to
                // the work item that calls this, after its tiles stored them; inside the part.
                let dst = unsafe { outs[q].part(r * n + j0, j1 - j0) };
                for v in dst {
                    *v = super::ops::gelu_erf(*v);
                }
            }
        }
    }
}

/// The part that global panel `gp` falls in, and its panel within that part.
#[inline]
fn locate(starts: &[usize], gp: usize) -> (usize, usize) {
    let part = starts[1..].iter().position(|&s| gp < s).unwrap_or(0);
    (part, gp - starts[part])
}

/// How an int8 product meets its activations; one per build ([`I8Kind::best`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum I8Kind {
    /// Each activation row to 16 bits with one scale (`amax / 32767`); the weights widened to
    /// i16, 8 values of each row per step: `i32x4.dot_i16x8_s`, AVX2's `vpmaddwd`, 8 products
    /// an instruction. Relative error 2⁻¹⁶ of the row's largest value.
    Wide,
    /// Each activation row to 7 bits (0..=127) over its range with a zero point; the weights as
    /// stored (i8), 16 values of each row per step: relaxed SIMD's
    /// `i32x4.relaxed_dot_i8x16_i7x16_add_s`, 16 products and the add in one instruction
    /// where the CPU has AVX-VNNI or Arm's dot product; half the weight bytes of `Wide`. Not
    /// exact: the step is the row's range / 127 (a BERT's few outlier channels set it). On
    /// all-MiniLM-L6-v2's int8 export the worst cosine to the dequantized weights' float run
    /// is 0.993, where onnxruntime's own int8 run of the file (8-bit activations, one scale
    /// per tensor) reaches 0.982; keeping the outlier columns apart in f32 reached 0.999 only
    /// with 32 of 384 columns, which cost all of the speed.
    Narrow,
}

impl I8Kind {
    /// `Narrow` in the relaxed-SIMD wasm builds, else `Wide`.
    pub fn best() -> Self {
        if cfg!(all(target_arch = "wasm32", target_feature = "relaxed-simd")) {
            I8Kind::Narrow
        } else {
            I8Kind::Wide
        }
    }
}

/// An int8 matrix's values as its [`I8Kind`] reads them.
enum I8Panels {
    /// 8 values of each of a panel's rows per step, widened to i16.
    Wide(Vec<i16>),
    /// 16 values of each of a panel's rows per step as stored, each row padded with zeros to
    /// `kp` (a multiple of 16) values, and each row's sum of values (for the zero points).
    Narrow {
        panels: Vec<i8>,
        sums: Vec<i32>,
        kp: usize,
    },
}

/// An int8 matrix `(rows, cols)` whose weight `(r, c)` is `(v − zero[r]) · scale[r]` (an int8
/// ONNX export's, kept as stored), packed in panels of [`I8_PANEL`] rows in the layout its
/// [`I8Kind`] reads. The product quantizes each activation row (one scale, and for `Narrow`
/// a zero point), sums `x_q · v` exactly in integers, and removes the zero points after:
/// the dequantized weights' product up to the activations' rounding.
///
/// `Wide` holds the values widened to i16: half of f32's bytes, twice the file's (in V8 the
/// product runs 1.3–1.5× the f32 kernel with i8 panels widened in the loop, ~1.8× with these).
pub struct I8Matrix {
    panels: I8Panels,
    scale: Vec<f32>,
    zero: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl I8Matrix {
    /// Whether rows of `cols` values fit the layout (a multiple of 8).
    pub fn takes(cols: usize) -> bool {
        cols > 0 && cols.is_multiple_of(8)
    }

    /// Packs `values` (`rows × cols`, row-major; [`Self::takes`] `cols`) with a scale and zero
    /// per row, for this build's kind.
    pub fn pack(values: &[i8], scale: Vec<f32>, zero: Vec<f32>, rows: usize, cols: usize) -> Self {
        Self::pack_as(I8Kind::best(), values, scale, zero, rows, cols)
    }

    /// [`Self::pack`] for a chosen kind.
    pub fn pack_as(
        kind: I8Kind,
        values: &[i8],
        scale: Vec<f32>,
        zero: Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Self {
        assert!(Self::takes(cols) && values.len() == rows * cols);
        assert!(scale.len() == rows && zero.len() == rows);
        let n_panels = rows.div_ceil(I8_PANEL);
        let panels = match kind {
            I8Kind::Wide => {
                let mut panels = vec![0i16; n_panels * I8_PANEL * cols];
                for (j, row) in values.chunks_exact(cols).enumerate() {
                    let (p, r) = (j / I8_PANEL, j % I8_PANEL);
                    let panel = &mut panels[p * I8_PANEL * cols..(p + 1) * I8_PANEL * cols];
                    for (c, v) in row.chunks_exact(8).enumerate() {
                        let at = c * 8 * I8_PANEL + r * 8;
                        for (d, &x) in panel[at..at + 8].iter_mut().zip(v) {
                            *d = i16::from(x);
                        }
                    }
                }
                I8Panels::Wide(panels)
            }
            I8Kind::Narrow => {
                let kp = cols.next_multiple_of(16);
                let mut panels = vec![0i8; n_panels * I8_PANEL * kp];
                let mut sums = Vec::with_capacity(rows);
                for (j, row) in values.chunks_exact(cols).enumerate() {
                    let (p, r) = (j / I8_PANEL, j % I8_PANEL);
                    let panel = &mut panels[p * I8_PANEL * kp..(p + 1) * I8_PANEL * kp];
                    for (c, v) in row.chunks(16).enumerate() {
                        let at = c * 16 * I8_PANEL + r * 16;
                        panel[at..at + v.len()].copy_from_slice(v);
                    }
                    sums.push(row.iter().map(|&v| i32::from(v)).sum());
                }
                I8Panels::Narrow { panels, sums, kp }
            }
        };
        Self {
            panels,
            scale,
            zero,
            rows,
            cols,
        }
    }

    pub fn kind(&self) -> I8Kind {
        match self.panels {
            I8Panels::Wide(_) => I8Kind::Wide,
            I8Panels::Narrow { .. } => I8Kind::Narrow,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `j`, dequantized, appended to `out`.
    pub fn row_into(&self, j: usize, out: &mut Vec<f32>) {
        let (p, r, k) = (j / I8_PANEL, j % I8_PANEL, self.cols);
        let (s, z) = (self.scale[j], self.zero[j]);
        let value = |v: f32| (v - z) * s;
        match &self.panels {
            I8Panels::Wide(panels) => {
                let panel = &panels[p * I8_PANEL * k..(p + 1) * I8_PANEL * k];
                for c in panel.chunks_exact(8 * I8_PANEL) {
                    out.extend(c[r * 8..r * 8 + 8].iter().map(|&v| value(f32::from(v))));
                }
            }
            I8Panels::Narrow { panels, kp, .. } => {
                let panel = &panels[p * I8_PANEL * kp..(p + 1) * I8_PANEL * kp];
                for (i, c) in panel.chunks_exact(16 * I8_PANEL).enumerate() {
                    let n = 16.min(k - i * 16);
                    out.extend(c[r * 16..r * 16 + n].iter().map(|&v| value(f32::from(v))));
                }
            }
        }
    }

    /// `x (m × cols) · selfᵀ (+ bias) → (m × rows)` on a chosen kernel.
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
    ) -> Vec<f32> {
        let mut ys = Self::products_with(kernel, &[(self, Out::plain(bias))], x, m);
        ys.pop().unwrap_or_default()
    }

    /// Several int8 matrices of the same width and kind applied to the same `x (m × cols)`,
    /// each with its [`Out`]: `x` quantized once, one pass over the pool. `(m × rows)` per
    /// matrix.
    pub fn products(parts: &[(&Self, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        Self::products_with(Kernel::best(), parts, x, m)
    }

    /// [`Self::products`] on a chosen kernel.
    pub fn products_with(
        kernel: Kernel,
        parts: &[(&Self, Out)],
        x: &[f32],
        m: usize,
    ) -> Vec<Vec<f32>> {
        let shapes: Vec<_> = parts.iter().map(|(d, o)| (d.rows, d.cols, *o)).collect();
        let (mut ys, plan) = Plan::new(&shapes, x, m, I8_PANEL, "int8");
        let Some(plan) = plan else {
            return ys;
        };
        let kind = parts[0].0.kind();
        assert!(
            parts.iter().all(|(d, _)| d.kind() == kind),
            "int8: parts of one kind"
        );
        let (k, outs, starts) = (plan.k, plan.outs(&mut ys), &plan.starts);
        let scratch: TileI8 = [[0; I8_PANEL]; 4];
        let gelu = |i: usize, t: usize, gps: Range<usize>| plan.gelu(&shapes, &outs, i..i + t, gps);
        match kind {
            I8Kind::Wide => {
                let (xq, sx, sum) = quantize_rows(x, k);
                for_each_tile(
                    m,
                    starts[parts.len()],
                    I8_PANEL * k * 2,
                    kernel.mr_i8(),
                    plan.macs / 2,
                    scratch,
                    |part_sums, i, t, gp| {
                        let (part, p) = locate(starts, gp);
                        let (d, o) = &parts[part];
                        let I8Panels::Wide(panels) = &d.panels else {
                            return;
                        };
                        let panel = &panels[p * I8_PANEL * k..(p + 1) * I8_PANEL * k];
                        let total = sum_chunks(t, k, part_sums, |k0, kc, out| {
                            let xt = &xq[i * k + k0..(i + t - 1) * k + k0 + kc];
                            let pc = &panel[k0 * I8_PANEL..(k0 + kc) * I8_PANEL];
                            kernel.tile_i8(t, xt, k, kc, pc, out);
                        });
                        for (r, sums) in total.iter().enumerate().take(t) {
                            let row = i + r;
                            // SAFETY: for_each_tile visits each (row, panel) pair once.
                            unsafe {
                                d.store_row(o, &outs[part], row, p, |j, c| {
                                    d.scale[j] * (sx[row] * sums[c] as f32 - d.zero[j] * sum[row])
                                })
                            };
                        }
                    },
                    gelu,
                );
            }
            I8Kind::Narrow => {
                let kp = k.next_multiple_of(16);
                let (xq, act) = quantize_rows_u7(x, k, kp);
                for_each_tile(
                    m,
                    starts[parts.len()],
                    I8_PANEL * kp,
                    kernel.mr_u7(),
                    plan.macs / 4,
                    scratch,
                    |part_sums, i, t, gp| {
                        let (part, p) = locate(starts, gp);
                        let (d, o) = &parts[part];
                        let I8Panels::Narrow { panels, sums, .. } = &d.panels else {
                            return;
                        };
                        let panel = &panels[p * I8_PANEL * kp..(p + 1) * I8_PANEL * kp];
                        let total = sum_chunks(t, kp, part_sums, |k0, kc, out| {
                            let xt = &xq[i * kp + k0..(i + t - 1) * kp + k0 + kc];
                            let pc = &panel[k0 * I8_PANEL..(k0 + kc) * I8_PANEL];
                            kernel.tile_u7(t, xt, kp, kc, pc, out);
                        });
                        for (r, qv) in total.iter().enumerate().take(t) {
                            let (row, a) = (i + r, act[i + r]);
                            // SAFETY: for_each_tile visits each (row, panel) pair once.
                            unsafe {
                                d.store_row(o, &outs[part], row, p, |j, c| {
                                    // Σ (q − zx)(v − zero) = Σ q v − zx Σ v − zero Σ (q − zx),
                                    // the integer part exact.
                                    let qz = qv[c] - i64::from(a.zero) * i64::from(sums[j]);
                                    let dot = qz as f64 - f64::from(d.zero[j]) * a.centred as f64;
                                    (f64::from(d.scale[j]) * f64::from(a.scale) * dot) as f32
                                })
                            };
                        }
                    },
                    gelu,
                );
            }
        }
        ys
    }

    /// Stores row `row`'s outputs of panel `p`: `value(j, c)` for the panel's columns
    /// `j = 4p + c`, then `o`'s bias and residual.
    ///
    /// # Safety
    /// No other thread writes or reads these outputs meanwhile (each (row, panel) pair is
    /// stored once, by the work item that computed it), and `out` outlives the call.
    #[inline]
    unsafe fn store_row(
        &self,
        o: &Out,
        out: &SharedOut,
        row: usize,
        p: usize,
        value: impl Fn(usize, usize) -> f32,
    ) {
        let (n, j0) = (self.rows, p * I8_PANEL);
        let w = I8_PANEL.min(n - j0);
        let mut v = [0f32; I8_PANEL];
        for (c, v) in v.iter_mut().enumerate().take(w) {
            *v = value(j0 + c, c);
        }
        // SAFETY: the caller's contract; the columns j0..j0 + w of the row lie inside.
        let dst = unsafe { out.part(row * n + j0, w) };
        o.store(dst, v, row, j0, n);
    }
}

/// The exact sums of a row tile (`t` rows) with one panel over `k` values, from kernel calls
/// over chunks of at most [`I8_KC`] values (`kernel(k0, kc, out)`), so that no i32 lane
/// overflows.
#[inline]
fn sum_chunks(
    t: usize,
    k: usize,
    part: &mut TileI8,
    mut kernel: impl FnMut(usize, usize, &mut TileI8),
) -> TileI8 {
    let mut total = [[0i64; I8_PANEL]; 4];
    for k0 in (0..k).step_by(I8_KC) {
        kernel(k0, (k - k0).min(I8_KC), part);
        for (tr, pr) in total.iter_mut().zip(part.iter()).take(t) {
            for (a, b) in tr.iter_mut().zip(pr) {
                *a += b;
            }
        }
    }
    total
}

/// Calls `tile(scratch, i, t, p)` once for every row tile (rows `i..i + t`, `t ≤ mr`) and
/// panel `p` of an `m`-row product, and `done(i, t, panels)` once a row tile has met every
/// panel of a block (those outputs are then final), with `n_panels` panels of `panel_bytes` each: work items of
/// [`ROW_BLOCK`] rows × the panels that fit [`PANEL_BLOCK_BYTES`], over the pool. Within an
/// item each row tile (in L1) meets every panel of the block (in L2). Each work item range
/// gets its own copy of `scratch` (the kernel's result tile).
#[allow(clippy::too_many_arguments)]
fn for_each_tile<S: Copy + Send + Sync>(
    m: usize,
    n_panels: usize,
    panel_bytes: usize,
    mr: usize,
    work: usize,
    scratch: S,
    tile: impl Fn(&mut S, usize, usize, usize) + Sync,
    done: impl Fn(usize, usize, Range<usize>) + Sync,
) {
    let per_block = (PANEL_BLOCK_BYTES / panel_bytes.max(1)).clamp(1, n_panels.max(1));
    let (row_blocks, panel_blocks) = (m.div_ceil(ROW_BLOCK), n_panels.div_ceil(per_block));
    pool::for_chunks(row_blocks * panel_blocks, work, |items| {
        let mut scratch = scratch;
        for item in items {
            let (rb, pb) = (item / panel_blocks, item % panel_blocks);
            let rows = rb * ROW_BLOCK..((rb + 1) * ROW_BLOCK).min(m);
            let panels = pb * per_block..((pb + 1) * per_block).min(n_panels);
            let mut i = rows.start;
            while i < rows.end {
                let t = (rows.end - i).min(mr);
                for p in panels.clone() {
                    tile(&mut scratch, i, t, p);
                }
                done(i, t, panels.clone());
                i += t;
            }
        }
    });
}

/// Each row of `x` (rows of `k`) as 16-bit integers with one scale (`amax / 32767`), that
/// scale, and the sum of the rounded row times it: the zero term of [`I8Matrix`] then cancels
/// the rounding's share of the uncentred `v`, leaving an error in proportion to `v − zero`,
/// the weight itself. A row holding NaN or ±∞ gets a NaN scale. Eight lanes throughout, so
/// that it vectorises (this pass ran as long as the products in wasm when it was scalar).
fn quantize_rows(x: &[f32], k: usize) -> (Vec<i16>, Vec<f32>, Vec<f32>) {
    let m = x.len() / k.max(1);
    let mut xq = vec![0i16; m * k];
    let mut sx = vec![0f32; m];
    let mut sum = vec![0f32; m];
    let (sx_out, sum_out) = (SharedOut::new(&mut sx), SharedOut::new(&mut sum));
    // A value's quantization takes about as long as 16 of the kernel's multiply-adds.
    pool::for_rows(&mut xq, k, (m * k).saturating_mul(16), |i, q| {
        let (s, total) = quantize_row(&x[i * k..(i + 1) * k], q);
        // SAFETY: for_rows hands each row to one item, so row i's scale and sum are written
        // here alone; both vectors hold m values and outlive the call.
        unsafe {
            sx_out.part(i, 1)[0] = s;
            sum_out.part(i, 1)[0] = total;
        }
    });
    (xq, sx, sum)
}

/// One row of [`quantize_rows`] into `q`: its scale and the rounded row's sum times it.
fn quantize_row(row: &[f32], q: &mut [i16]) -> (f32, f32) {
    let Some((lo, hi)) = row_range(row) else {
        return (f32::NAN, 0.0);
    };
    let amax = hi.max(-lo);
    if amax == 0.0 {
        return (0.0, 0.0);
    }
    let sx = amax / 32767.0;
    let inv = 32767.0 / amax;
    for (q, &v) in q.iter_mut().zip(row) {
        *q = nearest(v * inv, 0.0) as i16;
    }
    let total: i32 = q.iter().map(|&q| i32::from(q)).sum();
    (sx, (f64::from(sx) * f64::from(total)) as f32)
}

/// A row's smallest and largest values, the range stretched to hold 0, or `None` when it
/// holds NaN or ±∞. Eight lanes throughout, so that it vectorises (the quantization ran as
/// long as the products in wasm when it was scalar).
fn row_range(row: &[f32]) -> Option<(f32, f32)> {
    let (mut lo, mut hi, mut all) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    let (chunks, rest) = row.split_at(row.len() / 8 * 8);
    for c in chunks.chunks_exact(8) {
        for l in 0..8 {
            lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
            hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
            all[l] += c[l];
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        lo[l] = if v < lo[l] { v } else { lo[l] };
        hi[l] = if v > hi[l] { v } else { hi[l] };
        all[l] += v;
    }
    if !all.iter().sum::<f32>().is_finite() {
        return None;
    }
    Some((
        lo.iter().fold(0f32, |a, &b| a.min(b)),
        hi.iter().fold(0f32, |a, &b| a.max(b)),
    ))
}

/// `v + plus` (`plus` a whole number) rounded to the nearest integer (ties to even) for
/// |v + plus| < 2²²: adding 1.5·2²³ leaves the integer in the low bits of the float's
/// representation (`round` is a libm call per value in wasm). `plus` goes into that constant
/// first, exactly.
#[inline(always)]
fn nearest(v: f32, plus: f32) -> i32 {
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: i32 = 0x4B40_0000;
    (v + (plus + ROUND)).to_bits() as i32 - ROUND_BITS
}

/// One activation row of the `Narrow` int8 product: `x ≈ scale · (q − zero)`, and
/// `centred = Σ (q − zero)` over the row's values.
#[derive(Clone, Copy, Default)]
struct RowQ7 {
    scale: f32,
    zero: i32,
    centred: i64,
}

/// Each row of `x` (rows of `k`) as 7-bit values (0..=127) over its range stretched to hold
/// 0 (so that the zero point is a whole value in range and 0.0 exact), in rows of `kp ≥ k`
/// (the tail 0: its weights are 0), and each row's [`RowQ7`]. A row holding NaN or ±∞ gets a
/// NaN scale.
fn quantize_rows_u7(x: &[f32], k: usize, kp: usize) -> (Vec<u8>, Vec<RowQ7>) {
    let m = x.len() / k.max(1);
    let mut xq = vec![0u8; m * kp];
    let mut rows = vec![RowQ7::default(); m];
    let rows_out = SharedOut::new(&mut rows);
    pool::for_rows(&mut xq, kp, (m * k).saturating_mul(16), |i, q| {
        let r = quantize_row_u7(&x[i * k..(i + 1) * k], &mut q[..k]);
        // SAFETY: for_rows hands each row to one item, so row i's entry is written here
        // alone; the vector holds m entries and outlives the call.
        unsafe { rows_out.part(i, 1)[0] = r };
    });
    (xq, rows)
}

/// One row of [`quantize_rows_u7`] into `q`.
fn quantize_row_u7(row: &[f32], q: &mut [u8]) -> RowQ7 {
    let Some((lo, hi)) = row_range(row) else {
        return RowQ7 {
            scale: f32::NAN,
            ..RowQ7::default()
        };
    };
    if hi - lo == 0.0 {
        q.fill(0);
        return RowQ7::default();
    }
    let inv = 127.0 / (hi - lo);
    let zero = (-lo * inv).round().clamp(0.0, 127.0);
    // Clamped, since hi may round to 128.
    for (q, &v) in q.iter_mut().zip(row) {
        *q = nearest(v * inv, zero).clamp(0, 127) as u8;
    }
    let total: i64 = q.iter().map(|&q| i64::from(q)).sum();
    let zero = zero as i32;
    RowQ7 {
        scale: (hi - lo) / 127.0,
        zero,
        centred: total - i64::from(zero) * row.len() as i64,
    }
}

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
            d.matmul_with(Kernel::best(), &x, m, None),
            d.matmul_with(Kernel::Portable, &x, m, None),
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
                q.matmul_with(Kernel::best(), &x, m, None),
                q.matmul_with(Kernel::Portable, &x, m, None),
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
            |what: &str, mr: fn(Kernel) -> usize, tile: &dyn Fn(Kernel, usize, &mut TileI8)| {
                let (mut a, mut b) = ([[0i64; I8_PANEL]; 4], [[0i64; I8_PANEL]; 4]);
                for t in 1..=mr(Kernel::best()).min(mr(Kernel::Portable)) {
                    tile(Kernel::best(), t, &mut a);
                    tile(Kernel::Portable, t, &mut b);
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
        same("7-bit", Kernel::mr_u7, &|kn, t, out| {
            kn.tile_u7(t, &x7, k, k, &panel8, out)
        })?;
        same("16-bit", Kernel::mr_i8, &|kn, t, out| {
            kn.tile_i8(t, &x16, k, k, &panel16, out)
        })?;
    }
    Ok(compared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(rng: &mut crate::rng::Rng, n: usize) -> Vec<f32> {
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
                let best = q.matmul_with(Kernel::best(), &x, m, Some(&b));
                let portable = q.matmul_with(Kernel::Portable, &x, m, Some(&b));
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
}
