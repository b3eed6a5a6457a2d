//! WordPiece, the tokenizer of BERT-family encoders: from the GGUF (`tokenizer.ggml.model =
//! bert`, the vocabulary as llama.cpp's converter writes it) or from a Hugging Face
//! `tokenizer.json`. Both become the same `tokenizers` pipeline — `BertNormalizer` (clean,
//! CJK split, lower-case and accent stripping), `BertPreTokenizer`, the WordPiece model,
//! `[CLS] $A [SEP]` — so the ids are Hugging Face's. The GGUF side is described as the
//! `tokenizer.json` the model came with, then built by the same code as that file.

use super::tk_err;
use crate::error::Result;
use serde_json::{json, Value};

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

/// The `tokenizer.json` that describes this vocabulary (no padding, no truncation).
pub fn tokenizer_json(s: &Spec) -> Result<Value> {
    let piece = |id: u32| {
        s.pieces
            .get(id as usize)
            .cloned()
            .ok_or_else(|| tk_err(format!("token id {id} is outside the vocabulary")))
    };
    let (unk, cls, sep) = (piece(s.unk)?, piece(s.cls)?, piece(s.sep)?);
    let mut vocab = serde_json::Map::with_capacity(s.pieces.len());
    for (id, p) in s.pieces.iter().enumerate() {
        // The first id of a piece spelt twice wins, as Hugging Face's vocab.txt reader keeps it.
        vocab.entry(p.clone()).or_insert_with(|| json!(id));
    }
    let added: Vec<Value> = s
        .special
        .iter()
        .map(|&id| {
            Ok(json!({
                "id": id, "content": piece(id)?, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            }))
        })
        .collect::<Result<_>>()?;
    let tok = |id: &str, type_id: u32| json!({ "SpecialToken": { "id": id, "type_id": type_id } });
    let seq = |id: &str, type_id: u32| json!({ "Sequence": { "id": id, "type_id": type_id } });
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {
            "type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
            "strip_accents": null, "lowercase": s.lowercase,
        },
        "pre_tokenizer": { "type": "BertPreTokenizer" },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [tok(&cls, 0), seq("A", 0), tok(&sep, 0)],
            "pair": [tok(&cls, 0), seq("A", 0), tok(&sep, 0), seq("B", 1), tok(&sep, 1)],
            "special_tokens": {
                cls.clone(): { "id": cls, "ids": [s.cls], "tokens": [cls] },
                sep.clone(): { "id": sep, "ids": [s.sep], "tokens": [sep] },
            },
        },
        "decoder": { "type": "WordPiece", "prefix": CONTINUE, "cleanup": true },
        "model": {
            "type": "WordPiece", "unk_token": unk, "continuing_subword_prefix": CONTINUE,
            "max_input_chars_per_word": 100, "vocab": vocab,
        },
    }))
}
