//! Text ⇄ token ids, built from the GGUF's own vocabulary with the `tokenizers` crate.
//!
//! Owns: the SentencePiece-style (`tokenizer.ggml.model = llama`) construction that gives the
//! same ids as the model's Hugging Face `tokenizer.json`, the rule that user text never turns
//! into control tokens, and streaming decode in whole UTF-8 characters. Does not own: chat
//! templates (chat.rs) or stop conditions (generate.rs).

use crate::error::{Error, Result};
use crate::gguf::{Gguf, Value};
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer as HfTokenizer};

/// SentencePiece token types as GGUF stores them.
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// User-defined pieces that are markers, not text: Hugging Face's Gemma 3 file makes them
/// special, so user text must not produce them either.
const MARKERS: &[&str] = &["<start_of_image>", "<end_of_image>"];

/// The word-boundary marker of SentencePiece vocabularies.
const SPACE: &str = "\u{2581}";

fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

/// A tokenizer with two faces: `encode_raw` parses control tokens written in the text (as
/// Hugging Face's `encode` does), `encode_user` never does, so a visitor who types
/// `<start_of_turn>` gets plain text, not a turn marker.
pub struct Tokenizer {
    raw: HfTokenizer,
    user: HfTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    n_vocab: usize,
    /// Ids of byte-fallback tokens (`<0x00>`..`<0xFF>`): a streamed piece may end inside a
    /// UTF-8 character only after one of them.
    byte_tokens: Vec<bool>,
    /// Control tokens by id: never produced from user text.
    control: Vec<bool>,
}

impl Tokenizer {
    /// Build from the vocabulary in the GGUF metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .unwrap_or("");
        if model != "llama" {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.model `{model}` is not supported: kerze builds SentencePiece-style (`llama`) vocabularies"
            )));
        }
        let tokens = g
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .and_then(|a| a.strings())
            .ok_or_else(|| {
                tk_err("metadata tokenizer.ggml.tokens is missing or not an array of strings")
            })?;
        let n = tokens.len();
        let types_early = g
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .and_then(|a| a.to_f64s());
        // llama.cpp's converter writes the spaces of user-defined tokens ("▁▁" → "  ");
        // Hugging Face keeps the SentencePiece marker. Put it back so both agree.
        let owned: Vec<String> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let user_defined = types_early
                    .as_ref()
                    .and_then(|ty| ty.get(i))
                    .is_some_and(|&ty| ty as i64 == TYPE_USER_DEFINED);
                if user_defined {
                    t.replace(' ', SPACE)
                } else {
                    t.to_string()
                }
            })
            .collect();
        let tokens: Vec<&str> = owned.iter().map(String::as_str).collect();
        let numbers = |k: &str| -> Result<Option<Vec<f64>>> {
            match g.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_array()
                    .and_then(|a| a.to_f64s())
                    .map(Some)
                    .ok_or_else(|| tk_err(format!("metadata {k} is not an array of numbers"))),
            }
        };
        let scores: Vec<f32> = match numbers("tokenizer.ggml.scores")? {
            Some(v) => v.into_iter().map(|x| x as f32).collect(),
            None => (0..n).map(|i| -(i as f32)).collect(),
        };
        let types: Vec<i64> = match numbers("tokenizer.ggml.token_type")? {
            Some(v) => v.into_iter().map(|x| x as i64).collect(),
            None => vec![TYPE_NORMAL; n],
        };
        if scores.len() != n || types.len() != n {
            return Err(tk_err(format!(
                "{n} tokens but {} scores and {} token types",
                scores.len(),
                types.len()
            )));
        }
        let id_of = |key: &str| {
            g.get(key)
                .and_then(Value::as_u64)
                .map(|v| v as u32)
                .filter(|&v| (v as usize) < n)
        };
        let vocab_id = |s: &str| tokens.iter().position(|t| *t == s).map(|i| i as u32);
        let bos = vocab_id("<bos>").or_else(|| id_of("tokenizer.ggml.bos_token_id"));
        let eos = vocab_id("<eos>").or_else(|| id_of("tokenizer.ggml.eos_token_id"));
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_u64)
            .unwrap_or(1)
            != 0;
        let spec = VocabSpec {
            tokens: &tokens,
            scores: &scores,
            types: &types,
            bos,
            add_bos,
        };
        let raw = spec.build()?;
        let mut user = raw.clone();
        user.set_encode_special_tokens(true);
        let byte_tokens = tokens
            .iter()
            .map(|t| parse_byte_token(t).is_some())
            .collect();
        let control = types
            .iter()
            .map(|&t| t == TYPE_CONTROL || t == TYPE_UNKNOWN)
            .collect();
        Ok(Self {
            raw,
            user,
            bos,
            eos,
            n_vocab: n,
            byte_tokens,
            control,
        })
    }

    /// Load a Hugging Face `tokenizer.json` instead of the GGUF vocabulary.
    pub fn from_json(bytes: &[u8], n_vocab: usize) -> Result<Self> {
        let raw = HfTokenizer::from_bytes(bytes).map_err(tk_err)?;
        let mut user = raw.clone();
        user.set_encode_special_tokens(true);
        let bos = raw.token_to_id("<bos>").or_else(|| raw.token_to_id("<s>"));
        let eos = raw.token_to_id("<eos>").or_else(|| raw.token_to_id("</s>"));
        let byte_tokens = (0..n_vocab as u32)
            .map(|i| {
                raw.id_to_token(i)
                    .is_some_and(|t| parse_byte_token(&t).is_some())
            })
            .collect();
        let specials: Vec<u32> = raw
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let mut control = vec![false; n_vocab];
        for id in specials {
            if let Some(c) = control.get_mut(id as usize) {
                *c = true;
            }
        }
        Ok(Self {
            raw,
            user,
            bos,
            eos,
            n_vocab,
            byte_tokens,
            control,
        })
    }

    /// Ids of text whose control-token strings are parsed (`<start_of_turn>` → 105), with
    /// `<bos>` in front when the model wants it. For templates and raw tokenization.
    pub fn encode_raw(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        Ok(self
            .raw
            .encode_fast(text, add_bos)
            .map_err(tk_err)?
            .get_ids()
            .to_vec())
    }

    /// Ids of text typed by a user: control-token strings stay plain text.
    pub fn encode_user(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        Ok(self
            .user
            .encode_fast(text, add_bos)
            .map_err(tk_err)?
            .get_ids()
            .to_vec())
    }

    /// Text of ids (control tokens included as their strings unless `skip_special`).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.check_ids(ids)?;
        self.raw.decode(ids, skip_special).map_err(tk_err)
    }

    /// The id of a token string, if it is one token.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.raw.token_to_id(token)
    }

    /// The piece of one id.
    pub fn token(&self, id: u32) -> Option<String> {
        self.raw.id_to_token(id)
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// True for control tokens (`<bos>`, `<end_of_turn>`, `<unusedN>`, ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| id as usize >= self.n_vocab) {
            Some(id) => Err(Error::InvalidArgument(format!(
                "token id {id} is outside the vocabulary of {} tokens",
                self.n_vocab
            ))),
            None => Ok(()),
        }
    }
}

/// Streams text: each piece ends on a character boundary, so a multi-byte character spread
/// over byte-fallback tokens comes out whole.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    /// Ids not yet emitted: only a run of byte tokens that does not yet form a whole character.
    pending: Vec<u32>,
}

/// A UTF-8 character has at most 4 bytes: a longer pending run is not going to complete.
const MAX_PENDING_BYTES: usize = 4;

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed one id; get the text it completes (possibly empty).
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.pending.push(id);
        let text = tok.decode(&self.pending, false)?;
        let is_byte = tok.byte_tokens.get(id as usize).copied().unwrap_or(false);
        if is_byte && text.ends_with('\u{FFFD}') && self.pending.len() < MAX_PENDING_BYTES {
            return Ok(String::new());
        }
        // Gemma's decoder (▁ → space, byte fallback, fuse) is concatenative across pieces that
        // end on a character boundary, so the pending ids can be forgotten here.
        self.pending.clear();
        Ok(text)
    }

    /// Whatever is still pending, with U+FFFD for an incomplete character.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let text = tok.decode(&self.pending, false)?;
        self.pending.clear();
        Ok(text)
    }
}

fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

struct VocabSpec<'a> {
    tokens: &'a [&'a str],
    scores: &'a [f32],
    types: &'a [i64],
    bos: Option<u32>,
    add_bos: bool,
}

impl VocabSpec<'_> {
    /// The Hugging Face construction of a SentencePiece BPE: merges derived from the scores.
    fn build(&self) -> Result<HfTokenizer> {
        let dbg = std::env::var_os("KERZE_DEBUG_TOKENIZER").is_some();
        let t0 = crate::clock::now_ms();
        let lap = |what: &str| {
            if dbg {
                eprintln!("{what}: {:.0} ms", crate::clock::now_ms() - t0)
            }
        };
        let index: HashMap<&str, u32> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, i as u32))
            .collect();
        // Every normal or user-defined token of two or more characters, split every way into
        // two pieces that are both tokens, is a merge (user-defined runs of spaces, tabs and
        // newlines merge too: "▁▁" is reachable from two spaces). As in Hugging Face's
        // converter, merges rank by the whole token's score (highest first), then by the
        // lengths in characters of the left and right parts (longest first), then in
        // vocabulary order.
        struct Merge {
            token: u32,
            left: u32,
            right: u32,
            left_len: usize,
            right_len: usize,
        }
        let mut merges: Vec<Merge> = Vec::new();
        for (i, tok) in self.tokens.iter().enumerate() {
            if self.types[i] != TYPE_NORMAL && self.types[i] != TYPE_USER_DEFINED {
                continue;
            }
            let n_chars = tok.chars().count();
            for (k, (split, _)) in tok.char_indices().skip(1).enumerate() {
                let (l, r) = tok.split_at(split);
                if let (Some(&left), Some(&right)) = (index.get(l), index.get(r)) {
                    merges.push(Merge {
                        token: i as u32,
                        left,
                        right,
                        left_len: k + 1,
                        right_len: n_chars - k - 1,
                    });
                }
            }
        }
        // SentencePiece gives user-defined pieces score 0, above every normal piece (scores are
        // -rank); GGUF files carry -1000 for them.
        let score = |id: u32| {
            if self.types[id as usize] == TYPE_USER_DEFINED {
                0.0
            } else {
                self.scores[id as usize]
            }
        };
        if std::env::var_os("KERZE_DEBUG_TOKENIZER").is_some() {
            eprintln!("{} merges", merges.len());
        }
        merges.sort_by(|a, b| {
            score(b.token)
                .total_cmp(&score(a.token))
                .then(b.left_len.cmp(&a.left_len))
                .then(b.right_len.cmp(&a.right_len))
                .then(a.token.cmp(&b.token))
                .then((a.left, a.right).cmp(&(b.left, b.right)))
        });
        let merges: Vec<(String, String)> = merges
            .into_iter()
            .map(|m| {
                (
                    self.tokens[m.left as usize].to_string(),
                    self.tokens[m.right as usize].to_string(),
                )
            })
            .collect();
        let vocab: tokenizers::models::bpe::Vocab = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let unk = self
            .tokens
            .iter()
            .position(|t| *t == "<unk>")
            .map(|_| "<unk>".to_string());
        let mut bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unk) = unk {
            bpe = bpe.unk_token(unk);
        }
        lap("merges derived");
        let bpe = bpe.build().map_err(tk_err)?;
        lap("bpe built");

        let mut tk = HfTokenizer::new(bpe);
        tk.with_normalizer(Some(Replace::new(" ", SPACE).map_err(tk_err)?))
            .map_err(tk_err)?;
        tk.with_pre_tokenizer(Some(
            Split::new(
                SplitPattern::String(" ".into()),
                SplitDelimiterBehavior::MergedWithPrevious,
                false,
            )
            .map_err(tk_err)?,
        ));
        tk.with_decoder(Some(DecoderSequence::new(vec![
            Replace::new(SPACE, " ").map_err(tk_err)?.into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ])));
        if let (Some(bos), true) = (self.bos, self.add_bos) {
            let bos_str = self.tokens[bos as usize].to_string();
            let post = TemplateProcessing::builder()
                .try_single(format!("{bos_str} $A"))
                .map_err(tk_err)?
                .try_pair(format!("{bos_str} $A {bos_str} $B"))
                .map_err(tk_err)?
                .special_tokens(vec![(bos_str, bos)])
                .build()
                .map_err(tk_err)?;
            tk.with_post_processor(Some(post));
        }
        let control: Vec<AddedToken> = self
            .types
            .iter()
            .enumerate()
            .filter(|(i, &t)| {
                t == TYPE_CONTROL || t == TYPE_UNKNOWN || MARKERS.contains(&self.tokens[*i])
            })
            .map(|(i, _)| AddedToken::from(self.tokens[i], true))
            .collect();
        lap("pipeline");
        tk.add_special_tokens(control).map_err(tk_err)?;
        lap("special added");
        let user_defined: Vec<AddedToken> = self
            .types
            .iter()
            .enumerate()
            .filter(|(i, &t)| t == TYPE_USER_DEFINED && !MARKERS.contains(&self.tokens[*i]))
            .map(|(i, _)| AddedToken::from(self.tokens[i], false).normalized(false))
            .collect();
        tk.add_tokens(user_defined).map_err(tk_err)?;
        lap("user-defined added");
        Ok(tk)
    }
}
