//! The generation loop on a [`Session`]: [`Session::begin`] sets a generation up,
//! [`Session::next`] runs it one turn at a time (chunked prefill, then sampling and decoding
//! under stop tokens, stop strings and the constraint, with whole UTF-8 pieces streamed).

use super::generation::{Generation, Phase};
use super::options::{Chunk, Event, FinishReason, GenerateOptions, Usage};
use super::stop::StopStrings;
use crate::backend::Backend;
use crate::clock::now_ms;
use crate::constrain::Constraint;
use crate::error::{Error, Result};
use crate::sampler::Sampler;
use crate::session::Session;
use crate::tokenizer::StreamDecoder;

/// The most candidates a step asks the backend's top-k for (the GPU's limit).
const TOP_K_MAX: usize = 128;

impl<B: Backend> Session<B> {
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
    /// first token. Then call [`Session::next`] until it returns `None`.
    pub async fn start(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
    ) -> Result<Generation> {
        super::start(self, prompt_ids, opts, abort).await
    }

    /// Check `prompt_ids` and `opts` and set up a generation without computing anything: then
    /// [`Session::next`] until it returns `None`. A caller that must stay responsive (a JS
    /// worker) gets control back after every chunk of the prompt and every token.
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
        let cached = self.cached_len();
        let prefill_tokens = prompt_ids.len() - cached;
        // A snapshot only where the prefill computes the prefix and goes on past it.
        let save_at = opts
            .save_prefix_at
            .filter(|&n| n > cached && n < prompt_ids.len());
        Ok(Generation {
            sampler,
            max_tokens: opts.max_tokens,
            stop_tokens,
            stop: StopStrings::new(opts.stop.clone()),
            decoder: StreamDecoder::new(),
            prompt_len: prompt_ids.len(),
            ids: prompt_ids,
            phase: Phase::Prefill { replay: false },
            stash: None,
            save_at,
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

    /// The generation loop, one turn at a time: the next chunk of the prompt (or, after
    /// [`Generation::replay`], of every id so far), else the next piece of text; `None` once
    /// finished. Every caller drives this same loop: [`super::generate`] to the end, the
    /// server's slots and the browser's worker turn by turn (the worker yields to the page's
    /// events between turns). `abort` is asked before each chunk of the prompt and between
    /// the chunks of a decode step's input.
    pub async fn next(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Event>> {
        if let Some(c) = g.stash.take() {
            return Ok(Some(Event::Chunk(c)));
        }
        if g.is_prefilling() {
            if abort() {
                return Err(Error::Aborted);
            }
            let saving = g.save_at.is_some();
            self.prefill_step(g).await?;
            let saved = saving && g.save_at.is_none() && g.saved.is_some();
            return Ok(Some(if saved {
                Event::PrefixSaved
            } else {
                Event::Prefilled
            }));
        }
        Ok(self.step(g, abort).await?.map(Event::Chunk))
    }

    /// Run the next chunk of the prompt (or, after [`Generation::replay`], of every id so
    /// far); `true` once all are in the cache and the next token is sampled. A turn of
    /// [`Session::next`].
    pub async fn prefill_step(&mut self, g: &mut Generation) -> Result<bool> {
        let Phase::Prefill { replay } = g.phase else {
            return Ok(true);
        };
        let target = g.ids.len();
        let from = self.cached_len();
        if from >= target {
            return Err(Error::Backend("a prefill with nothing left to run".into()));
        }
        if !g.ids.starts_with(self.cached_ids()) {
            return Err(Error::InvalidArgument(
                "the session ran something else since this generation began".into(),
            ));
        }
        let mut end = (from + self.be.prompt_rows()).min(target);
        if let Some(at) = g.save_at.filter(|&at| at > from && at < end) {
            end = at;
        }
        let chunk = g.ids[from..end].to_vec();
        let t0 = now_ms();
        let h = self.forward_chunk(&chunk)?;
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
            g.usage.prefill_tokens_per_s = (end + g.usage.prefill_tokens - g.prompt_len) as f64
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

    /// Emit the token sampled last and compute the one after it. `None` once finished. A
    /// turn of [`Session::next`] (which runs what is left of a prefill first).
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
        let fresh = g.ids[self.cached_len()..].to_vec();
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

    /// Generate to the end, calling `on_chunk` for every piece (see [`super::generate`]).
    pub async fn generate(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
        on_chunk: &mut dyn FnMut(&Chunk),
    ) -> Result<Generation> {
        super::generate(self, prompt_ids, opts, abort, on_chunk).await
    }
}
