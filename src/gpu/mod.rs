//! The WebGPU backend: wgpu on Vulkan natively (lavapipe in CI) and WebGPU in the browser,
//! with our own WGSL kernels (shaders/*.wgsl, loaded by one table in shaders.rs; launch code
//! in kernels/). Weights stay quantized on the GPU (weights.rs).
//!
//! Built so far: the device with the limits the model needs, quantized weight upload
//! (repacked for alignment, split by rows under the binding limit) and the decode
//! matrix-vector product for every weight type, tested against the CPU backend. The other
//! ops, the `Backend` impl and the device choice in `engine.rs` come next.

pub mod backend;
pub mod kernels;
pub mod shaders;
pub mod weights;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::error::{Error, Result};

/// How to ask for a device.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Ask for WebGPU's default limits only (128 MiB per binding), as the weakest device
    /// would give: the tests run the model that way too.
    pub default_limits: bool,
    /// Split weights into parts of at most this many bytes (tests: force splits on small
    /// matrices). Default: the device's binding limit.
    pub max_part_bytes: Option<u64>,
}

/// An open device.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub limits: wgpu::Limits,
    pub info: wgpu::AdapterInfo,
    /// `shader-f16` was offered and requested (SwiftShader has none).
    pub f16: bool,
    /// Largest weight part, bytes.
    pub max_part_bytes: u64,
    /// Bytes read back and queue submissions so far (tests count them per step).
    pub bytes_read: std::sync::atomic::AtomicU64,
    pub submits: std::sync::atomic::AtomicU64,
}

fn gpu_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("{what}: {e}"))
}

impl Gpu {
    /// Open the first adapter with the limits it offers (or the defaults); `Ok(None)` when
    /// there is no adapter (no `navigator.gpu`, a blocklisted GPU, no Vulkan driver).
    pub async fn new(opts: &GpuOptions) -> Result<Option<Gpu>> {
        #[cfg(target_arch = "wasm32")]
        if !wgpu::util::is_browser_webgpu_supported().await {
            return Ok(None);
        }
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = if cfg!(target_arch = "wasm32") {
            wgpu::Backends::BROWSER_WEBGPU
        } else {
            wgpu::Backends::VULKAN
        };
        let instance = wgpu::Instance::new(desc);
        let Ok(adapter) = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
        else {
            return Ok(None);
        };
        let offered = adapter.limits();
        let limits = if opts.default_limits {
            wgpu::Limits::default()
        } else {
            // What a model needs beyond the defaults: big bindings and buffers (the LM
            // head), and the adapter's workgroup sizes. Nothing else is raised.
            wgpu::Limits {
                max_storage_buffer_binding_size: offered.max_storage_buffer_binding_size,
                max_buffer_size: offered.max_buffer_size,
                max_compute_workgroup_storage_size: offered.max_compute_workgroup_storage_size,
                max_compute_invocations_per_workgroup: offered
                    .max_compute_invocations_per_workgroup,
                max_compute_workgroup_size_x: offered.max_compute_workgroup_size_x,
                max_storage_buffers_per_shader_stage: offered.max_storage_buffers_per_shader_stage,
                ..wgpu::Limits::default()
            }
        };
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let required_features = if f16 {
            wgpu::Features::SHADER_F16
        } else {
            wgpu::Features::empty()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kerze"),
                required_features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| gpu_err("the GPU refused a device", e))?;
        let binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let max_part_bytes = opts.max_part_bytes.unwrap_or(binding).min(binding);
        Ok(Some(Gpu {
            device,
            queue,
            limits,
            info: adapter.get_info(),
            f16,
            max_part_bytes,
            bytes_read: Default::default(),
            submits: Default::default(),
        }))
    }

    /// A storage buffer of `bytes` (rounded up to 4).
    pub fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// Copy `n` f32 from `buf` to the CPU (submits what `enc` recorded first).
    pub async fn read_f32(
        &self,
        enc: wgpu::CommandEncoder,
        buf: &wgpu::Buffer,
        n: usize,
    ) -> Result<Vec<f32>> {
        let words = self.read_words(enc, &[buf], n).await?;
        Ok(words[0].iter().map(|&w| f32::from_bits(w)).collect())
    }

    /// Submit `enc` and wait until the GPU finished it.
    pub async fn submit_and_wait(&self, enc: wgpu::CommandEncoder) -> Result<()> {
        self.queue.submit([enc.finish()]);
        self.submits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot();
        self.queue.on_submitted_work_done(move || tx.send(()));
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_err("waiting for the GPU", e))?;
        rx.await;
        Ok(())
    }

    /// `n` f32 values and `n` u32 ids (a top-k) in one submission.
    pub async fn read_pair(
        &self,
        enc: wgpu::CommandEncoder,
        values: &wgpu::Buffer,
        ids: &wgpu::Buffer,
        n: usize,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        let mut words = self.read_words(enc, &[values, ids], n).await?;
        let ids = words.pop().unwrap_or_default();
        let values = words.pop().unwrap_or_default();
        Ok((values.into_iter().map(f32::from_bits).collect(), ids))
    }

    /// The first `n` words of each buffer, through one staging buffer and one submission.
    async fn read_words(
        &self,
        enc: wgpu::CommandEncoder,
        bufs: &[&wgpu::Buffer],
        n: usize,
    ) -> Result<Vec<Vec<u32>>> {
        use std::sync::atomic::Ordering;
        let bytes = (n as u64) * 4;
        let total = bytes * bufs.len() as u64;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: total.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = enc;
        for (i, b) in bufs.iter().enumerate() {
            enc.copy_buffer_to_buffer(b, 0, &staging, i as u64 * bytes, bytes);
        }
        self.queue.submit([enc.finish()]);
        self.submits.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(total, Ordering::Relaxed);
        let slice = staging.slice(..);
        let (tx, rx) = oneshot();
        slice.map_async(wgpu::MapMode::Read, move |r| tx.send(r));
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| gpu_err("waiting for the GPU", e))?;
        rx.await
            .map_err(|e| gpu_err("reading back from the GPU", e))?;
        let out = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| gpu_err("mapping the readback", e))?;
            let all: Vec<u32> = view
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            all.chunks(n.max(1))
                .take(bufs.len())
                .map(<[u32]>::to_vec)
                .collect()
        };
        staging.unmap();
        Ok(out)
    }
}

/// A one-value channel whose receiving end is a future: `map_async` completes from the
/// event loop in the browser (never block there), from `poll` natively.
struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

struct Sender<T>(Arc<Mutex<Slot<T>>>);
struct Receiver<T>(Arc<Mutex<Slot<T>>>);

fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let s = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
    }));
    (Sender(s.clone()), Receiver(s))
}

impl<T> Sender<T> {
    fn send(self, v: T) {
        if let Ok(mut s) = self.0.lock() {
            s.value = Some(v);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Ok(mut s) = self.0.lock() else {
            return Poll::Pending;
        };
        match s.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
