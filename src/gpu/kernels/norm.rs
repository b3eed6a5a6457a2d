//! RMS norm of each group of `len` values times a weight vector, optionally plus a residual
//! (shaders/rms_norm.wgsl), and LayerNorm with a bias (shaders/layer_norm.wgsl): one
//! workgroup per group.

use super::{grid, Recorder};
use crate::error::Result;
use crate::gpu::Gpu;

/// The shader's `Params`.
#[derive(Clone, Copy, Debug)]
pub struct NormParams {
    /// Values per group (the weight's length: n_embd, or head_dim for QK-norm).
    pub len: u32,
    pub n_groups: u32,
    pub eps: f32,
    /// `out = res + norm(x)` (else `res` is bound but not read).
    pub add_residual: bool,
}

pub struct RmsNorm {
    pipeline: wgpu::ComputePipeline,
}

impl RmsNorm {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let layout = super::layout(gpu, 4, 3, None);
        Ok(Self {
            pipeline: super::pipeline(gpu, "rms_norm", None, "main", &layout)?,
        })
    }

    /// `out = [res +] rms_norm(x) * w`.
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        res: &wgpu::Buffer,
        out: &wgpu::Buffer,
        p: NormParams,
    ) {
        let (gx, gy) = grid(p.n_groups);
        let words = [
            p.len,
            p.n_groups,
            p.eps.to_bits(),
            gx,
            u32::from(p.add_residual),
            0,
            0,
            0,
        ];
        rec.dispatch(
            gpu,
            &self.pipeline,
            &[x.into(), w.into(), res.into(), out.into()],
            &words,
            (gx, gy),
        );
    }
}

/// LayerNorm of each row, `(x − mean) / sqrt(var + eps) · w + b`.
pub struct LayerNorm {
    pipeline: wgpu::ComputePipeline,
}

impl LayerNorm {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let layout = super::layout(gpu, 4, 3, None);
        Ok(Self {
            pipeline: super::pipeline(gpu, "layer_norm", None, "main", &layout)?,
        })
    }

    /// `out = layer_norm(x) · w + b` over `n_rows` rows of `len`.
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        b: &wgpu::Buffer,
        out: &wgpu::Buffer,
        len: u32,
        n_rows: u32,
        eps: f32,
    ) {
        let (gx, gy) = grid(n_rows);
        rec.dispatch(
            gpu,
            &self.pipeline,
            &[x.into(), w.into(), b.into(), out.into()],
            &[len, n_rows, eps.to_bits(), gx],
            (gx, gy),
        );
    }
}
