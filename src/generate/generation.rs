//! The state of one generation between the loop's turns. How much of it the KV cache holds
//! is not kept here: the session's cache holds a prefix of [`Generation::ids`], and its length
//! says where the loop is.

use super::options::{Chunk, FinishReason, Usage};
use super::stop::StopStrings;
use crate::constrain::Guide;
use crate::prefix::Prefix;
use crate::sampler::Sampler;
use crate::tokenizer::StreamDecoder;

/// The state of one generation between steps.
pub struct Generation {
    pub(super) sampler: Sampler,
    pub(super) max_tokens: usize,
    pub(super) stop_tokens: Vec<u32>,
    pub(super) stop: StopStrings,
    pub(super) decoder: StreamDecoder,
    /// Prompt and generated ids so far.
    pub ids: Vec<u32>,
    pub prompt_len: usize,
    pub(super) phase: Phase,
    /// A chunk computed but not returned because the step after it failed: the next turn
    /// returns it first (whatever the phase).
    pub(super) stash: Option<Chunk>,
    /// Where a prefill chunk ends so that the cache is saved there (see
    /// [`super::GenerateOptions::save_prefix_at`]), and the snapshot once made.
    pub(super) save_at: Option<usize>,
    pub(super) saved: Option<Prefix>,
    /// The constraint's state: which tokens may come next.
    pub(super) guide: Option<Guide>,
    /// A `choices` constraint's options (their scores go to `usage.choices`).
    pub(super) choice_list: Option<Vec<String>>,
    /// Tokens decided without sampling (forced by the constraint, or a picked choice): each
    /// is emitted by a step of its own, and they are run together, as one chunk, when the
    /// last one is emitted (then the next token is sampled).
    pub(super) decided: std::collections::VecDeque<u32>,
    /// The output ends with the last decided token (a picked choice).
    pub(super) end_after_decided: bool,
    pub usage: Usage,
}

/// Where a generation is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Phase {
    /// The ids the cache does not hold yet are to be run: the prompt, or every id so far
    /// again on a new backend (`replay`, see [`Generation::replay`]).
    Prefill { replay: bool },
    /// Everything is in the cache and this token is sampled, not yet emitted or fed.
    Sampled(u32),
    /// Ended: the loop gives what is held back, then `None`.
    Finished(FinishReason),
}

impl Generation {
    /// How many more tokens may be generated: within `max_tokens` and the context.
    pub(super) fn tokens_left(&self, n_ctx: usize) -> usize {
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

    /// Whether ids are still to go into the cache before the next token is known (the
    /// prompt, or a replay).
    pub fn is_prefilling(&self) -> bool {
        matches!(self.phase, Phase::Prefill { .. })
    }

    /// Continue on a session whose cache is empty (the engine moved to another backend):
    /// the next turns run every id so far again, then sample as if nothing happened. A
    /// finished generation stays finished (only what is held back is left to give).
    pub fn replay(&mut self) {
        if self.finish().is_none() {
            // A token already sampled (the constraint has moved past it) stays what comes.
            if let Phase::Sampled(id) = self.phase {
                self.decided.push_front(id);
            }
            self.phase = Phase::Prefill { replay: true };
        }
        self.save_at = None;
    }

    /// The snapshot [`super::GenerateOptions::save_prefix_at`] asked for, once the prefill
    /// passed it.
    pub fn take_prefix(&mut self) -> Option<Prefix> {
        self.saved.take()
    }
}
