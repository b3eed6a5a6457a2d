//! A session (model + tokenizer + KV cache on one backend) and generation: chunked prefill,
//! the decode loop, stop tokens and stop strings, streaming of whole UTF-8 pieces, abort
//! between steps. Driven one step at a time, so a JS worker can interleave messages.

use crate::backend::Backend;
use crate::clock::now_ms;
use crate::constrain::{Constraint, Grammars, Guide};
use crate::error::{Error, Result};
use crate::model::{Cache, Model};
use crate::prefix::Prefix;
use crate::sampler::{top_k, Sampler, SamplerConfig};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::sync::Arc;

/// Tokens per prefill chunk: large enough to reuse each weight tile across rows, small enough
/// to keep activations small and let an abort land quickly.
pub const PREFILL_CHUNK: usize = 128;

/// The most candidates a step asks the backend's top-k for (the GPU's limit).
const TOP_K_MAX: usize = 128;

/// Options of one generation.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GenerateOptions {
    pub max_tokens: usize,
    #[serde(flatten)]
    pub sampler: SamplerConfig,
    /// Generation ends before any of these strings; the string is not returned.
    pub stop: Vec<String>,
    /// Generation ends at these ids (default: the model's end-of-sequence tokens).
    pub stop_tokens: Option<Vec<u32>>,
    /// What the output must be (see [`crate::constrain`]); it ends once that is complete.
    pub constraint: Option<Constraint>,
    /// JSON constraints allow free whitespace between tokens (default: compact JSON).
    pub json_whitespace: bool,
}

impl GenerateOptions {
    /// Exactly `n` greedy tokens, end-of-sequence ignored: benchmarks and tests.
    pub fn greedy_tokens(n: usize) -> Self {
        Self {
            max_tokens: n,
            sampler: SamplerConfig::greedy(),
            stop: Vec::new(),
            stop_tokens: Some(Vec::new()),
            constraint: None,
            json_whitespace: false,
        }
    }
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampler: SamplerConfig::default(),
            stop: Vec::new(),
            stop_tokens: None,
            constraint: None,
            json_whitespace: false,
        }
    }
}

/// One streamed piece: whole UTF-8 characters, and the token that completed it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Chunk {
    pub text: String,
    pub token_id: u32,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context window is full.
    ContextFull,
}

/// Counts and speeds of a generation.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens actually computed (the rest came from the KV cache).
    pub prefill_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// Tokens run again after the engine moved to the CPU (the GPU was lost), and the time.
    pub replayed_tokens: usize,
    pub replay_ms: f64,
    /// Milliseconds the constraint took (its masks and commits; 0 without one).
    pub mask_ms: f64,
    /// Generated tokens that were not sampled: forced by the constraint (the one
    /// continuation it allows) or those of a picked choice. They run as one chunk.
    pub forced_tokens: usize,
    /// Milliseconds the constraint took to compile (with the vocabulary's token trie the
    /// first time a model is constrained; a kept constraint is not compiled again).
    pub compile_ms: f64,
    /// A `choices` constraint: each choice's log-likelihood after the prompt and probability
    /// among the choices, in the order given (the answer is the one the sampler picked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<Vec<crate::classify::ChoiceScore>>,
}

/// The state of one generation between steps.
pub struct Generation {
    sampler: Sampler,
    max_tokens: usize,
    stop_tokens: Vec<u32>,
    stop: StopStrings,
    decoder: StreamDecoder,
    /// Prompt and generated ids so far.
    pub ids: Vec<u32>,
    pub prompt_len: usize,
    /// Ids (from the start of `ids`) in the cache so far.
    prefilled: usize,
    phase: Phase,
    /// A chunk computed but not returned because the step after it failed: the next
    /// `step` returns it first (whatever the phase).
    stash: Option<Chunk>,
    /// Where a prefill chunk ends so that the cache is saved there (see
    /// [`Generation::save_prefix_at`]), and the snapshot once made.
    save_at: Option<usize>,
    saved: Option<Prefix>,
    /// The constraint's state: which tokens may come next.
    guide: Option<Guide>,
    /// A `choices` constraint's options (their scores go to `usage.choices`).
    choice_list: Option<Vec<String>>,
    /// Tokens decided without sampling (forced by the constraint, or a picked choice): each
    /// is emitted by a step of its own, and they are run together, as one chunk, when the
    /// last one is emitted (then the next token is sampled).
    decided: std::collections::VecDeque<u32>,
    /// The output ends with the last decided token (a picked choice).
    end_after_decided: bool,
    pub usage: Usage,
}

/// Where a generation is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Ids from `prefilled` on are to be run: the prompt, or every id so far again on a new
    /// backend (`replay`, see [`Generation::replay`]).
    Prefill { replay: bool },
    /// Everything is in the cache and this token is sampled, not yet emitted or fed.
    Sampled(u32),
    /// Ended: [`Session::step`] gives what is held back, then `None`.
    Finished(FinishReason),
}

impl Generation {
    /// How many more tokens may be generated: within `max_tokens` and the context.
    fn tokens_left(&self, n_ctx: usize) -> usize {
        self.max_tokens
            .saturating_sub(self.usage.completion_tokens)
            .min(n_ctx.saturating_sub(self.ids.len()))
    }

    /// Generated ids so far.
    pub fn generated(&self) -> &[u32] {
        &self.ids[self.prompt_len..]
    }

    /// Why it ended, once it has.
    pub fn finish(&self) -> Option<FinishReason> {
        match self.phase {
            Phase::Finished(r) => Some(r),
            _ => None,
        }
    }

    /// Continue on a session whose cache is empty (the engine moved to another backend):
    /// the next steps run every id so far again, then sample as if nothing happened. A
    /// finished generation stays finished (only what is held back is left to give).
    pub fn replay(&mut self) {
        if self.finish().is_none() {
            // A token already sampled (the constraint has moved past it) stays what comes.
            if let Phase::Sampled(id) = self.phase {
                self.decided.push_front(id);
            }
            self.prefilled = 0;
            self.phase = Phase::Prefill { replay: true };
        }
        self.save_at = None;
    }

    /// Save the cache once the prompt's first `n` ids are in it (a fixed system prompt or
    /// few-shot prefix): a prefill chunk ends there, and [`Generation::take_prefix`] gives the
    /// snapshot. Ignored unless `n` ids are still to be computed and at least one follows.
    pub fn save_prefix_at(&mut self, n: usize) {
        self.save_at = (n > self.prefilled && n < self.prompt_len).then_some(n);
    }

    /// The snapshot [`Generation::save_prefix_at`] asked for, once the prefill passed it.
    pub fn take_prefix(&mut self) -> Option<Prefix> {
        self.saved.take()
    }
}

/// A loaded model ready to generate on backend `B`.
pub struct Session<B: Backend> {
    pub be: B,
    /// Shared by the sessions [`Session::fork`] makes (server slots): weights are read only.
    pub model: Arc<Model<B>>,
    pub tok: Arc<Tokenizer>,
    cache: Cache<B>,
    /// The ids whose keys and values the cache holds, in order.
    cached_ids: Vec<u32>,
    /// Unit embeddings of label names and examples, by text (see [`crate::classify`]).
    pub(crate) kept_embeddings: std::collections::HashMap<String, Vec<f32>>,
    /// The constraint compiler for this vocabulary (built at the first constraint; shared
    /// with forks).
    grammars: Grammars,
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
            cached_ids: Vec::new(),
            kept_embeddings: Default::default(),
            grammars,
        })
    }

    /// Forget the KV cache.
    pub fn reset(&mut self) {
        for kv in &mut self.cache.layers {
            self.be.clear_kv(kv);
        }
        self.cache.n_past = 0;
        self.cached_ids.clear();
    }

    /// Keep the longest part of the cache that `prompt_ids` starts with (see
    /// [`Session::cached_common`]), forget the rest.
    pub(crate) fn keep_common_prefix(&mut self, prompt_ids: &[u32]) {
        let keep = self.cached_common(prompt_ids);
        if keep == self.cached_ids.len() && keep > 0 {
            return;
        }
        if keep > 0 {
            self.cache.n_past = keep;
            self.cached_ids.truncate(keep);
        } else {
            self.reset();
        }
    }

    /// How many ids the cache holds.
    pub(crate) fn cached_len(&self) -> usize {
        self.cached_ids.len()
    }

    /// How many of `ids` the cache holds and a generation of them would keep: the longest part
    /// of the cache `ids` starts with, short of its last id (its logits pick the next token).
    /// Going back to a shorter part is possible while no sliding-window ring has wrapped (the
    /// positions before the cut are all still there; the attention ignores slots at or after
    /// it); otherwise only a cache that `ids` extends is kept.
    pub fn cached_common(&self, ids: &[u32]) -> usize {
        let common = self
            .cached_ids
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
        if common == self.cached_ids.len() || self.cached_ids.len() <= ring {
            common
        } else {
            0
        }
    }

    /// The cache as it is, every layer's keys and values read out.
    pub async fn save_prefix(&mut self) -> Result<Prefix> {
        let n = self.cache.n_past;
        if n == 0 || n != self.cached_ids.len() {
            return Err(Error::InvalidArgument(
                "nothing to save: the cache holds no prompt".into(),
            ));
        }
        let mut layers = Vec::with_capacity(self.cache.layers.len());
        for kv in &self.cache.layers {
            layers.push(self.be.save_kv(kv, n).await?);
        }
        Ok(Prefix {
            ids: self.cached_ids.clone(),
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
        self.cache.n_past = n;
        self.cached_ids = p.ids.clone();
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
        match self.model.forward(&mut self.be, chunk, &mut self.cache) {
            Ok(h) => {
                self.cached_ids.extend_from_slice(chunk);
                Ok(h)
            }
            Err(e) => {
                // A failed step may have written part of the chunk into the cache (a
                // sliding-window ring cannot be rolled back).
                self.reset();
                Err(e)
            }
        }
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

    /// Run `ids` after what the cache holds, in chunks; the hidden state of the last row.
    async fn feed(&mut self, ids: &[u32], abort: &dyn Fn() -> bool) -> Result<B::Tensor> {
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

    /// Sample the next token from the hidden state `h` (one row): from the backend's top-k
    /// when the sampler can decide from that (a GPU reads back a few hundred bytes), else
    /// from all the logits. Under a constraint, only allowed tokens are candidates (the
    /// backend's top-k among them, or the read logits masked); where it allows one
    /// continuation, its tokens are taken without sampling.
    async fn sample_next(&mut self, g: &mut Generation, h: &B::Tensor) -> Result<u32> {
        let left = g.tokens_left(self.model.cfg().n_ctx);
        if let Some(guide) = g.guide.as_mut() {
            // The one continuation the constraint allows: taken without the LM head.
            let t0 = now_ms();
            let forced = guide.take_forced(left);
            g.usage.mask_ms += now_ms() - t0;
            if let Some((&first, rest)) = forced?.split_first() {
                g.usage.forced_tokens += 1 + rest.len();
                g.decided.extend(rest);
                return Ok(first);
            }
        }
        let needed = g.sampler.candidates_needed(&g.ids, TOP_K_MAX);
        // The constraint's own time, apart from the backend's (its top-k and readbacks).
        let mut mask_ms = 0.0;
        let mut timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            let t0 = now_ms();
            let r = f();
            mask_ms += now_ms() - t0;
            r
        };
        let id = match (needed, g.guide.as_mut()) {
            (Some(k), None) => {
                let cands = self.model.lm_head_top_k(&mut self.be, h, k, None).await?;
                g.sampler.sample_top(cands, &g.ids)
            }
            (Some(k), Some(guide)) => {
                // The top-k among the allowed tokens (on a GPU the mask goes to the device and
                // only k pairs come back): all of them when fewer are allowed, so exact.
                let mut words = Vec::new();
                timed(&mut || {
                    words = guide.allowed_words()?;
                    Ok(())
                })?;
                let cands = self
                    .model
                    .lm_head_top_k(&mut self.be, h, k, Some(&words))
                    .await?;
                g.sampler.sample_top(cands, &g.ids)
            }
            (None, guide) => {
                let logits = self.model.lm_head(&mut self.be, h)?;
                let mut l = self.be.read(&logits).await?;
                if let Some(guide) = guide {
                    timed(&mut || guide.apply(&mut l))?;
                }
                g.sampler.sample(&mut l, &g.ids)
            }
        };
        if let Some(guide) = g.guide.as_mut() {
            timed(&mut || {
                if !guide.allows(id)? {
                    return Err(Error::Backend(format!(
                        "constraint: the sampler picked token {id}, which it does not allow"
                    )));
                }
                guide.commit(id)
            })?;
        }
        g.usage.mask_ms += mask_ms;
        Ok(id)
    }

    /// Prefill `prompt_ids` (reusing the cache when it holds a prefix of them) and sample the
    /// first token. Then call [`Session::step`] until it returns `None`.
    pub async fn start(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
    ) -> Result<Generation> {
        start(self, prompt_ids, opts, abort).await
    }

    /// Check `prompt_ids` and `opts` and set up a generation without computing anything: then
    /// [`Session::prefill_step`] until it returns `true`, then [`Session::step`]. A caller
    /// that must stay responsive (a JS worker) gets control back after every chunk.
    pub fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation> {
        if self.model.cfg().family.is_encoder() {
            return Err(Error::InvalidArgument(format!(
                "{} is an encoder (embeddings): it does not generate text; use embed",
                self.model.cfg().arch
            )));
        }
        if prompt_ids.is_empty() {
            return Err(Error::InvalidArgument("the prompt has no tokens".into()));
        }
        let n_ctx = self.model.cfg().n_ctx;
        if prompt_ids.len() > n_ctx {
            return Err(Error::ContextFull {
                needed: prompt_ids.len(),
                n_ctx,
            });
        }
        if let Some(bad) = prompt_ids
            .iter()
            .find(|&&id| id as usize >= self.model.cfg().n_vocab)
        {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary"
            )));
        }
        let sampler = Sampler::new(opts.sampler.clone())?;
        let stop_tokens = match &opts.stop_tokens {
            Some(s) => s.clone(),
            None => self.default_stop_tokens(),
        };
        let t0 = now_ms();
        let guide = match &opts.constraint {
            Some(c) => {
                let mut g = self.grammars.compile(&self.tok, c, opts.json_whitespace)?;
                g.set_ends(&stop_tokens);
                Some(g)
            }
            None => None,
        };
        let compile_ms = if guide.is_some() { now_ms() - t0 } else { 0.0 };
        self.keep_common_prefix(&prompt_ids);
        let prefill_tokens = prompt_ids.len() - self.cached_ids.len();
        Ok(Generation {
            sampler,
            max_tokens: opts.max_tokens,
            stop_tokens,
            stop: StopStrings::new(opts.stop.clone()),
            decoder: StreamDecoder::new(),
            prompt_len: prompt_ids.len(),
            prefilled: self.cached_ids.len(),
            ids: prompt_ids,
            phase: Phase::Prefill { replay: false },
            stash: None,
            save_at: None,
            saved: None,
            guide,
            choice_list: match &opts.constraint {
                Some(Constraint::Choices(c)) => Some(c.clone()),
                _ => None,
            },
            decided: Default::default(),
            end_after_decided: false,
            usage: Usage {
                prompt_tokens: 0,
                prefill_tokens,
                compile_ms,
                ..Usage::default()
            },
        })
    }

    /// Run the next chunk of the prompt (or, after [`Generation::replay`], of every id so
    /// far); `true` once all are in the cache and the next token is sampled.
    pub async fn prefill_step(&mut self, g: &mut Generation) -> Result<bool> {
        let Phase::Prefill { replay } = g.phase else {
            return Ok(true);
        };
        let target = g.ids.len();
        if g.prefilled >= target {
            return Err(Error::Backend("a prefill with nothing left to run".into()));
        }
        if self.cached_ids[..] != g.ids[..g.prefilled] {
            return Err(Error::InvalidArgument(
                "the session ran something else since this generation began".into(),
            ));
        }
        let mut end = (g.prefilled + self.be.prompt_rows()).min(target);
        if let Some(at) = g.save_at.filter(|&at| at > g.prefilled && at < end) {
            end = at;
        }
        let chunk = g.ids[g.prefilled..end].to_vec();
        let t0 = now_ms();
        let h = self.forward_chunk(&chunk)?;
        g.prefilled = end;
        let done = end == target;
        if done {
            g.usage.prompt_tokens = g.prompt_len;
            g.phase = if g.max_tokens == 0 {
                Phase::Finished(FinishReason::Length)
            } else if let Some(next) = g.decided.pop_front() {
                // A replay: what comes next was decided before.
                Phase::Sampled(next)
            } else if let Some(first) = self.pick_choice(g).await? {
                Phase::Sampled(first)
            } else {
                let h = self.be.rows(&h, chunk.len() - 1, 1)?;
                Phase::Sampled(self.sample_next(g, &h).await?)
            };
        } else {
            self.be.sync().await?;
        }
        let dt = now_ms() - t0;
        if replay {
            g.usage.replay_ms += dt;
            g.usage.replayed_tokens += chunk.len();
        } else {
            g.usage.prefill_ms += dt;
            g.usage.prefill_tokens_per_s = (g.prefilled + g.usage.prefill_tokens - g.prompt_len)
                as f64
                / (g.usage.prefill_ms / 1000.0).max(1e-9);
        }
        if g.save_at == Some(end) {
            // Outside the prefill's time: a GPU reads the cache back here.
            g.save_at = None;
            g.saved = Some(self.save_prefix().await?);
        }
        Ok(done)
    }

    /// A `choices` constraint, once the prompt is in the cache: every choice scored as a
    /// branch after it ([`Session::choice_scores`]), one picked by the sampler from their
    /// log-likelihoods (greedy: the likeliest), and its tokens decided: the first returned,
    /// the rest queued, the output ending with them. `None` without choices (or where a
    /// choice is too long to score: then the mask decides, token by token).
    async fn pick_choice(&mut self, g: &mut Generation) -> Result<Option<u32>> {
        let Some(list) = g.choice_list.take() else {
            return Ok(None);
        };
        let prompt = g.ids[..g.prompt_len].to_vec();
        g.usage.choices = self.choice_scores(&prompt, &list).await?;
        let Some(scores) = &g.usage.choices else {
            return Ok(None);
        };
        let cands = scores
            .iter()
            .enumerate()
            .map(|(i, c)| (i as u32, c.logprob as f32))
            .collect();
        let picked = g.sampler.sample_candidates(cands) as usize;
        let mut ids = self.tok.encode_user(&list[picked], false)?;
        let left = g.tokens_left(self.model.cfg().n_ctx).max(1);
        // Cut short by max_tokens or the context: it ends with `length`, not as a choice.
        g.end_after_decided = ids.len() <= left;
        ids.truncate(left);
        g.guide = None;
        let first = ids[0];
        g.decided.extend(&ids[1..]);
        g.usage.forced_tokens += ids.len();
        Ok(Some(first))
    }

    /// Emit the token sampled last and compute the one after it. `None` once finished.
    pub async fn step(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Chunk>> {
        if let Some(c) = g.stash.take() {
            return Ok(Some(c));
        }
        while !self.prefill_step(g).await? {
            if abort() {
                return Err(Error::Aborted);
            }
        }
        let id = match g.phase {
            Phase::Sampled(id) => id,
            Phase::Finished(_) => return Ok(self.flush(g)),
            Phase::Prefill { .. } => {
                return Err(Error::Backend("the prompt is not in the cache yet".into()))
            }
        };
        // A constraint's end: where it is complete, the model chose to end (also when the
        // caller's stop tokens leave the end of sequence out).
        let ends = g.guide.as_ref().is_some_and(|guide| guide.is_end(id));
        if g.stop_tokens.contains(&id) || ends {
            g.phase = Phase::Finished(FinishReason::Stop);
            return Ok(self.flush(g));
        }
        g.ids.push(id);
        g.usage.completion_tokens += 1;
        let piece = g.decoder.step(&self.tok, id)?;
        let (text, hit) = g.stop.push(&piece);
        if hit {
            g.phase = Phase::Finished(FinishReason::Stop);
            return Ok(Some(Chunk { text, token_id: id }));
        }
        let complete = match g.guide.as_mut() {
            // The constraint is already past the decided tokens still to come.
            _ if !g.decided.is_empty() => false,
            Some(guide) => {
                // Computes the next mask (kept for the next sample).
                let t0 = now_ms();
                let end = guide.must_end()?;
                g.usage.mask_ms += now_ms() - t0;
                end
            }
            None => g.end_after_decided,
        };
        if complete {
            g.phase = Phase::Finished(FinishReason::Stop);
        } else if g.usage.completion_tokens >= g.max_tokens {
            g.phase = Phase::Finished(FinishReason::Length);
        } else if g.ids.len() >= self.model.cfg().n_ctx {
            g.phase = Phase::Finished(FinishReason::ContextFull);
        } else if let Some(next) = g.decided.pop_front() {
            // Decided already: run with the others when the last of them is emitted.
            g.phase = Phase::Sampled(next);
        } else {
            // `id` (and the decided tokens before it) are not in the cache until `advance`
            // ran them.
            g.phase = Phase::Prefill { replay: false };
            let t0 = now_ms();
            match self.advance(g, abort).await {
                Ok(next) => {
                    g.phase = Phase::Sampled(next);
                    g.prefilled = g.ids.len();
                }
                Err(e) => {
                    // Keep the text: a caller that recovers (the engine, onto the CPU) gets
                    // it from the next step.
                    g.stash = Some(Chunk { text, token_id: id });
                    return Err(e);
                }
            }
            g.usage.decode_ms += now_ms() - t0;
            let n = g.usage.completion_tokens as f64;
            g.usage.decode_tokens_per_s = n / (g.usage.decode_ms / 1000.0).max(1e-9);
        }
        if g.finish().is_some() {
            let rest = self.flush(g).map(|c| c.text).unwrap_or_default();
            return Ok(Some(Chunk {
                text: text + &rest,
                token_id: id,
            }));
        }
        Ok(Some(Chunk { text, token_id: id }))
    }

    /// Feed the tokens emitted since the cache was last extended (the last one, or a run of
    /// decided ones, as one chunk) and sample the token after them.
    async fn advance(&mut self, g: &mut Generation, abort: &dyn Fn() -> bool) -> Result<u32> {
        let fresh = g.ids[g.prefilled..].to_vec();
        let h = self.feed(&fresh, abort).await?;
        self.sample_next(g, &h).await
    }

    /// The text held back (an incomplete character or a partial stop string) once finished.
    fn flush(&self, g: &mut Generation) -> Option<Chunk> {
        if g.stop.hit {
            return None;
        }
        let tail = g.decoder.flush(&self.tok).unwrap_or_default();
        let text = g.stop.finish(&tail);
        let id = g.ids.last().copied().unwrap_or(0);
        (!text.is_empty()).then_some(Chunk { text, token_id: id })
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

    /// Generate to the end, calling `on_chunk` for every piece.
    pub async fn generate(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
        on_chunk: &mut dyn FnMut(&Chunk),
    ) -> Result<Generation> {
        generate(self, prompt_ids, opts, abort, on_chunk).await
    }

    /// Teacher-forced: for every position of `ids` from `first` on, the `k` best `(id, logit)`
    /// of the next token. The LM head runs chunk by chunk (and only from `first`), so 600
    /// positions never hold 600 × 262 144 logits.
    pub async fn logits_top_k(
        &mut self,
        ids: &[u32],
        k: usize,
        first: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        self.reset();
        self.logits_from(ids, k, first).await
    }

    /// [`Session::logits_top_k`] computing only what the cache does not hold of `ids`
    /// before `first` (a restored prefix, an earlier call's ids).
    pub async fn logits_from(
        &mut self,
        ids: &[u32],
        k: usize,
        first: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        if ids.len() > self.model.cfg().n_ctx {
            return Err(Error::ContextFull {
                needed: ids.len(),
                n_ctx: self.model.cfg().n_ctx,
            });
        }
        self.keep_common_prefix(&ids[..(first + 1).min(ids.len())]);
        let start = self.cache.n_past;
        let mut out = Vec::with_capacity(ids.len().saturating_sub(first));
        for chunk in ids[start..].chunks(PREFILL_CHUNK / 2) {
            let start = self.cache.n_past;
            let h = self.forward_chunk(chunk)?;
            if start + chunk.len() <= first {
                continue;
            }
            let skip = first.saturating_sub(start);
            let h = self.be.rows(&h, skip, chunk.len() - skip)?;
            let logits = self.model.lm_head(&mut self.be, &h)?;
            let logits = self.be.read(&logits).await?;
            let n_vocab = self.model.cfg().n_vocab;
            out.extend(logits.chunks_exact(n_vocab).map(|row| top_k(row, k)));
        }
        Ok(out)
    }
}

impl<B: Backend> Session<B> {
    /// One vector per text from an encoder (see [`crate::embed`]).
    pub async fn embed(
        &mut self,
        texts: &[&str],
        opts: &crate::embed::EmbedOptions,
    ) -> Result<crate::embed::Embeddings> {
        use crate::embed::{normalize, Embeddings};
        let pooling = self
            .model
            .cfg()
            .pooling
            .ok_or_else(|| self.not_an_encoder())?;
        let t0 = now_ms();
        let (mut data, mut usage) = self.pooled(texts, opts.overflow, pooling).await?;
        if opts.normalize {
            data.iter_mut().for_each(|v| normalize(v));
        }
        usage.encode_ms = now_ms() - t0;
        Ok(Embeddings { data, usage })
    }

    fn not_an_encoder(&self) -> Error {
        Error::InvalidArgument(format!(
            "{} is a decoder: embeddings come from an encoder model (bert)",
            self.model.cfg().arch
        ))
    }

    /// One pooled, unnormalised vector per text; a text in chunks gets its pieces' vectors
    /// averaged, weighted by their tokens.
    pub(crate) async fn pooled(
        &mut self,
        texts: &[&str],
        overflow: crate::embed::Overflow,
        pooling: crate::config::Pooling,
    ) -> Result<(Vec<Vec<f32>>, crate::embed::EmbedUsage)> {
        use crate::embed::{batches, plan, pool, EmbedUsage};
        let cfg = self.model.cfg().clone();
        if cfg.pooling.is_none() {
            return Err(self.not_an_encoder());
        }
        if texts.is_empty() {
            return Err(Error::InvalidArgument("embed: no texts".into()));
        }
        let mut usage = EmbedUsage::default();
        // Each text's pieces (one, or its chunks), and which text each piece belongs to.
        let mut pieces: Vec<Vec<u32>> = Vec::new();
        let mut owner: Vec<usize> = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            let ids = self.tok.encode_user(t, true)?;
            for p in plan(ids, cfg.max_seq, overflow, &mut usage)?.pieces {
                owner.push(i);
                pieces.push(p);
            }
        }
        let mut vectors: Vec<Vec<f32>> = Vec::with_capacity(pieces.len());
        for r in batches(&pieces) {
            let batch = &pieces[r];
            let h = self.model.encode(&mut self.be, batch)?;
            let rows = self.be.read(&h).await?;
            let lens: Vec<usize> = batch.iter().map(Vec::len).collect();
            vectors.extend(pool(&rows, cfg.n_embd, &lens, pooling));
        }
        usage.prompt_tokens = pieces.iter().map(Vec::len).sum();
        let mut data = vec![vec![0f64; cfg.n_embd]; texts.len()];
        let mut weight = vec![0f64; texts.len()];
        for ((v, &i), p) in vectors.iter().zip(&owner).zip(&pieces) {
            let w = p.len() as f64;
            for (a, &x) in data[i].iter_mut().zip(v) {
                *a += w * f64::from(x);
            }
            weight[i] += w;
        }
        let data = data
            .into_iter()
            .zip(weight)
            .map(|(v, w)| v.iter().map(|x| (x / w) as f32).collect())
            .collect();
        Ok((data, usage))
    }

    /// The classification head's outputs per text (its `[CLS]` state, the text truncated
    /// to the model's length): the logits, before softmax or sigmoid.
    pub async fn head_logits(
        &mut self,
        texts: &[&str],
    ) -> Result<(Vec<Vec<f64>>, crate::embed::EmbedUsage)> {
        if self.model.head().is_none() {
            return Err(Error::InvalidArgument(
                "classify: this model has no classification head: give labels (names or examples)"
                    .into(),
            ));
        }
        let (cls, usage) = self
            .pooled(
                texts,
                crate::embed::Overflow::Truncate,
                crate::config::Pooling::Cls,
            )
            .await?;
        let head = self
            .model
            .head()
            .ok_or_else(|| Error::Backend("head gone".into()))?;
        Ok((cls.iter().map(|c| head.logits(c)).collect(), usage))
    }
}

impl Session<crate::cpu::CpuBackend> {
    /// A second session on the same weights and tokenizer with its own (empty) KV cache: one
    /// per server slot, at the cost of a cache, not of another copy of the model.
    pub fn fork(&self) -> Result<Self> {
        Self::with_shared(
            crate::cpu::CpuBackend::new(),
            Arc::clone(&self.model),
            Arc::clone(&self.tok),
            self.grammars.clone(),
        )
    }
}

/// What runs a generation step by step: a [`Session`], or an [`crate::Engine`] (which moves
/// to the CPU when the GPU fails between its steps). The loops over the steps, [`start`] and
/// [`generate`], are written once, for both; a JS worker drives the same steps itself, so that
/// it can yield between them.
#[allow(async_fn_in_trait)]
pub trait Steps {
    /// See [`Session::begin`].
    fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation>;
    /// See [`Session::prefill_step`].
    async fn prefill_step(&mut self, g: &mut Generation) -> Result<bool>;
    /// See [`Session::step`].
    async fn step(&mut self, g: &mut Generation, abort: &dyn Fn() -> bool)
        -> Result<Option<Chunk>>;
}

impl<B: Backend> Steps for Session<B> {
    fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation> {
        Session::begin(self, prompt_ids, opts)
    }
    async fn prefill_step(&mut self, g: &mut Generation) -> Result<bool> {
        Session::prefill_step(self, g).await
    }
    async fn step(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Chunk>> {
        Session::step(self, g, abort).await
    }
}

/// Begin, and prefill until the first token is sampled (aborting between chunks).
pub async fn start(
    s: &mut impl Steps,
    prompt_ids: Vec<u32>,
    opts: &GenerateOptions,
    abort: &dyn Fn() -> bool,
) -> Result<Generation> {
    let mut g = s.begin(prompt_ids, opts)?;
    loop {
        if abort() {
            return Err(Error::Aborted);
        }
        if s.prefill_step(&mut g).await? {
            return Ok(g);
        }
    }
}

/// [`start`], then every step to the end, calling `on_chunk` for every piece.
pub async fn generate(
    s: &mut impl Steps,
    prompt_ids: Vec<u32>,
    opts: &GenerateOptions,
    abort: &dyn Fn() -> bool,
    on_chunk: &mut dyn FnMut(&Chunk),
) -> Result<Generation> {
    let mut g = start(s, prompt_ids, opts, abort).await?;
    while let Some(c) = s.step(&mut g, abort).await? {
        on_chunk(&c);
    }
    Ok(g)
}

/// Holds back text that may be the start of a stop string.
struct StopStrings {
    stops: Vec<String>,
    held: String,
    hit: bool,
}

impl StopStrings {
    fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            hit: false,
        }
    }

    /// Add a piece; returns the text safe to emit and whether a stop string was found.
    fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.hit = true;
            return (out, true);
        }
        // Keep the longest suffix of `held` that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| s.char_indices().skip(1).map(move |(i, _)| &s[..i]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Everything still held, plus `tail`.
    fn finish(&mut self, tail: &str) -> String {
        let mut s = std::mem::take(&mut self.held);
        s.push_str(tail);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::StopStrings;

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
        let mut rng = crate::sampler::Rng::new(7);
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

    #[test]
    fn stop_strings_hold_back_prefixes() {
        let mut s = StopStrings::new(vec!["\n\nUser:".into()]);
        assert_eq!(s.push("Hello"), ("Hello".into(), false));
        assert_eq!(s.push(" world\n"), (" world".into(), false));
        assert_eq!(s.push("\nUs"), (String::new(), false));
        assert_eq!(s.push("er: hi"), (String::new(), true));
        let mut s = StopStrings::new(vec!["STOP".into()]);
        assert_eq!(s.push("ST"), (String::new(), false));
        assert_eq!(s.push("ay"), ("STay".into(), false));
        assert_eq!(s.finish("x"), "x");
    }
}
