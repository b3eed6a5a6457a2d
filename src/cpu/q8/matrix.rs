//! [`BlockMatrix`]: a quantized matrix held as the file's blocks, its load (the tensor's
//! bytes read straight into place: the file's size in memory, no repacking) and its
//! products with activation rows over the pool.

use super::act::{ActRow, Q8Rows};
use super::kind::Kind;
use crate::cpu::dense::Out;
use crate::cpu::pool::{self, SharedOut};
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType};
use std::ops::Range;

/// A `rows × cols` matrix of `kind` blocks, row after row, as in the file.
pub struct BlockMatrix {
    pub kind: Kind,
    pub rows: usize,
    pub cols: usize,
    data: Vec<u8>,
    row_bytes: usize,
}

/// Weight rows per work item of a prompt's product (each row meets all activation rows).
const ROW_CHUNK: usize = 16;
/// Weight rows a prompt's tile takes with four activation rows (each activation block read
/// from L2 once for them): Q8_0 and Q5_0 products on 64 rows ran 1.4 to 1.7 times as fast
/// as with one weight row (38 against 23 GMAC/s), Q4_K 1.05 times; two rows were slower
/// than four.
const PREFILL_ROWS: usize = 4;
/// Weight rows per work item of a one-row product.
const ONE_ROW_CHUNK: usize = 32;

impl BlockMatrix {
    /// Whether the 8-bit path takes a `ty` matrix of `cols` columns (whole blocks a row).
    pub fn takes(ty: GgmlType, cols: usize) -> bool {
        Kind::of(ty).is_some_and(|k| cols > 0 && cols.is_multiple_of(k.block_len()))
    }

    /// Bytes it holds for `n` values of `ty` in rows of `cols`: the file's.
    pub fn resident_bytes(ty: GgmlType, cols: u64, n: u64) -> Option<u64> {
        let k = Kind::of(ty)?;
        let bl = k.block_len() as u64;
        (cols > 0 && cols.is_multiple_of(bl))
            .then(|| (n / bl).saturating_mul(k.block_bytes() as u64))
    }

    /// The tensor at `offset` (`rows × cols` of `ty`, which [`BlockMatrix::takes`]) read
    /// straight into its place.
    pub async fn load(
        src: &dyn ByteSource,
        offset: u64,
        rows: usize,
        cols: usize,
        ty: GgmlType,
    ) -> Result<Self> {
        let kind = Kind::of(ty)
            .filter(|k| cols > 0 && cols.is_multiple_of(k.block_len()))
            .ok_or_else(|| {
                Error::Backend(format!(
                    "the 8-bit path does not take {ty:?} rows of {cols}"
                ))
            })?;
        let row_bytes = cols / kind.block_len() * kind.block_bytes();
        let n = rows
            .checked_mul(row_bytes)
            .ok_or_else(|| Error::Config(format!("a {rows} × {cols} tensor is too large")))?;
        let mut data = Vec::new();
        data.try_reserve_exact(n)
            .map_err(|_| Error::Backend(format!("no memory for a {n}-byte tensor")))?;
        data.resize(n, 0);
        src.read_at_async(offset, &mut data).await?;
        Ok(Self::from_bytes(kind, rows, cols, data))
    }

    /// A matrix of `rows` rows of `cols` values from its blocks.
    pub fn from_bytes(kind: Kind, rows: usize, cols: usize, data: Vec<u8>) -> Self {
        let row_bytes = cols / kind.block_len() * kind.block_bytes();
        assert!(
            cols.is_multiple_of(kind.block_len()) && data.len() == rows * row_bytes,
            "BlockMatrix: {} bytes for {rows} × {cols} {kind:?}",
            data.len()
        );
        Self {
            kind,
            rows,
            cols,
            data,
            row_bytes,
        }
    }

    /// Bytes held (the file's).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub(super) fn row_blocks(&self, r: usize) -> &[u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Rows `ids` dequantized and scaled by `scale` (an embedding table's lookup).
    pub fn rows_f32(&self, ids: &[u32], scale: f32) -> Result<Vec<f32>> {
        let mut out = vec![0f32; ids.len() * self.cols];
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            let r = id as usize;
            if r >= self.rows {
                return Err(Error::InvalidArgument(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    self.rows
                )));
            }
            self.kind.dequantize(self.row_blocks(r), o);
            if scale != 1.0 {
                o.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(out)
    }

    /// `x (m × cols) @ selfᵀ → (m × rows)`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut ys = Self::products(&[(self, Out::plain(None))], x, m);
        ys.pop().unwrap_or_default()
    }

    /// `x (m × cols) @ wᵀ` for every part `(w, out)`, each finished by its `out`, in one pass
    /// over the pool; `x` is quantized once per activation kind the parts take.
    pub fn products(parts: &[(&BlockMatrix, Out)], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        let Some((first, _)) = parts.first() else {
            return Vec::new();
        };
        let k = first.cols;
        assert!(
            parts.iter().all(|(w, _)| w.cols == k) && x.len() == m * k && k.is_multiple_of(32),
            "BlockMatrix::products: every part takes x's width"
        );
        // x on each grid its parts take (both only where 32-value types and K-quants share x).
        let quantized = |kq: bool| {
            parts
                .iter()
                .any(|(w, _)| w.kind.k_activations() == kq)
                .then(|| Q8Rows::quantize(x, m, k, kq))
        };
        let (flat, two_level) = (quantized(false), quantized(true));
        let mut ys: Vec<Vec<f32>> = parts.iter().map(|(w, _)| vec![0f32; m * w.rows]).collect();
        let outs: Vec<SharedOut> = ys.iter_mut().map(|y| SharedOut::new(y)).collect();
        let chunk = if m == 1 { ONE_ROW_CHUNK } else { ROW_CHUNK };
        let rows: Vec<usize> = parts.iter().map(|(w, _)| w.rows).collect();
        let work = parts.iter().fold(0usize, |a, (w, _)| {
            a.saturating_add(m.saturating_mul(w.rows).saturating_mul(k))
        });
        pool::for_part_chunks(&rows, chunk, work, |p, c| {
            let (w, out) = &parts[p];
            let act = if w.kind.k_activations() {
                &two_level
            } else {
                &flat
            };
            // Quantized for every kind among the parts.
            let Some(act) = act.as_ref() else { return };
            if m == 1 {
                // Item c: tiles c·chunk/4.. of the whole matrix (as many items as chunks of
                // rows); the last one also takes the rows after the quarters.
                let tiles = c.start * chunk / 4..(c.end * chunk / 4).min(w.rows / 4);
                // SAFETY: the items' tiles are disjoint, so are their rows (the rows after
                // the quarters go to the one range ending at the last tile), and outs[p]
                // outlives the pass.
                unsafe { w.quarters_into(act, tiles, &outs[p], out) };
            } else {
                let r = c.start * chunk..(c.end * chunk).min(w.rows);
                // SAFETY: outs[p] is part p's m × rows output, which outlives the pass, and
                // these rows are this item's alone.
                unsafe { w.rows_into(act, r, &outs[p], out) };
            }
        });
        ys
    }

    /// Output columns `rows` for every activation row, finished by `out` into `y`.
    ///
    /// # Safety
    /// `y` must hold `act.m × self.rows` values and outlive the call, and no other thread
    /// may touch columns `rows` of it meanwhile.
    unsafe fn rows_into(&self, act: &Q8Rows, rows: Range<usize>, y: &SharedOut, out: &Out) {
        let (m, n, rb) = (act.m, self.rows, self.row_bytes);
        let mut j = rows.start;
        while j < rows.end {
            // PREFILL_ROWS weight rows a tile where they are left, else one.
            let wn = if rows.end - j >= PREFILL_ROWS {
                PREFILL_ROWS
            } else {
                1
            };
            let w = &self.data[j * rb..(j + wn) * rb];
            let mut i = 0;
            while i < m {
                let t = (m - i).min(4);
                let mut acc = [0f32; 16];
                let tile: [ActRow; 4] = std::array::from_fn(|r| act.row(i + r.min(t - 1)));
                if t == 4 || wn == 1 {
                    self.dot_tile(w, rb, wn, &tile, t, &mut acc);
                } else {
                    // Fewer than four activation rows left: each weight row alone.
                    for k in 0..wn {
                        let mut one = [0f32; 16];
                        self.dot_tile(&w[k * rb..(k + 1) * rb], rb, 1, &tile, t, &mut one);
                        acc[k * t..(k + 1) * t].copy_from_slice(&one[..t]);
                    }
                }
                for (k, &v) in acc.iter().enumerate().take(wn * t) {
                    let (jj, ii) = (j + k / t, i + k % t);
                    // SAFETY: (ii, jj) lies inside y, and column jj is this call's alone.
                    unsafe { y.set(ii * n + jj, out.finish(v, ii, jj, n)) };
                }
                i += t;
            }
            j += wn;
        }
    }

    /// A one-row product's tiles `tiles` (tile q: rows q, q + Q, q + 2Q, q + 3Q, Q a quarter
    /// of the rows: four memory streams at once), and the rows after the quarters where the
    /// range ends at the last tile.
    ///
    /// # Safety
    /// As [`BlockMatrix::rows_into`], for the rows of these tiles.
    unsafe fn quarters_into(&self, act: &Q8Rows, tiles: Range<usize>, y: &SharedOut, out: &Out) {
        let (rb, q) = (self.row_bytes, self.rows / 4);
        let x: [ActRow; 4] = std::array::from_fn(|_| act.row(0));
        let mut acc = [0f32; 16];
        for t in tiles.clone() {
            let w = &self.data[t * rb..(t + 3 * q) * rb + rb];
            self.dot_tile(w, q * rb, 4, &x, 1, &mut acc);
            for (k, &v) in acc.iter().enumerate().take(4) {
                let j = t + k * q;
                // SAFETY: row j is this tile's alone.
                unsafe { y.set(j, out.finish(v, 0, j, self.rows)) };
            }
        }
        // The one range that ends at the last tile and holds tiles (or the only one, with no
        // tiles at all): ranges clamped past the last tile are empty and end there too.
        if tiles.end == q && (tiles.start < q || q == 0) {
            for j in 4 * q..self.rows {
                self.dot_tile(&self.data[j * rb..(j + 1) * rb], rb, 1, &x, 1, &mut acc);
                // SAFETY: the rows after the quarters are this range's alone.
                unsafe { y.set(j, out.finish(acc[0], 0, j, self.rows)) };
            }
        }
    }

    /// Weight rows `w` (`wn` of them, `stride` bytes apart: 1, or 4 with `t` = 1) with
    /// activation rows `x[..t]` (t ≤ 4) into `acc[row · t + activation row]`.
    #[inline]
    fn dot_tile(
        &self,
        w: &[u8],
        stride: usize,
        wn: usize,
        x: &[ActRow; 4],
        t: usize,
        acc: &mut [f32; 16],
    ) {
        #[cfg(target_arch = "x86_64")]
        if super::available() {
            // SAFETY: the CPU has AVX2, FMA and F16C (`available`), and every row has this
            // matrix's width in whole blocks.
            unsafe { super::avx2::dot_tile(self.kind, w, self.row_bytes, stride, wn, x, t, acc) };
            return;
        }
        let rb = self.row_bytes;
        for k in 0..wn * t {
            let at = k / t * stride;
            acc[k] = self.kind.dot(&w[at..at + rb], &x[k % t]);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Random blocks of `kind` whose scales are finite and moderate.
    pub(crate) fn random_blocks(kind: Kind, rows: usize, cols: usize, seed: u64) -> BlockMatrix {
        let mut rng = Rng::new(seed);
        let nb = rows * cols / kind.block_len();
        let mut data = vec![0u8; nb * kind.block_bytes()];
        for b in data.chunks_exact_mut(kind.block_bytes()) {
            for v in b.iter_mut() {
                *v = (rng.next_u64() & 0xFF) as u8;
            }
            let f16 = |x: f32| half::f16::from_f32(x).to_bits().to_le_bytes();
            let d = f16(0.001 + 0.01 * (rng.next_u64() % 100) as f32 / 100.0);
            let at = if kind == Kind::Q6K { 208 } else { 0 };
            b[at..at + 2].copy_from_slice(&d);
            if kind == Kind::Q4K {
                b[2..4].copy_from_slice(&f16(0.002));
            }
        }
        BlockMatrix::from_bytes(kind, rows, cols, data)
    }

    pub(crate) fn random_x(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n)
            .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    const KINDS: [Kind; 5] = [Kind::Q4_0, Kind::Q5_0, Kind::Q8_0, Kind::Q4K, Kind::Q6K];

    #[test]
    fn the_simd_tiles_equal_the_scalar_dots() {
        let (rows, cols) = (7, 512);
        for kind in KINDS {
            let w = random_blocks(kind, rows, cols, 3);
            for m in [1, 2, 3, 4, 5, 9] {
                let x = random_x(m * cols, 5);
                let act = Q8Rows::quantize(&x, m, cols, kind.k_activations());
                let y = w.matmul(&x, m);
                for i in 0..m {
                    for j in 0..rows {
                        let want = kind.dot(w.row_blocks(j), &act.row(i));
                        let got = y[i * rows + j];
                        let tol = 1e-5 * (1.0 + want.abs()) + 1e-4 * want.abs().max(1.0);
                        assert!(
                            (got - want).abs() <= tol,
                            "{kind:?} m={m} ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_dots_are_close_to_the_dequantized_product() {
        // The 8-bit activations move a product by about a 127th of each block's largest
        // value: compare with the float product of the dequantized weights.
        let (rows, cols) = (5, 768);
        for kind in KINDS {
            let w = random_blocks(kind, rows, cols, 11);
            let x = random_x(cols, 13);
            let y = w.matmul(&x, 1);
            let mut row = vec![0f32; cols];
            for (j, &got) in y.iter().enumerate() {
                kind.dequantize(w.row_blocks(j), &mut row);
                let exact: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let scale: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from((a * b).abs()))
                    .sum();
                let err = (f64::from(got) - exact).abs();
                assert!(
                    err <= 0.02 * scale + 1e-6,
                    "{kind:?} row {j}: {} vs {exact} (Σ|wx| {scale})",
                    got
                );
            }
        }
    }

    #[test]
    fn bad_ids_are_an_error() {
        let w = random_blocks(Kind::Q8_0, 3, 64, 1);
        assert!(w.rows_f32(&[3], 1.0).is_err());
        assert_eq!(w.rows_f32(&[2], 1.0).unwrap().len(), 64);
    }
}
