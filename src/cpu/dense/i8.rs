//! Int8 matrices with a scale and zero point per row (an int8 ONNX export's, kept as
//! stored), packed in panels as the build's kernel reads them ([`I8Kind`]), and their exact
//! integer products with quantized activation rows.

use super::dispatch;
use super::plan::{for_each_tile, locate, Out, Plan};
use super::tile::{TileI8, I8_PANEL};
use crate::cpu::isa::Isa;
use crate::cpu::pool::{self, SharedOut};
use std::ops::Range;

/// Values of `k` per int8 kernel call, so that its i32 lanes cannot overflow.
pub(super) const I8_KC: usize = 2048;

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
    pub fn matmul_with(&self, isa: Isa, x: &[f32], m: usize, bias: Option<&[f32]>) -> Vec<f32> {
        let mut ys = Self::products_with(isa, &[(self, Out::plain(bias))], x, m);
        ys.pop().unwrap_or_default()
    }

    /// Several int8 matrices of the same width and kind applied to the same `x (m × cols)`,
    /// each with its [`Out`]: `x` quantized once, one pass over the pool. `(m × rows)` per
    /// matrix.
    pub fn products(parts: &[(&Self, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        Self::products_with(Isa::best(), parts, x, m)
    }

    /// [`Self::products`] on a chosen kernel.
    pub fn products_with(isa: Isa, parts: &[(&Self, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
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
                    dispatch::mr_i8(isa),
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
                            dispatch::tile_i8(isa, t, xt, k, kc, pc, out);
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
                    dispatch::mr_u7(isa),
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
                            dispatch::tile_u7(isa, t, xt, kp, kc, pc, out);
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
