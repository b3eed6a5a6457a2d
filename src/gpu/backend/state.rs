//! The backend's state and what every op shares: the device, the kernels, the recorder with
//! its arena, the activation pool ([`GpuBackend`]); activations ([`GpuTensor`]); getting a
//! tensor from the pool, a step's small input into the arena, and the two launches several
//! ops share (elementwise, RMS norm).

use std::rc::Rc;

use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::gpu::kernels::elementwise::Op;
use crate::gpu::kernels::norm::NormParams;
use crate::gpu::kernels::{Kernels, Pool, Recorder};
use crate::gpu::weights::GpuWeight;
use crate::gpu::{Gpu, GpuOptions};

/// Activations on the GPU: `n_tok` rows of `width` f32.
#[derive(Clone)]
pub struct GpuTensor {
    /// From the pool: free again when the last clone is dropped.
    pub(super) buf: Rc<wgpu::Buffer>,
    pub n_tok: usize,
    pub width: usize,
}

impl GpuTensor {
    pub(super) fn len(&self) -> usize {
        self.n_tok * self.width
    }
}

pub struct GpuBackend {
    pub gpu: Gpu,
    pub(super) k: Kernels,
    pub rec: Recorder,
    pub(super) pool: Pool,
    /// Rotary cos/sin put in the arena (valid for the recording of their generation).
    pub(super) rope_cs: Vec<RopeCs>,
    /// An output constraint's allowed-token bitmask, for the top-k (made at the first one).
    pub(super) mask_buf: Option<std::rc::Rc<wgpu::Buffer>>,
}

/// Rotary cos/sin in the arena: for (first position, rows, the rope's key), the recorder
/// generation it was put in and its range.
pub(super) struct RopeCs {
    /// Digest of the positions, their count, the rope's key.
    pub(super) key: (u64, usize, u64),
    pub(super) generation: u64,
    pub(super) range: (u64, u64),
}

impl GpuBackend {
    /// Open a device and build every pipeline; `Ok(None)` when there is no adapter.
    pub async fn new(opts: &GpuOptions) -> Result<Option<Self>> {
        let Some(gpu) = Gpu::new(opts).await? else {
            return Ok(None);
        };
        let k = Kernels::new(&gpu)?;
        let rec = Recorder::new(&gpu);
        Ok(Some(Self {
            gpu,
            k,
            rec,
            pool: Pool::default(),
            rope_cs: Vec::new(),
            mask_buf: None,
        }))
    }

    /// Milliseconds spent recording commands so far.
    pub fn encode_ms(&self) -> f64 {
        self.rec.encode_ms
    }

    /// Bind groups created so far.
    pub fn bind_groups_created(&self) -> u64 {
        self.rec.bind_groups_created
    }

    /// Dispatches recorded so far.
    pub fn dispatches(&self) -> u64 {
        self.rec.dispatches
    }

    /// Bytes of activation buffers held by the pool.
    pub fn pool_bytes(&self) -> u64 {
        self.pool.bytes()
    }

    /// Activations from the CPU (`n_tok` rows of `width`).
    pub fn upload(&mut self, data: &[f32], n_tok: usize, width: usize) -> Result<GpuTensor> {
        if data.len() != n_tok * width {
            return Err(Error::Backend("upload: shape".into()));
        }
        // Submit what is recorded first: the queue write lands before the next submission.
        self.flush();
        let t = self.tensor(n_tok, width);
        self.gpu
            .queue
            .write_buffer(&t.buf, 0, &bytes_of(data, f32::to_le_bytes));
        Ok(t)
    }

    /// Take what was recorded (or a new encoder) for submission.
    pub(super) fn take_enc(&mut self) -> wgpu::CommandEncoder {
        self.rec
            .take(&self.gpu)
            .unwrap_or_else(|| self.gpu.device.create_command_encoder(&Default::default()))
    }

    /// Submit what was recorded without waiting.
    pub(super) fn flush(&mut self) {
        if let Some(enc) = self.rec.take(&self.gpu) {
            self.gpu.submit_later(enc);
        }
    }

    pub(super) fn tensor(&mut self, n_tok: usize, width: usize) -> GpuTensor {
        GpuTensor {
            buf: self.pool.take(&self.gpu, (n_tok * width * 4) as u64),
            n_tok,
            width,
        }
    }

    /// Put `bytes` (a step's small input) into the arena, with room for `then` more bytes
    /// of parameters after it, so no submission falls between the two.
    pub(super) fn put(&mut self, bytes: &[u8], then: u64) -> (u64, u64) {
        self.rec.reserve(&self.gpu, bytes.len() as u64 + then, 2);
        self.rec.put(bytes)
    }

    pub(super) fn elementwise(
        &mut self,
        a: &GpuTensor,
        b: &GpuTensor,
        op: Op,
    ) -> Result<GpuTensor> {
        if a.len() != b.len() {
            return Err(Error::Backend(format!(
                "elementwise op on {}×{} and {}×{}",
                a.n_tok, a.width, b.n_tok, b.width
            )));
        }
        self.gpu.check()?;
        let out = self.tensor(a.n_tok, a.width);
        self.k.elementwise.encode(
            &self.gpu,
            &mut self.rec,
            op,
            &a.buf,
            &b.buf,
            &out.buf,
            a.len() as u32,
        );
        Ok(out)
    }

    /// `[res +] rms_norm(x, w)`.
    pub(super) fn norm(
        &mut self,
        res: Option<&GpuTensor>,
        x: &GpuTensor,
        w: &GpuWeight,
        eps: f32,
    ) -> Result<GpuTensor> {
        let len = w.cols;
        if w.ty != GgmlType::F32 || w.rows != 1 || len == 0 || !x.len().is_multiple_of(len) {
            return Err(Error::Backend(format!(
                "rms_norm: weight {}×{} {} on rows of {}",
                w.rows, w.cols, w.ty, x.width
            )));
        }
        if res.is_some_and(|r| r.len() != x.len()) {
            return Err(Error::Backend("add_rms_norm: shapes differ".into()));
        }
        self.gpu.check()?;
        let out = self.tensor(x.n_tok, x.width);
        let p = NormParams {
            len: len as u32,
            n_groups: (x.len() / len) as u32,
            eps,
            add_residual: res.is_some(),
        };
        let res_buf = res.map_or(&x.buf, |r| &r.buf);
        self.k.rms_norm.encode(
            &self.gpu,
            &mut self.rec,
            &x.buf,
            &w.parts[0].buf,
            res_buf,
            &out.buf,
            p,
        );
        Ok(out)
    }
}

pub(super) fn bytes_of<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}
