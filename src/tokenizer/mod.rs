//! Text ⇄ token ids, built from the GGUF's own vocabulary with the `tokenizers` crate.
//!
//! Owns: the two constructions that give the same ids as the model's Hugging Face
//! `tokenizer.json` — SentencePiece-style (`tokenizer.ggml.model = llama`: merges derived from
//! the scores, byte fallback) and GPT-2 byte-level BPE (`gpt2`: merges in the file, the
//! pre-tokenizer chosen by `tokenizer.ggml.pre`) —, the rule that user text never turns into
//! control tokens, and streaming decode in whole UTF-8 characters. Does not own: chat
//! templates (chat.rs) or stop conditions (generate.rs).

mod bpe;
pub mod wordpiece;

use crate::error::{Error, Result};
use crate::gguf::{Gguf, Value};
use bpe::{score_order, GgufBpe, Vocab};
use std::sync::Mutex;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    SplitDelimiterBehavior, TokenizerImpl,
};

/// A `tokenizers` pipeline (added tokens, normalizer, pre-tokenizer, post-processor,
/// decoder) around model `M`: our GGUF BPE, or a model a `tokenizer.json` names (WordPiece).
type Impl<M> =
    TokenizerImpl<M, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// The BPE pipelines built from GGUF vocabularies.
type Pipeline = Impl<GgufBpe>;

/// What [`Tokenizer`] asks of its pipeline, whatever the model inside: the one seam a further
/// tokenizer kind goes through.
trait Pipe: Send {
    fn encode(&mut self, text: &str, add_special: bool, split_special: bool) -> Result<Vec<u32>>;
    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String>;
    fn token_to_id(&self, token: &str) -> Option<u32>;
    fn id_to_token(&self, id: u32) -> Option<String>;
}

impl<M: tokenizers::Model + Send> Pipe for Impl<M> {
    fn encode(&mut self, text: &str, add_special: bool, split_special: bool) -> Result<Vec<u32>> {
        self.set_encode_special_tokens(split_special);
        Ok(self
            .encode_fast(text, add_special)
            .map_err(tk_err)?
            .get_ids()
            .to_vec())
    }
    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        TokenizerImpl::decode(self, ids, skip_special).map_err(tk_err)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        TokenizerImpl::token_to_id(self, token)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        TokenizerImpl::id_to_token(self, id)
    }
}

/// SentencePiece token types as GGUF stores them.
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// User-defined pieces that are markers, not text: Hugging Face's Gemma 3 file makes them
/// special, so user text must not produce them either.
const MARKERS: &[&str] = &["<start_of_image>", "<end_of_image>"];

/// Control tokens that end a turn in some family's chat format, also where the file names no
/// `eot_token_id` (Gemma's GGUFs name only bos and eos): generation stops at them, as it does
/// in llama.cpp.
const END_OF_TURN: &[&str] = &[
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
];

/// GPT-2's reversible map of bytes to printable characters (the byte-level alphabet).
pub fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 256;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                let c = char::from_u32(extra).unwrap_or('?');
                extra += 1;
                c
            }
        })
        .collect()
}

/// The word-boundary marker of SentencePiece vocabularies.
const SPACE: &str = "\u{2581}";

/// The header's vocabulary arrays: copied into the tokenizer by [`Tokenizer::from_gguf`], so
/// a loader may drop them from the header once it is built ([`Tokenizer::drop_vocabulary`]).
const VOCABULARY_KEYS: &[&str] = &[
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
];

fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

/// One bit a token id (a `Vec<bool>` would take a byte: 448 KiB more for two such sets over
/// Gemma 3's 262 144 tokens, kept for the engine's life).
#[derive(Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn from_fn(n: usize, f: impl Fn(usize) -> bool) -> Self {
        let mut words = vec![0u64; n.div_ceil(64)];
        for i in (0..n).filter(|&i| f(i)) {
            words[i / 64] |= 1 << (i % 64);
        }
        Self(words)
    }

    /// Whether bit `i` is set (false past the end).
    fn get(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
}

/// A tokenizer with two faces: `encode_raw` parses control tokens written in the text (as
/// Hugging Face's `encode` does), `encode_user` never does, so a visitor who types
/// `<start_of_turn>` gets plain text, not a turn marker.
pub struct Tokenizer {
    /// One pipeline; the two faces differ only in its `encode_special_tokens` flag, set per
    /// call under the lock (a second copy would cost its whole vocabulary again).
    inner: Mutex<Box<dyn Pipe>>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// Where generation stops by default: eos, eot, eom and the control tokens of
    /// [`END_OF_TURN`], sorted.
    end_of_generation: Vec<u32>,
    n_vocab: usize,
    /// Ids of byte-fallback tokens (`<0x00>`..`<0xFF>`): a streamed piece may end inside a
    /// UTF-8 character only after one of them.
    byte_tokens: Bits,
    /// GPT-2 byte-level BPE: any token may end inside a UTF-8 character.
    byte_level: bool,
    /// SentencePiece with a dummy prefix (Llama 2): decoding strips one leading space, so a
    /// streamed piece after the first gets back the space its first `▁` stands for.
    space_prefix: bool,
    /// The file asks for <bos> in front of a prompt (`tokenizer.ggml.add_bos_token`).
    add_bos: bool,
    /// Control tokens by id: never produced from user text.
    control: Bits,
    /// The file's Jinja chat template (`tokenizer.chat_template`), rendered by chat/.
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Build from the vocabulary in the GGUF metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .unwrap_or("");
        let byte_level = match model {
            "llama" => false,
            "gpt2" => true,
            "bert" => return Self::from_gguf_wordpiece(g),
            other => {
                return Err(Error::Tokenizer(format!(
                    "tokenizer.ggml.model `{other}` is not supported: kerze builds SentencePiece-style (`llama`), GPT-2 byte-level BPE (`gpt2`) and WordPiece (`bert`) vocabularies"
                )))
            }
        };
        let tokens = gguf_tokens(g)?;
        let n = tokens.len();
        let scores: Vec<f32> = match gguf_numbers(g, "tokenizer.ggml.scores")? {
            Some(v) => v.into_iter().map(|x| x as f32).collect(),
            None => (0..n).map(|i| -(i as f32)).collect(),
        };
        let types = gguf_types(g, n)?;
        if scores.len() != n {
            return Err(tk_err(format!("{n} tokens but {} scores", scores.len())));
        }
        // llama.cpp's converter writes the spaces of user-defined tokens ("▁▁" → "  ");
        // Hugging Face keeps the SentencePiece marker. Put it back so both agree.
        let vocab = Vocab::new(tokens.iter().zip(&types).map(|(t, &ty)| {
            if !byte_level && ty == TYPE_USER_DEFINED && t.contains(' ') {
                std::borrow::Cow::Owned(t.replace(' ', SPACE))
            } else {
                std::borrow::Cow::Borrowed(t)
            }
        }));
        let special = |key: &str| gguf_special(g, key, n);
        let bos = special("bos_token_id")?;
        let eos = special("eos_token_id")?;
        let eot = special("eot_token_id")?;
        let eom = special("eom_token_id")?;
        // Absent: SentencePiece files want <bos> (Llama 2, Gemma), byte-level ones do not
        // (GPT-2, Qwen), as llama.cpp assumes.
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_u64)
            .map_or(!byte_level, |v| v != 0);
        let byte_tokens = Bits::from_fn(n, |i| {
            vocab.piece(i as u32).and_then(parse_byte_token).is_some()
        });
        let control: Vec<bool> = (0..n)
            .map(|i| {
                let t = vocab.piece(i as u32).unwrap_or("");
                types[i] == TYPE_CONTROL || types[i] == TYPE_UNKNOWN || MARKERS.contains(&t)
            })
            .collect();
        let mut end_of_generation: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        for t in END_OF_TURN {
            if let Some(id) = vocab
                .id(t)
                .filter(|&id| control.get(id as usize) == Some(&true))
            {
                end_of_generation.push(id);
            }
        }
        end_of_generation.sort_unstable();
        end_of_generation.dedup();
        let bos_added = bos.filter(|_| add_bos);
        let mut space_prefix = false;
        let pipeline = if byte_level {
            let pre = g
                .get("tokenizer.ggml.pre")
                .and_then(Value::as_str)
                .unwrap_or("default");
            let merges = g
                .get("tokenizer.ggml.merges")
                .and_then(Value::as_array)
                .and_then(|a| a.strings())
                .ok_or_else(|| {
                    tk_err("metadata tokenizer.ggml.merges is missing or not an array of strings")
                })?;
            build_byte_level(vocab, merges, &types, &control, bos_added, pre)?
        } else {
            // SentencePiece's dummy prefix (Llama 2: yes; Gemma's files say no). Absent:
            // yes, as llama.cpp assumes.
            space_prefix = g
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(Value::as_u64)
                .is_none_or(|v| v != 0);
            build(vocab, &scores, &types, &control, bos_added, space_prefix)?
        };
        let chat_template = g
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .map(str::to_string);
        Ok(Self {
            inner: Mutex::new(Box::new(pipeline)),
            bos,
            eos,
            end_of_generation,
            n_vocab: n,
            byte_tokens,
            byte_level,
            space_prefix,
            add_bos,
            control: Bits::from_fn(n, |i| control[i]),
            chat_template,
        })
    }

    /// Drop the vocabulary arrays from `g`'s metadata (about 8 MB for Gemma 3's 262 144
    /// tokens), once a tokenizer has been built from them: the weights loaded next then reuse
    /// that room, where wasm memory, which never shrinks, would otherwise grow past it.
    pub fn drop_vocabulary(g: &mut Gguf) {
        for k in VOCABULARY_KEYS {
            g.metadata.remove(*k);
        }
    }

    /// WordPiece from the GGUF (`tokenizer.ggml.model = bert`): the vocabulary in llama.cpp's
    /// spelling, `[CLS]`/`[SEP]` from `cls_token_id`/`seperator_token_id` (llama.cpp's key
    /// names; else bos/eos, else the pieces by name), lower-casing from
    /// `tokenizer.ggml.normalizer.lowercase` (or kerze's older `kerze.tokenizer.lowercase`;
    /// absent: on, as llama.cpp assumed before it wrote the key).
    fn from_gguf_wordpiece(g: &Gguf) -> Result<Self> {
        let tokens = gguf_tokens(g)?;
        let n = tokens.len();
        let types = gguf_types(g, n)?;
        let control: Vec<bool> = types
            .iter()
            .map(|&t| t == TYPE_CONTROL || t == TYPE_UNKNOWN)
            .collect();
        let pieces: Vec<String> = tokens
            .iter()
            .zip(&control)
            .map(|(t, &c)| wordpiece::from_phantom(t, c))
            .collect();
        let by_name = |name: &str| pieces.iter().position(|p| p == name).map(|i| i as u32);
        let pick = |keys: &[&str], name: &str| -> Result<u32> {
            for k in keys {
                if let Some(id) = gguf_special(g, k, n)? {
                    return Ok(id);
                }
            }
            by_name(name).ok_or_else(|| {
                tk_err(format!(
                    "this WordPiece vocabulary names no {name} token ({})",
                    keys.join(", ")
                ))
            })
        };
        let unk = pick(&["unknown_token_id"], "[UNK]")?;
        let cls = pick(&["cls_token_id", "bos_token_id"], "[CLS]")?;
        let sep = pick(&["seperator_token_id", "eos_token_id"], "[SEP]")?;
        // llama.cpp's key, or the one kerze wrote before llama.cpp had one.
        let lowercase = g
            .get("tokenizer.ggml.normalizer.lowercase")
            .or_else(|| g.get("kerze.tokenizer.lowercase"))
            .and_then(Value::as_u64)
            .is_none_or(|v| v != 0);
        let special: Vec<u32> = (0..n as u32).filter(|&i| control[i as usize]).collect();
        let pipe = wordpiece::build(&wordpiece::Spec {
            pieces: &pieces,
            special: &special,
            unk,
            cls,
            sep,
            lowercase,
        })?;
        Ok(Self::assemble(
            Box::new(pipe),
            control,
            Some(cls),
            Some(sep),
        ))
    }

    /// Build from a Hugging Face `tokenizer.json` (its padding and truncation turned off: the
    /// caller decides lengths). Special added tokens are control tokens; `[CLS]`/`[SEP]` (or
    /// `<s>`/`</s>`) are bos/eos when the vocabulary has them.
    pub fn from_tokenizer_json(json: &[u8]) -> Result<Self> {
        let tk = tokenizers::Tokenizer::from_bytes(json).map_err(tk_err)?;
        Self::from_hf(tk)
    }

    fn from_hf(mut tk: tokenizers::Tokenizer) -> Result<Self> {
        tk.with_padding(None);
        tk.with_truncation(None).map_err(tk_err)?;
        let n = tk.get_vocab_size(true);
        let mut control = vec![false; n];
        for (id, t) in tk.get_added_tokens_decoder() {
            if t.special {
                if let Some(c) = control.get_mut(id as usize) {
                    *c = true;
                }
            }
        }
        let id = |names: &[&str]| names.iter().find_map(|t| tk.token_to_id(t));
        let bos = id(&["[CLS]", "<s>"]);
        let eos = id(&["[SEP]", "</s>"]);
        Ok(Self::assemble(Box::new(tk.into_inner()), control, bos, eos))
    }

    /// A tokenizer around a pipeline with no byte tokens (WordPiece, a tokenizer.json's model).
    fn assemble(
        pipe: Box<dyn Pipe>,
        control: Vec<bool>,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Self {
        let n = control.len();
        Self {
            inner: Mutex::new(pipe),
            bos,
            eos,
            end_of_generation: eos.into_iter().collect(),
            n_vocab: n,
            byte_tokens: Bits::from_fn(n, |_| false),
            byte_level: false,
            space_prefix: false,
            add_bos: bos.is_some(),
            control: Bits::from_fn(n, |i| control[i]),
            chat_template: None,
        }
    }

    fn encode(&self, text: &str, add_bos: bool, split_special: bool) -> Result<Vec<u32>> {
        let mut p = self
            .inner
            .lock()
            .map_err(|_| tk_err("tokenizer lock poisoned"))?;
        p.encode(text, add_bos, split_special)
    }

    /// Ids of text whose control-token strings are parsed (`<start_of_turn>` → 105), with
    /// `<bos>` in front when the model wants it. For templates and raw tokenization.
    pub fn encode_raw(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        self.encode(text, add_bos, false)
    }

    /// The benchmark prompt: `<bos>` and ordinary English text, exactly `n_tok` tokens long
    /// (fewer only if `n_tok` passes ~1 500), the same natively and in the browser.
    pub fn bench_prompt(&self, n_tok: usize) -> Result<Vec<u32>> {
        let text = "The history of the city begins with a small settlement on the river, where traders met to exchange salt, grain and cloth. ".repeat(64);
        let mut ids = self.encode_user(&text, true)?;
        ids.truncate(n_tok);
        Ok(ids)
    }

    /// Ids of text typed by a user: control-token strings stay plain text.
    pub fn encode_user(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        self.encode(text, add_bos, true)
    }

    /// Text of ids (control tokens included as their strings unless `skip_special`).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.check_ids(ids)?;
        let p = self
            .inner
            .lock()
            .map_err(|_| tk_err("tokenizer lock poisoned"))?;
        p.decode(ids, skip_special)
    }

    /// The id of a token string, if it is one token.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.lock().ok()?.token_to_id(token)
    }

    /// The piece of one id.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.lock().ok()?.id_to_token(id)
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether a prompt starts with <bos> (the file's `add_bos_token`, and it names one).
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The file's chat template source, if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The ids that end a generation unless the caller names its own stop tokens.
    pub fn end_of_generation(&self) -> &[u32] {
        &self.end_of_generation
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// True for control tokens (`<bos>`, `<end_of_turn>`, `<unusedN>`, ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize)
    }

    /// The bytes each id stands for in generated text, for a constraint engine: a control
    /// token is `0xFF` and its name (it never matches text), a byte token its byte, a
    /// SentencePiece piece its text with `▁` as a space, a byte-level piece its bytes.
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>> {
        let chars = byte_chars();
        let byte_of: std::collections::HashMap<char, u8> = chars
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let p = self
            .inner
            .lock()
            .map_err(|_| tk_err("tokenizer lock poisoned"))?;
        (0..self.n_vocab as u32)
            .map(|id| {
                let piece = p.id_to_token(id).unwrap_or_default();
                if self.is_control(id) {
                    let mut b = vec![0xFF];
                    b.extend_from_slice(piece.as_bytes());
                    return Ok(b);
                }
                if self.byte_tokens.get(id as usize) {
                    let hex = piece.trim_start_matches("<0x").trim_end_matches('>');
                    return u8::from_str_radix(hex, 16)
                        .map(|b| vec![b])
                        .map_err(|_| tk_err(format!("byte token {id} is {piece:?}")));
                }
                if self.byte_level {
                    return Ok(piece
                        .chars()
                        .map(|c| byte_of.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_else(|| piece.as_bytes().to_vec()));
                }
                Ok(piece.replace(SPACE, " ").into_bytes())
            })
            .collect()
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
    /// Something was emitted already (a dummy-prefix vocabulary strips only the first space).
    emitted: bool,
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
        let is_byte = tok.byte_level || tok.byte_tokens.get(id as usize);
        if is_byte && text.ends_with('\u{FFFD}') && self.pending.len() < MAX_PENDING_BYTES {
            return Ok(String::new());
        }
        // Both decoders (▁ → space, byte fallback, fuse; byte-level) are concatenative across
        // pieces that end on a character boundary, so the pending ids can be forgotten here;
        // but for the first leading space, which a dummy-prefix vocabulary strips.
        let text = match self.pending.first() {
            Some(&first)
                if tok.space_prefix
                    && self.emitted
                    && tok
                        .token(first)
                        .is_some_and(|p| p.starts_with(SPACE) || p == "<0x20>") =>
            {
                format!(" {text}")
            }
            _ => text,
        };
        self.emitted |= !text.is_empty();
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

/// `tokenizer.ggml.tokens`.
fn gguf_tokens(g: &Gguf) -> Result<&crate::gguf::Strings> {
    g.get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.strings())
        .ok_or_else(|| {
            tk_err("metadata tokenizer.ggml.tokens is missing or not an array of strings")
        })
}

/// An optional array of numbers.
fn gguf_numbers(g: &Gguf, k: &str) -> Result<Option<Vec<f64>>> {
    match g.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .and_then(|a| a.to_f64s())
            .map(Some)
            .ok_or_else(|| tk_err(format!("metadata {k} is not an array of numbers"))),
    }
}

/// `tokenizer.ggml.token_type` (absent: all normal), one per token.
fn gguf_types(g: &Gguf, n: usize) -> Result<Vec<i64>> {
    let types: Vec<i64> = match gguf_numbers(g, "tokenizer.ggml.token_type")? {
        Some(v) => v.into_iter().map(|x| x as i64).collect(),
        None => vec![TYPE_NORMAL; n],
    };
    if types.len() != n {
        return Err(tk_err(format!(
            "{n} tokens but {} token types",
            types.len()
        )));
    }
    Ok(types)
}

/// A special id the file names (`tokenizer.ggml.{key}`; absent: `None`); an id outside the
/// vocabulary is a broken file.
fn gguf_special(g: &Gguf, key: &str, n: usize) -> Result<Option<u32>> {
    let full = format!("tokenizer.ggml.{key}");
    match g.get(&full) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&id| id < n as u64)
            .map(|id| Some(id as u32))
            .ok_or_else(|| {
                tk_err(format!(
                    "metadata {full} is not a token id of this {n}-token vocabulary"
                ))
            }),
    }
}

fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// What both constructions add around their BPE model: the control tokens (special: never
/// from user text), the user-defined ones (matched whole, not normalized) and the <bos>
/// post-processor when the file wants <bos>.
struct Added {
    bos: Option<(String, u32)>,
    special: Vec<AddedToken>,
    user_defined: Vec<AddedToken>,
}

impl Added {
    fn new(vocab: &Vocab, types: &[i64], control: &[bool], bos: Option<u32>) -> Self {
        let piece = |id: u32| vocab.piece(id).unwrap_or("").to_string();
        Self {
            bos: bos.map(|id| (piece(id), id)),
            special: (0..types.len())
                .filter(|&i| control[i])
                .map(|i| AddedToken::from(piece(i as u32), true))
                .collect(),
            user_defined: (0..types.len())
                .filter(|&i| types[i] == TYPE_USER_DEFINED && !control[i])
                .map(|i| AddedToken::from(piece(i as u32), false).normalized(false))
                .collect(),
        }
    }

    fn install<M: tokenizers::Model>(self, tk: &mut Impl<M>) -> Result<()> {
        if let Some((bos_str, bos)) = self.bos {
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
        // Each call rebuilds the matcher over every added token so far: the few user-defined
        // ones first, so that it is built once over the thousands of special ones (Gemma 3:
        // ~6 000), not twice. Matching is leftmost-longest, so the order changes nothing.
        tk.add_tokens(self.user_defined).map_err(tk_err)?;
        tk.add_special_tokens(self.special).map_err(tk_err)?;
        Ok(())
    }
}

/// The Hugging Face construction of a SentencePiece BPE, with merges derived from the scores.
/// `control[i]`: token i is special (never produced from user text).
fn build(
    vocab: Vocab,
    scores: &[f32],
    types: &[i64],
    control: &[bool],
    bos: Option<u32>,
    space_prefix: bool,
) -> Result<Pipeline> {
    let dbg = std::env::var_os("KERZE_DEBUG_TOKENIZER").is_some();
    let t0 = crate::clock::now_ms();
    let lap = |what: &str| {
        if dbg {
            eprintln!("{what}: {:.0} ms", crate::clock::now_ms() - t0)
        }
    };
    // Merges as Hugging Face's converter derives them from the scores (bpe.rs): every normal
    // or user-defined token merges (user-defined runs of spaces, tabs and newlines too: "▁▁"
    // is reachable from two spaces). SentencePiece gives user-defined pieces score 0, above
    // every normal piece (scores are -rank); GGUF files carry -1000 for them.
    let orders: Vec<Option<u32>> = types
        .iter()
        .zip(scores)
        .map(|(&ty, &score)| match ty {
            TYPE_USER_DEFINED => Some(score_order(0.0)),
            TYPE_NORMAL => Some(score_order(score)),
            _ => None,
        })
        .collect();
    let unk = vocab.id("<unk>");
    let added = Added::new(&vocab, types, control, bos);
    let model = GgufBpe::scored(vocab, orders, unk);
    lap("bpe built");

    let mut tk = Pipeline::new(model);
    let replace = Replace::new(" ", SPACE).map_err(tk_err)?;
    if space_prefix {
        tk.with_normalizer(Some(NormalizerSequence::new(vec![
            Prepend::new(SPACE.to_string()).into(),
            replace.into(),
        ])))
        .map_err(tk_err)?;
    } else {
        tk.with_normalizer(Some(replace)).map_err(tk_err)?;
    }
    tk.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::MergedWithPrevious,
            false,
        )
        .map_err(tk_err)?,
    ));
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(tk_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tk.with_decoder(Some(DecoderSequence::new(decoders)));
    added.install(&mut tk)?;
    lap("added tokens");
    Ok(tk)
}

/// The pre-tokenizer regex of a byte-level file's `tokenizer.ggml.pre`, as its Hugging Face
/// `tokenizer.json` writes it (None: GPT-2's own, inside the ByteLevel step).
fn byte_level_split(pre: &str) -> Result<(Option<&'static str>, bool, bool)> {
    // (regex split before ByteLevel, digits one by one first, normalize to NFC)
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Ok(match pre {
        "llama-bpe" | "llama3" | "llama-v3" => (Some(LLAMA3), false, false),
        "qwen2" | "qwen3" | "deepseek-r1-qwen" => (Some(QWEN2), false, true),
        "smollm" | "starcoder" | "refact" => (None, true, false),
        "gpt2" | "gpt-2" | "default" => (None, false, false),
        other => {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.pre `{other}` is not supported for byte-level BPE (llama-bpe, qwen2, smollm, gpt2)"
            )))
        }
    })
}

/// The Hugging Face construction of a GPT-2 byte-level BPE: the file's merges (`"a b"`, best
/// first), the pre-tokenizer of `pre`, the byte-level decoder.
fn build_byte_level(
    vocab: Vocab,
    merges: &crate::gguf::Strings,
    types: &[i64],
    control: &[bool],
    bos: Option<u32>,
    pre: &str,
) -> Result<Pipeline> {
    let (split, digits, nfc) = byte_level_split(pre)?;
    let mut triples: Vec<(u32, u32, u32)> = Vec::with_capacity(merges.len());
    let mut joined = String::new();
    for (i, m) in merges.iter().enumerate() {
        let m: &str = m;
        let (l, r) = m
            .split_once(' ')
            .ok_or_else(|| tk_err(format!("merge {i} `{m}` is not two pieces")))?;
        joined.clear();
        joined.push_str(l);
        joined.push_str(r);
        // A merge whose parts or result are not tokens can never apply (Hugging Face refuses
        // the file; llama.cpp ignores it).
        if let (Some(a), Some(b), Some(c)) = (vocab.id(l), vocab.id(r), vocab.id(&joined)) {
            triples.push((a, b, c));
        }
    }
    let added = Added::new(&vocab, types, control, bos);
    // Llama 3's tokenizer takes a word that is a token as it is, merges or not.
    let ignore_merges = split.is_some() && !nfc;
    let model = GgufBpe::new(vocab, &triples, None).ignore_merges(ignore_merges);
    drop(triples);
    let mut tk = Pipeline::new(model);
    if nfc {
        tk.with_normalizer(Some(NFC)).map_err(tk_err)?;
    }
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    if digits {
        steps.push(Digits::new(true).into());
    }
    if let Some(re) = split {
        steps.push(
            Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(tk_err)?
            .into(),
        );
    }
    steps.push(ByteLevel::new(false, true, split.is_none()).into());
    tk.with_pre_tokenizer(Some(PreSequence::new(steps)));
    tk.with_decoder(Some(ByteLevel::new(false, true, true)));
    added.install(&mut tk)?;
    Ok(tk)
}

#[cfg(test)]
mod tests {
    use super::Bits;

    /// Each id's bit, across word boundaries, and false past the end.
    #[test]
    fn bits_hold_each_id() {
        for n in [0usize, 1, 63, 64, 65, 200] {
            let set = |i: usize| i.is_multiple_of(3) || i == 63 || i == 64;
            let b = Bits::from_fn(n, set);
            for i in 0..n + 70 {
                assert_eq!(b.get(i), i < n && set(i), "n {n}, id {i}");
            }
        }
    }
}
