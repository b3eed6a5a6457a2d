//! Constrained decoding: the output must be JSON valid against a schema, any JSON object, a
//! match of a regex, a sentence of a Lark grammar, one of a list of choices or tool calls.
//! Built on llguidance (JSON schema, regex and Lark compiled to token masks), behind one small
//! type at the sampling boundary: the allowed tokens ([`Guide::allowed_words`] for a backend's
//! masked top-k, [`Guide::apply`] on read logits) → the sampler picks among them →
//! [`Guide::commit`]; where only one continuation is allowed, [`Guide::take_forced`] gives its
//! tokens without sampling. The mask only removes candidates: the allowed tokens' logits are
//! never changed, so greedy decoding stays deterministic and picks what it would pick
//! unconstrained whenever that is allowed.
//!
//! The token trie of a vocabulary (262 144 tokens for Gemma: ~1 s natively) is built once per
//! tokenizer, at the first constrained request ([`Grammars`]); a schema compiles in about a
//! millisecond.
//!
//! The compiler and matcher are the `kerze-guide` crate (src/guide/): linked natively (the
//! `guide` feature); in the browser a wasm module of its own that the package loads at the
//! first constrained request, reached through src/wasm.rs's `guide` with the same interface.

use crate::error::{Error, Result};
use crate::logits::{is_allowed, TokenMask};
use crate::tokenizer::Tokenizer;
use kerze_guide::Grammar;
use std::sync::{Arc, OnceLock};

#[cfg(all(not(feature = "guide"), target_arch = "wasm32"))]
use crate::bridge::guide::{Matcher, Vocabulary};
#[cfg(feature = "guide")]
use kerze_guide::{Matcher, Vocabulary};
#[cfg(all(not(feature = "guide"), not(target_arch = "wasm32")))]
compile_error!("a native kerze compiles its constraints itself: build with the `guide` feature");

/// The most bytes a schema, regex or grammar may have.
pub const MAX_CONSTRAINT_BYTES: usize = 256 << 10;
/// The most choices.
pub const MAX_CHOICES: usize = 1024;

/// What the output must be.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Constraint {
    /// A JSON value valid against this JSON Schema (the subset llguidance supports).
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A whole match of this regex.
    Regex(String),
    /// A sentence of this Lark grammar (llguidance's dialect).
    Grammar(String),
    /// Exactly one of these strings.
    Choices(Vec<String>),
    /// Calls of these tools (or text without calls, as their choice allows): see
    /// [`crate::chat::tools`].
    Tools(crate::chat::tools::Tools),
}

impl Constraint {
    /// The grammar llguidance compiles, after the checks that need no vocabulary. `whitespace`:
    /// JSON may have free whitespace between its tokens (off: compact JSON, so a model cannot
    /// run on in spaces).
    fn grammar(&self, whitespace: bool) -> Result<Grammar> {
        let too_big = |what: &str, n: usize| {
            Error::InvalidArgument(format!(
                "the {what} has {n} bytes, more than the {MAX_CONSTRAINT_BYTES} a constraint may have"
            ))
        };
        let json = |mut schema: serde_json::Value| -> Result<Grammar> {
            let n = serde_json::to_string(&schema).map_or(0, |s| s.len());
            if n > MAX_CONSTRAINT_BYTES {
                return Err(too_big("JSON schema", n));
            }
            let serde_json::Value::Object(map) = &mut schema else {
                return Err(Error::InvalidArgument(
                    "the JSON schema must be an object".into(),
                ));
            };
            map.insert(
                "x-guidance".into(),
                serde_json::json!({
                    "whitespace_flexible": whitespace,
                    "item_separator": if whitespace { ", " } else { "," },
                    "key_separator": if whitespace { ": " } else { ":" },
                }),
            );
            Ok(Grammar::JsonSchema(schema))
        };
        match self {
            Constraint::JsonSchema(s) => json(s.clone()),
            Constraint::JsonObject => json(serde_json::json!({ "type": "object" })),
            Constraint::Regex(r) if r.len() > MAX_CONSTRAINT_BYTES => {
                Err(too_big("regex", r.len()))
            }
            Constraint::Regex(r) => Ok(Grammar::Regex(r.clone())),
            Constraint::Grammar(g) if g.len() > MAX_CONSTRAINT_BYTES => {
                Err(too_big("grammar", g.len()))
            }
            Constraint::Grammar(g) => Ok(Grammar::Lark(g.clone())),
            Constraint::Tools(t) => {
                let n = serde_json::to_string(&t.tools).map_or(0, |s| s.len());
                if n > MAX_CONSTRAINT_BYTES {
                    return Err(too_big("tools", n));
                }
                Ok(Grammar::Lark(t.grammar()?))
            }
            Constraint::Choices(c) => {
                if c.is_empty() || c.len() > MAX_CHOICES {
                    return Err(Error::InvalidArgument(format!(
                        "choices: give 1 to {MAX_CHOICES} strings, not {}",
                        c.len()
                    )));
                }
                if let Some(i) = c.iter().position(String::is_empty) {
                    return Err(Error::InvalidArgument(format!(
                        "choices: choice {i} is empty"
                    )));
                }
                let n: usize = c.iter().map(String::len).sum();
                if n > MAX_CONSTRAINT_BYTES {
                    return Err(too_big("choices' text", n));
                }
                // Each choice a Lark string literal (JSON's escapes are Lark's).
                let alts: Vec<String> = c
                    .iter()
                    .map(|s| serde_json::to_string(s).unwrap_or_default())
                    .collect();
                Ok(Grammar::Lark(format!("start: {}", alts.join(" | "))))
            }
        }
    }
}

/// Compiled constraints kept per vocabulary, by their canonical JSON: a repeated schema
/// compiles once.
const COMPILED_KEPT: usize = 32;

/// The compiler of constraints for one vocabulary: built once, shared by sessions (forks),
/// with the last [`COMPILED_KEPT`] compiled constraints.
#[derive(Clone, Default)]
pub struct Grammars(Arc<GrammarsInner>);

#[derive(Default)]
struct GrammarsInner {
    /// The vocabulary's compiler and its end of sequence, once built.
    vocabulary: OnceLock<(Vocabulary, u32)>,
    /// Held while it is built.
    building: std::sync::Mutex<()>,
    /// (key, a matcher before its first token), most recently used last.
    compiled: std::sync::Mutex<Vec<(String, Matcher)>>,
}

impl Grammars {
    /// The vocabulary's compiler, built at the first call. A failed build is not kept (in the
    /// browser: the constraint module missing), so the next request tries again; the build
    /// runs once at a time (the server's slots share it).
    fn vocabulary(&self, tok: &Arc<Tokenizer>) -> Result<&(Vocabulary, u32)> {
        let started =
            |e: String| Error::Backend(format!("the constraint engine did not start: {e}"));
        if let Some(v) = self.0.vocabulary.get() {
            return Ok(v);
        }
        let _one = self.0.building.lock().map_err(|e| started(e.to_string()))?;
        if let Some(v) = self.0.vocabulary.get() {
            return Ok(v);
        }
        let words = tok.token_bytes()?;
        let eos = tok
            .eos()
            .or_else(|| tok.end_of_generation().first().copied())
            .unwrap_or(0);
        let model = Arc::clone(tok);
        // Forced text as user text (never control tokens).
        let tokenize: kerze_guide::Tokenize =
            Arc::new(move |s: &[u8]| model.encode_user(std::str::from_utf8(s).ok()?, false).ok());
        let built = (
            Vocabulary::new(&words, eos, tokenize).map_err(started)?,
            eos,
        );
        Ok(self.0.vocabulary.get_or_init(|| built))
    }

    /// Build the vocabulary's token trie now (it is otherwise built at the first constraint:
    /// ~1 s and ~120 MB for Gemma's 262 144 tokens): the milliseconds it took, 0 when built.
    pub fn prepare(&self, tok: &Arc<Tokenizer>) -> Result<f64> {
        if self.0.vocabulary.get().is_some() {
            return Ok(0.0);
        }
        let t0 = crate::clock::now_ms();
        self.vocabulary(tok)?;
        Ok(crate::clock::now_ms() - t0)
    }

    /// Compile `c` for generation with `tok`'s vocabulary: a typed error before any token.
    pub fn compile(&self, tok: &Arc<Tokenizer>, c: &Constraint, whitespace: bool) -> Result<Guide> {
        let grammar = c.grammar(whitespace)?;
        let (vocabulary, eos) = self.vocabulary(tok)?;
        let bad =
            |e: String| Error::InvalidArgument(format!("the constraint does not compile: {e}"));
        let key = format!(
            "{whitespace}|{}",
            serde_json::to_string(c).unwrap_or_default()
        );
        let kept = self.0.compiled.lock().ok().and_then(|mut kept| {
            let at = kept.iter().position(|(k, _)| *k == key)?;
            let entry = kept.remove(at);
            let m = entry.1.fork();
            kept.push(entry);
            Some(m)
        });
        let mut m = match kept {
            Some(m) => m,
            None => {
                let m = vocabulary.compile(&grammar).map_err(bad)?;
                if let Ok(mut kept) = self.0.compiled.lock() {
                    if kept.len() >= COMPILED_KEPT {
                        kept.remove(0);
                    }
                    kept.push((key, m.fork()));
                }
                m
            }
        };
        let mask = m.mask().map_err(bad)?;
        Ok(Guide {
            m,
            mask: Some(mask),
            n_vocab: vocabulary.len(),
            eos: *eos,
            ends: vec![*eos],
        })
    }
}

/// One generation's constraint: which tokens may come next.
pub struct Guide {
    m: Matcher,
    /// The mask for the next token (bit `i % 32` of word `i / 32`), computed after the last
    /// commit.
    mask: Option<Vec<u32>>,
    /// The vocabulary's size: the mask's bits.
    n_vocab: usize,
    eos: u32,
    /// The tokens that end the output where the constraint may end: its end of sequence
    /// first, then the generation's stop tokens (a chat model ends its turn with its own).
    ends: Vec<u32>,
}

impl Guide {
    /// End the output with any of `ids` too (besides the vocabulary's end of sequence), where
    /// the constraint may end.
    pub fn set_ends(&mut self, ids: &[u32]) {
        self.ends = vec![self.eos];
        for &id in ids {
            if !self.ends.contains(&id) {
                self.ends.push(id);
            }
        }
        if let Some(m) = self.mask.as_mut() {
            allow_ends(&self.ends, self.n_vocab, m);
        }
    }

    /// Whether `id` ends the output (it may only come where the constraint is complete).
    pub fn is_end(&self, id: u32) -> bool {
        self.ends.contains(&id)
    }

    /// Whether `id` may come next.
    pub fn allows(&mut self, id: u32) -> Result<bool> {
        let n = self.n_vocab;
        Ok(allowed(self.mask()?, n, id))
    }

    /// The tokens that may come next: the matcher's mask, with the end tokens allowed where
    /// its end of sequence is (computed once per step, after the last commit).
    fn mask(&mut self) -> Result<&[u32]> {
        if self.mask.is_none() {
            let mut m = self.m.mask().map_err(guide_err)?;
            allow_ends(&self.ends, self.n_vocab, &mut m);
            self.mask = Some(m);
        }
        self.mask
            .as_deref()
            .ok_or_else(|| Error::Backend("constraint: no mask".into()))
    }

    /// Set every token that may not come next to −∞ in `logits` (one row of the vocabulary);
    /// allowed tokens keep their values bit for bit.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        let n = self.n_vocab;
        let mask = self.mask()?;
        for (id, l) in logits.iter_mut().enumerate() {
            if !allowed(mask, n, id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// The allowed tokens as a bitmask (bit `i % 32` of word `i / 32`), the end tokens
    /// among them where the constraint may end: what [`crate::backend::Backend::top_k_masked`]
    /// takes.
    pub fn allowed_words(&mut self) -> Result<Vec<u32>> {
        Ok(self.mask()?.to_vec())
    }

    /// The tokens the constraint forces next (the one continuation it allows, as the model's
    /// tokenizer writes it; none where the model has a choice), at most `max`, consumed: the
    /// caller emits them without sampling.
    pub fn take_forced(&mut self, max: usize) -> Result<Vec<u32>> {
        if max == 0 || self.m.is_stopped() {
            return Ok(Vec::new());
        }
        let mut f = self.m.forced();
        // An end token is the generation's to take (it ends it), not a forced text token.
        if let Some(at) = f.iter().position(|&id| self.is_end(id)) {
            f.truncate(at);
        }
        f.truncate(max);
        if !f.is_empty() {
            self.mask = None;
            self.m.consume(&f).map_err(guide_err)?;
        }
        Ok(f)
    }

    /// `id` was sampled: the constraint moves past it (end of sequence: nothing to move).
    pub fn commit(&mut self, id: u32) -> Result<()> {
        self.mask = None;
        if self.is_end(id) {
            return Ok(());
        }
        self.m.consume(&[id]).map_err(guide_err)
    }

    /// Whether the output is complete and nothing may follow (the JSON value closed, the
    /// regex matched with no longer match possible): generation ends here, even on a model
    /// that would never emit an end of sequence.
    pub fn must_end(&mut self) -> Result<bool> {
        if self.m.is_stopped() {
            return Ok(true);
        }
        // Nothing allowed but the end tokens.
        let n = self.n_vocab;
        self.mask()?;
        let Some(mask) = self.mask.as_deref() else {
            return Ok(false);
        };
        let set: u32 = mask.iter().map(|w| w.count_ones()).sum();
        let ends = self.ends.iter().filter(|&&id| allowed(mask, n, id)).count();
        Ok(allowed(mask, n, self.eos) && set as usize == ends)
    }
}

/// Whether token `id` of a vocabulary of `n` is allowed by `mask`.
fn allowed(mask: &TokenMask, n: usize, id: u32) -> bool {
    (id as usize) < n && is_allowed(mask, id as usize)
}

/// Allow every end token in `m` where its first (the end of sequence) is allowed: a chat
/// model may end its turn with its own token wherever the constraint is complete.
fn allow_ends(ends: &[u32], n: usize, m: &mut [u32]) {
    if ends.first().is_some_and(|&eos| allowed(m, n, eos)) {
        for &id in ends.iter().filter(|&&id| (id as usize) < n) {
            if let Some(w) = m.get_mut(id as usize / 32) {
                *w |= 1 << (id % 32);
            }
        }
    }
}

fn guide_err(e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("constraint: {e}"))
}
