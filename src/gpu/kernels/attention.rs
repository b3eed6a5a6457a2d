//! Attention of a chunk of queries over the KV cache and the chunk's own keys
//! (shaders/attention.wgsl: `scores`, then `mix`), then the chunk's keys and values into the
//! cache (shaders/kv_write.wgsl), and the empty cache (shaders/fill.wgsl); an encoder's
//! bidirectional attention within packed sequences (shaders/attention_packed.wgsl); branches
//! after a cached prefix, which read the cache and write nothing to it
//! (shaders/attention_branches.wgsl).

use super::{grid, Bind, Recorder};
use crate::error::Result;
use crate::gpu::Gpu;

/// Query heads per KV head the attention kernels take (GMAX in attention.wgsl and
/// attention_branches.wgsl).
pub const GROUP_MAX: usize = 8;
/// Values per head the one-invocation-per-row kernels take (HEAD_DIM_MAX in
/// attention_packed.wgsl and attention_branches.wgsl).
pub const HEAD_DIM_MAX: usize = 256;

/// The attention shaders' `Params`.
#[derive(Clone, Copy, Debug)]
pub struct AttnDispatch {
    pub n_tok: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    /// Cache slots holding positions before `first`.
    pub n_cached: u32,
    /// The chunk's first position.
    pub first: u32,
    /// Keys visible from a query: `pq - pk < window` (`u32::MAX`: all).
    pub window: u32,
    pub scale: f32,
}

impl AttnDispatch {
    fn words(&self) -> [u32; 8] {
        [
            self.n_tok,
            self.n_head,
            self.n_head_kv,
            self.head_dim,
            self.n_cached,
            self.first,
            self.window,
            self.scale.to_bits(),
        ]
    }
}

/// The buffers of one attention call.
pub struct AttnBuffers<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub v: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    /// The position each cache slot holds (-1: empty).
    pub slot_pos: &'a wgpu::Buffer,
    /// Scratch for the scores, `n_tok × n_head × keys` f32.
    pub scores: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
}

pub struct Attention {
    scores: wgpu::ComputePipeline,
    mix: wgpu::ComputePipeline,
    kv_write: wgpu::ComputePipeline,
    fill: wgpu::ComputePipeline,
}

impl Attention {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let attn = super::layout(gpu, 8, 6, None);
        Ok(Self {
            scores: super::pipeline(gpu, "attention", None, "scores", &attn)?,
            mix: super::pipeline(gpu, "attention", None, "mix", &attn)?,
            kv_write: super::pipeline(
                gpu,
                "kv_write",
                None,
                "main",
                &super::layout(gpu, 5, 2, None),
            )?,
            fill: super::pipeline(gpu, "fill", None, "main", &super::layout(gpu, 1, 0, None))?,
        })
    }

    /// Record the scores and the mix of `p.n_tok` queries over `n_keys` keys (cached +
    /// new), then the new keys and values into ring slots `(first + t) % n_slots`.
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        b: &AttnBuffers,
        p: AttnDispatch,
        n_keys: u32,
        n_slots: u32,
    ) {
        let binds = [
            b.q.into(),
            b.k.into(),
            b.v.into(),
            b.k_cache.into(),
            b.v_cache.into(),
            b.slot_pos.into(),
            b.scores.into(),
            b.out.into(),
        ];
        let words = p.words();
        let rows = p.n_tok * p.n_head_kv;
        rec.dispatch(
            gpu,
            &self.scores,
            &binds,
            &words,
            (n_keys.div_ceil(64), rows),
        );
        rec.dispatch(
            gpu,
            &self.mix,
            &binds,
            &words,
            (rows, p.head_dim.div_ceil(64)),
        );
        // The new rows enter the cache after the attention: the kernels above saw the
        // cache as it was.
        let kv_w = p.n_head_kv * p.head_dim;
        rec.dispatch(
            gpu,
            &self.kv_write,
            &[
                b.k.into(),
                b.v.into(),
                b.k_cache.into(),
                b.v_cache.into(),
                b.slot_pos.into(),
            ],
            &[p.n_tok, kv_w, p.first, n_slots],
            (p.n_tok, 1),
        );
    }

    /// Mark every slot of a cache empty (position -1).
    pub fn clear(&self, gpu: &Gpu, rec: &mut Recorder, slot_pos: &wgpu::Buffer, n_slots: u32) {
        let (gx, gy) = grid(n_slots.div_ceil(64));
        rec.dispatch(
            gpu,
            &self.fill,
            &[slot_pos.into()],
            &[n_slots, (-1i32) as u32, gx, 0],
            (gx, gy),
        );
    }
}

/// Bidirectional attention within packed sequences (encoders).
pub struct AttentionPacked {
    pipeline: wgpu::ComputePipeline,
}

impl AttentionPacked {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let layout = super::layout(gpu, 5, 4, Some(3));
        Ok(Self {
            pipeline: super::pipeline(gpu, "attention_packed", None, "main", &layout)?,
        })
    }

    /// `out` (n_tok × n_head·head_dim) from q, k, v; `bounds` (in the arena): each row's
    /// sequence as (first row, end row).
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        bounds: Bind,
        out: &wgpu::Buffer,
        p: AttnDispatch,
    ) {
        let (gx, gy) = grid((p.n_tok * p.n_head).div_ceil(64));
        let words = [
            p.n_tok,
            p.n_head,
            p.n_head_kv,
            p.head_dim,
            p.scale.to_bits(),
            gx,
            0,
            0,
        ];
        rec.dispatch(
            gpu,
            &self.pipeline,
            &[q.into(), k.into(), v.into(), bounds, out.into()],
            &words,
            (gx, gy),
        );
    }
}

/// Branches after a cached prefix (many continuations of one prompt in one pass).
pub struct AttentionBranches {
    pipeline: wgpu::ComputePipeline,
}

/// The buffers of one branches call.
pub struct BranchBuffers<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub v: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    pub slot_pos: &'a wgpu::Buffer,
    /// Each row's first row of its run (in the arena).
    pub starts: Bind<'a>,
    pub out: &'a wgpu::Buffer,
}

impl AttentionBranches {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let layout = super::layout(gpu, 8, 7, Some(6));
        Ok(Self {
            pipeline: super::pipeline(gpu, "attention_branches", None, "main", &layout)?,
        })
    }

    /// `b.out` from q, k, v over the cache's first `p.n_cached` slots.
    pub fn encode(&self, gpu: &Gpu, rec: &mut Recorder, b: BranchBuffers, p: AttnDispatch) {
        rec.dispatch(
            gpu,
            &self.pipeline,
            &[
                b.q.into(),
                b.k.into(),
                b.v.into(),
                b.k_cache.into(),
                b.v_cache.into(),
                b.slot_pos.into(),
                b.starts,
                b.out.into(),
            ],
            &p.words(),
            (p.n_tok, p.n_head_kv),
        );
    }
}
