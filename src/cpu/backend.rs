//! The CPU backend: [`Backend`]'s operations on [`Act`] and [`CpuWeight`]. Products go to
//! the dense and int8 kernels (over the pool's threads), attention to attention/;
//! norms, RoPE and the gated activations are here, on the helpers of ops/.

use super::attention::{self, KvCache};
use super::load::load_cpu_weight;
use super::tensor::{Act, CpuWeight};
use super::{dense, int8, ops, pool};
use crate::backend::{AttnParams, Backend, KvRows, Rope, Then};
use crate::config::Glu;
use crate::error::{Error, Result};
use crate::gguf::{now, ByteSource, SyncReads, TensorInfo};
use crate::logits::TokenMask;

/// The CPU backend.
#[derive(Default)]
pub struct CpuBackend {
    /// The cos/sin tables last made, by angles and positions: every layer of a step turns q
    /// and k at the same positions, with one of a model's one or two embeddings (Gemma 3:
    /// local and global), so each table is made once a step, not twice a layer.
    pub(super) rope_tables: Vec<RopeTable>,
    /// Natively: load the types the 8-bit path takes as the file's blocks ([`super::q8`]).
    fast: bool,
}

pub(super) struct RopeTable {
    theta: Vec<f64>,
    pos: Vec<usize>,
    cs: Vec<(f32, f32)>,
}

/// Tables kept by [`CpuBackend`] (the oldest goes first).
pub(super) const ROPE_TABLES: usize = 4;

/// `f(gate) * up` elementwise, over the pool (`f` inlined, so that a run vectorises).
fn glu_with(gate: &Act, up: &Act, f: impl Fn(f32) -> f32 + Sync) -> Act {
    let mut data = vec![0f32; gate.data.len()];
    let out = pool::SharedOut::new(&mut data);
    let n = gate.data.len();
    // A value's inlined exp costs about as much as 8 of the kernels' multiply-adds (a
    // decode step's 2 048 values stay on the calling thread).
    pool::for_chunks(n.div_ceil(GLU_CHUNK), n.saturating_mul(8), |items| {
        let r = items.start * GLU_CHUNK..(items.end * GLU_CHUNK).min(n);
        // SAFETY: the item ranges are disjoint, so these values are this item's alone,
        // inside `data`, which outlives `for_chunks`.
        let o = unsafe { out.part(r.start, r.len()) };
        for ((o, &g), &u) in o.iter_mut().zip(&gate.data[r.clone()]).zip(&up.data[r]) {
            *o = f(g) * u;
        }
    });
    Act {
        data,
        width: gate.width,
    }
}

/// Every part's weight as the one kind `pick` takes, each with its `Out`; `None` when a part
/// is of another kind.
fn all_of<'w, 'o, T>(
    parts: &[(&'w CpuWeight, dense::Out<'o>)],
    pick: impl Fn(&'w CpuWeight) -> Option<&'w T>,
) -> Option<Vec<(&'w T, dense::Out<'o>)>> {
    parts
        .iter()
        .map(|&(w, o)| pick(w).map(|t| (t, o)))
        .collect()
}

/// Values per work item of [`glu_with`].
const GLU_CHUNK: usize = 512;

impl CpuBackend {
    /// `x @ wᵀ` for each part, its bias added to the finished sums, then its post-step.
    /// Parts that are all of one kind (float matrices, an ONNX export's int8 rows, or
    /// quantized matrices) go in one pass over the pool, `x` prepared once; a mix goes one
    /// part at a time.
    fn products(&mut self, x: &Act, parts: &[(&CpuWeight, dense::Out)]) -> Result<Vec<Act>> {
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let m = x.n_tok();
        let mut widths = Vec::with_capacity(parts.len());
        for (w, o) in parts {
            let (rows, cols) = match w {
                CpuWeight::Dense(d) => (d.rows(), d.cols()),
                CpuWeight::DenseI8(d) => (d.rows(), d.cols()),
                CpuWeight::Int8(q) => (q.rows, q.cols),
                #[cfg(not(target_arch = "wasm32"))]
                CpuWeight::Blocks(q) => (q.rows, q.cols),
                CpuWeight::Vector(_) => {
                    return Err(Error::Backend("matmul weight is not a matrix".into()))
                }
            };
            if x.width != cols {
                return Err(Error::Backend(format!(
                    "matmul: input width {} ≠ weight columns {cols}",
                    x.width
                )));
            }
            if let Some(b) = o.bias.filter(|b| b.len() != rows) {
                return Err(Error::Backend(format!(
                    "linear: a bias of {} for {rows} outputs",
                    b.len()
                )));
            }
            if let dense::Post::Add(r) = o.post {
                if r.len() != m * rows {
                    return Err(Error::Backend(format!(
                        "linear: a residual of {} values for {m} × {rows}",
                        r.len()
                    )));
                }
            }
            widths.push(rows);
        }
        let acts = |ys: Vec<Vec<f32>>| -> Vec<Act> {
            ys.into_iter()
                .zip(&widths)
                .map(|(data, &width)| Act { data, width })
                .collect()
        };
        if let Some(d) = all_of(parts, |w| match w {
            CpuWeight::Dense(d) => Some(d),
            _ => None,
        }) {
            return Ok(acts(dense::DenseMatrix::products(&d, &x.data, m)));
        }
        if let Some(d) = all_of(parts, |w| match w {
            CpuWeight::DenseI8(d) => Some(d),
            _ => None,
        }) {
            return Ok(acts(dense::I8Matrix::products(&d, &x.data, m)));
        }
        if let Some(q) = all_of(parts, |w| match w {
            CpuWeight::Int8(q) => Some(q),
            _ => None,
        }) {
            return Ok(acts(int8::QMatrix::products(&q, &x.data, m)));
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(q) = all_of(parts, |w| match w {
            CpuWeight::Blocks(q) => Some(q),
            _ => None,
        }) {
            return Ok(acts(super::q8::BlockMatrix::products(&q, &x.data, m)));
        }
        let mut out = Vec::with_capacity(parts.len());
        for part in parts {
            out.extend(self.products(x, std::slice::from_ref(part))?);
        }
        Ok(out)
    }

    /// One product: `x @ wᵀ`, then `out`.
    fn product(&mut self, x: &Act, w: &CpuWeight, out: dense::Out) -> Result<Act> {
        let mut ys = self.products(x, &[(w, out)])?;
        ys.pop()
            .ok_or_else(|| Error::Backend("matmul: no output".into()))
    }

    /// A backend on the exact path.
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend on the 8-bit path where this build and CPU have it ([`super::q8`]), unless
    /// `exact`.
    pub fn with_exact(exact: bool) -> Self {
        #[cfg(not(target_arch = "wasm32"))]
        let fast = !exact && super::q8::available();
        #[cfg(target_arch = "wasm32")]
        let fast = {
            let _ = exact;
            false
        };
        Self {
            fast,
            ..Self::default()
        }
    }

    /// `8-bit` on the 8-bit path, else `16-bit`.
    pub fn activations(&self) -> &'static str {
        if self.fast {
            "8-bit"
        } else {
            "16-bit"
        }
    }

    /// The cos/sin table of `rope`'s angles at `pos`: kept from an earlier call, or made.
    fn rope_table(&mut self, pos: &[usize], rope: &Rope) -> &[(f32, f32)] {
        let at = match self
            .rope_tables
            .iter()
            .position(|t| t.pos == pos && t.theta == rope.theta)
        {
            Some(i) => i,
            None => {
                if self.rope_tables.len() == ROPE_TABLES {
                    self.rope_tables.remove(0);
                }
                self.rope_tables.push(RopeTable {
                    theta: rope.theta.clone(),
                    pos: pos.to_vec(),
                    cs: ops::rope_table(pos, &rope.theta),
                });
                self.rope_tables.len() - 1
            }
        };
        &self.rope_tables[at].cs
    }
}

/// A bias's values.
fn bias_vector(b: &CpuWeight) -> Result<&[f32]> {
    match b {
        CpuWeight::Vector(b) => Ok(b),
        _ => Err(Error::Backend("bias is not a vector".into())),
    }
}

impl Backend for CpuBackend {
    type Tensor = Act;
    type Weight = CpuWeight;
    type Kv = KvCache;

    fn load_weight(&mut self, info: &TensorInfo, src: &dyn ByteSource) -> Result<CpuWeight> {
        now(load_cpu_weight(info, &SyncReads(src), false, self.fast))?
    }

    /// In wasm a quarter of [`crate::backend::PREFILL_CHUNK`] on one thread, half on more: a
    /// step's activations (Gemma 3 270M: the feed-forward's 2048-wide rows, the quantized
    /// copies) stay in the tab's memory for good: 128 positions' ~4 MiB more than 64's, 64's
    /// ~1.6 MiB more than 32's. One thread in Chromium prefills as fast at 32 (131 tok/s
    /// either way: a weight row meets 8 activation tiles instead of 16); two threads lost 7%
    /// at 32 (221 → 205 tok/s, 4 pairs: a step's share of each thread halves, its
    /// synchronization does not). Natively, where memory is returned and prefill is measured
    /// against llama.cpp, the whole chunk.
    fn prompt_rows(&self) -> usize {
        if !cfg!(target_arch = "wasm32") {
            crate::backend::PREFILL_CHUNK
        } else if pool::threads() == 1 {
            crate::backend::PREFILL_CHUNK / 4
        } else {
            crate::backend::PREFILL_CHUNK / 2
        }
    }

    fn load_head(&mut self, info: &TensorInfo, src: &dyn ByteSource) -> Result<CpuWeight> {
        now(load_cpu_weight(info, &SyncReads(src), true, self.fast))?
    }

    async fn load_weight_async(
        &mut self,
        info: &TensorInfo,
        src: &dyn ByteSource,
        head: bool,
    ) -> Result<CpuWeight> {
        load_cpu_weight(info, src, head, self.fast).await
    }

    fn load_int8_weight(
        &mut self,
        info: &TensorInfo,
        scale: &[f32],
        zero: &[f32],
        src: &dyn ByteSource,
    ) -> Result<CpuWeight> {
        let values = crate::quant::int8_rows(info, scale, zero, src)?;
        let (rows, cols) = info.rows_cols();
        if !dense::I8Matrix::takes(cols) {
            // Rows the int8 layout does not take: as f32, exactly dequantized.
            let floats = crate::quant::dequantize_int8_rows(&values, scale, zero);
            return Ok(CpuWeight::Dense(dense::DenseMatrix::pack(
                &floats, rows, cols,
            )));
        }
        Ok(CpuWeight::DenseI8(dense::I8Matrix::pack(
            &values,
            scale.to_vec(),
            zero.to_vec(),
            rows,
            cols,
        )))
    }

    /// A fresh backend: the weights it will run are the loaded ones, shared read-only.
    fn fork(&self) -> Result<Self> {
        Ok(CpuBackend {
            fast: self.fast,
            ..CpuBackend::new()
        })
    }

    fn new_kv(&mut self, n_slots: usize, n_head_kv: usize, head_dim: usize) -> Result<KvCache> {
        Ok(KvCache::new(n_slots, n_head_kv * head_dim))
    }

    fn clear_kv(&mut self, kv: &mut KvCache) {
        kv.clear();
    }

    async fn save_kv(&mut self, kv: &KvCache, n_past: usize) -> Result<KvRows> {
        kv.save(n_past)
    }

    fn load_kv(&mut self, kv: &mut KvCache, rows: &KvRows, n_past: usize) -> Result<()> {
        kv.load(rows, n_past)
    }

    fn embed(&mut self, table: &CpuWeight, ids: &[u32], scale: f32) -> Result<Act> {
        if let CpuWeight::Int8(m) = table {
            return Ok(Act {
                data: m.rows_f32(ids, scale)?,
                width: m.cols,
            });
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let CpuWeight::Blocks(m) = table {
            return Ok(Act {
                data: m.rows_f32(ids, scale)?,
                width: m.cols,
            });
        }
        let (rows, cols) = match table {
            CpuWeight::Dense(d) => (d.rows(), d.cols()),
            CpuWeight::DenseI8(d) => (d.rows(), d.cols()),
            _ => return Err(Error::Backend("embedding table is not a matrix".into())),
        };
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= rows) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {rows} tokens"
            )));
        }
        let mut data = Vec::with_capacity(ids.len() * cols);
        for &id in ids {
            match table {
                CpuWeight::Dense(d) => d.row_into(id as usize, &mut data),
                CpuWeight::DenseI8(d) => d.row_into(id as usize, &mut data),
                _ => {}
            }
        }
        ops::scale(&mut data, scale);
        Ok(Act { data, width: cols })
    }

    fn rms_norm(&mut self, x: &Act, w: &CpuWeight, eps: f32) -> Result<Act> {
        let CpuWeight::Vector(w) = w else {
            return Err(Error::Backend("norm weight is not a vector".into()));
        };
        if w.is_empty() || !x.width.is_multiple_of(w.len()) {
            return Err(Error::Backend(format!(
                "rms_norm: width {} is not a multiple of {}",
                x.width,
                w.len()
            )));
        }
        let mut data = x.data.clone();
        ops::rms_norm(&mut data, w, eps);
        Ok(Act {
            data,
            width: x.width,
        })
    }

    fn matmul(&mut self, x: &Act, w: &CpuWeight) -> Result<Act> {
        self.product(x, w, dense::Out::plain(None))
    }

    fn matmuls(&mut self, x: &Act, ws: &[&CpuWeight]) -> Result<Vec<Act>> {
        let parts: Vec<_> = ws.iter().map(|&w| (w, dense::Out::plain(None))).collect();
        self.products(x, &parts)
    }

    fn linear(&mut self, x: &Act, w: &CpuWeight, b: &CpuWeight) -> Result<Act> {
        self.product(x, w, dense::Out::plain(Some(bias_vector(b)?)))
    }

    fn linear_then(
        &mut self,
        x: &Act,
        w: &CpuWeight,
        b: &CpuWeight,
        then: Then<'_, Act>,
    ) -> Result<Act> {
        let post = match then {
            Then::Gelu => dense::Post::Gelu,
            Then::Add(r) => dense::Post::Add(&r.data),
        };
        let out = dense::Out {
            bias: Some(bias_vector(b)?),
            post,
        };
        self.product(x, w, out)
    }

    fn linears(&mut self, x: &Act, layers: &[(&CpuWeight, &CpuWeight)]) -> Result<Vec<Act>> {
        let parts = layers
            .iter()
            .map(|&(w, b)| Ok((w, dense::Out::plain(Some(bias_vector(b)?)))))
            .collect::<Result<Vec<_>>>()?;
        self.products(x, &parts)
    }

    fn rope(&mut self, x: &Act, pos: &[usize], rope: &Rope) -> Result<Act> {
        let hd = rope.head_dim;
        if pos.len() != x.n_tok()
            || hd == 0
            || !x.width.is_multiple_of(hd)
            || rope.theta.len() * 2 != hd
        {
            return Err(Error::Backend("rope: shape mismatch".into()));
        }
        let mut data = x.data.clone();
        let cs = self.rope_table(pos, rope);
        ops::rope(&mut data, x.width, cs, rope);
        Ok(Act {
            data,
            width: x.width,
        })
    }

    fn attention(
        &mut self,
        q: &Act,
        k: &Act,
        v: &Act,
        kv: &mut KvCache,
        pos: &[usize],
        p: AttnParams,
    ) -> Result<Act> {
        attention::attend(q, k, v, kv, pos, p)
    }

    fn attention_branches(
        &mut self,
        q: &Act,
        k: &Act,
        v: &Act,
        kv: &KvCache,
        first: usize,
        lens: &[usize],
        p: AttnParams,
    ) -> Result<Act> {
        attention::attend_branches(q, k, v, kv, first, lens, p)
    }

    fn attention_packed(
        &mut self,
        q: &Act,
        k: &Act,
        v: &Act,
        lens: &[usize],
        p: AttnParams,
    ) -> Result<Act> {
        attention::attend_packed(q, k, v, lens, p)
    }

    fn layer_norm(&mut self, x: &Act, w: &CpuWeight, b: &CpuWeight, eps: f32) -> Result<Act> {
        let (CpuWeight::Vector(w), CpuWeight::Vector(b)) = (w, b) else {
            return Err(Error::Backend(
                "layer_norm: weight and bias must be vectors".into(),
            ));
        };
        if w.len() != x.width || b.len() != x.width {
            return Err(Error::Backend(format!(
                "layer_norm: weight {} and bias {} on rows of {}",
                w.len(),
                b.len(),
                x.width
            )));
        }
        let mut data = x.data.clone();
        // A value's LayerNorm (f64 sums, two passes) takes about as long as 32 of the
        // dense kernel's multiply-adds.
        let work = data.len().saturating_mul(32);
        pool::for_rows(&mut data, x.width, work, |_, row| {
            ops::layer_norm(row, w, b, eps)
        });
        Ok(Act {
            data,
            width: x.width,
        })
    }

    fn gelu(&mut self, x: &Act) -> Result<Act> {
        let mut data = x.data.clone();
        for v in &mut data {
            *v = ops::gelu_erf(*v);
        }
        Ok(Act {
            data,
            width: x.width,
        })
    }

    fn glu(&mut self, gate: &Act, up: &Act, act: Glu) -> Result<Act> {
        if gate.data.len() != up.data.len() {
            return Err(Error::Backend("glu: shape mismatch".into()));
        }
        match act {
            Glu::GeluTanh => Ok(glu_with(gate, up, ops::gelu_tanh)),
            Glu::Silu => Ok(glu_with(gate, up, ops::silu)),
        }
    }

    fn add(&mut self, a: &Act, b: &Act) -> Result<Act> {
        if a.data.len() != b.data.len() {
            return Err(Error::Backend("add: shape mismatch".into()));
        }
        Ok(Act {
            data: a.data.iter().zip(&b.data).map(|(x, y)| x + y).collect(),
            width: a.width,
        })
    }

    fn add_bias(&mut self, x: &Act, bias: &CpuWeight) -> Result<Act> {
        let CpuWeight::Vector(b) = bias else {
            return Err(Error::Backend("bias is not a vector".into()));
        };
        if b.len() != x.width {
            return Err(Error::Backend(format!(
                "add_bias: a bias of {} on rows of {}",
                b.len(),
                x.width
            )));
        }
        let mut data = x.data.clone();
        for row in data.chunks_exact_mut(x.width) {
            for (v, bi) in row.iter_mut().zip(b) {
                *v += bi;
            }
        }
        Ok(Act {
            data,
            width: x.width,
        })
    }

    fn rows(&mut self, x: &Act, start: usize, n: usize) -> Result<Act> {
        let s = start * x.width;
        let e = (start + n) * x.width;
        let data = x
            .data
            .get(s..e)
            .ok_or_else(|| Error::Backend("rows: out of range".into()))?
            .to_vec();
        Ok(Act {
            data,
            width: x.width,
        })
    }

    async fn read(&mut self, x: &Act) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    async fn top_k(&mut self, x: &Act, k: usize) -> Result<Vec<(u32, f32)>> {
        let last = x.data.len().saturating_sub(x.width);
        Ok(crate::logits::top_k(&x.data[last..], k))
    }

    async fn head_top_k(
        &mut self,
        x: &Act,
        w: &CpuWeight,
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Result<Vec<(u32, f32)>> {
        if let (CpuWeight::Int8(q), Some(last)) = (w, x.data.len().checked_sub(x.width)) {
            if let Some(top) = q.top_k(&x.data[last..], k, allowed) {
                return Ok(top);
            }
        }
        crate::backend::head_top_k_of_logits(self, x, w, k, allowed).await
    }

    fn width(&self, x: &Act) -> usize {
        x.width
    }
}
