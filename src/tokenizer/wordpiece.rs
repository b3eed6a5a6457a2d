//! WordPiece, the tokenizer of BERT-family encoders: from the GGUF (`tokenizer.ggml.model =
//! bert`, the vocabulary as llama.cpp's converter writes it) or from a Hugging Face
//! `tokenizer.json`. Both become the same `tokenizers` pipeline — `BertNormalizer` (clean,
//! CJK split, lower-case and accent stripping), `BertPreTokenizer`, the WordPiece model,
//! `[CLS] $A [SEP]` — so the ids are Hugging Face's.

use super::pipeline::{tk_err, Impl};
use crate::error::Result;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

/// Where a word continues in WordPiece spelling.
pub const CONTINUE: &str = "##";
/// Where a word starts in llama.cpp's spelling of a WordPiece vocabulary.
const WORD_START: &str = "\u{2581}";

/// A GGUF piece back in WordPiece spelling: llama.cpp's converter writes `▁word` for a word
/// start and `ing` for `##ing`; control tokens (`[CLS]`) stay as they are.
pub fn from_phantom(piece: &str, control: bool) -> String {
    if control {
        piece.to_string()
    } else if let Some(w) = piece.strip_prefix(WORD_START) {
        w.to_string()
    } else {
        format!("{CONTINUE}{piece}")
    }
}

/// The other way: a WordPiece vocabulary entry as the GGUF stores it.
pub fn to_phantom(piece: &str, control: bool) -> String {
    if control {
        piece.to_string()
    } else if let Some(w) = piece.strip_prefix(CONTINUE) {
        w.to_string()
    } else {
        format!("{WORD_START}{piece}")
    }
}

/// What a WordPiece pipeline needs besides the vocabulary.
pub struct Spec<'a> {
    /// Vocabulary entries in id order, in WordPiece spelling.
    pub pieces: &'a [String],
    /// Ids of the special tokens (`[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`).
    pub special: &'a [u32],
    pub unk: u32,
    pub cls: u32,
    pub sep: u32,
    pub lowercase: bool,
}

/// The pipeline Hugging Face builds for a BERT `tokenizer.json`, built directly (deserializing
/// a described `tokenizer.json` would bring every tokenizer kind's reader into the wasm).
pub fn build(s: &Spec) -> Result<Impl<WordPiece>> {
    let piece = |id: u32| {
        s.pieces
            .get(id as usize)
            .cloned()
            .ok_or_else(|| tk_err(format!("token id {id} is outside the vocabulary")))
    };
    let (unk, cls, sep) = (piece(s.unk)?, piece(s.cls)?, piece(s.sep)?);
    let mut vocab = ahash::AHashMap::with_capacity(s.pieces.len());
    for (id, p) in s.pieces.iter().enumerate() {
        // The first id of a piece spelt twice wins, as Hugging Face's vocab.txt reader keeps it.
        vocab.entry(p.clone()).or_insert(id as u32);
    }
    let model = WordPiece::builder()
        .vocab(vocab)
        .unk_token(unk)
        .continuing_subword_prefix(CONTINUE.into())
        .max_input_chars_per_word(100)
        .build()
        .map_err(tk_err)?;
    let mut tk = Impl::new(model);
    tk.with_normalizer(Some(BertNormalizer::new(true, true, None, s.lowercase)))
        .map_err(tk_err)?;
    tk.with_pre_tokenizer(Some(BertPreTokenizer));
    let post = TemplateProcessing::builder()
        .try_single(format!("{cls} $A {sep}"))
        .map_err(tk_err)?
        .try_pair(format!("{cls} $A {sep} $B:1 {sep}:1"))
        .map_err(tk_err)?
        .special_tokens(vec![(cls, s.cls), (sep, s.sep)])
        .build()
        .map_err(tk_err)?;
    tk.with_post_processor(Some(post));
    tk.with_decoder(Some(WordPieceDecoder::new(CONTINUE.into(), true)));
    let special: Vec<AddedToken> = s
        .special
        .iter()
        .map(|&id| piece(id).map(|p| AddedToken::from(p, true)))
        .collect::<Result<_>>()?;
    tk.add_special_tokens(special).map_err(tk_err)?;
    Ok(tk)
}
