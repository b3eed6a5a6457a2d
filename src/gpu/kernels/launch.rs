//! What every kernel's launch code uses: pipelines built once at load; dispatches recorded
//! by the [`Recorder`] (one encoder per step, parameters in one arena, cached bind groups) on
//! buffers from the [`Pool`].

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::gpu::{shaders, Gpu};

/// Workgroups for `n` items: (x, y) with x ≤ 65 535 (the dispatch limit per dimension).
pub fn grid(n: u32) -> (u32, u32) {
    const MAX: u32 = 65_535;
    if n <= MAX {
        (n.max(1), 1)
    } else {
        (MAX, n.div_ceil(MAX))
    }
}

/// Compile `kernel` (with weight type `ty`) and make a pipeline for `entry` with `layout`.
pub fn pipeline(
    gpu: &Gpu,
    kernel: &str,
    ty: Option<GgmlType>,
    entry: &str,
    layout: &wgpu::PipelineLayout,
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
            layout: Some(layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        }))
}

/// Every kernel binds `n_storage` storage buffers (the first `n_read` read-only) and then
/// its params as a uniform: this is its layout. The params, and storage binding `arena_at`
/// when there is one (a small input: token ids, rotary cos/sin), live in the recorder's
/// arena at dynamic offsets, so a bind group does not depend on where in the arena a step
/// put them.
pub fn layout(
    gpu: &Gpu,
    n_storage: u32,
    n_read: u32,
    arena_at: Option<u32>,
) -> wgpu::PipelineLayout {
    let mut entries: Vec<wgpu::BindGroupLayoutEntry> = (0..n_storage)
        .map(|i| wgpu::BindGroupLayoutEntry {
            binding: i,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage {
                    read_only: i < n_read,
                },
                has_dynamic_offset: arena_at == Some(i),
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
            has_dynamic_offset: true,
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

/// A buffer binding: the whole buffer, or `size` bytes from `offset` (`dynamic`: an arena
/// range, bound at a dynamic offset).
#[derive(Clone, Copy)]
pub struct Bind<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: Option<u64>,
    pub dynamic: bool,
}

impl<'a> From<&'a wgpu::Buffer> for Bind<'a> {
    fn from(buf: &'a wgpu::Buffer) -> Self {
        Bind {
            buf,
            offset: 0,
            size: None,
            dynamic: false,
        }
    }
}

/// The recorder's arena buffer.
pub struct Arena(wgpu::Buffer);

impl Arena {
    /// The range `(offset, size)` that [`Recorder::put`] gave, as a binding.
    pub fn range(&self, (offset, size): (u64, u64)) -> Bind<'_> {
        Bind {
            buf: &self.0,
            offset,
            size: Some(size),
            dynamic: true,
        }
    }
}

/// A bind group's identity: the pipeline and every binding (arena ranges by size only: they
/// move, at dynamic offsets). A decode step binds the same buffers (weights, the KV cache,
/// pooled activations) every time, so its bind groups are made once and found again.
#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: wgpu::ComputePipeline,
    bindings: Vec<(wgpu::Buffer, u64, u64)>,
}

/// Bytes of the arena that holds a recording's parameters and small inputs (token ids,
/// rotary cos/sin): a step needs ~100 KB; a recording that needs more is submitted in parts.
const ARENA_BYTES: u64 = 4 << 20;
/// Bind groups kept before the cache starts over (prefill chunk shapes add a few each).
const MAX_BIND_GROUPS: usize = 16_384;

/// Records the commands of a step into one encoder: uniforms and small inputs go into one
/// arena buffer, written once at submission; bind groups come from a cache. Dispatches go
/// into one compute pass until a copy or the submission ends it: WebGPU makes each dispatch
/// its own usage scope, so a dispatch still sees what the one before it wrote, and a pass per
/// dispatch only added two calls (and in a browser two messages to its GPU process) to each.
pub struct Recorder {
    /// The open compute pass of `enc` (ended before anything else is recorded on `enc`;
    /// declared first, so that it is dropped, and ended, before `enc`).
    pass: Option<wgpu::ComputePass<'static>>,
    enc: Option<wgpu::CommandEncoder>,
    /// When the open encoder got its first command (ms, crate::clock).
    t0: Option<f64>,
    /// Milliseconds spent recording, from each encoder's first command to its submission
    /// (the CPU side of a step).
    pub encode_ms: f64,
    arena: wgpu::Buffer,
    align: u64,
    data: Vec<u8>,
    /// Bumped each time the arena is handed to a submission: earlier ranges are void.
    pub generation: u64,
    binds: HashMap<BindKey, wgpu::BindGroup>,
    /// Bind groups created so far (tests count them per step).
    pub bind_groups_created: u64,
    /// Dispatches recorded so far.
    pub dispatches: u64,
}

impl Recorder {
    pub fn new(gpu: &Gpu) -> Self {
        let l = &gpu.limits;
        let align = u64::from(
            l.min_uniform_buffer_offset_alignment
                .max(l.min_storage_buffer_offset_alignment),
        );
        let arena = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("arena"),
            size: ARENA_BYTES.min(l.max_buffer_size),
            usage: wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        gpu.count_buffer();
        Self {
            pass: None,
            enc: None,
            t0: None,
            encode_ms: 0.0,
            arena,
            align,
            data: Vec::new(),
            generation: 0,
            binds: HashMap::new(),
            bind_groups_created: 0,
            dispatches: 0,
        }
    }

    /// The open encoder (a new one when there is none). Not while a pass is open.
    fn enc(&mut self, gpu: &Gpu) -> &mut wgpu::CommandEncoder {
        self.t0.get_or_insert_with(crate::clock::now_ms);
        self.enc
            .get_or_insert_with(|| gpu.device.create_command_encoder(&Default::default()))
    }

    /// Make room for `bytes` more (in up to `pieces` aligned pieces) in the arena, submitting
    /// what was recorded when it is full. Ranges taken before a submission are void after it.
    pub fn reserve(&mut self, gpu: &Gpu, bytes: u64, pieces: u64) {
        let need = self.data.len() as u64 + bytes + pieces * self.align;
        if need > self.arena.size() {
            if let Some(enc) = self.take(gpu) {
                gpu.submit_later(enc);
            }
        }
    }

    /// Put `bytes` into the arena: its range (offset, size). Call [`Recorder::reserve`] first.
    pub fn put(&mut self, bytes: &[u8]) -> (u64, u64) {
        let off = (self.data.len() as u64).next_multiple_of(self.align);
        self.data.resize(off as usize, 0);
        self.data.extend_from_slice(bytes);
        let size = (bytes.len() as u64).next_multiple_of(4).max(4);
        self.data.resize((off + size) as usize, 0);
        (off, size)
    }

    /// The arena buffer (a handle: bind ranges of it with [`Arena::range`]).
    pub fn arena(&self) -> Arena {
        Arena(self.arena.clone())
    }

    /// Record one dispatch: `bindings` at 0.., the params as a uniform after them.
    pub fn dispatch(
        &mut self,
        gpu: &Gpu,
        pipeline: &wgpu::ComputePipeline,
        bindings: &[Bind],
        params: &[u32],
        groups: (u32, u32),
    ) {
        let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.reserve(gpu, bytes.len() as u64, 1);
        let (off, size) = self.put(&bytes);
        let mut dynamic = Vec::new();
        let mut all: Vec<(wgpu::Buffer, u64, u64)> = Vec::with_capacity(bindings.len() + 1);
        for b in bindings {
            let offset = if b.dynamic {
                dynamic.push(b.offset as u32);
                0
            } else {
                b.offset
            };
            all.push((b.buf.clone(), offset, b.size.unwrap_or(u64::MAX)));
        }
        all.push((self.arena.clone(), 0, size));
        dynamic.push(off as u32);
        let key = BindKey {
            pipeline: pipeline.clone(),
            bindings: all,
        };
        if self.binds.len() >= MAX_BIND_GROUPS && !self.binds.contains_key(&key) {
            self.binds.clear();
        }
        let bind = match self.binds.get(&key) {
            Some(b) => b.clone(),
            None => {
                let layout = pipeline.get_bind_group_layout(0);
                let entries: Vec<wgpu::BindGroupEntry> = key
                    .bindings
                    .iter()
                    .enumerate()
                    .map(|(i, (buf, offset, size))| wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: buf,
                            offset: *offset,
                            size: (*size != u64::MAX)
                                .then(|| wgpu::BufferSize::new(*size))
                                .flatten(),
                        }),
                    })
                    .collect();
                let b = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &layout,
                    entries: &entries,
                });
                self.bind_groups_created += 1;
                self.binds.insert(key, b.clone());
                b
            }
        };
        let pass = match self.pass.take() {
            Some(pass) => pass,
            None => self
                .enc(gpu)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                })
                .forget_lifetime(),
        };
        let pass = self.pass.insert(pass);
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind, &dynamic);
        pass.dispatch_workgroups(groups.0, groups.1, 1);
        self.dispatches += 1;
    }

    /// Record a buffer copy.
    pub fn copy(
        &mut self,
        gpu: &Gpu,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        size: u64,
    ) {
        self.pass = None;
        self.enc(gpu)
            .copy_buffer_to_buffer(src, src_off, dst, dst_off, size);
    }

    /// What was recorded, ready to submit (the arena is written first: a queue write lands
    /// before the next submission), or `None` when nothing was.
    pub fn take(&mut self, gpu: &Gpu) -> Option<wgpu::CommandEncoder> {
        // Dropping the pass ends it.
        self.pass = None;
        if let Some(t0) = self.t0.take() {
            self.encode_ms += crate::clock::now_ms() - t0;
        }
        if !self.data.is_empty() {
            gpu.queue.write_buffer(&self.arena, 0, &self.data);
            self.data.clear();
        }
        self.generation += 1;
        self.enc.take()
    }
}

/// Activation buffers, reused: a buffer is free when only the pool holds it. Sizes are
/// rounded up to a power of two, so a step of the same shape takes the same buffers in the
/// same order (and finds its bind groups again), and prefill chunks of any length share a
/// few sizes. Kernels never read a buffer's length, only their parameters.
#[derive(Default)]
pub struct Pool {
    free: HashMap<u64, Vec<std::rc::Rc<wgpu::Buffer>>>,
}

impl Pool {
    pub fn take(&mut self, gpu: &Gpu, bytes: u64) -> std::rc::Rc<wgpu::Buffer> {
        self.take_sized(gpu, bytes.max(256).next_power_of_two())
    }

    fn take_sized(&mut self, gpu: &Gpu, size: u64) -> std::rc::Rc<wgpu::Buffer> {
        let list = self.free.entry(size).or_default();
        if let Some(b) = list.iter().find(|b| std::rc::Rc::strong_count(b) == 1) {
            return b.clone();
        }
        let b = std::rc::Rc::new(gpu.storage("activations", size));
        list.push(b.clone());
        b
    }

    /// A buffer of exactly `bytes` (rounded to 256): for sizes near the binding limit, where
    /// rounding up to a power of two could pass it.
    pub fn take_exact(&mut self, gpu: &Gpu, bytes: u64) -> std::rc::Rc<wgpu::Buffer> {
        self.take_sized(gpu, bytes.max(256).next_multiple_of(256))
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.free
            .iter()
            .map(|(size, v)| size * v.len() as u64)
            .sum()
    }
}
