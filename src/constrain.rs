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

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use std::sync::{Arc, OnceLock};

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
    fn grammar(&self, whitespace: bool) -> Result<llguidance::api::TopLevelGrammar> {
        use llguidance::api::TopLevelGrammar;
        let too_big = |what: &str, n: usize| {
            Error::InvalidArgument(format!(
                "the {what} has {n} bytes, more than the {MAX_CONSTRAINT_BYTES} a constraint may have"
            ))
        };
        let json = |mut schema: serde_json::Value| -> Result<TopLevelGrammar> {
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
            Ok(TopLevelGrammar::from_json_schema(schema))
        };
        match self {
            Constraint::JsonSchema(s) => json(s.clone()),
            Constraint::JsonObject => json(serde_json::json!({ "type": "object" })),
            Constraint::Regex(r) if r.len() > MAX_CONSTRAINT_BYTES => {
                Err(too_big("regex", r.len()))
            }
            Constraint::Regex(r) => Ok(TopLevelGrammar::from_regex(r)),
            Constraint::Grammar(g) if g.len() > MAX_CONSTRAINT_BYTES => {
                Err(too_big("grammar", g.len()))
            }
            Constraint::Grammar(g) => Ok(TopLevelGrammar::from_lark(g.clone())),
            Constraint::Tools(t) => {
                let n = serde_json::to_string(&t.tools).map_or(0, |s| s.len());
                if n > MAX_CONSTRAINT_BYTES {
                    return Err(too_big("tools", n));
                }
                Ok(TopLevelGrammar::from_lark(t.grammar()?))
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
                Ok(TopLevelGrammar::from_lark(format!(
                    "start: {}",
                    alts.join(" | ")
                )))
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
    factory: OnceLock<std::result::Result<Arc<llguidance::ParserFactory>, String>>,
    /// (key, a matcher before its first token), most recently used last.
    compiled: std::sync::Mutex<Vec<(String, llguidance::Matcher)>>,
}

/// The vocabulary as llguidance sees it: the token trie, and the model's own tokenizer for the
/// bytes a grammar forces (so forced tokens are the ones the model would read).
struct Vocabulary {
    trie: toktrie::TokTrie,
    tok: Arc<Tokenizer>,
}

impl toktrie::TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &toktrie::TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        // Forced text as user text (never control tokens). Where that is not exactly these
        // bytes (a tokenizer that adds a space before text, bytes that are not whole UTF-8),
        // the trie's longest-match way.
        std::str::from_utf8(s)
            .ok()
            .and_then(|t| self.tok.encode_user(t, false).ok())
            .filter(|ids| {
                let mut b = Vec::with_capacity(s.len());
                ids.iter()
                    .for_each(|&id| b.extend_from_slice(self.trie.token(id)));
                b == s
            })
            .unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }
}

impl Grammars {
    fn factory(&self, tok: &Arc<Tokenizer>) -> Result<Arc<llguidance::ParserFactory>> {
        self.0
            .factory
            .get_or_init(|| {
                let words = tok.token_bytes().map_err(|e| e.to_string())?;
                let eos = tok
                    .eos()
                    .or_else(|| tok.end_of_generation().first().copied())
                    .unwrap_or(0);
                let info = toktrie::TokRxInfo::new(words.len() as u32, eos);
                let trie = toktrie::TokTrie::from(&info, &words);
                let env: toktrie::TokEnv = Arc::new(Vocabulary {
                    trie,
                    tok: Arc::clone(tok),
                });
                let mut f =
                    llguidance::ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                Ok(Arc::new(f))
            })
            .clone()
            .map_err(|e| Error::Backend(format!("the constraint engine did not start: {e}")))
    }

    /// Build the vocabulary's token trie now (it is otherwise built at the first constraint:
    /// ~1 s and ~120 MB for Gemma's 262 144 tokens): the milliseconds it took, 0 when built.
    pub fn prepare(&self, tok: &Arc<Tokenizer>) -> Result<f64> {
        if self.0.factory.get().is_some() {
            return Ok(0.0);
        }
        let t0 = crate::clock::now_ms();
        self.factory(tok)?;
        Ok(crate::clock::now_ms() - t0)
    }

    /// Compile `c` for generation with `tok`'s vocabulary: a typed error before any token.
    pub fn compile(&self, tok: &Arc<Tokenizer>, c: &Constraint, whitespace: bool) -> Result<Guide> {
        let grammar = c.grammar(whitespace)?;
        let factory = self.factory(tok)?;
        let eos = factory.tok_env().tok_trie().eos_token();
        let bad =
            |e: String| Error::InvalidArgument(format!("the constraint does not compile: {e}"));
        let key = format!(
            "{whitespace}|{}",
            serde_json::to_string(c).unwrap_or_default()
        );
        let kept = self.0.compiled.lock().ok().and_then(|mut kept| {
            let at = kept.iter().position(|(k, _)| *k == key)?;
            let entry = kept.remove(at);
            let m = entry.1.deep_clone();
            kept.push(entry);
            Some(m)
        });
        let mut m = match kept {
            Some(m) => m,
            None => {
                let parser = factory
                    .create_parser(grammar)
                    .map_err(|e| bad(e.to_string()))?;
                let m = llguidance::Matcher::new(Ok(parser));
                if let Some(e) = m.get_error() {
                    return Err(bad(e));
                }
                if let Ok(mut kept) = self.0.compiled.lock() {
                    if kept.len() >= COMPILED_KEPT {
                        kept.remove(0);
                    }
                    kept.push((key, m.deep_clone()));
                }
                m
            }
        };
        let mask = m.compute_mask().map_err(|e| bad(e.to_string()))?;
        Ok(Guide {
            m,
            mask: Some(mask),
            eos,
            ends: vec![eos],
        })
    }
}

/// One generation's constraint: which tokens may come next.
pub struct Guide {
    m: llguidance::Matcher,
    /// The mask for the next token, computed after the last commit.
    mask: Option<toktrie::SimpleVob>,
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
            allow_ends(&self.ends, m);
        }
    }

    /// Whether `id` ends the output (it may only come where the constraint is complete).
    pub fn is_end(&self, id: u32) -> bool {
        self.ends.contains(&id)
    }

    /// Whether `id` may come next.
    pub fn allows(&mut self, id: u32) -> Result<bool> {
        let mask = self.mask()?;
        Ok((id as usize) < mask.len() && mask.is_allowed(id))
    }

    /// The tokens that may come next: the matcher's mask, with the end tokens allowed where
    /// its end of sequence is (computed once per step, after the last commit).
    fn mask(&mut self) -> Result<&toktrie::SimpleVob> {
        if self.mask.is_none() {
            let mut m = self.m.compute_mask().map_err(guide_err)?;
            allow_ends(&self.ends, &mut m);
            self.mask = Some(m);
        }
        self.mask
            .as_ref()
            .ok_or_else(|| Error::Backend("constraint: no mask".into()))
    }

    /// Set every token that may not come next to −∞ in `logits` (one row of the vocabulary);
    /// allowed tokens keep their values bit for bit.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        let mask = self.mask()?;
        for (id, l) in logits.iter_mut().enumerate() {
            if id >= mask.len() || !mask.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// The allowed tokens as a bitmask (bit `i % 32` of word `i / 32`), the end tokens
    /// among them where the constraint may end: what [`crate::backend::Backend::top_k_masked`]
    /// takes.
    pub fn allowed_words(&mut self) -> Result<Vec<u32>> {
        Ok(self.mask()?.as_slice().to_vec())
    }

    /// The tokens the constraint forces next (the one continuation it allows, as the model's
    /// tokenizer writes it; none where the model has a choice), at most `max`, consumed: the
    /// caller emits them without sampling.
    pub fn take_forced(&mut self, max: usize) -> Result<Vec<u32>> {
        if max == 0 || self.m.is_stopped() {
            return Ok(Vec::new());
        }
        let mut f = self.m.compute_ff_tokens();
        // An end token is the generation's to take (it ends it), not a forced text token.
        if let Some(at) = f.iter().position(|&id| self.is_end(id)) {
            f.truncate(at);
        }
        f.truncate(max);
        if !f.is_empty() {
            self.mask = None;
            self.m.consume_tokens(&f).map_err(guide_err)?;
        }
        Ok(f)
    }

    /// `id` was sampled: the constraint moves past it (end of sequence: nothing to move).
    pub fn commit(&mut self, id: u32) -> Result<()> {
        self.mask = None;
        if self.is_end(id) {
            return Ok(());
        }
        self.m.consume_token(id).map_err(guide_err)
    }

    /// Whether the output is complete and nothing may follow (the JSON value closed, the
    /// regex matched with no longer match possible): generation ends here, even on a model
    /// that would never emit an end of sequence.
    pub fn must_end(&mut self) -> Result<bool> {
        if self.m.is_stopped() {
            return Ok(true);
        }
        // Nothing allowed but the end tokens.
        self.mask()?;
        let Some(mask) = self.mask.as_ref() else {
            return Ok(false);
        };
        let ends = self
            .ends
            .iter()
            .filter(|&&id| (id as usize) < mask.len() && mask.is_allowed(id))
            .count();
        Ok(mask.is_allowed(self.eos) && mask.num_set() == ends)
    }
}

/// Allow every end token in `m` where its first (the end of sequence) is allowed: a chat
/// model may end its turn with its own token wherever the constraint is complete.
fn allow_ends(ends: &[u32], m: &mut toktrie::SimpleVob) {
    if ends.first().is_some_and(|&eos| m.is_allowed(eos)) {
        let n = m.len();
        for &id in ends.iter().filter(|&&id| (id as usize) < n) {
            m.allow_token(id);
        }
    }
}

fn guide_err(e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("constraint: {e}"))
}
