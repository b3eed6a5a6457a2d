//! Launch code of the kernels: pipelines built once at load, dispatches recorded into the
//! caller's encoder.

pub mod matvec;

use std::collections::HashMap;

use wgpu::util::DeviceExt;

use super::{shaders, Gpu};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;

/// Workgroups for `n` items: (x, y) with x ≤ 65 535 (the dispatch limit per dimension).
pub fn grid(n: u32) -> (u32, u32) {
    const MAX: u32 = 65_535;
    if n <= MAX {
        (n.max(1), 1)
    } else {
        (MAX, n.div_ceil(MAX))
    }
}

/// Compile `kernel` (with weight type `ty`) and make a pipeline for `entry` (its bind group
/// layout derived from what the entry point uses).
pub fn pipeline(
    gpu: &Gpu,
    kernel: &str,
    ty: Option<GgmlType>,
    entry: &str,
) -> Result<wgpu::ComputePipeline> {
    pipeline_with(gpu, kernel, ty, entry, None)
}

/// A layout of `n_storage` storage buffers (the first `n_read` read-only) and a uniform
/// after them, for entry points that share one bind group but not every binding.
pub fn shared_layout(gpu: &Gpu, n_storage: u32, n_read: u32) -> wgpu::PipelineLayout {
    let mut entries: Vec<wgpu::BindGroupLayoutEntry> = (0..n_storage)
        .map(|i| wgpu::BindGroupLayoutEntry {
            binding: i,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage {
                    read_only: i < n_read,
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    entries.push(wgpu::BindGroupLayoutEntry {
        binding: n_storage,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    });
    let bgl = gpu
        .device
        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &entries,
        });
    gpu.device
        .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        })
}

fn pipeline_with(
    gpu: &Gpu,
    kernel: &str,
    ty: Option<GgmlType>,
    entry: &str,
    layout: Option<&wgpu::PipelineLayout>,
) -> Result<wgpu::ComputePipeline> {
    let src = shaders::source(kernel, ty)
        .ok_or_else(|| Error::Backend(format!("no shader {kernel} for {ty:?}")))?;
    let module = gpu
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(kernel),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
    Ok(gpu
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        }))
}

/// Record one dispatch: `buffers` bound at 0.., the params as a uniform after them.
pub fn dispatch(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    pipeline: &wgpu::ComputePipeline,
    buffers: &[&wgpu::Buffer],
    params: &[u32],
    groups: (u32, u32),
) {
    let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ubuf = gpu
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: &bytes,
            usage: wgpu::BufferUsages::UNIFORM,
        });
    let layout = pipeline.get_bind_group_layout(0);
    let mut entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    entries.push(wgpu::BindGroupEntry {
        binding: buffers.len() as u32,
        resource: ubuf.as_entire_binding(),
    });
    let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &layout,
        entries: &entries,
    });
    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: None,
        timestamp_writes: None,
    });
    pass.set_pipeline(pipeline);
    pass.set_bind_group(0, &bind, &[]);
    pass.dispatch_workgroups(groups.0, groups.1, 1);
}

/// Every pipeline of the forward pass.
pub struct Kernels {
    pub matvec: matvec::Matvec,
    pub embed: HashMap<GgmlType, wgpu::ComputePipeline>,
    pub rms_norm: wgpu::ComputePipeline,
    pub rope: wgpu::ComputePipeline,
    pub add: wgpu::ComputePipeline,
    pub gelu_mul: wgpu::ComputePipeline,
    pub attn_scores: wgpu::ComputePipeline,
    pub attn_mix: wgpu::ComputePipeline,
    pub topk: wgpu::ComputePipeline,
}

impl Kernels {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let attn = shared_layout(gpu, 8, 6);
        let mut embed = HashMap::new();
        for (ty, _) in shaders::WEIGHT_TYPES {
            embed.insert(*ty, pipeline(gpu, "embed", Some(*ty), "main")?);
        }
        Ok(Self {
            matvec: matvec::Matvec::new(gpu)?,
            embed,
            rms_norm: pipeline(gpu, "rms_norm", None, "main")?,
            rope: pipeline(gpu, "rope", None, "main")?,
            add: pipeline(gpu, "elementwise", None, "add")?,
            gelu_mul: pipeline(gpu, "elementwise", None, "gelu_mul")?,
            attn_scores: pipeline_with(gpu, "attention", None, "scores", Some(&attn))?,
            attn_mix: pipeline_with(gpu, "attention", None, "mix", Some(&attn))?,
            topk: pipeline(gpu, "topk", None, "main")?,
        })
    }
}
