//! The WebGPU backend: wgpu on Vulkan natively (lavapipe in CI) and WebGPU in the browser,
//! with our own WGSL kernels (shaders/*.wgsl, loaded by one table in shaders.rs; launch code
//! in kernels/). Weights stay quantized on the GPU (weights.rs).
//!
//! This file: the device with the limits the model needs, submission and readback, and the
//! fault record: wgpu errors (caught by error scopes around every submission and the weight
//! upload, or by the uncaptured-error handler) and device loss become [`Error::Device`], never
//! a panic, and the engine moves to the CPU. `backend/` is the `Backend` impl.

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
    /// Buffers created so far (weights, caches, activations, readback).
    pub buffers_created: std::sync::atomic::AtomicU64,
    /// The readback buffer, reused while big enough.
    staging: Mutex<Option<wgpu::Buffer>>,
    /// Error scopes of submissions nobody waited for (a full arena, an upload): collected
    /// at the next wait, so their errors void that step too.
    pending: std::cell::RefCell<Vec<ScopeErrors>>,
    /// The first error the device reported outside a scope, or its loss: once set, nothing
    /// it computes is trusted (`check`).
    fault: Arc<Mutex<Option<String>>>,
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
        // Errors and loss are recorded, never left to wgpu's default handler (which panics:
        // in wasm that would kill the engine); the engine then continues on the CPU.
        let fault = Arc::new(Mutex::new(None::<String>));
        let f = fault.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            note_fault(&f, format!("{e}"));
        }));
        let f = fault.clone();
        device.set_device_lost_callback(move |reason, msg| {
            let msg = if msg.is_empty() {
                String::new()
            } else {
                format!(": {msg}")
            };
            note_fault(&f, format!("the device was lost ({reason:?}{msg})"));
        });
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
            buffers_created: Default::default(),
            staging: Mutex::new(None),
            pending: Default::default(),
            fault,
        }))
    }

    /// `Err(Error::Device)` once the device reported an error or was lost.
    pub fn check(&self) -> Result<()> {
        match self.fault.lock().ok().and_then(|f| f.clone()) {
            Some(why) => Err(Error::Device(why)),
            None => Ok(()),
        }
    }

    /// Destroy the device, as a driver reset or a browser reclaiming the GPU would: what
    /// follows fails with [`Error::Device`] (tests of the recovery onto the CPU).
    pub fn destroy(&self) {
        self.device.destroy();
    }

    /// Submit `enc` inside error scopes; the returned future gives the first validation or
    /// out-of-memory error of the submission (the encoder's own errors surface at `finish`).
    /// Push, submit and pop happen at once, so no other work can interleave with the scopes.
    fn submit(&self, enc: wgpu::CommandEncoder) -> ScopeErrors {
        self.count_submit();
        scoped(&self.device, || self.queue.submit([enc.finish()])).1
    }

    /// Wait for the queue, then report any error the scope `scoped` caught, or a fault.
    pub async fn settle(&self, scoped: ScopeErrors) -> Result<()> {
        let (tx, rx) = oneshot();
        self.queue.on_submitted_work_done(move || tx.send(()));
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the GPU: {e}")))?;
        rx.await;
        self.after(scoped).await
    }

    /// The fault after a submission: its scopes' error or an earlier unwaited submission's,
    /// else any error or loss reported.
    async fn after(&self, scoped: ScopeErrors) -> Result<()> {
        let earlier = std::mem::take(&mut *self.pending.borrow_mut());
        if let Some(e) = scoped.await {
            note_fault(&self.fault, e);
        }
        for p in earlier {
            if let Some(e) = p.await {
                note_fault(&self.fault, e);
            }
        }
        self.check()
    }

    /// Submit `enc` without waiting; its errors are collected at the next wait.
    pub fn submit_later(&self, enc: wgpu::CommandEncoder) {
        let errors = self.submit(enc);
        self.pending.borrow_mut().push(errors);
    }

    pub fn count_buffer(&self) {
        self.buffers_created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn count_submit(&self) {
        self.submits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A storage buffer of `bytes` (rounded up to 4).
    pub fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.count_buffer();
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
        self.check()?;
        let scoped = self.submit(enc);
        self.settle(scoped).await
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
        let staging = {
            let mut kept = self
                .staging
                .lock()
                .map_err(|_| Error::Backend("the readback buffer is poisoned".into()))?;
            match kept.as_ref() {
                Some(b) if b.size() >= total => b.clone(),
                _ => {
                    self.count_buffer();
                    let b = self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("readback"),
                        size: total.max(1024).next_multiple_of(4),
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    });
                    *kept = Some(b.clone());
                    b
                }
            }
        };
        self.check()?;
        if total == 0 {
            return Ok(vec![Vec::new(); bufs.len()]);
        }
        let mut enc = enc;
        for (i, b) in bufs.iter().enumerate() {
            enc.copy_buffer_to_buffer(b, 0, &staging, i as u64 * bytes, bytes);
        }
        let scoped = self.submit(enc);
        self.bytes_read.fetch_add(total, Ordering::Relaxed);
        let slice = staging.slice(..total);
        let (tx, rx) = oneshot();
        slice.map_async(wgpu::MapMode::Read, move |r| tx.send(r));
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the GPU: {e}")))?;
        let mapped = rx.await;
        // A lost device fails the mapping; an error in the step voids what it computed.
        self.after(scoped).await?;
        mapped.map_err(|e| Error::Device(format!("reading back from the GPU: {e}")))?;
        let out = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| Error::Device(format!("mapping the readback: {e}")))?;
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

/// Run `f` (work that creates or writes GPU resources: the weight upload, a submission)
/// inside error scopes; the future gives its first out-of-memory or validation error. Push,
/// `f` and pop happen at once: no other work can interleave with the scopes.
pub fn scoped<T>(device: &wgpu::Device, f: impl FnOnce() -> T) -> (T, ScopeErrors) {
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let out = f();
    let oom = oom.pop();
    let validation = validation.pop();
    (
        out,
        Box::pin(async move {
            let (o, v) = (oom.await, validation.await);
            o.or(v).map(|e| e.to_string())
        }),
    )
}

/// The first error error scopes caught (see [`scoped`]).
pub type ScopeErrors = Pin<Box<dyn Future<Output = Option<String>>>>;

/// Record the first fault, on one line (wgpu's messages span several).
fn note_fault(fault: &Mutex<Option<String>>, why: String) {
    let line = why
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "Caused by:")
        .collect::<Vec<_>>()
        .join(": ");
    if let Ok(mut f) = fault.lock() {
        f.get_or_insert(line);
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
