//! One stage of the GPU top-k (shaders/topk.wgsl): each workgroup takes `BLOCK` candidates
//! and writes its `k` best (value, id) pairs.

use super::Recorder;
use crate::error::Result;
use crate::gpu::Gpu;

/// Candidates per workgroup (BLOCK in topk.wgsl).
pub const TOPK_BLOCK: usize = 1024;

/// The shader's `Params`.
#[derive(Clone, Copy, Debug)]
pub struct TopKStage {
    /// Candidates in the input.
    pub len: u32,
    pub k: u32,
    /// The input is the logits row itself (ids are positions; `in_i` is not read).
    pub first: bool,
    /// The first stage reads the allowed-token bitmask.
    pub masked: bool,
}

pub struct TopK {
    pipeline: wgpu::ComputePipeline,
}

impl TopK {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let layout = super::layout(gpu, 5, 3, None);
        Ok(Self {
            pipeline: super::pipeline(gpu, "topk", None, "main", &layout)?,
        })
    }

    /// Record one stage: `len.div_ceil(BLOCK)` workgroups, each writing `k` pairs. `mask`
    /// is read only when `p.masked` (any buffer otherwise).
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        in_v: &wgpu::Buffer,
        in_i: &wgpu::Buffer,
        mask: &wgpu::Buffer,
        out_v: &wgpu::Buffer,
        out_i: &wgpu::Buffer,
        p: TopKStage,
    ) {
        let blocks = (p.len as usize).div_ceil(TOPK_BLOCK) as u32;
        rec.dispatch(
            gpu,
            &self.pipeline,
            &[
                in_v.into(),
                in_i.into(),
                mask.into(),
                out_v.into(),
                out_i.into(),
            ],
            &[p.len, p.k, u32::from(p.first), u32::from(p.masked)],
            (blocks, 1),
        );
    }
}
