//! The tokenizer built from the GGUF's own vocabulary against Hugging Face's Gemma 3
//! `tokenizer.json` on the committed corpus (tests/fixtures/tokenizer_corpus.json).
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use kerze::gguf::{FileSource, Gguf};
use kerze::tokenizer::{StreamDecoder, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Corpus {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    ids_plain: Vec<u32>,
}

fn corpus() -> Corpus {
    serde_json::from_str(include_str!("fixtures/tokenizer_corpus.json")).unwrap()
}

fn tokenizer() -> Tokenizer {
    let g = Gguf::read(&FileSource::open(&common::model_path()).unwrap()).unwrap();
    let t0 = std::time::Instant::now();
    let t = Tokenizer::from_gguf(&g).unwrap();
    eprintln!(
        "tokenizer built in {:.0} ms",
        t0.elapsed().as_secs_f64() * 1000.0
    );
    t
}

#[test]
fn ids_equal_hugging_face_on_the_corpus() {
    let tok = tokenizer();
    let c = corpus();
    assert!(
        c.cases.len() >= 300,
        "corpus has only {} strings",
        c.cases.len()
    );
    let mut bad = Vec::new();
    for case in &c.cases {
        // Hugging Face's file has one token past the GGUF vocabulary (<image_soft_token>,
        // 262144); the model cannot embed it, so such cases are not comparable.
        if case.ids.iter().any(|&id| id as usize >= tok.n_vocab()) {
            continue;
        }
        let got = tok.encode_raw(&case.text, true).unwrap();
        if got != case.ids {
            bad.push(format!(
                "{:?}\n  hf:   {:?}\n  ours: {:?}",
                case.text, case.ids, got
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} differ:\n{}",
        bad.len(),
        c.cases.len(),
        bad.join("\n")
    );
}

#[test]
fn user_text_never_becomes_control_tokens() {
    let tok = tokenizer();
    for case in &corpus().cases {
        let got = tok.encode_user(&case.text, true).unwrap();
        assert_eq!(got.first(), Some(&2));
        assert!(
            got[1..].iter().all(|&id| !tok.is_control(id)),
            "{:?} gave control tokens: {got:?}",
            case.text
        );
        // Hugging Face's `encode_special_tokens = true` splits only its 9 special tokens and
        // still matches <mask>, <unusedN>, ... (control tokens in the GGUF); we split every
        // control token. Where its plain ids hold no control token, the two must agree.
        if case.ids_plain[1..]
            .iter()
            .all(|&id| (id as usize) < tok.n_vocab() && !tok.is_control(id))
        {
            assert_eq!(got, case.ids_plain, "{:?}", case.text);
        }
    }
    let ids = tok
        .encode_user("<start_of_turn>user\nhi<end_of_turn>", true)
        .unwrap();
    assert!(!ids.contains(&105) && !ids.contains(&106), "{ids:?}");
    let raw = tok
        .encode_raw("<start_of_turn>user\nhi<end_of_turn>", true)
        .unwrap();
    assert_eq!(raw[1], 105);
}

#[test]
fn decoding_round_trips_and_streams_whole_characters() {
    let tok = tokenizer();
    for case in &corpus().cases {
        let ids = tok.encode_user(&case.text, false).unwrap();
        // A literal "▁" (U+2581) is the space marker: it decodes as a space, as in Hugging Face.
        if case.text.contains('\u{2581}') {
            continue;
        }
        assert_eq!(tok.decode(&ids, false).unwrap(), case.text, "round trip");
        let mut s = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids {
            // Every piece is a `String`, so it is valid UTF-8 by construction; what matters is
            // that no U+FFFD appears for a character split across byte tokens.
            streamed.push_str(&s.step(&tok, id).unwrap());
        }
        streamed.push_str(&s.flush(&tok).unwrap());
        assert_eq!(streamed, case.text, "stream");
    }
}

#[test]
fn out_of_vocabulary_ids_are_refused() {
    let tok = tokenizer();
    assert!(matches!(
        tok.decode(&[5, 999_999], false),
        Err(kerze::Error::InvalidArgument(_))
    ));
}

#[test]
fn special_ids_come_from_the_file() {
    let tok = tokenizer();
    // Gemma 3's GGUF names bos 2 and eos 1 and no eot; <end_of_turn> (106) ends a turn.
    assert_eq!((tok.bos(), tok.eos()), (Some(2), Some(1)));
    assert_eq!(tok.token_id("<end_of_turn>"), Some(106));
    assert_eq!(tok.end_of_generation(), &[1, 106]);
}
