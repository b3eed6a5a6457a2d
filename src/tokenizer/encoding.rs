//! The [`Tokenizer`]: text ⇄ ids through one pipeline, with two faces for control tokens
//! (parsed in templates, never in user text), and what a constraint engine and a streaming
//! decoder need of its vocabulary. Built from a GGUF (`from_gguf.rs`) or a `tokenizer.json`.

use super::pipeline::{byte_chars, tk_err, Bits, Pipe, SPACE};
use crate::error::{Error, Result};
use std::sync::Mutex;

/// A tokenizer with two faces: `encode_raw` parses control tokens written in the text (as
/// Hugging Face's `encode` does), `encode_user` never does, so a visitor who types
/// `<start_of_turn>` gets plain text, not a turn marker.
pub struct Tokenizer {
    /// One pipeline; the two faces differ only in its `encode_special_tokens` flag, set per
    /// call under the lock (a second copy would cost its whole vocabulary again).
    pub(super) inner: Mutex<Box<dyn Pipe>>,
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    /// Where generation stops by default: eos, eot, eom and the control tokens of
    /// [`END_OF_TURN`], sorted.
    pub(super) end_of_generation: Vec<u32>,
    pub(super) n_vocab: usize,
    /// Ids of byte-fallback tokens (`<0x00>`..`<0xFF>`): a streamed piece may end inside a
    /// UTF-8 character only after one of them.
    pub(super) byte_tokens: Bits,
    /// GPT-2 byte-level BPE: any token may end inside a UTF-8 character.
    pub(super) byte_level: bool,
    /// SentencePiece with a dummy prefix (Llama 2): decoding strips one leading space, so a
    /// streamed piece after the first gets back the space its first `▁` stands for.
    pub(super) space_prefix: bool,
    /// The file asks for <bos> in front of a prompt (`tokenizer.ggml.add_bos_token`).
    pub(super) add_bos: bool,
    /// Control tokens by id: never produced from user text.
    pub(super) control: Bits,
    /// The file's Jinja chat template (`tokenizer.chat_template`), rendered by chat/.
    pub(super) chat_template: Option<String>,
}

impl Tokenizer {
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
    pub(super) fn assemble(
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
