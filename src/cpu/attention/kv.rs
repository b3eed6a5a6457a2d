//! One layer's KV cache: keys and values as f16 bits, a slot per position (a ring for a
//! sliding window), each slot remembering its absolute position; saved and restored as
//! prefix snapshots.

use crate::backend::KvRows;
use crate::cpu::ops::{f16_to_f32, f32_to_f16};
use crate::cpu::tensor::Act;
use crate::error::{Error, Result};

/// Slots per allocation of a layer's cache: it grows with the positions it holds, in runs of
/// this many, not with the context it may reach (Gemma 3 270M at 4096: 39 MiB for every
/// conversation; a 192-token one now holds 7). A run is never moved or freed, so growing
/// copies nothing and leaves no hole in wasm memory, whose size never comes down.
pub(super) const RUN_SLOTS: usize = 64;

/// One layer's cached keys and values, `n_slots` rows of `n_head_kv · head_dim` f16 bits.
#[derive(Clone)]
pub struct KvCache {
    /// Keys and values of slots `i · RUN_SLOTS..`, allocated when one of them is first written.
    pub(super) k: Vec<Vec<u16>>,
    pub(super) v: Vec<Vec<u16>>,
    /// Absolute position held by each slot (None: empty).
    pub(super) pos: Vec<Option<usize>>,
    pub(super) width: usize,
}

impl KvCache {
    pub fn new(n_slots: usize, width: usize) -> Self {
        Self {
            k: Vec::new(),
            v: Vec::new(),
            pos: vec![None; n_slots],
            width,
        }
    }

    pub fn clear(&mut self) {
        self.pos.iter_mut().for_each(|p| *p = None);
    }

    /// Slot `s`'s key: a slot that holds a position (`pos[s]` is `Some`) was written.
    pub(super) fn key(&self, s: usize) -> &[u16] {
        let at = (s % RUN_SLOTS) * self.width;
        &self.k[s / RUN_SLOTS][at..at + self.width]
    }

    pub(super) fn value(&self, s: usize) -> &[u16] {
        let at = (s % RUN_SLOTS) * self.width;
        &self.v[s / RUN_SLOTS][at..at + self.width]
    }

    /// Slot `s`'s key and value to write, its run allocated if it is not yet.
    pub(super) fn slot_mut(&mut self, s: usize) -> (&mut [u16], &mut [u16]) {
        let run = s / RUN_SLOTS;
        while self.k.len() <= run {
            let first = self.k.len() * RUN_SLOTS;
            let len = RUN_SLOTS.min(self.pos.len() - first) * self.width;
            self.k.push(vec![0; len]);
            self.v.push(vec![0; len]);
        }
        let at = (s % RUN_SLOTS) * self.width;
        (
            &mut self.k[run][at..at + self.width],
            &mut self.v[run][at..at + self.width],
        )
    }

    /// Slots allocated (a multiple of `RUN_SLOTS`, or every slot).
    #[cfg(test)]
    pub(super) fn allocated_slots(&self) -> usize {
        self.k.iter().map(Vec::len).sum::<usize>() / self.width.max(1)
    }

    /// The slots holding positions below `n_past` (all of them once a ring wrapped).
    pub fn save(&self, n_past: usize) -> Result<KvRows> {
        let n_slots = self.pos.len();
        let used = n_past.min(n_slots);
        let probe = KvRows {
            n_slots,
            width: self.width,
            k: Vec::new(),
            v: Vec::new(),
        };
        if (0..used).any(|s| self.pos[s] != Some(probe.position(s, n_past))) {
            return Err(Error::Backend(format!(
                "the KV cache does not hold exactly {n_past} positions"
            )));
        }
        let (mut k, mut v) = (
            Vec::with_capacity(used * self.width),
            Vec::with_capacity(used * self.width),
        );
        for s in 0..used {
            k.extend(self.key(s).iter().map(|&h| f16_to_f32(h)));
            v.extend(self.value(s).iter().map(|&h| f16_to_f32(h)));
        }
        Ok(KvRows { k, v, ..probe })
    }

    /// Put back what [`KvCache::save`] gave after `n_past` positions (f32 rows, as every
    /// backend saves them: the values this cache saved come back exactly).
    pub fn load(&mut self, rows: &KvRows, n_past: usize) -> Result<()> {
        let used = rows.fit(self.pos.len(), self.width, n_past)?;
        self.clear();
        let w = self.width;
        let (mut k, mut v) = (vec![0; w], vec![0; w]);
        for s in 0..used {
            round_into(&mut k, &rows.k[s * w..(s + 1) * w]);
            round_into(&mut v, &rows.v[s * w..(s + 1) * w]);
            self.write_slot(s, &k, &v, rows.position(s, n_past));
        }
        Ok(())
    }

    pub(super) fn write_slot(&mut self, s: usize, k: &[u16], v: &[u16], p: usize) {
        let (ks, vs) = self.slot_mut(s);
        ks.copy_from_slice(k);
        vs.copy_from_slice(v);
        self.pos[s] = Some(p);
    }
}

/// `src` as the cache holds it, into `dst` (as long).
pub(super) fn round_into(dst: &mut [u16], src: &[f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(x);
    }
}

/// A call's keys or values as the cache holds them.
pub(super) fn to_f16(a: &Act) -> Vec<u16> {
    let mut out = vec![0; a.data.len()];
    round_into(&mut out, &a.data);
    out
}

/// `row` (f32) from the f16 `bits`.
pub(super) fn widen(row: &mut [f32], bits: &[u16]) {
    for (d, &x) in row.iter_mut().zip(bits) {
        *d = f16_to_f32(x);
    }
}
