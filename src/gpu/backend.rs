//! [`Backend`] on the GPU: every op records a dispatch into one command encoder; `read`
//! submits it and reads the result back. The forward pass is the same generic model code as
//! on the CPU. Activations come from a pool, parameters and small inputs from one arena,
//! bind groups from a cache: a decode step of a shape seen before creates nothing.

use std::rc::Rc;

use super::kernels::attention::{
    AttnBuffers, AttnDispatch, BranchBuffers, GROUP_MAX, HEAD_DIM_MAX,
};
use super::kernels::elementwise::Op;
use super::kernels::embed;
use super::kernels::norm::NormParams;
use super::kernels::rope::RopeParams;
use super::kernels::topk::{TopKStage, TOPK_BLOCK};
use super::kernels::{Kernels, Pool, Recorder};
use super::weights::GpuWeight;
use super::{Gpu, GpuOptions};
use crate::backend::{AttnParams, Backend, KvRows, Rope};
use crate::config::Glu;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, TensorInfo};
use crate::logits::TokenMask;

/// Activations on the GPU: `n_tok` rows of `width` f32.
#[derive(Clone)]
pub struct GpuTensor {
    /// From the pool: free again when the last clone is dropped.
    buf: Rc<wgpu::Buffer>,
    pub n_tok: usize,
    pub width: usize,
}

impl GpuTensor {
    fn len(&self) -> usize {
        self.n_tok * self.width
    }
}

/// One layer's KV cache: `n_slots` rows of keys and values, and the position each slot
/// holds (-1: empty), written on the GPU.
pub struct GpuKv {
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    pos_buf: wgpu::Buffer,
    n_slots: usize,
    width: usize,
}

/// The most candidates the GPU top-k gives (more: the logits are read whole).
pub const TOPK_MAX: usize = 128;

pub struct GpuBackend {
    pub gpu: Gpu,
    k: Kernels,
    pub rec: Recorder,
    pool: Pool,
    /// Rotary cos/sin put in the arena (valid for the recording of their generation).
    rope_cs: Vec<RopeCs>,
    /// An output constraint's allowed-token bitmask, for the top-k (made at the first one).
    mask_buf: Option<std::rc::Rc<wgpu::Buffer>>,
}

/// Rotary cos/sin in the arena: for (first position, rows, the rope's key), the recorder
/// generation it was put in and its range.
struct RopeCs {
    /// Digest of the positions, their count, the rope's key.
    key: (u64, usize, u64),
    generation: u64,
    range: (u64, u64),
}

impl GpuBackend {
    /// Open a device and build every pipeline; `Ok(None)` when there is no adapter.
    pub async fn new(opts: &GpuOptions) -> Result<Option<Self>> {
        let Some(gpu) = Gpu::new(opts).await? else {
            return Ok(None);
        };
        let k = Kernels::new(&gpu)?;
        let rec = Recorder::new(&gpu);
        Ok(Some(Self {
            gpu,
            k,
            rec,
            pool: Pool::default(),
            rope_cs: Vec::new(),
            mask_buf: None,
        }))
    }

    /// Milliseconds spent recording commands so far.
    pub fn encode_ms(&self) -> f64 {
        self.rec.encode_ms
    }

    /// Bind groups created so far.
    pub fn bind_groups_created(&self) -> u64 {
        self.rec.bind_groups_created
    }

    /// Dispatches recorded so far.
    pub fn dispatches(&self) -> u64 {
        self.rec.dispatches
    }

    /// Bytes of activation buffers held by the pool.
    pub fn pool_bytes(&self) -> u64 {
        self.pool.bytes()
    }

    /// Activations from the CPU (`n_tok` rows of `width`).
    pub fn upload(&mut self, data: &[f32], n_tok: usize, width: usize) -> Result<GpuTensor> {
        if data.len() != n_tok * width {
            return Err(Error::Backend("upload: shape".into()));
        }
        // Submit what is recorded first: the queue write lands before the next submission.
        self.flush();
        let t = self.tensor(n_tok, width);
        self.gpu
            .queue
            .write_buffer(&t.buf, 0, &bytes_of(data, f32::to_le_bytes));
        Ok(t)
    }

    /// Take what was recorded (or a new encoder) for submission.
    fn take_enc(&mut self) -> wgpu::CommandEncoder {
        self.rec
            .take(&self.gpu)
            .unwrap_or_else(|| self.gpu.device.create_command_encoder(&Default::default()))
    }

    /// Submit what was recorded without waiting.
    fn flush(&mut self) {
        if let Some(enc) = self.rec.take(&self.gpu) {
            self.gpu.submit_later(enc);
        }
    }

    fn tensor(&mut self, n_tok: usize, width: usize) -> GpuTensor {
        GpuTensor {
            buf: self.pool.take(&self.gpu, (n_tok * width * 4) as u64),
            n_tok,
            width,
        }
    }

    /// Put `bytes` (a step's small input) into the arena, with room for `then` more bytes
    /// of parameters after it, so no submission falls between the two.
    fn put(&mut self, bytes: &[u8], then: u64) -> (u64, u64) {
        self.rec.reserve(&self.gpu, bytes.len() as u64 + then, 2);
        self.rec.put(bytes)
    }

    fn elementwise(&mut self, a: &GpuTensor, b: &GpuTensor, op: Op) -> Result<GpuTensor> {
        if a.len() != b.len() {
            return Err(Error::Backend(format!(
                "elementwise op on {}×{} and {}×{}",
                a.n_tok, a.width, b.n_tok, b.width
            )));
        }
        self.gpu.check()?;
        let out = self.tensor(a.n_tok, a.width);
        self.k.elementwise.encode(
            &self.gpu,
            &mut self.rec,
            op,
            &a.buf,
            &b.buf,
            &out.buf,
            a.len() as u32,
        );
        Ok(out)
    }

    /// `[res +] rms_norm(x, w)`.
    fn norm(
        &mut self,
        res: Option<&GpuTensor>,
        x: &GpuTensor,
        w: &GpuWeight,
        eps: f32,
    ) -> Result<GpuTensor> {
        let len = w.cols;
        if w.ty != GgmlType::F32 || w.rows != 1 || len == 0 || !x.len().is_multiple_of(len) {
            return Err(Error::Backend(format!(
                "rms_norm: weight {}×{} {} on rows of {}",
                w.rows, w.cols, w.ty, x.width
            )));
        }
        if res.is_some_and(|r| r.len() != x.len()) {
            return Err(Error::Backend("add_rms_norm: shapes differ".into()));
        }
        self.gpu.check()?;
        let out = self.tensor(x.n_tok, x.width);
        let p = NormParams {
            len: len as u32,
            n_groups: (x.len() / len) as u32,
            eps,
            add_residual: res.is_some(),
        };
        let res_buf = res.map_or(&x.buf, |r| &r.buf);
        self.k.rms_norm.encode(
            &self.gpu,
            &mut self.rec,
            &x.buf,
            &w.parts[0].buf,
            res_buf,
            &out.buf,
            p,
        );
        Ok(out)
    }
}

fn bytes_of<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// `q`, `k`, `v` have `n_tok` rows laid out as `p`'s heads (query heads a whole number of
/// groups per KV head): what every attention kernel assumes.
fn heads_fit(q: &GpuTensor, k: &GpuTensor, v: &GpuTensor, n_tok: usize, p: AttnParams) -> bool {
    let kv_w = p.n_head_kv * p.head_dim;
    q.width == p.n_head * p.head_dim
        && k.width == kv_w
        && v.width == kv_w
        && q.n_tok == n_tok
        && k.n_tok == n_tok
        && v.n_tok == n_tok
        && p.n_head_kv != 0
        && p.n_head.is_multiple_of(p.n_head_kv)
}

impl Backend for GpuBackend {
    type Tensor = GpuTensor;
    type Weight = GpuWeight;
    type Kv = GpuKv;

    fn load_weight(&mut self, info: &TensorInfo, src: &dyn ByteSource) -> Result<GpuWeight> {
        GpuWeight::load(&self.gpu, info, src)
    }

    fn new_kv(&mut self, n_slots: usize, n_head_kv: usize, head_dim: usize) -> Result<GpuKv> {
        let width = n_head_kv * head_dim;
        let bytes = (n_slots * width * 4) as u64;
        let mut kv = GpuKv {
            k: self.gpu.storage("k cache", bytes),
            v: self.gpu.storage("v cache", bytes),
            pos_buf: self.gpu.storage("kv pos", (n_slots * 4) as u64),
            n_slots,
            width,
        };
        self.clear_kv(&mut kv);
        Ok(kv)
    }

    fn clear_kv(&mut self, kv: &mut GpuKv) {
        self.k
            .attention
            .clear(&self.gpu, &mut self.rec, &kv.pos_buf, kv.n_slots as u32);
    }

    async fn save_kv(&mut self, kv: &GpuKv, n_past: usize) -> Result<KvRows> {
        let used = n_past.min(kv.n_slots);
        let enc = self.take_enc();
        let mut kvw = self
            .gpu
            .read_words(enc, &[&kv.k, &kv.v], used * kv.width)
            .await?;
        let enc = self.take_enc();
        let pos = self.gpu.read_words(enc, &[&kv.pos_buf], used).await?;
        let to_f32 = |w: Vec<u32>| w.into_iter().map(f32::from_bits).collect::<Vec<f32>>();
        let v = to_f32(kvw.pop().unwrap_or_default());
        let k = to_f32(kvw.pop().unwrap_or_default());
        let rows = KvRows {
            n_slots: kv.n_slots,
            width: kv.width,
            k,
            v,
        };
        let held = pos.first().map_or(&[][..], Vec::as_slice);
        if held.len() != used || (0..used).any(|s| held[s] as usize != rows.position(s, n_past)) {
            return Err(Error::Backend(format!(
                "the KV cache does not hold exactly {n_past} positions"
            )));
        }
        Ok(rows)
    }

    fn load_kv(&mut self, kv: &mut GpuKv, rows: &KvRows, n_past: usize) -> Result<()> {
        let used = rows.fit(kv.n_slots, kv.width, n_past)?;
        self.gpu.check()?;
        // What was recorded runs first (a clear of this cache among it): queue writes land
        // before the next submission, so the recorder must be empty.
        self.flush();
        let pos: Vec<i32> = (0..kv.n_slots)
            .map(|s| {
                if s < used {
                    rows.position(s, n_past) as i32
                } else {
                    -1
                }
            })
            .collect();
        let le = |w: &mut dyn Iterator<Item = [u8; 4]>| w.flatten().collect::<Vec<u8>>();
        let q = &self.gpu.queue;
        if used > 0 {
            q.write_buffer(&kv.k, 0, &le(&mut rows.k.iter().map(|x| x.to_le_bytes())));
            q.write_buffer(&kv.v, 0, &le(&mut rows.v.iter().map(|x| x.to_le_bytes())));
        }
        q.write_buffer(
            &kv.pos_buf,
            0,
            &le(&mut pos.iter().map(|x| x.to_le_bytes())),
        );
        Ok(())
    }

    fn embed(&mut self, table: &GpuWeight, ids: &[u32], scale: f32) -> Result<GpuTensor> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                table.rows
            )));
        }
        self.gpu.check()?;
        let out = self.tensor(ids.len(), table.cols);
        let params_bytes = (table.parts.len() as u64) * embed::PARAMS_BYTES_PER_PART;
        let ids_range = self.put(&bytes_of(ids, u32::to_le_bytes), params_bytes);
        let arena = self.rec.arena();
        self.k.embed.encode(
            &self.gpu,
            &mut self.rec,
            table,
            arena.range(ids_range),
            ids.len() as u32,
            scale,
            &out.buf,
        )?;
        Ok(out)
    }

    fn rms_norm(&mut self, x: &GpuTensor, w: &GpuWeight, eps: f32) -> Result<GpuTensor> {
        self.norm(None, x, w, eps)
    }

    fn add_rms_norm(
        &mut self,
        res: &GpuTensor,
        x: &GpuTensor,
        w: &GpuWeight,
        eps: f32,
    ) -> Result<GpuTensor> {
        self.norm(Some(res), x, w, eps)
    }

    fn matmul(&mut self, x: &GpuTensor, w: &GpuWeight) -> Result<GpuTensor> {
        if x.width != w.cols {
            return Err(Error::Backend(format!(
                "matmul: rows of {} times a {}×{} weight",
                x.width, w.rows, w.cols
            )));
        }
        self.gpu.check()?;
        let out = self.tensor(x.n_tok, w.rows);
        self.k
            .matvec
            .encode(&self.gpu, &mut self.rec, w, &x.buf, &out.buf, x.n_tok)?;
        Ok(out)
    }

    fn rope(&mut self, x: &GpuTensor, pos: &[usize], rope: &Rope) -> Result<GpuTensor> {
        let head_dim = rope.head_dim;
        if pos.len() != x.n_tok
            || head_dim == 0
            || !x.width.is_multiple_of(head_dim)
            || rope.theta.len() * 2 != head_dim
        {
            return Err(Error::Backend("rope: shape".into()));
        }
        self.gpu.check()?;
        if pos.is_empty() {
            return Err(Error::Backend("rope: no rows".into()));
        }
        // cos/sin in f64, as the CPU backend computes them; once per recording for all the
        // layers (and q and k) that share the positions and rope.
        // Room for the params first: a submission between finding a range and binding it
        // would void the range. Entries from earlier recordings are void.
        self.rec.reserve(&self.gpu, 16, 1);
        let generation = self.rec.generation;
        self.rope_cs.retain(|e| e.generation == generation);
        // Rows at any positions (branches restart theirs); the key is their digest.
        let digest = pos.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &p| {
            (h ^ p as u64).wrapping_mul(0x0100_0000_01b3)
        });
        let key = (digest, pos.len(), rope.key);
        let range = match self.rope_cs.iter().find(|e| e.key == key) {
            Some(e) => e.range,
            None => {
                let mut cs = Vec::with_capacity(pos.len() * head_dim);
                for &p in pos {
                    for f in &rope.theta {
                        let (s, c) = (p as f64 * f).sin_cos();
                        cs.push(c as f32);
                        cs.push(s as f32);
                    }
                }
                let r = self.put(&bytes_of(&cs, f32::to_le_bytes), 16);
                self.rope_cs.push(RopeCs {
                    key,
                    generation: self.rec.generation,
                    range: r,
                });
                r
            }
        };
        let out = self.tensor(x.n_tok, x.width);
        let arena = self.rec.arena();
        let p = RopeParams {
            width: x.width as u32,
            head_dim: head_dim as u32,
            n_tok: x.n_tok as u32,
            neox: rope.neox,
        };
        self.k.rope.encode(
            &self.gpu,
            &mut self.rec,
            &x.buf,
            arena.range(range),
            &out.buf,
            p,
        );
        Ok(out)
    }

    fn attention(
        &mut self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        kv: &mut GpuKv,
        pos: &[usize],
        p: AttnParams,
    ) -> Result<GpuTensor> {
        let n_tok = pos.len();
        if !heads_fit(q, k, v, n_tok, p)
            || kv.width != p.n_head_kv * p.head_dim
            || p.n_head / p.n_head_kv > GROUP_MAX
        {
            return Err(Error::Backend("attention: shapes disagree".into()));
        }
        if let Some(t) = (1..n_tok).find(|&t| pos[t] != pos[t - 1] + 1) {
            return Err(Error::Backend(format!(
                "attention: positions not consecutive at row {t}"
            )));
        }
        self.gpu.check()?;
        if n_tok == 0 {
            return Err(Error::Backend("attention: no rows".into()));
        }
        let n_slots = kv.n_slots;
        let first = pos[0];
        let n_cached = n_slots.min(first);
        let n_keys = n_cached + n_tok;
        // Sized for the most keys this chunk length can see, so every decode step binds the
        // same scores buffer; where that passes the binding limit (long contexts, many
        // heads), for the keys present in steps of 1024.
        let row_bytes = (n_tok * p.n_head * 4) as u64;
        let limit = self.gpu.max_part_bytes;
        let mut keys = n_slots + n_tok;
        if row_bytes * keys as u64 > limit {
            keys = n_keys.next_multiple_of(1024).min(keys);
        }
        if row_bytes * keys as u64 > limit {
            return Err(Error::Device(format!(
                "the attention scores of {n_tok} rows over {n_keys} keys pass the GPU's binding limit of {limit} bytes"
            )));
        }
        let scores = self.pool.take_exact(&self.gpu, row_bytes * keys as u64);
        let out = self.tensor(n_tok, p.n_head * p.head_dim);
        let d = AttnDispatch {
            n_tok: n_tok as u32,
            n_head: p.n_head as u32,
            n_head_kv: p.n_head_kv as u32,
            head_dim: p.head_dim as u32,
            n_cached: n_cached as u32,
            first: first as u32,
            window: p.window.min(u32::MAX as usize) as u32,
            scale: p.scale,
        };
        let b = AttnBuffers {
            q: &q.buf,
            k: &k.buf,
            v: &v.buf,
            k_cache: &kv.k,
            v_cache: &kv.v,
            slot_pos: &kv.pos_buf,
            scores: &scores,
            out: &out.buf,
        };
        self.k.attention.encode(
            &self.gpu,
            &mut self.rec,
            &b,
            d,
            n_keys as u32,
            n_slots as u32,
        );
        Ok(out)
    }

    fn attention_branches(
        &mut self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        kv: &GpuKv,
        first: usize,
        lens: &[usize],
        p: AttnParams,
    ) -> Result<GpuTensor> {
        let n_tok: usize = lens.iter().sum();
        if !heads_fit(q, k, v, n_tok, p)
            || kv.width != p.n_head_kv * p.head_dim
            || p.n_head / p.n_head_kv > GROUP_MAX
            || p.head_dim > HEAD_DIM_MAX
            || n_tok == 0
            || n_tok > 65_535
            || p.n_head_kv > 65_535
        {
            return Err(Error::Backend("attention_branches: shapes disagree".into()));
        }
        self.gpu.check()?;
        let starts: Vec<u32> = crate::backend::branch_starts(lens)
            .into_iter()
            .map(|s| s as u32)
            .collect();
        let range = self.put(&bytes_of(&starts, u32::to_le_bytes), 64);
        let out = self.tensor(n_tok, p.n_head * p.head_dim);
        let d = AttnDispatch {
            n_tok: n_tok as u32,
            n_head: p.n_head as u32,
            n_head_kv: p.n_head_kv as u32,
            head_dim: p.head_dim as u32,
            n_cached: kv.n_slots.min(first) as u32,
            first: first as u32,
            window: p.window.min(u32::MAX as usize) as u32,
            scale: p.scale,
        };
        let arena = self.rec.arena();
        let b = BranchBuffers {
            q: &q.buf,
            k: &k.buf,
            v: &v.buf,
            k_cache: &kv.k,
            v_cache: &kv.v,
            slot_pos: &kv.pos_buf,
            starts: arena.range(range),
            out: &out.buf,
        };
        self.k
            .attention_branches
            .encode(&self.gpu, &mut self.rec, b, d);
        Ok(out)
    }

    fn attention_packed(
        &mut self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        lens: &[usize],
        p: AttnParams,
    ) -> Result<GpuTensor> {
        let n_tok: usize = lens.iter().sum();
        if !heads_fit(q, k, v, n_tok, p) || p.head_dim > HEAD_DIM_MAX || n_tok == 0 {
            return Err(Error::Backend("attention_packed: shapes disagree".into()));
        }
        self.gpu.check()?;
        let mut bounds = Vec::with_capacity(2 * n_tok);
        let mut start = 0u32;
        for &len in lens {
            let end = start + len as u32;
            for _ in 0..len {
                bounds.extend([start, end]);
            }
            start = end;
        }
        let out = self.tensor(n_tok, p.n_head * p.head_dim);
        let range = self.put(&bytes_of(&bounds, u32::to_le_bytes), 64);
        let d = AttnDispatch {
            n_tok: n_tok as u32,
            n_head: p.n_head as u32,
            n_head_kv: p.n_head_kv as u32,
            head_dim: p.head_dim as u32,
            n_cached: 0,
            first: 0,
            window: u32::MAX,
            scale: p.scale,
        };
        let arena = self.rec.arena();
        self.k.attention_packed.encode(
            &self.gpu,
            &mut self.rec,
            &q.buf,
            &k.buf,
            &v.buf,
            arena.range(range),
            &out.buf,
            d,
        );
        Ok(out)
    }

    fn layer_norm(
        &mut self,
        x: &GpuTensor,
        w: &GpuWeight,
        b: &GpuWeight,
        eps: f32,
    ) -> Result<GpuTensor> {
        let vector = |t: &GpuWeight| t.ty == GgmlType::F32 && t.rows == 1 && t.cols == x.width;
        if !vector(w) || !vector(b) || x.width == 0 {
            return Err(Error::Backend(format!(
                "layer_norm: weight {}×{} and bias {}×{} on rows of {}",
                w.rows, w.cols, b.rows, b.cols, x.width
            )));
        }
        self.gpu.check()?;
        let out = self.tensor(x.n_tok, x.width);
        self.k.layer_norm.encode(
            &self.gpu,
            &mut self.rec,
            &x.buf,
            &w.parts[0].buf,
            &b.parts[0].buf,
            &out.buf,
            x.width as u32,
            x.n_tok as u32,
            eps,
        );
        Ok(out)
    }

    fn gelu(&mut self, x: &GpuTensor) -> Result<GpuTensor> {
        self.elementwise(x, x, Op::GeluErf)
    }

    fn glu(&mut self, gate: &GpuTensor, up: &GpuTensor, act: Glu) -> Result<GpuTensor> {
        self.elementwise(gate, up, Op::Glu(act))
    }

    fn add(&mut self, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        self.elementwise(a, b, Op::Add)
    }

    fn add_bias(&mut self, x: &GpuTensor, bias: &GpuWeight) -> Result<GpuTensor> {
        if bias.ty != GgmlType::F32 || bias.rows != 1 || bias.cols != x.width {
            return Err(Error::Backend(format!(
                "add_bias: a {}×{} {} bias on rows of {}",
                bias.rows, bias.cols, bias.ty, x.width
            )));
        }
        self.gpu.check()?;
        let out = self.tensor(x.n_tok, x.width);
        let op = Op::AddRow {
            width: x.width as u32,
        };
        let n = x.len() as u32;
        self.k.elementwise.encode(
            &self.gpu,
            &mut self.rec,
            op,
            &x.buf,
            &bias.parts[0].buf,
            &out.buf,
            n,
        );
        Ok(out)
    }

    fn rows(&mut self, x: &GpuTensor, start: usize, n: usize) -> Result<GpuTensor> {
        if start + n > x.n_tok {
            return Err(Error::Backend(format!(
                "rows {start}..{} of {}",
                start + n,
                x.n_tok
            )));
        }
        let out = self.tensor(n, x.width);
        let w = (x.width * 4) as u64;
        self.rec.copy(
            &self.gpu,
            &x.buf,
            start as u64 * w,
            &out.buf,
            0,
            n as u64 * w,
        );
        Ok(out)
    }

    fn width(&self, x: &GpuTensor) -> usize {
        x.width
    }

    async fn sync(&mut self) -> Result<()> {
        if let Some(enc) = self.rec.take(&self.gpu) {
            self.gpu.submit_and_wait(enc).await?;
        }
        Ok(())
    }

    async fn top_k(&mut self, x: &GpuTensor, k: usize) -> Result<Vec<(u32, f32)>> {
        self.top_k_on_device(x, k, None).await
    }

    async fn top_k_masked(
        &mut self,
        x: &GpuTensor,
        k: usize,
        allowed: &TokenMask,
    ) -> Result<Vec<(u32, f32)>> {
        self.top_k_on_device(x, k, Some(allowed)).await
    }

    async fn read(&mut self, x: &GpuTensor) -> Result<Vec<f32>> {
        let enc = self.take_enc();
        self.gpu.read_f32(enc, &x.buf, x.len()).await
    }
}

impl GpuBackend {
    /// The top-k stages of [`Backend::top_k`], the first one under `allowed` when given (it
    /// goes up in a buffer of its own: 32 KiB for 262 144 tokens).
    async fn top_k_on_device(
        &mut self,
        x: &GpuTensor,
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Result<Vec<(u32, f32)>> {
        self.gpu.check()?;
        let k = k.clamp(1, TOPK_MAX);
        let row = self.rows(x, x.n_tok - 1, 1)?;
        let mut len = x.width;
        let mut first = true;
        let (mut in_v, mut in_i) = (row.buf.clone(), row.buf.clone());
        let words = x.width.div_ceil(32);
        let mask = match allowed {
            Some(a) => {
                let mut w = vec![0u32; words];
                let n = a.len().min(words);
                w[..n].copy_from_slice(&a[..n]);
                let buf = match &self.mask_buf {
                    Some(b) if b.size() >= (words * 4) as u64 => b.clone(),
                    _ => {
                        let b =
                            std::rc::Rc::new(self.gpu.storage("token mask", (words * 4) as u64));
                        self.mask_buf = Some(b.clone());
                        b
                    }
                };
                // Read only by this step's first stage, which the next submission runs; the
                // last step's is read back already.
                self.gpu
                    .queue
                    .write_buffer(&buf, 0, &bytes_of(&w, u32::to_le_bytes));
                Some(buf)
            }
            None => None,
        };
        loop {
            let blocks = len.div_ceil(TOPK_BLOCK);
            let out_v = self.pool.take(&self.gpu, (blocks * k * 4) as u64);
            let out_i = self.pool.take(&self.gpu, (blocks * k * 4) as u64);
            let stage = TopKStage {
                len: len as u32,
                k: k as u32,
                first,
                masked: first && mask.is_some(),
            };
            self.k.topk.encode(
                &self.gpu,
                &mut self.rec,
                &in_v,
                &in_i,
                mask.as_deref().unwrap_or(in_i.as_ref()),
                &out_v,
                &out_i,
                stage,
            );
            (in_v, in_i, len, first) = (out_v, out_i, blocks * k, false);
            if blocks == 1 {
                break;
            }
        }
        // One readback of k values and k ids: the only bytes a decode step moves.
        let enc = self.take_enc();
        let (v, ids) = self.gpu.read_pair(enc, &in_v, &in_i, k).await?;
        Ok(v.into_iter()
            .zip(ids)
            .filter(|&(v, id)| (id as usize) < x.width && v > -3.0e38)
            .map(|(v, id)| (id, v))
            .collect())
    }
}
