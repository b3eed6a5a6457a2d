//! What a generation is asked for and what it reports: its options, the pieces it streams,
//! the loop's events, why it ended and its usage.

use crate::constrain::Constraint;
use crate::sampler::SamplerConfig;
use crate::score::ChoiceScore;

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
    /// Save the KV cache once the prompt's first `n` ids are in it (a fixed system prompt or
    /// few-shot prefix that the caller keeps, see [`crate::prefix`]): a prefill chunk ends
    /// there, the loop reports [`Event::PrefixSaved`] and [`super::Generation::take_prefix`]
    /// gives the snapshot. Ignored unless `n` ids are still to be computed and one follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save_prefix_at: Option<usize>,
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
            save_prefix_at: None,
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
            save_prefix_at: None,
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

/// What one turn of the generation loop did (see [`super::Steps::next`]): every caller (the
/// CLI, the server's slots, the browser's worker) drives the same loop and reacts to these.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum Event {
    /// A chunk of the prompt (or, after a move to another device, of every id so far) went
    /// into the cache, and more are to come or the next token was sampled.
    Prefilled,
    /// As `Prefilled`, and the cache now holds the prefix [`GenerateOptions::save_prefix_at`]
    /// asked for: its snapshot is ready ([`super::Generation::take_prefix`]).
    PrefixSaved,
    /// The next piece of text.
    Chunk(Chunk),
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
    pub choices: Option<Vec<ChoiceScore>>,
}
