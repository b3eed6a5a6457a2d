//! Launch code of the kernels, one file per kernel with its typed parameters; what they
//! share (pipelines, the [`Recorder`], the buffer [`Pool`]) is `launch.rs`.

pub mod attention;
pub mod elementwise;
pub mod embed;
mod launch;
pub mod matvec;
pub mod norm;
pub mod rope;
pub mod topk;

pub use launch::{grid, layout, pipeline, Arena, Bind, Pool, Recorder};

use crate::error::Result;
use crate::gpu::Gpu;

/// Every kernel of the forward pass, each with its launch code in its own file.
pub struct Kernels {
    pub matvec: matvec::Matvec,
    pub embed: embed::Embed,
    pub rms_norm: norm::RmsNorm,
    pub layer_norm: norm::LayerNorm,
    pub rope: rope::RopeKernel,
    pub elementwise: elementwise::Elementwise,
    pub attention: attention::Attention,
    pub attention_packed: attention::AttentionPacked,
    pub attention_branches: attention::AttentionBranches,
    pub topk: topk::TopK,
}

impl Kernels {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Self {
            matvec: matvec::Matvec::new(gpu)?,
            embed: embed::Embed::new(gpu)?,
            rms_norm: norm::RmsNorm::new(gpu)?,
            layer_norm: norm::LayerNorm::new(gpu)?,
            rope: rope::RopeKernel::new(gpu)?,
            elementwise: elementwise::Elementwise::new(gpu)?,
            attention: attention::Attention::new(gpu)?,
            attention_packed: attention::AttentionPacked::new(gpu)?,
            attention_branches: attention::AttentionBranches::new(gpu)?,
            topk: topk::TopK::new(gpu)?,
        })
    }
}
