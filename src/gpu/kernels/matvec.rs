//! The decode product `y = x @ Wᵀ` for a few activation rows, per weight type, over every
//! part of a split weight (shaders/matvec.wgsl + the type's `subdot`).

use std::collections::HashMap;

use super::grid;
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::gpu::shaders;
use crate::gpu::weights::GpuWeight;
use crate::gpu::Gpu;

/// Output rows per workgroup (ROWS in matvec.wgsl).
const ROWS: u32 = 4;

pub struct Matvec {
    pipelines: HashMap<GgmlType, wgpu::ComputePipeline>,
}

impl Matvec {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let mut pipelines = HashMap::new();
        for (ty, w) in shaders::WEIGHT_TYPES {
            let src = shaders::source("matvec", Some(*ty))
                .ok_or_else(|| Error::Backend("matvec shader missing".into()))?;
            let module = gpu
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(w.name),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                });
            let p = gpu
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(w.name),
                    layout: None,
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: Default::default(),
                    cache: None,
                });
            pipelines.insert(*ty, p);
        }
        Ok(Self { pipelines })
    }

    /// Record `y (m × w.rows) = x (m × w.cols) @ wᵀ` into `enc`.
    pub fn encode(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        m: usize,
    ) -> Result<()> {
        let pipeline = self.pipelines.get(&w.ty).ok_or_else(|| {
            Error::Backend(format!("no matrix-vector kernel for {} weights", w.ty))
        })?;
        for part in &w.parts {
            let groups = (part.rows as u32).div_ceil(ROWS);
            let (gx, gy) = grid(groups);
            let params: [u32; 8] = [
                w.cols as u32,
                part.rows as u32,
                part.row0 as u32,
                w.rows as u32,
                m as u32,
                gx,
                0,
                0,
            ];
            let ubuf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("matvec params"),
                size: 32,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
            gpu.queue.write_buffer(&ubuf, 0, &bytes);
            let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("matvec"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: part.buf.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: x.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: y.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 3,
                        resource: ubuf.as_entire_binding(),
                    },
                ],
            });
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("matvec"),
                timestamp_writes: None,
            });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(gx, gy, 1);
        }
        Ok(())
    }
}
