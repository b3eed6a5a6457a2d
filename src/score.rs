//! Scores of continuations on a decoder [`Session`]: the log-likelihood of each of several
//! continuations of one prompt (labels, choices), computed as branches after the prompt's KV
//! cache in one pass, and teacher-forced top-k logits. Classification on decoders
//! ([`crate::classify`]) and `choices` constraints ([`crate::generate`]) both score here.

use crate::backend::{Backend, PREFILL_CHUNK};
use crate::error::{Error, Result};
use crate::logits::{log_prob, softmax, top_k};
use crate::session::Session;

/// One choice of a `choices` constraint and how likely the model finds it after the prompt:
/// its log-likelihood (the sum over its tokens) and its probability among the choices.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChoiceScore {
    pub choice: String,
    pub logprob: f64,
    pub prob: f64,
}

/// Logit rows read back at once (a row is the vocabulary: 1 MB for Gemma 3).
const LOGIT_ROWS: usize = 16;

/// The most ids a label may have on a decoder (its continuation runs in one pass).
pub const MAX_LABEL_IDS: usize = PREFILL_CHUNK;

/// What scoring ran: prompt tokens computed and decoder passes (a caller adds them to its
/// own usage).
#[derive(Clone, Copy, Debug, Default)]
pub struct ScoreUsage {
    pub prompt_tokens: usize,
    pub decoder_passes: usize,
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument(format!("classify: {msg}"))
}

impl<B: Backend> Session<B> {
    /// Each choice's probability after `prompt`, from its log-likelihood (the same scoring as
    /// [`crate::classify`]'s on decoders), normalised over the choices; `None` when a choice
    /// is longer than [`MAX_LABEL_IDS`] tokens. The cache holds `prompt` after it (the
    /// choices ran as branches).
    pub async fn choice_scores(
        &mut self,
        prompt: &[u32],
        choices: &[String],
    ) -> Result<Option<Vec<ChoiceScore>>> {
        let ids = choices
            .iter()
            .map(|c| self.tok.encode_user(c, false))
            .collect::<Result<Vec<_>>>()?;
        if ids.iter().any(|i| i.is_empty() || i.len() > MAX_LABEL_IDS) {
            return Ok(None);
        }
        let mut usage = ScoreUsage::default();
        let ll = self.label_log_likelihoods(prompt, &ids, &mut usage).await?;
        let probs = softmax(&ll);
        Ok(Some(
            choices
                .iter()
                .zip(ll.iter().zip(probs))
                .map(|(c, (&logprob, prob))| ChoiceScore {
                    choice: c.clone(),
                    logprob,
                    prob,
                })
                .collect(),
        ))
    }

    /// `log p(label | prompt)` for each label. The prompt runs once: its last row scores
    /// every label's first id. The labels' other ids then run together, as branches after the
    /// prompt's KV (each sees the prompt and its own earlier ids, nothing enters the cache):
    /// one pass for all the labels, or a few when their ids pass [`PREFILL_CHUNK`] rows.
    pub async fn label_log_likelihoods(
        &mut self,
        prompt: &[u32],
        labels: &[Vec<u32>],
        usage: &mut ScoreUsage,
    ) -> Result<Vec<f64>> {
        let p = prompt.len();
        if p == 0 {
            return Err(bad("the prompt is empty".into()));
        }
        // Keeps at most the prompt but its last id, whose row is needed.
        self.keep_common_prefix(prompt);
        let last = self.rows_after(prompt, p - 1, usage).await?;
        let mut out: Vec<f64> = labels.iter().map(|l| log_prob(&last, l[0])).collect();
        // Labels of more than one id, in groups of at most PREFILL_CHUNK continuation rows.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut rows = 0;
        for (i, l) in labels.iter().enumerate().filter(|(_, l)| l.len() > 1) {
            if groups.is_empty() || rows + l.len() - 1 > PREFILL_CHUNK {
                groups.push(Vec::new());
                rows = 0;
            }
            if let Some(g) = groups.last_mut() {
                g.push(i);
            }
            rows += l.len() - 1;
        }
        for group in groups {
            // A label's ids but its last run; each row scores the label's next id.
            let ids: Vec<u32> = group
                .iter()
                .flat_map(|&g| labels[g][..labels[g].len() - 1].iter().copied())
                .collect();
            let next: Vec<u32> = group
                .iter()
                .flat_map(|&g| labels[g][1..].iter().copied())
                .collect();
            let lens: Vec<usize> = group.iter().map(|&g| labels[g].len() - 1).collect();
            let scores = self.branch_log_probs(&ids, &lens, &next, usage).await?;
            let mut at = 0;
            for (&g, &len) in group.iter().zip(&lens) {
                out[g] += scores[at..at + len].iter().sum::<f64>();
                at += len;
            }
        }
        Ok(out)
    }

    /// Run `ids` as branches of `lens` ids after the cache (which keeps only what it holds):
    /// `log p(next[r])` after each row r. The logits are read back and scored a slice of a
    /// few rows at a time, so what is held is a slice's, not every row's (up to
    /// [`PREFILL_CHUNK`] rows of the vocabulary: 128 MiB for Gemma 3, which wasm memory would
    /// keep for the page's life).
    async fn branch_log_probs(
        &mut self,
        ids: &[u32],
        lens: &[usize],
        next: &[u32],
        usage: &mut ScoreUsage,
    ) -> Result<Vec<f64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        usage.prompt_tokens += ids.len();
        usage.decoder_passes += 1;
        let h = self.forward_branches(ids, lens)?;
        let n_vocab = self.model.cfg().n_vocab;
        let mut out = Vec::with_capacity(ids.len());
        for start in (0..ids.len()).step_by(LOGIT_ROWS) {
            let n = LOGIT_ROWS.min(ids.len() - start);
            let slice = self.be.rows(&h, start, n)?;
            let logits = self.model.lm_head(&mut self.be, &slice)?;
            let rows = self.be.read(&logits).await?;
            out.extend(
                rows.chunks_exact(n_vocab)
                    .zip(&next[start..start + n])
                    .map(|(row, &id)| log_prob(row, id)),
            );
        }
        Ok(out)
    }

    /// Run `ids` after the part of them the cache holds; the logits of the rows from
    /// position `first` on (`(ids.len() - first) × n_vocab`, read back).
    async fn rows_after(
        &mut self,
        ids: &[u32],
        first: usize,
        usage: &mut ScoreUsage,
    ) -> Result<Vec<f32>> {
        let mut at = self.cached_len();
        debug_assert!(at <= first);
        usage.prompt_tokens += ids.len() - at;
        let mut rows = Vec::new();
        while at < ids.len() {
            let end = (at + self.be.prompt_rows()).min(ids.len());
            let h = self.forward_chunk(&ids[at..end])?;
            usage.decoder_passes += 1;
            let from = first.max(at);
            if from < end {
                let h = self.be.rows(&h, from - at, end - from)?;
                let logits = self.model.lm_head(&mut self.be, &h)?;
                rows.extend(self.be.read(&logits).await?);
            }
            at = end;
        }
        Ok(rows)
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
        let start = self.cached_len();
        let mut out = Vec::with_capacity(ids.len().saturating_sub(first));
        for chunk in ids[start..].chunks(PREFILL_CHUNK / 2) {
            let start = self.cached_len();
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
