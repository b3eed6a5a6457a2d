//! The tiny models' vocabularies: a 400-token SentencePiece one and a Qwen-style byte-level
//! BPE one, with the ChatML template of the byte-level models.

use crate::gguf::{Array, Value, Writer};
use crate::tokenizer::byte_chars;

const WORDS: &[&str] = &[
    "▁t", "he", "▁the", "in", "▁a", "er", "an", "re", "on", "▁s", "en", "at", "▁o", "▁w", "nd",
    "ed", "▁and", "is", "▁of", "ing", "▁in", "▁to", "ou", "es", "▁b", "it", "or", "▁c", "ar", "al",
    "▁th", "▁i", "ll", "▁is", "▁h",
];

/// The vocabulary: (piece, score, token type).
pub fn vocab() -> Vec<(String, f32, i32)> {
    let mut v: Vec<(String, f32, i32)> = Vec::new();
    for c in [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<mask>",
        "<start_of_turn>",
        "<end_of_turn>",
    ] {
        v.push((c.to_string(), -1000.0, 3));
    }
    for u in ["\n", "\n\n", "<b>"] {
        v.push((u.to_string(), -1000.0, 4));
    }
    for b in 0..=255u32 {
        v.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    let mut normal: Vec<String> = vec!["▁".to_string()];
    normal.extend((33u8..127).map(|c| (c as char).to_string()));
    normal.extend(WORDS.iter().map(|s| s.to_string()));
    for (i, p) in normal.into_iter().enumerate() {
        // Multi-character pieces outrank single characters, as in a real SentencePiece model.
        let score = if p.chars().count() > 1 {
            -(i as f32)
        } else {
            -1000.0 - i as f32
        };
        v.push((p, score, 1));
    }
    v
}

/// A Qwen-style byte-level BPE vocabulary: the 256 byte characters, merges of common English
/// pieces, ChatML's control tokens and Qwen3's `<think>` markers. (tokens, types, merges).
pub fn byte_level_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let bc = byte_chars();
    let mut tokens: Vec<String> = bc.iter().map(|c| c.to_string()).collect();
    let sp = bc[b' ' as usize];
    let words = [
        "Ġt", "he", "Ġthe", "in", "er", "an", "re", "on", "Ġa", "Ġs", "en", "at", "Ġo", "Ġw", "nd",
        "ed", "Ġand", "is", "Ġof", "ing", "Ġin", "Ġto", "ou", "es", "Ġb", "it", "or", "Ġc", "ar",
        "al", "Ġth", "Ġi", "ll", "Ġis", "Ġh", "Ġhe", "Ġhello", "Ċ", "ĊĊ",
    ];
    let mut merges = Vec::new();
    for w in words {
        let w = w.replace('Ġ', &sp.to_string());
        let chars: Vec<char> = w.chars().collect();
        if chars.len() < 2 || tokens.contains(&w) {
            continue;
        }
        // The first split whose halves are both tokens already.
        for k in (1..chars.len()).rev() {
            let (l, r): (String, String) =
                (chars[..k].iter().collect(), chars[k..].iter().collect());
            if tokens.contains(&l) && tokens.contains(&r) {
                merges.push(format!("{l} {r}"));
                tokens.push(w.clone());
                break;
            }
        }
    }
    let mut types = vec![1i32; tokens.len()];
    for (t, ty) in [
        ("<|endoftext|>", 3),
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<think>", 4),
        ("</think>", 4),
    ] {
        tokens.push(t.to_string());
        types.push(ty);
    }
    (tokens, types, merges)
}

/// The ChatML template of the byte-level tiny models (Qwen2.5's shape: a default system
/// prompt when the conversation brings none).
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}{%- if loop.first and message.role != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}";

/// A byte-level vocabulary's metadata (`tokens`, `types`, `merges` as [`byte_level_vocab`]
/// gives them, or read from a tokenizer.json): pre `qwen2`, `<|endoftext|>` as bos (not
/// added), `<|im_end|>` as eos, the ChatML template.
pub(super) fn write_byte_level(
    w: &mut Writer,
    tokens: &[String],
    types: &[i32],
    merges: &[String],
) {
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap_or(0) as u32;
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::Str(tokens.iter().map(String::as_str).collect())),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(types.to_vec())),
        )
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::Str(merges.iter().map(String::as_str).collect())),
        )
        .kv(
            "tokenizer.ggml.bos_token_id",
            Value::U32(id("<|endoftext|>")),
        )
        .kv("tokenizer.ggml.eos_token_id", Value::U32(id("<|im_end|>")))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv(
            "tokenizer.chat_template",
            Value::String(CHATML_TEMPLATE.into()),
        );
}
