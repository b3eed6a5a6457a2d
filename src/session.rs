//! A session: one model, its tokenizer and a KV cache on one backend. It runs ids after what
//! the cache holds and keeps, saves and restores that cache; what runs on it sits above: the
//! generation loop ([`crate::generate`]), continuation scores ([`crate::score`]), embeddings
//! ([`crate::embed`]) and classification ([`crate::classify`]).

use crate::backend::Backend;
use crate::constrain::Grammars;
use crate::error::{Error, Result};
use crate::model::{Cache, Model};
use crate::prefix::Prefix;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// A loaded model ready to run on backend `B`.
pub struct Session<B: Backend> {
    pub be: B,
    /// Shared by the sessions [`Session::fork`] makes (server slots): weights are read only.
    pub model: Arc<Model<B>>,
    pub tok: Arc<Tokenizer>,
    /// The KV cache and the ids it holds.
    cache: Cache<B>,
    /// Unit embeddings of label names and examples, by text (see [`crate::classify`]).
    pub(crate) kept_embeddings: std::collections::HashMap<String, Vec<f32>>,
    /// The constraint compiler for this vocabulary (built at the first constraint; shared
    /// with forks).
    pub(crate) grammars: Grammars,
}

impl<B: Backend> Session<B> {
    pub fn new(be: B, model: Model<B>, tok: Tokenizer) -> Result<Self> {
        Self::with_shared(be, Arc::new(model), Arc::new(tok), Grammars::default())
    }

    fn with_shared(
        mut be: B,
        model: Arc<Model<B>>,
        tok: Arc<Tokenizer>,
        grammars: Grammars,
    ) -> Result<Self> {
        let cache = model.new_cache(&mut be)?;
        Ok(Self {
            be,
            model,
            tok,
            cache,
            kept_embeddings: Default::default(),
            grammars,
        })
    }

    /// A second session on the same weights and tokenizer with its own (empty) KV cache: one
    /// per server slot, at the cost of a cache, not of another copy of the model. Where the
    /// backend can share its weights with another instance ([`Backend::fork`]).
    pub fn fork(&self) -> Result<Self> {
        Self::with_shared(
            self.be.fork()?,
            Arc::clone(&self.model),
            Arc::clone(&self.tok),
            self.grammars.clone(),
        )
    }

    /// Forget the KV cache.
    pub fn reset(&mut self) {
        self.cache.clear(&mut self.be);
    }

    /// Keep the longest part of the cache that `prompt_ids` starts with (see
    /// [`Session::cached_common`]), forget the rest.
    pub(crate) fn keep_common_prefix(&mut self, prompt_ids: &[u32]) {
        let keep = self.cached_common(prompt_ids);
        if keep == self.cached_len() && keep > 0 {
            return;
        }
        if keep > 0 {
            self.cache.truncate(keep);
        } else {
            self.reset();
        }
    }

    /// How many ids the cache holds.
    pub fn cached_len(&self) -> usize {
        self.cache.n_past()
    }

    /// The ids the cache holds, in order.
    pub fn cached_ids(&self) -> &[u32] {
        self.cache.ids()
    }

    /// How many of `ids` the cache holds and a generation of them would keep: the longest part
    /// of the cache `ids` starts with, short of its last id (its logits pick the next token).
    /// Going back to a shorter part is possible while no sliding-window ring has wrapped (the
    /// positions before the cut are all still there; the attention ignores slots at or after
    /// it); otherwise only a cache that `ids` extends is kept.
    pub fn cached_common(&self, ids: &[u32]) -> usize {
        let held = self.cache.ids();
        let common = held
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len().saturating_sub(1));
        let cfg = self.model.cfg();
        let ring = (0..cfg.n_layer)
            .map(|il| cfg.kv_slots(il))
            .min()
            .unwrap_or(0);
        if common == held.len() || held.len() <= ring {
            common
        } else {
            0
        }
    }

    /// The cache as it is, every layer's keys and values read out.
    pub async fn save_prefix(&mut self) -> Result<Prefix> {
        let n = self.cache.n_past();
        if n == 0 {
            return Err(Error::InvalidArgument(
                "nothing to save: the cache holds no prompt".into(),
            ));
        }
        let mut layers = Vec::with_capacity(self.cache.layers.len());
        for kv in &self.cache.layers {
            layers.push(self.be.save_kv(kv, n).await?);
        }
        Ok(Prefix {
            ids: self.cache.ids().to_vec(),
            layers,
        })
    }

    /// Put `p` into the cache (it was saved by this backend from this model, see
    /// [`crate::prefix`]): a prompt that starts with `p.ids` computes only the rest. On a
    /// mismatch the cache is left empty.
    pub fn restore_prefix(&mut self, p: &Prefix) -> Result<()> {
        let cfg = self.model.cfg();
        if p.layers.len() != self.cache.layers.len() {
            return Err(Error::Snapshot(format!(
                "{} layers, the model has {}",
                p.layers.len(),
                self.cache.layers.len()
            )));
        }
        if p.ids.is_empty() || p.ids.len() > cfg.n_ctx {
            return Err(Error::Snapshot(format!(
                "{} ids do not fit a context of {}",
                p.ids.len(),
                cfg.n_ctx
            )));
        }
        if let Some(bad) = p.ids.iter().find(|&&id| id as usize >= cfg.n_vocab) {
            return Err(Error::Snapshot(format!(
                "token id {bad} is outside the vocabulary"
            )));
        }
        self.reset();
        let n = p.ids.len();
        for (kv, rows) in self.cache.layers.iter_mut().zip(&p.layers) {
            if let Err(e) = self.be.load_kv(kv, rows, n) {
                self.reset();
                return Err(e);
            }
        }
        self.cache.set_restored(p.ids.clone());
        Ok(())
    }

    /// Run `ids` as branches of `lens` ids, each after what the cache holds (which keeps only
    /// that): their hidden states, a branch's rows together.
    pub(crate) fn forward_branches(&mut self, ids: &[u32], lens: &[usize]) -> Result<B::Tensor> {
        self.model
            .forward_branches(&mut self.be, ids, lens, &mut self.cache)
    }

    /// Run one chunk after what the cache holds: its hidden states `(chunk, n_embd)`.
    pub(crate) fn forward_chunk(&mut self, chunk: &[u32]) -> Result<B::Tensor> {
        let h = self.model.forward(&mut self.be, chunk, &mut self.cache);
        if h.is_err() {
            // A failed step may have written part of the chunk into the cache (a
            // sliding-window ring cannot be rolled back).
            self.reset();
        }
        h
    }

    /// Run `ids` after what the cache holds, in chunks; the hidden state of the last row.
    pub(crate) async fn feed(
        &mut self,
        ids: &[u32],
        abort: &dyn Fn() -> bool,
    ) -> Result<B::Tensor> {
        let mut last = None;
        for chunk in ids.chunks(self.be.prompt_rows()) {
            if abort() {
                return Err(Error::Aborted);
            }
            last = Some((self.forward_chunk(chunk)?, chunk.len()));
        }
        let (h, n) =
            last.ok_or_else(|| Error::InvalidArgument("nothing to run: empty input".into()))?;
        self.be.rows(&h, n - 1, 1)
    }

    /// Run one decode-shaped step (`<bos>`, the LM head, a top-1) and forget it: a GPU
    /// creates the buffers and bind groups of a decode step here, at load, and generation
    /// starts at full speed.
    pub async fn warm_up(&mut self) -> Result<()> {
        if self.model.cfg().family.is_encoder() {
            // An encoder's shapes vary with the batch: one short text creates its kernels.
            let ids: Vec<u32> = [self.tok.bos(), self.tok.eos()]
                .into_iter()
                .flatten()
                .collect();
            let ids = if ids.is_empty() { vec![0] } else { ids };
            let h = self.model.encode(&mut self.be, &[ids])?;
            self.be.read(&h).await?;
            return Ok(());
        }
        self.reset();
        let id = self.tok.bos().unwrap_or(0);
        let h = self.feed(&[id], &|| false).await?;
        self.model.lm_head_top_k(&mut self.be, &h, 1, None).await?;
        self.reset();
        Ok(())
    }

    /// Build the constraint engine's token trie now rather than at the first constraint (see
    /// [`Grammars::prepare`]): the milliseconds it took.
    pub fn prepare_constraints(&self) -> Result<f64> {
        self.grammars.prepare(&self.tok)
    }

    /// The model's end of generation (eos, end of turn: see [`Tokenizer::end_of_generation`]).
    pub fn default_stop_tokens(&self) -> Vec<u32> {
        self.tok.end_of_generation().to_vec()
    }
}

#[cfg(test)]
mod tests {
    /// On Gemma 3 270M's real head (262 144 × 640 Q8_0, the model `make test` fetches): at
    /// every step of greedy continuations, the CPU backend's head top-k (the 7-bit filter
    /// where this CPU has AVX2) equals the top-k of every logit, bit for bit and in order, for
    /// k = 1, 40 and 128, with and without a constraint's mask.
    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn the_filtered_head_equals_the_whole_head_on_gemma() {
        use crate::backend::{head_top_k_of_logits, Backend};
        use crate::gguf::{FileSource, Gguf};
        let path = std::env::var_os("KERZE_MODEL").map_or_else(
            || {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("models/gemma-3-270m-q4_k_m.gguf")
            },
            std::path::PathBuf::from,
        );
        let src = FileSource::open(&path).expect("the default model (make fetch)");
        let g = Gguf::read(&src).unwrap();
        let cfg = crate::config::ModelConfig::from_gguf(&g, Some(512)).unwrap();
        let tok = crate::tokenizer::Tokenizer::from_gguf(&g).unwrap();
        let mut be = crate::cpu::CpuBackend::new();
        let model = crate::model::Model::load(&mut be, &g, &src, cfg, &mut |_, _| {}).unwrap();
        let mut s = super::Session::new(be, model, tok).unwrap();
        let mut rng = crate::rng::Rng::new(7);
        let n_vocab = s.model.cfg().n_vocab;
        let mut checked = 0;
        for prompt in [
            "The history of the city begins",
            "fn main() {\n    let x = vec![",
        ] {
            s.reset();
            let mut ids = s.tok.encode_user(prompt, true).unwrap();
            let mut h = pollster::block_on(s.feed(&ids, &|| false)).unwrap();
            for _ in 0..12 {
                let mask: Vec<u32> = (0..n_vocab.div_ceil(32))
                    .map(|_| rng.next_u64() as u32)
                    .collect();
                let w = s.model.lm_weight().unwrap();
                for k in [1, 40, 128] {
                    for allowed in [None, Some(&mask[..])] {
                        let got = pollster::block_on(s.be.head_top_k(&h, w, k, allowed)).unwrap();
                        let want =
                            pollster::block_on(head_top_k_of_logits(&mut s.be, &h, w, k, allowed))
                                .unwrap();
                        assert_eq!(got, want, "{prompt:?} after {} ids, k {k}", ids.len());
                        checked += 1;
                    }
                }
                let next = pollster::block_on(s.be.head_top_k(&h, w, 1, None)).unwrap()[0].0;
                ids.push(next);
                h = pollster::block_on(s.feed(&[next], &|| false)).unwrap();
            }
        }
        assert_eq!(checked, 2 * 12 * 6);
    }
}
