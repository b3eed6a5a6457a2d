//! The `bedrock` kind: Bedrock's Converse API (`POST {url or
//! https://bedrock-runtime.{region}.amazonaws.com}/model/{id}/converse`, `converse-stream`),
//! signed with SigV4 (service `bedrock`) or a Bedrock API key as bearer. An OpenAI chat request
//! is mapped to Converse (system, messages, sampling, stop, tools ↔ toolConfig) and its answer
//! back (text, tool calls, stop reason, usage); a streamed answer's events become OpenAI
//! chunks.

use super::aws;
use super::eventstream::Messages;
use super::http::{self, Chunks, Reply};
use super::link::{Upstream, UpstreamError};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

fn bad(name: &str, what: String) -> UpstreamError {
    UpstreamError::new(400, "status", format!("upstream {name} (bedrock): {what}"))
}

/// A message's content as text: a string, or the text parts of a list.
fn text_of(name: &str, c: &Value) -> Result<String, UpstreamError> {
    match c {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p["type"].as_str() {
                    Some("text") => out.push_str(p["text"].as_str().unwrap_or("")),
                    t => {
                        return Err(bad(
                            name,
                            format!("content parts of type {t:?} are not mapped to Converse"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad(name, "a message's content is not text".into())),
    }
}

/// An OpenAI chat request as a Converse request.
pub(super) fn to_converse(name: &str, body: &Value) -> Result<Value, UpstreamError> {
    let msgs = body["messages"]
        .as_array()
        .ok_or_else(|| bad(name, "`messages` is not a list".into()))?;
    let mut system = Vec::new();
    let mut out: Vec<(String, Vec<Value>)> = Vec::new();
    let mut push = |role: &str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        // Converse wants the roles to alternate: a turn's blocks go together.
        match out.last_mut() {
            Some((r, b)) if r == role => b.extend(blocks),
            _ => out.push((role.to_string(), blocks)),
        }
    };
    for m in msgs {
        let text = text_of(name, &m["content"])?;
        match m["role"].as_str().unwrap_or("") {
            "system" | "developer" => system.push(json!({ "text": text })),
            "user" => push("user", vec![json!({ "text": text })]),
            "assistant" => {
                let mut blocks = Vec::new();
                if !text.is_empty() {
                    blocks.push(json!({ "text": text }));
                }
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    let args = c["function"]["arguments"].as_str().unwrap_or("{}");
                    let input: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
                    blocks.push(json!({ "toolUse": {
                        "toolUseId": c["id"], "name": c["function"]["name"], "input": input } }));
                }
                push("assistant", blocks);
            }
            "tool" => push(
                "user",
                vec![json!({ "toolResult": {
                    "toolUseId": m["tool_call_id"], "content": [{ "text": text }] } })],
            ),
            r => {
                return Err(bad(
                    name,
                    format!("the role {r:?} is not mapped to Converse"),
                ))
            }
        }
    }
    if body
        .get("response_format")
        .is_some_and(|f| f["type"].as_str().is_some_and(|t| t != "text"))
    {
        return Err(bad(
            name,
            "response_format is not mapped to Converse".into(),
        ));
    }
    let mut req = Map::new();
    req.insert(
        "messages".into(),
        out.into_iter()
            .map(|(role, content)| json!({ "role": role, "content": content }))
            .collect(),
    );
    if !system.is_empty() {
        req.insert("system".into(), system.into());
    }
    let mut inference = Map::new();
    if let Some(n) = body
        .get("max_completion_tokens")
        .or(body.get("max_tokens"))
        .and_then(Value::as_u64)
    {
        inference.insert("maxTokens".into(), n.into());
    }
    for (from, to) in [("temperature", "temperature"), ("top_p", "topP")] {
        if let Some(x) = body.get(from).and_then(Value::as_f64) {
            inference.insert(to.into(), x.into());
        }
    }
    match body.get("stop") {
        Some(Value::String(s)) => {
            inference.insert("stopSequences".into(), json!([s]));
        }
        Some(Value::Array(a)) => {
            inference.insert("stopSequences".into(), a.clone().into());
        }
        _ => {}
    }
    if !inference.is_empty() {
        req.insert("inferenceConfig".into(), inference.into());
    }
    let tools = body["tools"].as_array().filter(|t| !t.is_empty());
    let choice = &body["tool_choice"];
    if let (Some(tools), false) = (tools, choice.as_str() == Some("none")) {
        let specs: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                let mut spec = json!({
                    "name": f["name"],
                    "inputSchema": { "json": if f["parameters"].is_object() {
                        f["parameters"].clone()
                    } else {
                        json!({ "type": "object", "properties": {} })
                    } },
                });
                if let Some(d) = f["description"].as_str() {
                    spec["description"] = d.into();
                }
                json!({ "toolSpec": spec })
            })
            .collect();
        let mut config = json!({ "tools": specs });
        match choice {
            Value::String(s) if s == "required" => config["toolChoice"] = json!({ "any": {} }),
            Value::String(s) if s == "auto" => config["toolChoice"] = json!({ "auto": {} }),
            Value::Object(_) => {
                config["toolChoice"] = json!({ "tool": { "name": choice["function"]["name"] } })
            }
            _ => {}
        }
        req.insert("toolConfig".into(), config);
    }
    Ok(Value::Object(req))
}

fn finish_reason(stop: &str) -> &'static str {
    match stop {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "content_filtered" | "guardrail_intervened" => "content_filter",
        _ => "stop",
    }
}

fn usage(u: &Value) -> Value {
    let (i, o) = (
        u["inputTokens"].as_u64().unwrap_or(0),
        u["outputTokens"].as_u64().unwrap_or(0),
    );
    json!({
        "prompt_tokens": i,
        "completion_tokens": o,
        "total_tokens": u["totalTokens"].as_u64().unwrap_or(i + o),
    })
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn answer_id() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("chatcmpl-bedrock-{n:x}")
}

/// A Converse answer as an OpenAI chat completion.
pub(super) fn from_converse(v: &Value, model: &str) -> Option<Value> {
    let content = v["output"]["message"]["content"].as_array()?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for b in content {
        if let Some(t) = b["text"].as_str() {
            text.push_str(t);
        }
        if let Some(u) = b.get("toolUse") {
            calls.push(json!({
                "id": u["toolUseId"],
                "type": "function",
                "function": { "name": u["name"], "arguments": u["input"].to_string() },
            }));
        }
    }
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { text.into() },
    });
    if !calls.is_empty() {
        message["tool_calls"] = calls.into();
    }
    Some(json!({
        "id": answer_id(),
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": finish_reason(v["stopReason"].as_str().unwrap_or("")),
        }],
        "usage": usage(&v["usage"]),
    }))
}

/// Converse's stream events as OpenAI chunks.
struct Stream {
    id: String,
    model: String,
    created: u64,
    /// A content block's index → its tool call's index.
    tools: HashMap<u64, usize>,
    stopped: bool,
}

impl Stream {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    }

    /// The chunk (if any) of one event.
    fn event(&mut self, event: &str, p: &Value) -> Option<Value> {
        let block = p["contentBlockIndex"].as_u64().unwrap_or(0);
        match event {
            "messageStart" => Some(self.chunk(json!({ "role": "assistant", "content": "" }), None)),
            "contentBlockStart" => {
                let u = p["start"].get("toolUse")?;
                let i = self.tools.len();
                self.tools.insert(block, i);
                Some(self.chunk(
                    json!({ "tool_calls": [{ "index": i, "id": u["toolUseId"], "type": "function",
                        "function": { "name": u["name"], "arguments": "" } }] }),
                    None,
                ))
            }
            "contentBlockDelta" => {
                let d = &p["delta"];
                if let Some(t) = d["text"].as_str() {
                    return Some(self.chunk(json!({ "content": t }), None));
                }
                let args = d["toolUse"]["input"].as_str()?;
                let i = *self.tools.get(&block)?;
                Some(self.chunk(
                    json!({ "tool_calls": [{ "index": i, "function": { "arguments": args } }] }),
                    None,
                ))
            }
            "messageStop" => {
                self.stopped = true;
                let r = finish_reason(p["stopReason"].as_str().unwrap_or(""));
                Some(self.chunk(json!({}), Some(r)))
            }
            "metadata" => Some(json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(&p["usage"]),
            })),
            _ => None,
        }
    }
}

pub(super) async fn send(
    up: &Arc<Upstream>,
    body: &Value,
    stream: bool,
) -> Result<Reply, UpstreamError> {
    let name = up.name();
    let model = body["model"]
        .as_str()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            bad(
                name,
                "no model id to send (give the upstream `model`)".into(),
            )
        })?
        .to_string();
    let converse = to_converse(name, body)?;
    let base = match &up.cfg.url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!(
            "https://bedrock-runtime.{}.amazonaws.com",
            aws::region(up.cfg.region.as_deref()).unwrap_or_default()
        ),
    };
    let path = if stream {
        "converse-stream"
    } else {
        "converse"
    };
    let url = format!("{base}/model/{}/{path}", aws::path_segment(&model));
    let resp = http::post(up, &url, &converse).await?;
    if !stream {
        let v = http::json(up, resp).await?;
        let answer =
            from_converse(&v, &model).ok_or_else(|| http::bad_response(up, &v.to_string()))?;
        return http::completion(up, answer).map(Reply::Whole);
    }
    struct S {
        messages: Messages,
        map: Stream,
        name: String,
        done: bool,
    }
    let s = S {
        messages: Messages::new(http::bytes(up, resp), name),
        map: Stream {
            id: answer_id(),
            model,
            created: now(),
            tools: HashMap::new(),
            stopped: false,
        },
        name: name.to_string(),
        done: false,
    };
    let chunks = futures_util::stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            let e = match s.messages.next().await {
                Some(Ok(m)) if m.kind == "event" => {
                    let p: Value = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
                    match s.map.event(&m.event, &p) {
                        Some(c) => return Some((Ok(c), s)),
                        None => continue,
                    }
                }
                Some(Ok(m)) => m.error(&s.name),
                Some(Err(e)) => e,
                None if s.map.stopped => return None,
                None => {
                    http::stream_error(&s.name, "its event stream ended before messageStop".into())
                }
            };
            s.done = true;
            return Some((Err(e), s));
        }
    });
    Ok(Reply::Stream(Chunks::new(up, chunks.boxed())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_to_converse_and_back() {
        let body = json!({
            "model": "m", "max_tokens": 50, "temperature": 0.5, "stop": "END",
            "messages": [
                { "role": "system", "content": "Be brief." },
                { "role": "user", "content": [{ "type": "text", "text": "Weather?" }] },
                { "role": "assistant", "content": null, "tool_calls": [{ "id": "t1", "type": "function",
                    "function": { "name": "w", "arguments": "{\"city\":\"Bonn\"}" } }] },
                { "role": "tool", "tool_call_id": "t1", "content": "sunny" },
                { "role": "user", "content": "Thanks" },
            ],
            "tools": [{ "type": "function", "function": { "name": "w", "parameters": { "type": "object" } } }],
            "tool_choice": "required",
        });
        let c = to_converse("u", &body).unwrap();
        assert_eq!(c["system"], json!([{ "text": "Be brief." }]));
        let msgs = c["messages"].as_array().unwrap();
        assert_eq!(
            msgs.len(),
            3,
            "the tool result and the next user turn are one turn: {msgs:?}"
        );
        assert_eq!(
            msgs[1]["content"][0]["toolUse"]["input"],
            json!({ "city": "Bonn" })
        );
        assert_eq!(msgs[2]["content"][0]["toolResult"]["toolUseId"], "t1");
        assert_eq!(msgs[2]["content"][1]["text"], "Thanks");
        assert_eq!(
            c["inferenceConfig"],
            json!({ "maxTokens": 50, "temperature": 0.5, "stopSequences": ["END"] })
        );
        assert_eq!(c["toolConfig"]["toolChoice"], json!({ "any": {} }));
        let answer = json!({
            "output": { "message": { "role": "assistant", "content": [
                { "text": "Let me look." },
                { "toolUse": { "toolUseId": "t2", "name": "w", "input": { "city": "Ulm" } } }] } },
            "stopReason": "tool_use",
            "usage": { "inputTokens": 10, "outputTokens": 4, "totalTokens": 14 },
        });
        let o = from_converse(&answer, "m").unwrap();
        assert_eq!(o["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(
            o["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Ulm\"}"
        );
        assert_eq!(o["usage"]["completion_tokens"], 4);
        let mut st = Stream {
            id: "c".into(),
            model: "m".into(),
            created: 0,
            tools: HashMap::new(),
            stopped: false,
        };
        let start = json!({ "contentBlockIndex": 1, "start": { "toolUse": { "toolUseId": "t3", "name": "w" } } });
        let c = st.event("contentBlockStart", &start).unwrap();
        assert_eq!(c["choices"][0]["delta"]["tool_calls"][0]["id"], "t3");
        let d = json!({ "contentBlockIndex": 1, "delta": { "toolUse": { "input": "{\"ci" } } });
        let c = st.event("contentBlockDelta", &d).unwrap();
        assert_eq!(
            c["choices"][0]["delta"]["tool_calls"][0],
            json!({ "index": 0, "function": { "arguments": "{\"ci" } })
        );
        let c = st
            .event("messageStop", &json!({ "stopReason": "tool_use" }))
            .unwrap();
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        assert!(st.stopped && st.event("contentBlockStop", &json!({})).is_none());
        let images =
            json!({ "messages": [{ "role": "user", "content": [{ "type": "image_url" }] }] });
        assert_eq!(to_converse("u", &images).unwrap_err().status, 400);
    }
}
