//! The top-k on the GPU: the logits' last row reduced in stages of blocks, the first under
//! an output constraint's token mask when there is one; k values and k ids come back.

use super::state::{bytes_of, GpuBackend, GpuTensor};
use crate::backend::Backend;
use crate::error::Result;
use crate::gpu::kernels::topk::{TopKStage, TOPK_BLOCK};
use crate::logits::TokenMask;

/// The most candidates the GPU top-k gives (more: the logits are read whole).
pub const TOPK_MAX: usize = 128;

impl GpuBackend {
    /// The top-k stages of [`Backend::top_k`], the first one under `allowed` when given (it
    /// goes up in a buffer of its own: 32 KiB for 262 144 tokens).
    pub(super) async fn top_k_on_device(
        &mut self,
        x: &GpuTensor,
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Result<Vec<(u32, f32)>> {
        self.gpu.check()?;
        let k = k.clamp(1, TOPK_MAX);
        let row = self.rows(x, x.n_tok - 1, 1)?;
        let mut len = x.width;
        let mut first = true;
        let (mut in_v, mut in_i) = (row.buf.clone(), row.buf.clone());
        let words = x.width.div_ceil(32);
        let mask = match allowed {
            Some(a) => {
                let mut w = vec![0u32; words];
                let n = a.len().min(words);
                w[..n].copy_from_slice(&a[..n]);
                let buf = match &self.mask_buf {
                    Some(b) if b.size() >= (words * 4) as u64 => b.clone(),
                    _ => {
                        let b =
                            std::rc::Rc::new(self.gpu.storage("token mask", (words * 4) as u64));
                        self.mask_buf = Some(b.clone());
                        b
                    }
                };
                // Read only by this step's first stage, which the next submission runs; the
                // last step's is read back already.
                self.gpu
                    .queue
                    .write_buffer(&buf, 0, &bytes_of(&w, u32::to_le_bytes));
                Some(buf)
            }
            None => None,
        };
        loop {
            let blocks = len.div_ceil(TOPK_BLOCK);
            let out_v = self.pool.take(&self.gpu, (blocks * k * 4) as u64);
            let out_i = self.pool.take(&self.gpu, (blocks * k * 4) as u64);
            let stage = TopKStage {
                len: len as u32,
                k: k as u32,
                first,
                masked: first && mask.is_some(),
            };
            self.k.topk.encode(
                &self.gpu,
                &mut self.rec,
                &in_v,
                &in_i,
                mask.as_deref().unwrap_or(in_i.as_ref()),
                &out_v,
                &out_i,
                stage,
            );
            (in_v, in_i, len, first) = (out_v, out_i, blocks * k, false);
            if blocks == 1 {
                break;
            }
        }
        // One readback of k values and k ids: the only bytes a decode step moves.
        let enc = self.take_enc();
        let (v, ids) = self.gpu.read_pair(enc, &in_v, &in_i, k).await?;
        Ok(v.into_iter()
            .zip(ids)
            .filter(|&(v, id)| (id as usize) < x.width && v > -3.0e38)
            .map(|(v, id)| (id, v))
            .collect())
    }
}
