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

/// The tools of the tool-call tests: a function with a required string and an enum, and one
/// without parameters.
fn weather_tools() -> serde_json::Value {
    serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
         "parameters": {"type": "object", "properties": {
             "city": {"type": "string", "minLength": 1, "maxLength": 12},
             "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "local_time"}}
    ])
}

/// Calls as the tools allow them: a known name, arguments valid for it.
fn check_call(c: &kerze::chat::tools::Call) {
    let args: serde_json::Value = serde_json::from_str(&c.arguments)
        .unwrap_or_else(|e| panic!("{}: {e}: {:?}", c.name, c.arguments));
    let o = args.as_object().unwrap();
    match c.name.as_str() {
        "get_weather" => {
            let city = o["city"].as_str().unwrap();
            assert!((1..=12).contains(&city.chars().count()), "{city:?}");
            if let Some(u) = o.get("unit") {
                assert!(u == "celsius" || u == "fahrenheit", "{u}");
            }
            assert!(o.keys().all(|k| k == "city" || k == "unit"), "{o:?}");
        }
        "local_time" => assert!(o.is_empty(), "{o:?}"),
        n => panic!("a call of {n}, which is no tool"),
    }
}

#[test]
fn tool_calls_follow_the_tools_for_every_choice_and_seed() {
    use kerze::chat::tools::{split_calls, ToolChoice, Tools};
    let tools: Vec<serde_json::Value> = weather_tools().as_array().unwrap().clone();
    for bytes in models() {
        let mut e = engine(&bytes);
        for (choice, parallel) in [
            (ToolChoice::Required, false),
            (ToolChoice::Required, true),
            (ToolChoice::Function("get_weather".into()), false),
            (ToolChoice::Function("local_time".into()), true),
            (ToolChoice::Auto, false),
        ] {
            for seed in [None, Some(1), Some(2), Some(3), Some(4), Some(5)] {
                let c = Constraint::Tools(Tools {
                    tools: tools.clone(),
                    choice: choice.clone(),
                    parallel,
                });
                let (text, _, finish) = run(&mut e, "what is the weather", Some(c), seed, 400);
                let (content, calls) = split_calls(&text);
                let what = format!("{choice:?} parallel {parallel} seed {seed:?}: {text:?}");
                match &choice {
                    ToolChoice::Auto => {
                        // Text without a call, or calls: never a broken call.
                        if calls.is_empty() {
                            assert!(!text.contains("<tool_call>"), "{what}");
                        }
                    }
                    _ => {
                        assert!(!calls.is_empty(), "{what}");
                        if finish == Some(FinishReason::Stop) {
                            assert_eq!(content, None, "{what}");
                        }
                        if let ToolChoice::Function(n) = &choice {
                            assert!(calls.iter().all(|c| &c.name == n), "{what}");
                        }
                    }
                }
                if finish == Some(FinishReason::Stop) {
                    calls.iter().for_each(check_call);
                }
                if !parallel && !calls.is_empty() {
                    // One call and nothing after it: complete, so it ends there.
                    assert_eq!(calls.len(), 1, "{what}");
                    assert_eq!(finish, Some(FinishReason::Stop), "{what}");
                }
            }
        }
    }
}

#[test]
fn bad_tools_are_typed_errors_before_any_token() {
    use kerze::chat::tools::{ToolChoice, Tools};
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let t = |tools: serde_json::Value, choice: ToolChoice| {
        Constraint::Tools(Tools {
            tools: tools.as_array().unwrap().clone(),
            choice,
            parallel: true,
        })
    };
    let bad = [
        t(serde_json::json!([]), ToolChoice::Auto),
        t(weather_tools(), ToolChoice::Function("nope".into())),
        t(weather_tools(), ToolChoice::None),
        t(
            serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}}}]),
            ToolChoice::Required,
        ),
    ];
    for c in bad {
        let ids = e.tokenizer().encode_user("hi", true).unwrap();
        let opts = GenerateOptions {
            constraint: Some(c.clone()),
            ..Default::default()
        };
        let err = pollster::block_on(e.generate(ids, &opts, &never, &mut |_| {}))
            .err()
            .unwrap_or_else(|| panic!("{c:?} was taken"));
        assert_eq!(err.kind(), "InvalidArgumentError", "{err}");
    }
}

#[test]
fn the_auto_grammar_takes_text_or_whole_calls_and_nothing_between() {
    use kerze::chat::tools::{ToolChoice, Tools};
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let e = engine(&bytes);
    let g = Grammars::default();
    let c = Constraint::Tools(Tools {
        tools: weather_tools().as_array().unwrap().clone(),
        choice: ToolChoice::Auto,
        parallel: true,
    });
    // How far into `text` the grammar follows (its tokens, committed one by one), and
    // whether it may end there.
    let follow = |text: &str| -> (usize, bool) {
        let mut guide = g.compile(e.tokenizer(), &c, false).unwrap();
        let ids = e.tokenizer().encode_user(text, false).unwrap();
        for (n, &id) in ids.iter().enumerate() {
            if !guide.allows(id).unwrap() {
                return (n, false);
            }
            guide.commit(id).unwrap();
        }
        let eos = e.tokenizer().eos().unwrap();
        (ids.len(), guide.allows(eos).unwrap())
    };
    let whole = |t: &str| {
        let n = e.tokenizer().encode_user(t, false).unwrap().len();
        assert_eq!(follow(t), (n, true), "{t:?}");
    };
    whole("It is sunny in Paris <tool today.");
    whole("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    whole("Let me look.\n<tool_call>\n{\"name\": \"local_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}\n</tool_call>");
    for broken in [
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"kelvin\"}}\n</tool_call>",
        "text, then <tool_call> with no call",
    ] {
        let (n, end) = follow(broken);
        let all = e.tokenizer().encode_user(broken, false).unwrap().len();
        assert!(n < all || !end, "{broken:?} was taken whole");
    }
    // Unfinished: a call that is not closed may not end.
    assert!(!follow("<tool_call>\n{\"name\": \"local_time\", \"arguments\": {}}").1);
}

#[test]
fn a_choice_is_picked_by_its_likelihood_which_a_teacher_forced_pass_gives() {
    for bytes in models() {
        let mut e = engine(&bytes);
        let choices: Vec<String> = vec![
            "the cat".into(),
            " a dog".into(),
            "x".into(),
            "garden".into(),
        ];
        let prompt = "in the garden the dog saw";
        let p = e.tokenizer().encode_user(prompt, true).unwrap();
        // The reference: each choice's ids teacher-forced after the prompt, log-softmax summed.
        let n_vocab = e.config().n_vocab;
        let want: Vec<f64> = choices
            .iter()
            .map(|c| {
                let ids: Vec<u32> = p
                    .iter()
                    .copied()
                    .chain(e.tokenizer().encode_user(c, false).unwrap())
                    .collect();
                let rows = pollster::block_on(e.logits_top_k(&ids, n_vocab, p.len() - 1)).unwrap();
                rows.iter()
                    .zip(&ids[p.len()..])
                    .map(|(row, id)| {
                        let max = row.iter().map(|x| f64::from(x.1)).fold(f64::MIN, f64::max);
                        let lse = max
                            + row
                                .iter()
                                .map(|x| (f64::from(x.1) - max).exp())
                                .sum::<f64>()
                                .ln();
                        f64::from(row.iter().find(|x| x.0 == *id).unwrap().1) - lse
                    })
                    .sum()
            })
            .collect();
        for seed in [None, Some(1), Some(2), Some(3)] {
            let ids = e.tokenizer().encode_user(prompt, true).unwrap();
            let opts = GenerateOptions {
                max_tokens: 16,
                sampler: match seed {
                    Some(seed) => SamplerConfig {
                        temperature: 1.0,
                        seed,
                        ..Default::default()
                    },
                    None => SamplerConfig::greedy(),
                },
                constraint: Some(Constraint::Choices(choices.clone())),
                ..Default::default()
            };
            let mut text = String::new();
            let g =
                pollster::block_on(e.generate(ids, &opts, &never, &mut |c| text.push_str(&c.text)))
                    .unwrap();
            let scores = g.usage.choices.clone().expect("choice scores");
            assert_eq!(g.finish(), Some(FinishReason::Stop));
            assert!(choices.contains(&text), "{text:?}");
            assert_eq!(g.usage.forced_tokens, g.generated().len());
            let total: f64 = scores.iter().map(|s| s.prob).sum();
            assert!((total - 1.0).abs() < 1e-9, "{total}");
            for (s, w) in scores.iter().zip(&want) {
                assert!(
                    (s.logprob - w).abs() < 1e-3,
                    "{}: {} vs {w}",
                    s.choice,
                    s.logprob
                );
            }
            if seed.is_none() {
                let best = scores
                    .iter()
                    .max_by(|a, b| a.prob.total_cmp(&b.prob))
                    .unwrap();
                assert_eq!(text, best.choice, "greedy takes the likeliest choice");
            }
        }
    }
}

#[test]
fn a_choice_cut_short_by_max_tokens_says_length() {
    for bytes in models() {
        let mut e = engine(&bytes);
        let choices = vec!["the cat is in the garden".to_string(), "a dog".to_string()];
        let (text, ids, finish) = run(
            &mut e,
            "a dog",
            Some(Constraint::Choices(choices.clone())),
            None,
            1,
        );
        assert_eq!(ids.len(), 1);
        assert_eq!(finish, Some(FinishReason::Length), "{text:?}");
        assert!(
            choices.iter().any(|c| c.starts_with(&text) && *c != text),
            "{text:?}"
        );
    }
}

#[test]
fn forced_text_is_taken_without_sampling_and_run_as_one_chunk() {
    // Also a SentencePiece vocabulary that puts a space before text (Llama 2's way): forced
    // text must not gain one.
    let mut all = models();
    all.push(tiny_decoder_with(Family::Llama, Quants::all(GgmlType::Q8_0), 5, false).unwrap());
    for (m, bytes) in all.iter().enumerate() {
        // The dummy-prefix vocabulary writes forced text the trie's way (its own tokens would
        // add a space).
        let dummy_prefix = m == 2;
        let mut e = engine(bytes);
        // Everything but the value's digits is forced.
        let schema = serde_json::json!({"type": "object", "properties": {
            "a_rather_long_key": {"const": "and a fixed value"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a_rather_long_key", "n"], "additionalProperties": false});
        let c = Constraint::JsonSchema(schema);
        for seed in [None, Some(4)] {
            let (text, ids, finish) = run(&mut e, "some json", Some(c.clone()), seed, 64);
            assert_eq!(finish, Some(FinishReason::Stop), "{text:?}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["a_rather_long_key"], "and a fixed value");
            assert!(v["n"].as_u64().unwrap() <= 9);
            // Forced text is written in the tokenizer's own tokens (where they are exactly
            // the text).
            let forced = "{\"a_rather_long_key\":\"and a fixed value\",\"n\":";
            let canon = e.tokenizer().encode_user(forced, false).unwrap();
            if !dummy_prefix {
                assert_eq!(&ids[..canon.len()], &canon[..], "{text:?}");
            }
            assert!(text.starts_with(forced), "{text:?}");
        }
        let ids = e.tokenizer().encode_user("some json", true).unwrap();
        let opts = GenerateOptions {
            max_tokens: 64,
            sampler: SamplerConfig::greedy(),
            constraint: Some(c.clone()),
            ..Default::default()
        };
        let g = pollster::block_on(e.generate(ids, &opts, &never, &mut |_| {})).unwrap();
        let n = g.generated().len();
        assert!(
            g.usage.forced_tokens + 3 >= n && g.usage.forced_tokens > n / 2,
            "{} of {n} forced",
            g.usage.forced_tokens
        );
    }
}

#[test]
fn a_dummy_prefix_vocabulary_streams_its_spaces() {
    // Llama 2's SentencePiece way: decoding strips one leading space, which must not drop the
    // space of every streamed piece after the first.
    let bytes = tiny_decoder_with(Family::Llama, Quants::all(GgmlType::Q8_0), 5, false).unwrap();
    let e = engine(&bytes);
    let tok = e.tokenizer();
    let text = "and a fixed value, the dog";
    let ids = tok.encode_user(text, false).unwrap();
    let mut d = kerze::tokenizer::StreamDecoder::new();
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&d.step(tok, id).unwrap());
    }
    streamed.push_str(&d.flush(tok).unwrap());
    assert_eq!(streamed, tok.decode(&ids, false).unwrap());
    assert_eq!(streamed, text);
}
