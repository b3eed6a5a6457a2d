//! The OpenAI shapes of src/openai.rs against the cases in tests/fixtures/openai/, which the
//! JS package's pkg/openai.js is checked against too (tests/openai.mjs): one request mapping
//! and one response shape for the browser and `kerze serve`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kerze::generate::{FinishReason, Usage};
use kerze::openai::{self, Meta, Prompt};
use serde_json::{json, Value};

fn fixture(name: &str) -> Vec<Value> {
    let p = format!(
        "{}/tests/fixtures/openai/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Numbers as f64 (JSON has one number type: 0 and 0.0 are the same value).
fn norm(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(a) => Value::Array(a.iter().map(norm).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), norm(v))).collect()),
        v => v.clone(),
    }
}

#[test]
fn requests_map_as_the_fixtures_say() {
    let cases = fixture("requests.json");
    assert!(cases.len() >= 30);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let body = &c["body"];
        let got = match c["endpoint"].as_str().unwrap() {
            "chat" => openai::parse_chat(body).map(|r| {
                let mut chat = match r.chat.enable_thinking {
                    Some(b) => json!({ "enableThinking": b }),
                    None => json!({}),
                };
                if let Some(t) = &r.chat.tools {
                    chat["tools"] = json!(t);
                }
                json!({
                    "options": r.generate,
                    "chat": chat,
                    "stream": r.stream,
                    "includeUsage": r.include_usage,
                })
            }),
            "completions" => openai::parse_completion(body).map(|r| {
                json!({
                    "prompt": match r.prompt {
                        Prompt::Text(t) => json!(t),
                        Prompt::Ids(ids) => json!(ids),
                    },
                    "options": r.generate,
                    "stream": r.stream,
                    "includeUsage": r.include_usage,
                })
            }),
            "embeddings" => openai::parse_embeddings(body).map(|r| {
                let mut v = json!({
                    "input": r.input,
                    "encodingFormat": match r.encoding_format {
                        openai::EncodingFormat::Float => "float",
                        openai::EncodingFormat::Base64 => "base64",
                    },
                });
                if let Some(d) = r.dimensions {
                    v["dimensions"] = json!(d);
                }
                if let Some(m) = r.model {
                    v["model"] = json!(m);
                }
                v
            }),
            e => panic!("{name}: endpoint {e}"),
        };
        match (c.get("error").and_then(Value::as_str), got) {
            (Some(want), Err(e)) => {
                assert_eq!(e.kind(), "InvalidArgumentError", "{name}");
                assert!(
                    e.to_string().contains(want),
                    "{name}: {e} does not say {want:?}"
                );
            }
            (Some(want), Ok(v)) => panic!("{name}: expected an error {want:?}, got {v}"),
            (None, Ok(v)) => assert_eq!(norm(&v), norm(&c["expect"]), "{name}"),
            (None, Err(e)) => panic!("{name}: {e}"),
        }
        // What parses, maps onto the library's options without a second check failing.
        if c.get("error").is_none() && c["endpoint"] != "embeddings" {
            let r = if c["endpoint"] == "chat" {
                openai::parse_chat(body).unwrap().generate
            } else {
                openai::parse_completion(body).unwrap().generate
            };
            r.options().unwrap();
        }
    }
}

fn usage(u: &Value) -> Usage {
    Usage {
        prompt_tokens: u["promptTokens"].as_u64().unwrap() as usize,
        prefill_tokens: u["prefillTokens"].as_u64().unwrap() as usize,
        completion_tokens: u["completionTokens"].as_u64().unwrap() as usize,
        choices: serde_json::from_value(u["choices"].clone()).ok(),
        ..Usage::default()
    }
}

fn finish(s: &str) -> FinishReason {
    match s {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "context_full" => FinishReason::ContextFull,
        s => panic!("finish {s}"),
    }
}

#[test]
fn responses_and_stream_chunks_are_the_fixtures() {
    let cases = fixture("responses.json");
    assert!(cases.len() >= 5);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let m = &c["meta"];
        let meta = Meta {
            id: m["id"].as_str().unwrap().into(),
            created: m["created"].as_u64().unwrap(),
            model: m["model"].as_str().unwrap().into(),
        };
        let pieces: Vec<&str> = c["pieces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        let (f, u) = (
            finish(c["finishReason"].as_str().unwrap()),
            usage(&c["usage"]),
        );
        let tools = c["toolCalls"].as_bool().unwrap_or(false);
        let whole = openai::chat_completion(&meta, &pieces.concat(), f, &u, tools);
        assert_eq!(
            serde_json::to_value(&whole).unwrap(),
            c["completion"],
            "{name}"
        );
        let mut s = openai::ChatStream::new(meta, c["includeUsage"].as_bool().unwrap())
            .with_tool_calls(tools);
        let mut chunks = vec![s.start()];
        for p in &pieces {
            chunks.extend(s.push(p));
        }
        chunks.extend(s.finish(f, &u));
        assert_eq!(
            serde_json::to_value(&chunks).unwrap(),
            c["chunks"],
            "{name}"
        );
    }
}

#[test]
fn the_splitter_agrees_with_the_whole_text_split_on_every_cut() {
    // Every way of cutting a reply in two gives what the whole reply gives.
    for text in [
        "<think>\nabc\n</think>\n\nanswer",
        "  <think>x</think>y",
        "no thinking <think> here",
        "<think>unfinished\n",
        "<think>\n\n</think>",
        "<thi",
    ] {
        let whole = {
            let mut s = openai::ThinkSplitter::default();
            let (mut r, mut c) = s.push(text);
            let (r2, c2) = s.end();
            r.push_str(&r2);
            c.push_str(&c2);
            (r, c)
        };
        for cut in 0..=text.len() {
            let mut s = openai::ThinkSplitter::default();
            let (mut r, mut c) = s.push(&text[..cut]);
            for (a, b) in [s.push(&text[cut..]), s.end()] {
                r.push_str(&a);
                c.push_str(&b);
            }
            assert_eq!((r, c), whole, "{text:?} cut at {cut}");
        }
    }
}

#[test]
fn error_bodies_have_the_openai_shape() {
    let e = openai::ErrorBody::new(503, "Loading model");
    assert_eq!(
        serde_json::to_value(&e).unwrap(),
        json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error", "param": null}})
    );
    assert_eq!(
        openai::ErrorBody::new(429, "busy").error.kind,
        "rate_limit_error"
    );
    assert_eq!(
        openai::ErrorBody::new(401, "key").error.kind,
        "authentication_error"
    );
}

#[test]
fn embeddings_responses_are_the_fixtures() {
    let cases = fixture("embeddings.json");
    assert_eq!(openai::base64(b"kerze!!"), "a2VyemUhIQ==");
    for c in cases {
        let vectors: Vec<Vec<f32>> = serde_json::from_value(c["vectors"].clone()).unwrap();
        let format = match c["encodingFormat"].as_str().unwrap() {
            "float" => openai::EncodingFormat::Float,
            _ => openai::EncodingFormat::Base64,
        };
        let r = openai::embeddings_response(
            c["model"].as_str().unwrap(),
            &vectors,
            c["promptTokens"].as_u64().unwrap() as usize,
            format,
        );
        assert_eq!(
            norm(&serde_json::to_value(&r).unwrap()),
            norm(&c["response"]),
            "{}",
            c["name"]
        );
    }
}
