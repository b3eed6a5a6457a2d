//! Rotary embedding (shaders/rope.wgsl): NeoX or normal pairs, cos/sin per row and pair
//! given by the caller (computed on the CPU in f64, frequency factors included).

use super::{grid, Bind, Recorder};
use crate::error::Result;
use crate::gpu::Gpu;

/// The shader's `Params`.
#[derive(Clone, Copy, Debug)]
pub struct RopeParams {
    /// Values per row.
    pub width: u32,
    pub head_dim: u32,
    pub n_tok: u32,
    /// NeoX pairs (`i`, `i + head_dim/2`); else normal pairs (`2i`, `2i + 1`).
    pub neox: bool,
}

impl RopeParams {
    fn words(&self) -> [u32; 4] {
        [self.width, self.head_dim, self.n_tok, u32::from(self.neox)]
    }
}

pub struct RopeKernel {
    pipeline: wgpu::ComputePipeline,
}

impl RopeKernel {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let layout = super::layout(gpu, 3, 2, Some(1));
        Ok(Self {
            pipeline: super::pipeline(gpu, "rope", None, "main", &layout)?,
        })
    }

    /// `out = rope(x)`; `cs` holds `(cos, sin)` for each of the `n_tok` rows and
    /// `head_dim/2` pairs (an arena range).
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        x: &wgpu::Buffer,
        cs: Bind,
        out: &wgpu::Buffer,
        p: RopeParams,
    ) {
        let pairs = p.n_tok * p.width / 2;
        let (gx, gy) = grid(pairs.div_ceil(64));
        rec.dispatch(
            gpu,
            &self.pipeline,
            &[x.into(), cs, out.into()],
            &p.words(),
            (gx, gy),
        );
    }
}
