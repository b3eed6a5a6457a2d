//! Attention with a KV cache on the CPU. A sliding-window layer keeps a ring of `window`
//! slots; a global layer keeps one slot per context position. Each slot remembers its
//! absolute position, so visibility is decided by positions, never by slot order, and so is
//! the order of every sum: a row's scores, weights and weighted values go by its keys'
//! positions, a chunk of `KEY_CHUNK` positions at a time (`chunks.rs`: `ChunkSums`, `fold`).
//!
//! Keys and values are held as f16, as llama.cpp holds them: half the memory (Gemma 3 270M:
//! 18 KiB a position instead of 36 over its 18 layers; 19.5 MiB less at 4096 positions, where
//! its sliding-window layers keep 512). A call's own rows are
//! rounded to f16 too before they are attended, so that a position reads the same key
//! whether it came in this call or an earlier one: a prompt gives the same values fed in
//! any chunks, restored from a saved prefix or not. Against the float64 reference this
//! moves Gemma 3's logits by ~0.001 (the gate is 0.01 mean, 0.05 max).

//!
//! - `kv.rs`: [`KvCache`], one layer's cache, and the f16 rounding;
//! - `chunks.rs`: a row's sums over chunks of its keys, folded in key order;
//! - `pass.rs`: the decode and prompt passes, and branches, over the pool's threads;
//! - `packed.rs`: an encoder's bidirectional attention over a packed batch.

mod chunks;
mod kv;
mod packed;
mod pass;
#[cfg(test)]
mod tests;

pub use kv::KvCache;
pub use packed::attend_packed;
pub use pass::{attend, attend_branches};
