//! The KV cache on the GPU ([`GpuKv`]): made, cleared, read back to rows and written from
//! them (what the `Backend`'s `save_kv` and `load_kv` do on this backend).

use super::state::GpuBackend;
use crate::backend::KvRows;
use crate::error::{Error, Result};

/// One layer's KV cache: `n_slots` rows of keys and values, and the position each slot
/// holds (-1: empty), written on the GPU.
pub struct GpuKv {
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
    pub(super) pos_buf: wgpu::Buffer,
    pub(super) n_slots: usize,
    pub(super) width: usize,
}

impl GpuBackend {
    /// See [`Backend::new_kv`](crate::backend::Backend::new_kv).
    pub(super) fn make_kv(
        &mut self,
        n_slots: usize,
        n_head_kv: usize,
        head_dim: usize,
    ) -> Result<GpuKv> {
        let width = n_head_kv * head_dim;
        let bytes = (n_slots * width * 4) as u64;
        let mut kv = GpuKv {
            k: self.gpu.storage("k cache", bytes),
            v: self.gpu.storage("v cache", bytes),
            pos_buf: self.gpu.storage("kv pos", (n_slots * 4) as u64),
            n_slots,
            width,
        };
        self.reset_kv(&mut kv);
        Ok(kv)
    }

    /// See [`Backend::clear_kv`](crate::backend::Backend::clear_kv).
    pub(super) fn reset_kv(&mut self, kv: &mut GpuKv) {
        self.k
            .attention
            .clear(&self.gpu, &mut self.rec, &kv.pos_buf, kv.n_slots as u32);
    }

    /// See [`Backend::save_kv`](crate::backend::Backend::save_kv): the cache read back.
    pub(super) async fn read_kv(&mut self, kv: &GpuKv, n_past: usize) -> Result<KvRows> {
        let used = n_past.min(kv.n_slots);
        let enc = self.take_enc();
        let mut kvw = self
            .gpu
            .read_words(enc, &[&kv.k, &kv.v], used * kv.width)
            .await?;
        let enc = self.take_enc();
        let pos = self.gpu.read_words(enc, &[&kv.pos_buf], used).await?;
        let to_f32 = |w: Vec<u32>| w.into_iter().map(f32::from_bits).collect::<Vec<f32>>();
        let v = to_f32(kvw.pop().unwrap_or_default());
        let k = to_f32(kvw.pop().unwrap_or_default());
        let rows = KvRows {
            n_slots: kv.n_slots,
            width: kv.width,
            k,
            v,
        };
        let held = pos.first().map_or(&[][..], Vec::as_slice);
        if held.len() != used || (0..used).any(|s| held[s] as usize != rows.position(s, n_past)) {
            return Err(Error::Backend(format!(
                "the KV cache does not hold exactly {n_past} positions"
            )));
        }
        Ok(rows)
    }

    /// See [`Backend::load_kv`](crate::backend::Backend::load_kv): the rows written to the cache.
    pub(super) fn write_kv(&mut self, kv: &mut GpuKv, rows: &KvRows, n_past: usize) -> Result<()> {
        let used = rows.fit(kv.n_slots, kv.width, n_past)?;
        self.gpu.check()?;
        // What was recorded runs first (a clear of this cache among it): queue writes land
        // before the next submission, so the recorder must be empty.
        self.flush();
        let pos: Vec<i32> = (0..kv.n_slots)
            .map(|s| {
                if s < used {
                    rows.position(s, n_past) as i32
                } else {
                    -1
                }
            })
            .collect();
        let le = |w: &mut dyn Iterator<Item = [u8; 4]>| w.flatten().collect::<Vec<u8>>();
        let q = &self.gpu.queue;
        if used > 0 {
            q.write_buffer(&kv.k, 0, &le(&mut rows.k.iter().map(|x| x.to_le_bytes())));
            q.write_buffer(&kv.v, 0, &le(&mut rows.v.iter().map(|x| x.to_le_bytes())));
        }
        q.write_buffer(
            &kv.pos_buf,
            0,
            &le(&mut pos.iter().map(|x| x.to_le_bytes())),
        );
        Ok(())
    }
}
