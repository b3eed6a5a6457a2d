//! The [`Backend`] impl on the GPU: each op checks its shapes and records its dispatch (the
//! launch code is in gpu/kernels/); `read` and the top-k submit and read back. The KV cache's
//! ops are in `kv.rs`, the top-k's stages in `topk.rs`.

use super::kv::GpuKv;
use super::state::{bytes_of, GpuBackend, GpuTensor, RopeCs};
use crate::backend::{AttnParams, Backend, KvRows, Rope};
use crate::config::Glu;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, TensorInfo};
use crate::gpu::kernels::attention::{
    AttnBuffers, AttnDispatch, BranchBuffers, GROUP_MAX, HEAD_DIM_MAX,
};
use crate::gpu::kernels::elementwise::Op;
use crate::gpu::kernels::embed;
use crate::gpu::kernels::rope::RopeParams;
use crate::gpu::weights::GpuWeight;
use crate::logits::TokenMask;

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
        self.make_kv(n_slots, n_head_kv, head_dim)
    }

    fn clear_kv(&mut self, kv: &mut GpuKv) {
        self.reset_kv(kv)
    }

    async fn save_kv(&mut self, kv: &GpuKv, n_past: usize) -> Result<KvRows> {
        self.read_kv(kv, n_past).await
    }

    fn load_kv(&mut self, kv: &mut GpuKv, rows: &KvRows, n_past: usize) -> Result<()> {
        self.write_kv(kv, rows, n_past)
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
