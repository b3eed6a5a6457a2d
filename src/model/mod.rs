//! Forward passes, one file per architecture family, each generic over [`crate::Backend`].
//! [`Model`] is the one place that matches on the family; everything above it (session.rs,
//! generate/, engine/) holds a `Model<B>` and never names a family.

pub mod bert;
pub mod gemma3;
pub mod llama;
mod pass;
mod weights;

pub use pass::{Cache, Rows, Span};
pub use weights::{host_f32, host_vector, load_weights, Progress, Want, Weights};

use crate::backend::Backend;
use crate::config::{Family, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::{now, ByteSource, Gguf, SyncReads};
use crate::logits::TokenMask;

/// A loaded decoder of any family this build runs.
pub enum Model<B: Backend> {
    Gemma3(gemma3::Gemma3<B>),
    /// Llama, SmolLM, Qwen2 and Qwen3: one forward pass, the differences in the config.
    Llama(llama::Llama<B>),
    /// BERT-family encoders: token states for embeddings, no next token.
    Bert(bert::Bert<B>),
}

impl<B: Backend> Model<B> {
    /// The family's weights from `src` (every tensor's presence and shape checked first),
    /// every read done when asked ([`SyncReads`]).
    pub fn load(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress,
    ) -> Result<Self> {
        now(Self::load_async(be, g, &SyncReads(src), cfg, progress))?
    }

    /// [`Model::load`] awaiting each read ([`ByteSource::read_at_async`]): a source that
    /// reads ahead on another thread has the next bytes ready while these are unpacked.
    pub async fn load_async(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress<'_>,
    ) -> Result<Self> {
        match cfg.family {
            Family::Gemma3 => gemma3::Gemma3::load(be, g, src, cfg, progress)
                .await
                .map(Self::Gemma3),
            Family::Llama | Family::Qwen2 | Family::Qwen3 => {
                llama::Llama::load(be, g, src, cfg, progress)
                    .await
                    .map(Self::Llama)
            }
            Family::Bert => bert::Bert::load(be, g, src, cfg, progress)
                .await
                .map(Self::Bert),
        }
    }

    pub fn cfg(&self) -> &ModelConfig {
        match self {
            Self::Gemma3(m) => &m.cfg,
            Self::Llama(m) => &m.cfg,
            Self::Bert(m) => &m.cfg,
        }
    }

    /// An empty KV cache: per layer, a ring of `sliding_window` slots for sliding layers,
    /// `n_ctx` for global ones.
    pub fn new_cache(&self, be: &mut B) -> Result<Cache<B>> {
        let c = self.cfg();
        let layers = if c.family.is_encoder() {
            Vec::new()
        } else {
            (0..c.n_layer)
                .map(|il| be.new_kv(c.kv_slots(il), c.n_head_kv, c.head_dim))
                .collect::<Result<_>>()?
        };
        Ok(Cache::new(layers))
    }

    /// Run `ids` after what `cache` holds: the hidden states `(ids.len(), n_embd)`.
    pub fn forward(&self, be: &mut B, ids: &[u32], cache: &mut Cache<B>) -> Result<B::Tensor> {
        self.forward_rows(be, ids, Rows::Next, cache)
    }

    /// Run `ids` as branches of `lens` ids, each continuing what `cache` holds, which keeps
    /// only that: the hidden states `(ids.len(), n_embd)`, a branch's rows together.
    pub fn forward_branches(
        &self,
        be: &mut B,
        ids: &[u32],
        lens: &[usize],
        cache: &mut Cache<B>,
    ) -> Result<B::Tensor> {
        self.forward_rows(be, ids, Rows::Branches(lens), cache)
    }

    fn forward_rows(
        &self,
        be: &mut B,
        ids: &[u32],
        rows: Rows,
        cache: &mut Cache<B>,
    ) -> Result<B::Tensor> {
        match self {
            Self::Gemma3(m) => m.forward(be, ids, rows, cache),
            Self::Llama(m) => m.forward(be, ids, rows, cache),
            Self::Bert(_) => Err(not_a_decoder()),
        }
    }

    /// A decoder's LM head `(n_vocab, n_embd)`.
    pub(crate) fn lm_weight(&self) -> Result<&B::Weight> {
        match self {
            Self::Gemma3(m) => Ok(m.head()),
            Self::Llama(m) => Ok(m.head()),
            Self::Bert(_) => Err(not_a_decoder()),
        }
    }

    /// Logits `(rows, n_vocab)` of hidden states `(rows, n_embd)`.
    pub fn lm_head(&self, be: &mut B, hidden: &B::Tensor) -> Result<B::Tensor> {
        be.matmul(hidden, self.lm_weight()?)
    }

    /// The `k` largest logits of the last hidden row (among `allowed`, an output
    /// constraint's mask), as [`Backend::top_k`] of [`Model::lm_head`] gives them, without
    /// every logit where the backend can (see [`Backend::head_top_k`]).
    pub async fn lm_head_top_k(
        &self,
        be: &mut B,
        hidden: &B::Tensor,
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Result<Vec<(u32, f32)>> {
        be.head_top_k(hidden, self.lm_weight()?, k, allowed).await
    }

    /// The sequence-classification head of an encoder that has one.
    pub fn head(&self) -> Option<&bert::Head> {
        match self {
            Self::Bert(m) => m.head.as_ref(),
            _ => None,
        }
    }

    /// Every token's state for a batch of texts, packed `(Σ len, n_embd)`: encoders only.
    pub fn encode(&self, be: &mut B, texts: &[Vec<u32>]) -> Result<B::Tensor> {
        match self {
            Self::Bert(m) => m.forward(be, texts),
            _ => Err(Error::InvalidArgument(format!(
                "{} is a decoder: embeddings come from an encoder model (bert)",
                self.cfg().arch
            ))),
        }
    }
}

fn not_a_decoder() -> Error {
    Error::InvalidArgument(
        "this model is an encoder (embeddings): it does not generate text; use embed".into(),
    )
}
