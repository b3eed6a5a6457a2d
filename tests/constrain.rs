//! Constrained decoding on tiny synthetic models (a SentencePiece and a byte-level
//! vocabulary): the mask only removes candidates (an any-text grammar gives the unconstrained
//! greedy text; allowed logits are untouched), constraints end generation when complete,
//! choices and regexes hold for every seed, and bad constraints are typed errors before any
//! token. (`tests/constrain/schemas.py` checks 100+ JSON schemas against `jsonschema`.)
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kerze::constrain::{Constraint, Grammars};
use kerze::synth::{tiny_decoder_with, Quants};
use kerze::{Engine, Family, FinishReason, GenerateOptions, GgmlType, SamplerConfig};

fn never() -> bool {
    false
}

fn models() -> Vec<Vec<u8>> {
    vec![
        kerze::synth::tiny_gemma3().unwrap(),
        tiny_decoder_with(Family::Qwen2, Quants::all(GgmlType::Q8_0), 5, true).unwrap(),
    ]
}

fn engine(bytes: &[u8]) -> Engine {
    Engine::load(&bytes, &Default::default(), &mut |_, _| {})
        .unwrap()
        .0
}

fn run(
    e: &mut Engine,
    prompt: &str,
    c: Option<Constraint>,
    seed: Option<u64>,
    n: usize,
) -> (String, Vec<u32>, Option<FinishReason>) {
    let ids = e.tokenizer().encode_user(prompt, true).unwrap();
    let sampler = match seed {
        Some(seed) => SamplerConfig {
            temperature: 0.8,
            seed,
            ..Default::default()
        },
        None => SamplerConfig::greedy(),
    };
    let opts = GenerateOptions {
        max_tokens: n,
        sampler,
        stop_tokens: Some(Vec::new()),
        constraint: c,
        ..Default::default()
    };
    let mut text = String::new();
    let g = pollster::block_on(e.generate(ids, &opts, &never, &mut |c| text.push_str(&c.text)))
        .unwrap();
    (text, g.generated().to_vec(), g.finish())
}

#[test]
fn an_any_text_grammar_gives_the_unconstrained_greedy_text() {
    for bytes in models() {
        let mut e = engine(&bytes);
        let prompt = "the cat is in the garden and the dog";
        let (free, free_ids, _) = run(&mut e, prompt, None, None, 24);
        // Any text at all: the mask allows every token the unconstrained text used.
        let any = Constraint::Grammar("start: /(.|\\n)*/".into());
        let (text, ids, finish) = run(&mut e, prompt, Some(any), None, 24);
        assert_eq!(ids, free_ids, "{free:?} vs {text:?}");
        assert_eq!(finish, Some(FinishReason::Length));
    }
}

#[test]
fn the_mask_keeps_allowed_logits_bit_for_bit_and_removes_the_rest() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let e = engine(&bytes);
    let g = Grammars::default();
    let mut guide = g
        .compile(
            e.tokenizer(),
            &Constraint::Choices(vec!["the cat".into(), "a dog".into()]),
            false,
        )
        .unwrap();
    let n = e.config().n_vocab;
    let logits: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
        .collect();
    let mut masked = logits.clone();
    guide.apply(&mut masked).unwrap();
    let mut allowed = 0;
    for (i, (a, b)) in logits.iter().zip(&masked).enumerate() {
        if guide.allows(i as u32).unwrap() {
            allowed += 1;
            assert_eq!(a.to_bits(), b.to_bits(), "token {i}");
        } else {
            assert_eq!(*b, f32::NEG_INFINITY, "token {i}");
        }
    }
    assert!(allowed > 0 && allowed < n / 2, "{allowed} of {n} allowed");
    // Compiled again (from the kept ones): the same mask, and a matcher of its own.
    let c = Constraint::Choices(vec!["the cat".into(), "a dog".into()]);
    let mut again = g.compile(e.tokenizer(), &c, false).unwrap();
    let mut second = logits.clone();
    again.apply(&mut second).unwrap();
    assert_eq!(
        second.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        masked.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let the = e.tokenizer().encode_user("the", false).unwrap()[0];
    again.commit(the).unwrap();
    let mut third = g.compile(e.tokenizer(), &c, false).unwrap();
    let mut fresh = logits.clone();
    third.apply(&mut fresh).unwrap();
    assert_eq!(
        fresh.iter().filter(|x| x.is_finite()).count(),
        allowed,
        "the kept matcher moved"
    );
}

#[test]
fn choices_and_regexes_hold_for_every_seed_and_end_the_generation() {
    for bytes in models() {
        let mut e = engine(&bytes);
        let choices = vec![
            "the sea".to_string(),
            "a boat on the river".into(),
            "rain".into(),
        ];
        for seed in [None, Some(1), Some(2), Some(3), Some(4), Some(5)] {
            let (text, _, finish) = run(
                &mut e,
                "the cat is",
                Some(Constraint::Choices(choices.clone())),
                seed,
                64,
            );
            assert!(choices.contains(&text), "{text:?} (seed {seed:?})");
            assert_eq!(finish, Some(FinishReason::Stop), "{text:?}");
            let re = Constraint::Regex("[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]".into());
            let (text, _, finish) = run(&mut e, "a date:", Some(re), seed, 64);
            assert_eq!(finish, Some(FinishReason::Stop), "{text:?}");
            let b = text.as_bytes();
            assert!(
                text.len() == 10
                    && b[4] == b'-'
                    && b[7] == b'-'
                    && text.chars().filter(char::is_ascii_digit).count() == 8,
                "{text:?}"
            );
        }
    }
}

#[test]
fn json_ends_when_the_value_closes_or_says_length() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "a": { "type": "boolean" }, "b": { "enum": ["x", "y"] } },
        "required": ["a", "b"],
        "additionalProperties": false
    });
    for seed in [None, Some(1), Some(2)] {
        let (text, _, finish) = run(
            &mut e,
            "the cat",
            Some(Constraint::JsonSchema(schema.clone())),
            seed,
            64,
        );
        assert_eq!(finish, Some(FinishReason::Stop), "{text:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            v["a"].is_boolean() && (v["b"] == "x" || v["b"] == "y"),
            "{v}"
        );
    }
    // Too few tokens for the object: `length`, and the text is not a whole value.
    let (text, _, finish) = run(
        &mut e,
        "the cat",
        Some(Constraint::JsonSchema(schema)),
        None,
        3,
    );
    assert_eq!(finish, Some(FinishReason::Length));
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_err(),
        "{text:?}"
    );
}

#[test]
fn bad_constraints_are_typed_errors_before_any_token() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let ids = e.tokenizer().encode_user("the cat", true).unwrap();
    let huge = serde_json::json!({ "type": "object", "description": "x".repeat(1 << 20) });
    let cases = [
        Constraint::JsonSchema(
            serde_json::json!({ "type": "object", "properties": { "a": { "type": "strin" } } }),
        ),
        Constraint::JsonSchema(serde_json::json!([1, 2])),
        Constraint::JsonSchema(huge),
        Constraint::Regex("(unclosed".into()),
        Constraint::Grammar("start: nothing_defined".into()),
        Constraint::Choices(vec![]),
        Constraint::Choices(vec!["a".into(), String::new()]),
    ];
    for c in cases {
        let opts = GenerateOptions {
            constraint: Some(c.clone()),
            ..Default::default()
        };
        let err = e
            .begin(ids.clone(), &opts)
            .err()
            .unwrap_or_else(|| panic!("{c:?} compiled"));
        assert_eq!(err.kind(), "InvalidArgumentError", "{c:?}: {err}");
    }
    // The engine still runs.
    let g = pollster::block_on(e.generate(
        ids,
        &GenerateOptions::greedy_tokens(2),
        &never,
        &mut |_| {},
    ))
    .unwrap();
    assert_eq!(g.generated().len(), 2);
}
