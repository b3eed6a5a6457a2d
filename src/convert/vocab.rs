//! A WordPiece `tokenizer.json` as the tokenizer metadata llama.cpp's converter writes.

use super::error::bad;
use crate::error::Result;
use crate::gguf::{Array, Value};
use crate::tokenizer::wordpiece;
use serde_json::Value as Json;

/// GGUF token types (llama.cpp's): what the WordPiece vocabulary needs.
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;

/// The tokenizer metadata of a WordPiece `tokenizer.json`, as llama.cpp's converter writes
/// it (the vocabulary in its `▁word` / `ing` spelling, special ids,
/// `tokenizer.ggml.normalizer.lowercase`: a cased model needs it off).
pub fn tokenizer_metadata(tokenizer_json: &[u8]) -> Result<Vec<(String, Value)>> {
    let t: Json =
        serde_json::from_slice(tokenizer_json).map_err(|e| bad(format!("tokenizer.json: {e}")))?;
    let model = &t["model"];
    if model["type"] != "WordPiece" {
        return Err(bad(format!(
            "tokenizer.json: model type {} is not WordPiece",
            model["type"]
        )));
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("tokenizer.json: model.vocab is not an object"))?;
    let n = vocab.len();
    let mut pieces: Vec<Option<String>> = vec![None; n];
    for (p, id) in vocab {
        let id = id
            .as_u64()
            .filter(|&i| (i as usize) < n)
            .ok_or_else(|| bad(format!("tokenizer.json: id of {p:?} is not in 0..{n}")))?;
        if pieces[id as usize].replace(p.clone()).is_some() {
            return Err(bad(format!("tokenizer.json: id {id} is given twice")));
        }
    }
    let pieces: Vec<String> = pieces
        .into_iter()
        .map(|p| p.ok_or_else(|| bad("tokenizer.json: the vocabulary's ids have gaps")))
        .collect::<Result<_>>()?;
    let mut control = vec![false; n];
    for a in t["added_tokens"].as_array().into_iter().flatten() {
        if a["special"] == true {
            let id = a["id"]
                .as_u64()
                .filter(|&i| (i as usize) < n)
                .ok_or_else(|| {
                    bad("tokenizer.json: an added token outside the vocabulary (not supported)")
                })?;
            control[id as usize] = true;
        }
    }
    let id_of = |name: &str| pieces.iter().position(|p| p == name).map(|i| i as u32);
    let named = |field: &str, default: &str| -> Result<u32> {
        let name = model[field].as_str().unwrap_or(default);
        id_of(name).ok_or_else(|| bad(format!("tokenizer.json: no {name} token")))
    };
    let unk = named("unk_token", "[UNK]")?;
    let special_id =
        |name: &str| id_of(name).ok_or_else(|| bad(format!("tokenizer.json: no {name} token")));
    let (cls, sep) = (special_id("[CLS]")?, special_id("[SEP]")?);
    let lowercase = t["normalizer"]["lowercase"].as_bool().unwrap_or(true);
    let tokens: Vec<String> = pieces
        .iter()
        .zip(&control)
        .map(|(p, &c)| wordpiece::to_phantom(p, c))
        .collect();
    let types: Vec<i32> = control
        .iter()
        .map(|&c| if c { TYPE_CONTROL } else { TYPE_NORMAL })
        .collect();
    let mut kv = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("bert".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String("default".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(Array::Str(tokens.iter().map(String::as_str).collect())),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(cls)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(sep)),
        (
            "tokenizer.ggml.seperator_token_id".to_string(),
            Value::U32(sep),
        ),
        (
            "tokenizer.ggml.unknown_token_id".to_string(),
            Value::U32(unk),
        ),
    ];
    for (key, name) in [("padding_token_id", "[PAD]"), ("mask_token_id", "[MASK]")] {
        if let Some(id) = id_of(name) {
            kv.push((format!("tokenizer.ggml.{key}"), Value::U32(id)));
        }
    }
    kv.push((
        "tokenizer.ggml.normalizer.lowercase".to_string(),
        Value::Bool(lowercase),
    ));
    Ok(kv)
}
