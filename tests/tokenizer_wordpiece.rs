//! WordPiece (BERT-family encoders) against Hugging Face `tokenizers` on 706 strings
//! (tests/fixtures/wordpiece_minilm.json, made by make_wordpiece_fixture.py from
//! all-MiniLM-L6-v2's own tokenizer.json): built from that tokenizer.json, and from the GGUF
//! vocabulary `kerze convert` writes in llama.cpp's spelling. Accents, CJK, punctuation runs,
//! URLs, emoji, control characters, texts of more than 512 tokens (never truncated here).
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kerze::gguf::{Gguf, Writer};
use kerze::Tokenizer;

const TOKENIZER_JSON: &[u8] = include_bytes!("fixtures/all-minilm-l6-v2.tokenizer.json");

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    ids_plain: Vec<u32>,
}

fn cases() -> Vec<Case> {
    #[derive(serde::Deserialize)]
    struct F {
        cases: Vec<Case>,
    }
    let f: F = serde_json::from_str(include_str!("fixtures/wordpiece_minilm.json")).unwrap();
    assert!(f.cases.len() >= 300);
    assert!(
        f.cases.iter().any(|c| c.ids.len() > 512),
        "a text past 512 tokens"
    );
    f.cases
}

fn check(tok: &Tokenizer, what: &str) {
    let mut bad = Vec::new();
    for c in cases() {
        let raw = tok.encode_raw(&c.text, true).unwrap();
        let user = tok.encode_user(&c.text, true).unwrap();
        if raw != c.ids || user != c.ids_plain {
            bad.push(format!(
                "{:?}: {raw:?} / {user:?} != {:?} / {:?}",
                c.text, c.ids, c.ids_plain
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} differ, first: {}",
        bad.len(),
        bad[0]
    );
}

#[test]
fn from_tokenizer_json_equals_hugging_face() {
    let tok = Tokenizer::from_tokenizer_json(TOKENIZER_JSON).unwrap();
    assert_eq!(tok.n_vocab(), 30522);
    check(&tok, "tokenizer.json");
}

/// A GGUF with the tokenizer metadata `kerze convert` writes (no tensors).
fn gguf_with_vocab() -> Vec<u8> {
    let mut w = Writer::new();
    w.kv(
        "general.architecture",
        kerze::gguf::Value::String("bert".into()),
    );
    for (k, v) in kerze::convert::tokenizer_metadata(TOKENIZER_JSON).unwrap() {
        w.kv(&k, v);
    }
    w.to_bytes()
}

#[test]
fn from_the_gguf_vocabulary_equals_hugging_face() {
    let bytes = gguf_with_vocab();
    let g = Gguf::read(&bytes[..]).unwrap();
    // llama.cpp's spelling: word starts with ▁, continuations without ##, specials as they are.
    let tokens = g
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_array()
        .unwrap()
        .strings()
        .unwrap();
    let t: Vec<&str> = tokens.iter().collect();
    assert_eq!((t[101], t[1996], t[2075]), ("[CLS]", "\u{2581}the", "ing"));
    let tok = Tokenizer::from_gguf(&g).unwrap();
    check(&tok, "GGUF");
    assert_eq!(
        tok.decode(&[101, 7592, 2088, 102], true).unwrap(),
        "hello world"
    );
}

#[test]
fn a_cased_vocabulary_keeps_its_case() {
    // The same vocabulary with lower-casing off: "Hello" is no longer "hello".
    let mut json: serde_json::Value = serde_json::from_slice(TOKENIZER_JSON).unwrap();
    json["normalizer"]["lowercase"] = serde_json::Value::Bool(false);
    let bytes = serde_json::to_vec(&json).unwrap();
    let from_json = Tokenizer::from_tokenizer_json(&bytes).unwrap();
    let mut w = Writer::new();
    for (k, v) in kerze::convert::tokenizer_metadata(&bytes).unwrap() {
        w.kv(&k, v);
    }
    let g_bytes = w.to_bytes();
    let from_gguf = Tokenizer::from_gguf(&Gguf::read(&g_bytes[..]).unwrap()).unwrap();
    let a = from_json.encode_raw("Hello World", true).unwrap();
    assert_eq!(a, from_gguf.encode_raw("Hello World", true).unwrap());
    assert_ne!(
        a,
        Tokenizer::from_tokenizer_json(TOKENIZER_JSON)
            .unwrap()
            .encode_raw("Hello World", true)
            .unwrap()
    );
}
