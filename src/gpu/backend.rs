//! [`Backend`] on the GPU: every op records a dispatch into one command encoder; `read`
//! submits it and reads the result back. The forward pass is the same generic model code as
//! on the CPU.

use wgpu::util::DeviceExt;

use super::kernels::{dispatch, grid, Kernels};
use super::weights::GpuWeight;
use super::{Gpu, GpuOptions};
use crate::backend::{AttnParams, Backend};
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, TensorInfo};

/// Activations on the GPU: `n_tok` rows of `width` f32.
#[derive(Clone)]
pub struct GpuTensor {
    /// wgpu buffers are reference-counted handles: clones share the buffer.
    buf: wgpu::Buffer,
    pub n_tok: usize,
    pub width: usize,
}

impl GpuTensor {
    fn len(&self) -> usize {
        self.n_tok * self.width
    }
}

/// One layer's KV cache: `n_slots` rows of keys and values, and the position each slot
/// holds (-1: empty), mirrored on the CPU.
pub struct GpuKv {
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    pos_buf: wgpu::Buffer,
    pos: Vec<i32>,
    width: usize,
}

/// The most candidates the GPU top-k gives (more: the logits are read whole).
pub const TOPK_MAX: usize = 128;
/// Candidates per top-k workgroup (BLOCK in topk.wgsl).
const TOPK_BLOCK: usize = 1024;

pub struct GpuBackend {
    pub gpu: Gpu,
    k: Kernels,
    enc: Option<wgpu::CommandEncoder>,
    /// When the open encoder got its first command (ms, crate::clock).
    enc_t0: Option<f64>,
    /// Milliseconds spent recording commands, from each encoder's first command to its
    /// submission (the CPU side of a step).
    pub encode_ms: f64,
}

impl GpuBackend {
    /// Open a device and build every pipeline; `Ok(None)` when there is no adapter.
    pub async fn new(opts: &GpuOptions) -> Result<Option<Self>> {
        let Some(gpu) = Gpu::new(opts).await? else {
            return Ok(None);
        };
        let k = Kernels::new(&gpu)?;
        Ok(Some(Self {
            gpu,
            k,
            enc: None,
            enc_t0: None,
            encode_ms: 0.0,
        }))
    }

    /// Activations from the CPU (`n_tok` rows of `width`).
    pub fn upload(&self, data: &[f32], n_tok: usize, width: usize) -> Result<GpuTensor> {
        if data.len() != n_tok * width {
            return Err(Error::Backend("upload: shape".into()));
        }
        let t = self.tensor(n_tok, width);
        self.gpu
            .queue
            .write_buffer(&t.buf, 0, &bytes_of(data, f32::to_le_bytes));
        Ok(t)
    }

    /// Take the open encoder (or a new one) for submission, counting its recording time.
    fn take_enc(&mut self) -> wgpu::CommandEncoder {
        if let Some(t0) = self.enc_t0.take() {
            self.encode_ms += crate::clock::now_ms() - t0;
        }
        self.enc
            .take()
            .unwrap_or_else(|| self.gpu.device.create_command_encoder(&Default::default()))
    }

    fn enc(&mut self) -> &mut wgpu::CommandEncoder {
        open(&mut self.enc, &mut self.enc_t0, &self.gpu)
    }

    fn tensor(&self, n_tok: usize, width: usize) -> GpuTensor {
        GpuTensor {
            buf: self.gpu.storage("act", (n_tok * width * 4) as u64),
            n_tok,
            width,
        }
    }

    fn init_buffer(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        self.gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            })
    }

    fn elementwise(&mut self, a: &GpuTensor, b: &GpuTensor, gelu: bool) -> Result<GpuTensor> {
        if a.len() != b.len() {
            return Err(Error::Backend(format!(
                "elementwise op on {}×{} and {}×{}",
                a.n_tok, a.width, b.n_tok, b.width
            )));
        }
        let out = self.tensor(a.n_tok, a.width);
        let (gx, gy) = grid((a.len() as u32).div_ceil(64));
        let pipeline = if gelu { &self.k.gelu_mul } else { &self.k.add };
        let gpu = &self.gpu;
        let enc = open(&mut self.enc, &mut self.enc_t0, gpu);
        dispatch(
            gpu,
            enc,
            pipeline,
            &[&a.buf, &b.buf, &out.buf],
            &[a.len() as u32, gx, 0, 0],
            (gx, gy),
        );
        Ok(out)
    }
}

/// The open encoder (a new one when there is none), noting when it got its first command.
/// Takes the fields, not `self`, so callers may hold other borrows of the backend.
fn open<'a>(
    enc: &'a mut Option<wgpu::CommandEncoder>,
    t0: &mut Option<f64>,
    gpu: &Gpu,
) -> &'a mut wgpu::CommandEncoder {
    t0.get_or_insert_with(crate::clock::now_ms);
    enc.get_or_insert_with(|| gpu.device.create_command_encoder(&Default::default()))
}

fn bytes_of<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
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
        let pos = vec![-1i32; n_slots];
        let pos_buf = self.gpu.storage("kv pos", (n_slots * 4) as u64);
        self.gpu
            .queue
            .write_buffer(&pos_buf, 0, &bytes_of(&pos, i32::to_le_bytes));
        Ok(GpuKv {
            k: self.gpu.storage("k cache", bytes),
            v: self.gpu.storage("v cache", bytes),
            pos_buf,
            pos,
            width,
        })
    }

    fn clear_kv(&mut self, kv: &mut GpuKv) {
        kv.pos.iter_mut().for_each(|p| *p = -1);
        let staging = self.init_buffer("kv pos", &bytes_of(&kv.pos, i32::to_le_bytes));
        let size = (kv.pos.len() * 4) as u64;
        self.enc()
            .copy_buffer_to_buffer(&staging, 0, &kv.pos_buf, 0, size);
    }

    fn embed(&mut self, table: &GpuWeight, ids: &[u32], scale: f32) -> Result<GpuTensor> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                table.rows
            )));
        }
        let out = self.tensor(ids.len(), table.cols);
        let ids_buf = self.init_buffer("ids", &bytes_of(ids, u32::to_le_bytes));
        let pipeline = self
            .k
            .embed
            .get(&table.ty)
            .ok_or_else(|| Error::Backend(format!("no embedding kernel for {}", table.ty)))?;
        let gpu = &self.gpu;
        let enc = open(&mut self.enc, &mut self.enc_t0, gpu);
        for part in &table.parts {
            let params = [
                table.cols as u32,
                part.rows as u32,
                part.row0 as u32,
                ids.len() as u32,
                scale.to_bits(),
                0,
                0,
                0,
            ];
            dispatch(
                gpu,
                enc,
                pipeline,
                &[&part.buf, &ids_buf, &out.buf],
                &params,
                (ids.len() as u32, 1),
            );
        }
        Ok(out)
    }

    fn rms_norm(&mut self, x: &GpuTensor, w: &GpuWeight, eps: f32) -> Result<GpuTensor> {
        let len = w.cols;
        if w.ty != GgmlType::F32 || w.rows != 1 || len == 0 || !x.len().is_multiple_of(len) {
            return Err(Error::Backend(format!(
                "rms_norm: weight {}×{} {} on rows of {}",
                w.rows, w.cols, w.ty, x.width
            )));
        }
        let out = self.tensor(x.n_tok, x.width);
        let n_groups = (x.len() / len) as u32;
        let (gx, gy) = grid(n_groups);
        let gpu = &self.gpu;
        let enc = open(&mut self.enc, &mut self.enc_t0, gpu);
        dispatch(
            gpu,
            enc,
            &self.k.rms_norm,
            &[&x.buf, &w.parts[0].buf, &out.buf],
            &[len as u32, n_groups, eps.to_bits(), gx],
            (gx, gy),
        );
        Ok(out)
    }

    fn matmul(&mut self, x: &GpuTensor, w: &GpuWeight) -> Result<GpuTensor> {
        if x.width != w.cols {
            return Err(Error::Backend(format!(
                "matmul: rows of {} times a {}×{} weight",
                x.width, w.rows, w.cols
            )));
        }
        let out = self.tensor(x.n_tok, w.rows);
        let gpu = &self.gpu;
        let enc = open(&mut self.enc, &mut self.enc_t0, gpu);
        self.k
            .matvec
            .encode(gpu, enc, w, &x.buf, &out.buf, x.n_tok)?;
        Ok(out)
    }

    fn rope(
        &mut self,
        x: &GpuTensor,
        pos: &[usize],
        head_dim: usize,
        base: f32,
    ) -> Result<GpuTensor> {
        if pos.len() != x.n_tok
            || head_dim == 0
            || !x.width.is_multiple_of(head_dim)
            || !head_dim.is_multiple_of(2)
        {
            return Err(Error::Backend("rope: shape".into()));
        }
        let half = head_dim / 2;
        // cos/sin in f64, as the CPU backend computes them.
        let mut cs = Vec::with_capacity(pos.len() * half * 2);
        for &p in pos {
            for i in 0..half {
                let f = f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
                let (s, c) = (p as f64 * f).sin_cos();
                cs.push(c as f32);
                cs.push(s as f32);
            }
        }
        let cs_buf = self.init_buffer("rope", &bytes_of(&cs, f32::to_le_bytes));
        let out = self.tensor(x.n_tok, x.width);
        let n = (x.len() / 2) as u32;
        let gpu = &self.gpu;
        let enc = open(&mut self.enc, &mut self.enc_t0, gpu);
        dispatch(
            gpu,
            enc,
            &self.k.rope,
            &[&x.buf, &cs_buf, &out.buf],
            &[x.width as u32, head_dim as u32, x.n_tok as u32, 0],
            (n.div_ceil(64), 1),
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
        let kv_w = p.n_head_kv * p.head_dim;
        if q.width != p.n_head * p.head_dim
            || k.width != kv_w
            || v.width != kv_w
            || kv.width != kv_w
            || q.n_tok != n_tok
            || k.n_tok != n_tok
            || v.n_tok != n_tok
            || p.n_head_kv == 0
            || !p.n_head.is_multiple_of(p.n_head_kv)
        {
            return Err(Error::Backend("attention: shapes disagree".into()));
        }
        if let Some(t) = (1..n_tok).find(|&t| pos[t] != pos[t - 1] + 1) {
            return Err(Error::Backend(format!(
                "attention: positions not consecutive at row {t}"
            )));
        }
        let n_slots = kv.pos.len();
        let first = pos.first().copied().unwrap_or(0);
        let n_cached = n_slots.min(first);
        let n_keys = n_cached + n_tok;
        let scores = self
            .gpu
            .storage("scores", (n_tok * p.n_head * n_keys * 4) as u64);
        let out = self.tensor(n_tok, p.n_head * p.head_dim);
        let window = p.window.min(u32::MAX as usize) as u32;
        let params = [
            n_tok as u32,
            p.n_head as u32,
            p.n_head_kv as u32,
            p.head_dim as u32,
            n_cached as u32,
            first as u32,
            window,
            p.scale.to_bits(),
        ];
        // The new rows enter the cache after the attention (below), and the slot positions
        // are updated by a copy recorded after it: the kernels see the cache as it was.
        for &pt in pos {
            kv.pos[pt % n_slots] = pt as i32;
        }
        let pos_staging = self.init_buffer("kv pos", &bytes_of(&kv.pos, i32::to_le_bytes));
        let gpu = &self.gpu;
        let enc = open(&mut self.enc, &mut self.enc_t0, gpu);
        let bufs = [
            &q.buf,
            &k.buf,
            &v.buf,
            &kv.k,
            &kv.v,
            &kv.pos_buf,
            &scores,
            &out.buf,
        ];
        dispatch(
            gpu,
            enc,
            &self.k.attn_scores,
            &bufs,
            &params,
            ((n_keys as u32).div_ceil(64), (n_tok * p.n_head) as u32),
        );
        dispatch(
            gpu,
            enc,
            &self.k.attn_mix,
            &bufs,
            &params,
            ((n_tok * p.n_head) as u32, 1),
        );
        let row = (kv_w * 4) as u64;
        for (t, &pt) in pos.iter().enumerate() {
            let slot = (pt % n_slots) as u64;
            enc.copy_buffer_to_buffer(&k.buf, t as u64 * row, &kv.k, slot * row, row);
            enc.copy_buffer_to_buffer(&v.buf, t as u64 * row, &kv.v, slot * row, row);
        }
        enc.copy_buffer_to_buffer(&pos_staging, 0, &kv.pos_buf, 0, (n_slots * 4) as u64);
        Ok(out)
    }

    fn gelu_mul(&mut self, gate: &GpuTensor, up: &GpuTensor) -> Result<GpuTensor> {
        self.elementwise(gate, up, true)
    }

    fn add(&mut self, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        self.elementwise(a, b, false)
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
        let (src, dst) = (x.buf.clone(), out.buf.clone());
        self.enc()
            .copy_buffer_to_buffer(&src, start as u64 * w, &dst, 0, n as u64 * w);
        Ok(out)
    }

    fn width(&self, x: &GpuTensor) -> usize {
        x.width
    }

    async fn sync(&mut self) -> Result<()> {
        if self.enc.is_some() {
            let enc = self.take_enc();
            self.gpu.submit_and_wait(enc).await?;
        }
        Ok(())
    }

    async fn top_k(&mut self, x: &GpuTensor, k: usize) -> Result<Vec<(u32, f32)>> {
        let k = k.clamp(1, TOPK_MAX);
        let row = self.rows(x, x.n_tok - 1, 1)?;
        let mut len = x.width;
        let mut first = true;
        let (mut in_v, mut in_i) = (row.buf.clone(), row.buf.clone());
        loop {
            let blocks = len.div_ceil(TOPK_BLOCK);
            let out_v = self.gpu.storage("top-k values", (blocks * k * 4) as u64);
            let out_i = self.gpu.storage("top-k ids", (blocks * k * 4) as u64);
            let gpu = &self.gpu;
            let enc = open(&mut self.enc, &mut self.enc_t0, gpu);
            dispatch(
                gpu,
                enc,
                &self.k.topk,
                &[&in_v, &in_i, &out_v, &out_i],
                &[len as u32, k as u32, u32::from(first), 0],
                (blocks as u32, 1),
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

    async fn read(&mut self, x: &GpuTensor) -> Result<Vec<f32>> {
        let enc = self.take_enc();
        self.gpu.read_f32(enc, &x.buf, x.len()).await
    }
}
