//! How a product's work is cut and where its outputs go: the bias and post-step of each
//! output ([`Out`], [`Post`]), the multi-part plan ([`Plan`]), and the walk over row tiles and
//! blocks of panels on the pool ([`for_each_tile`]).

use crate::cpu::pool::{self, SharedOut};
use std::ops::Range;

/// Activation rows per work item.
const ROW_BLOCK: usize = 64;
/// Bytes of panels per work item: the block stays in L2 while each row tile (≤ 8 × k
/// values, in L1) meets all of it.
const PANEL_BLOCK_BYTES: usize = 64 << 10;

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
            Post::Gelu => crate::cpu::ops::gelu_erf(v),
            Post::Add(r) => v + r[i * n + j],
        }
    }
}

/// What a multi-part product sets up before its pass: the shared width `k`, the
/// multiply-adds, and each part's first global panel (`panel` rows each; the total at the
/// end).
pub struct Plan {
    pub k: usize,
    pub macs: usize,
    pub panel: usize,
    pub starts: Vec<usize>,
}

impl Plan {
    /// Zeroed outputs (`m × rows` per part `(rows, cols, out)`), and the plan, or `None` when
    /// there is nothing to compute. Asserts the shapes (the CPU backend checks them first and
    /// returns typed errors): one width, `x` of `m` rows of it, biases and residuals that fit.
    pub fn new(
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
    pub fn outs(&self, ys: &mut [Vec<f32>]) -> Vec<SharedOut> {
        ys.iter_mut().map(|y| SharedOut::new(y)).collect()
    }

    /// GELU on the finished outputs of rows `rows` in global panels `gps`, for each part
    /// whose post is [`Post::Gelu`].
    pub fn gelu(
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
                    *v = crate::cpu::ops::gelu_erf(*v);
                }
            }
        }
    }
}

/// The part that global panel `gp` falls in, and its panel within that part.
#[inline]
pub fn locate(starts: &[usize], gp: usize) -> (usize, usize) {
    let part = starts[1..].iter().position(|&s| gp < s).unwrap_or(0);
    (part, gp - starts[part])
}

/// Calls `tile(scratch, i, t, p)` once for every row tile (rows `i..i + t`, `t ≤ mr`) and
/// panel `p` of an `m`-row product, and `done(i, t, panels)` once a row tile has met every
/// panel of a block (those outputs are then final), with `n_panels` panels of `panel_bytes` each: work items of
/// [`ROW_BLOCK`] rows × the panels that fit [`PANEL_BLOCK_BYTES`], over the pool. Within an
/// item each row tile (in L1) meets every panel of the block (in L2). Each work item range
/// gets its own copy of `scratch` (the kernel's result tile).
#[allow(clippy::too_many_arguments)]
pub fn for_each_tile<S: Copy + Send + Sync>(
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
