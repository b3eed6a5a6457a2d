//! Forward passes, one file per architecture family, each generic over [`crate::Backend`].
//! [`Model`] is the one place that matches on the family; everything above it (generate.rs,
//! engine.rs) holds a `Model<B>` and never names a family.

pub mod gemma3;

use crate::backend::Backend;
use crate::config::{Family, ModelConfig};
use crate::error::Result;
use crate::gguf::{ByteSource, Gguf};

/// The KV caches of all layers and how many positions they hold.
pub struct Cache<B: Backend> {
    pub layers: Vec<B::Kv>,
    pub n_past: usize,
}

/// Load progress: bytes copied so far, of all tensor bytes.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// A loaded decoder of any family this build runs.
pub enum Model<B: Backend> {
    Gemma3(gemma3::Gemma3<B>),
}

impl<B: Backend> Model<B> {
    /// The family's weights from `src` (every tensor's presence and shape checked first).
    pub fn load(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress,
    ) -> Result<Self> {
        match cfg.family {
            Family::Gemma3 => gemma3::Gemma3::load(be, g, src, cfg, progress).map(Self::Gemma3),
        }
    }

    pub fn cfg(&self) -> &ModelConfig {
        match self {
            Self::Gemma3(m) => &m.cfg,
        }
    }

    /// An empty KV cache sized for `cfg().n_ctx`.
    pub fn new_cache(&self, be: &mut B) -> Result<Cache<B>> {
        match self {
            Self::Gemma3(m) => m.new_cache(be),
        }
    }

    /// Run `ids` after what `cache` holds: the hidden states `(ids.len(), n_embd)`.
    pub fn forward(&self, be: &mut B, ids: &[u32], cache: &mut Cache<B>) -> Result<B::Tensor> {
        match self {
            Self::Gemma3(m) => m.forward(be, ids, cache),
        }
    }

    /// Logits `(rows, n_vocab)` of hidden states `(rows, n_embd)`.
    pub fn lm_head(&self, be: &mut B, hidden: &B::Tensor) -> Result<B::Tensor> {
        match self {
            Self::Gemma3(m) => m.lm_head(be, hidden),
        }
    }
}
