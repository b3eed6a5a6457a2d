//! The OpenAI shapes of chat and text completions: a request body → kerze's options, and a
//! generation → the response object or the stream's chunks. `kerze serve` speaks through this
//! module; the JS package's `pkg/openai.js` keeps the same shapes, and both are checked
//! against the same cases (`tests/fixtures/openai/`).
//!
//! Requests are checked field by field, so a wrong type or an unknown field is an
//! [`Error::InvalidArgument`] that names the field (the server answers 400 with it).

use crate::chat::tools::{CallSplitter, Part, ToolChoice, Tools};
use crate::chat::{ChatOptions, Message};
use crate::constrain::Constraint;
use crate::error::{Error, Result};
use crate::generate::{FinishReason, GenerateOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Sampling and stopping as a request gives them (`None`: the library's default). Its JSON
/// (camelCase, absent fields left out) is what the JS package passes to the engine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerateRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// `response_format` (see [`response_format`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
}

impl GenerateRequest {
    /// The library's options with these fields set, checked (ranges as the sampler wants them).
    pub fn options(&self) -> Result<GenerateOptions> {
        let mut o = GenerateOptions::default();
        if let Some(n) = self.max_tokens {
            o.max_tokens = usize::try_from(n).unwrap_or(usize::MAX);
        }
        let s = &mut o.sampler;
        let set = |dst: &mut f32, v: Option<f64>| {
            if let Some(v) = v {
                *dst = v as f32;
            }
        };
        set(&mut s.temperature, self.temperature);
        set(&mut s.top_p, self.top_p);
        set(&mut s.min_p, self.min_p);
        set(&mut s.presence_penalty, self.presence_penalty);
        set(&mut s.frequency_penalty, self.frequency_penalty);
        set(&mut s.repetition_penalty, self.repetition_penalty);
        if let Some(k) = self.top_k {
            s.top_k = usize::try_from(k).unwrap_or(usize::MAX);
        }
        if let Some(seed) = self.seed {
            s.seed = seed;
        }
        if let Some(stop) = &self.stop {
            o.stop = stop.clone();
        }
        o.constraint = self.constraint.clone();
        o.sampler.validate()?;
        Ok(o)
    }
}

/// `POST /v1/chat/completions`, parsed.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Message>,
    /// `enable_thinking` (top level or in `chat_template_kwargs`, as llama-server takes it).
    pub chat: ChatOptions,
    pub generate: GenerateRequest,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage` and no choices.
    pub include_usage: bool,
    /// The reply may hold tool calls (tools given, `tool_choice` not `none`): it is split into
    /// content and `tool_calls`.
    pub tool_calls: bool,
}

/// `POST /v1/completions`, parsed.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub generate: GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
}

/// A completion's prompt: text (tokenized as `kerze generate` does) or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// Fields both endpoints take (sampling, stopping, streaming and the ones that must keep
/// their OpenAI default).
const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "user",
    // kerze: `false` keeps a deterministic request out of `serve`'s response cache.
    "cache",
    "response_format",
];
const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "enable_thinking",
    "chat_template_kwargs",
    "continue_final_message",
    "logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];
const COMPLETION: &[&str] = &["prompt", "echo", "logprobs", "suffix", "best_of"];
const EMBEDDINGS: &[&str] = &["input", "model", "encoding_format", "dimensions", "user"];

/// The most texts one embeddings request may give (OpenAI's limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// The roles a message may have (OpenAI's; the model's template decides what each becomes).
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// The most stop strings a request may give, and their longest length in bytes.
const MAX_STOP: usize = 16;
const MAX_STOP_BYTES: usize = 1024;

/// A request body's fields, read with typed errors that name the field. `null` is absent.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    what: &'static str,
}

impl<'a> Fields<'a> {
    fn new(body: &'a Value, what: &'static str, known: &[&[&str]]) -> Result<Self> {
        let map = body
            .as_object()
            .ok_or_else(|| bad(format!("{what}: the body must be a JSON object")))?;
        if let Some(k) = map
            .keys()
            .find(|k| !known.iter().any(|list| list.contains(&k.as_str())))
        {
            return Err(bad(format!("{what}: '{k}' is not supported")));
        }
        Ok(Self { map, what })
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }

    fn number(&self, k: &str) -> Result<Option<f64>> {
        self.get(k)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| bad(format!("{}: {k} must be a number", self.what)))
            })
            .transpose()
    }

    fn count(&self, k: &str) -> Result<Option<u64>> {
        self.get(k)
            .map(|v| {
                // 2.0 is 2, as in JS (and Python's json writes ints as ints anyway).
                v.as_u64()
                    .or_else(|| {
                        v.as_f64()
                            .filter(|f| {
                                f.fract() == 0.0 && (0.0..9.007_199_254_740_992e15).contains(f)
                            })
                            .map(|f| f as u64)
                    })
                    .ok_or_else(|| {
                        bad(format!("{}: {k} must be a non-negative integer", self.what))
                    })
            })
            .transpose()
    }

    fn flag(&self, k: &str) -> Result<Option<bool>> {
        self.get(k)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| bad(format!("{}: {k} must be true or false", self.what)))
            })
            .transpose()
    }

    fn string(&self, k: &str) -> Result<Option<&'a str>> {
        self.get(k)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| bad(format!("{}: {k} must be a string", self.what)))
            })
            .transpose()
    }

    /// `stop`: a string or a list of (non-empty) strings.
    fn stop(&self) -> Result<Option<Vec<String>>> {
        let Some(v) = self.get("stop") else {
            return Ok(None);
        };
        let list: Vec<String> = match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    bad(format!(
                        "{}: stop must be a string or a list of strings",
                        self.what
                    ))
                })?,
            _ => {
                return Err(bad(format!(
                    "{}: stop must be a string or a list of strings",
                    self.what
                )))
            }
        };
        if list.len() > MAX_STOP {
            return Err(bad(format!(
                "{}: stop takes at most {MAX_STOP} strings",
                self.what
            )));
        }
        if list
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(bad(format!(
                "{}: a stop string must have 1 to {MAX_STOP_BYTES} bytes",
                self.what
            )));
        }
        Ok(Some(list))
    }

    /// The fields both endpoints share.
    fn common(&self, max_tokens: Option<u64>) -> Result<(GenerateRequest, bool, bool)> {
        if let Some(n) = self.count("n")? {
            if n != 1 {
                return Err(bad(format!("{}: only n = 1 is supported", self.what)));
            }
        }
        self.string("user")?;
        let stream = self.flag("stream")?.unwrap_or(false);
        self.flag("cache")?; // a boolean; serve's response cache reads it
        let include_usage = match self.get("stream_options") {
            None => false,
            Some(Value::Object(o)) => {
                if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                    return Err(bad(format!(
                        "{}: stream_options.{k} is not supported",
                        self.what
                    )));
                }
                match o.get("include_usage") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        return Err(bad(format!(
                            "{}: stream_options.include_usage must be true or false",
                            self.what
                        )))
                    }
                }
            }
            Some(_) => {
                return Err(bad(format!(
                    "{}: stream_options must be an object",
                    self.what
                )))
            }
        };
        let generate = GenerateRequest {
            max_tokens: max_tokens.or(self.count("max_tokens")?),
            temperature: self.number("temperature")?,
            top_p: self.number("top_p")?,
            top_k: self.count("top_k")?,
            min_p: self.number("min_p")?,
            seed: self.count("seed")?,
            presence_penalty: self.number("presence_penalty")?,
            frequency_penalty: self.number("frequency_penalty")?,
            repetition_penalty: self.number("repetition_penalty")?,
            stop: self.stop()?,
            constraint: response_format(self.what, self.get("response_format"))?,
        };
        // The ranges (temperature ≥ 0, top_p in (0, 1], …) as the sampler checks them.
        generate
            .options()
            .map_err(|e| bad(format!("{}: {}", self.what, message(&e))))?;
        Ok((generate, stream, include_usage))
    }

    /// A field that is accepted only at its OpenAI default.
    fn only_default(&self, k: &str, ok: impl Fn(&Value) -> bool, default: &str) -> Result<()> {
        match self.get(k) {
            Some(v) if !ok(v) => Err(bad(format!(
                "{}: {k} is not supported (only {default})",
                self.what
            ))),
            _ => Ok(()),
        }
    }
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// `response_format` as a constraint: OpenAI's `{ type: 'text' }` (none), `{ type:
/// 'json_object' }` and `{ type: 'json_schema', json_schema: { name, schema, strict } }`;
/// WebLLM's `{ type: 'json_object', schema }` (the schema as an object or a JSON string) and
/// `{ type: 'grammar', grammar }` (here a Lark grammar); kerze's `{ type: 'regex', regex }`
/// and `{ type: 'choices', choices }`. The JS package reads it the same way (pkg/openai.js).
pub fn response_format(what: &str, v: Option<&Value>) -> Result<Option<Constraint>> {
    let Some(v) = v else { return Ok(None) };
    let f = format!("{what}: response_format");
    let o = v
        .as_object()
        .ok_or_else(|| bad(format!("{f} must be an object")))?;
    let ty = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{f}.type must be a string")))?;
    let allow = |keys: &[&str]| match o
        .keys()
        .find(|k| *k != "type" && !keys.contains(&k.as_str()))
    {
        Some(k) => Err(bad(format!("{f}.{k} is not supported with type '{ty}'"))),
        None => Ok(()),
    };
    let schema = |v: &Value, at: &str| -> Result<Value> {
        let s = match v {
            Value::String(text) => {
                serde_json::from_str(text).map_err(|e| bad(format!("{f}.{at} is not JSON: {e}")))?
            }
            other => other.clone(),
        };
        if !s.is_object() {
            return Err(bad(format!("{f}.{at} must be a JSON schema (an object)")));
        }
        Ok(s)
    };
    let text = |k: &str| -> Result<String> {
        o.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| bad(format!("{f}.{k} must be a string")))
    };
    Ok(match ty {
        "text" => {
            allow(&[])?;
            None
        }
        "json_object" => {
            allow(&["schema"])?;
            match o.get("schema").filter(|v| !v.is_null()) {
                Some(v) => Some(Constraint::JsonSchema(schema(v, "schema")?)),
                None => Some(Constraint::JsonObject),
            }
        }
        "json_schema" => {
            allow(&["json_schema"])?;
            let js = o
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad(format!("{f}.json_schema must be an object")))?;
            if let Some(k) = js
                .keys()
                .find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
            {
                return Err(bad(format!("{f}.json_schema.{k} is not supported")));
            }
            let s = js
                .get("schema")
                .ok_or_else(|| bad(format!("{f}.json_schema.schema is missing")))?;
            Some(Constraint::JsonSchema(schema(s, "json_schema.schema")?))
        }
        "grammar" => {
            allow(&["grammar"])?;
            Some(Constraint::Grammar(text("grammar")?))
        }
        "regex" => {
            allow(&["regex"])?;
            Some(Constraint::Regex(text("regex")?))
        }
        "choices" => {
            allow(&["choices"])?;
            let c = o
                .get("choices")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad(format!("{f}.choices must be an array of strings")))?;
            Some(Constraint::Choices(c))
        }
        other => {
            return Err(bad(format!(
                "{f}.type '{other}' is not supported: text, json_object, json_schema, grammar, regex or choices"
            )))
        }
    })
}

/// An error's message without its kind.
fn message(e: &Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.clone(),
        e => e.to_string(),
    }
}

/// Parse a chat completions body.
pub fn parse_chat(body: &Value) -> Result<ChatRequest> {
    const WHAT: &str = "chat.completions.create";
    let f = Fields::new(body, WHAT, &[COMMON, CHAT])?;
    let messages = match f.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let m = Message::deserialize(m)
                    .map_err(|e| bad(format!("{WHAT}: messages[{i}]: {e}")))?;
                if !ROLES.contains(&m.role.as_str()) {
                    return Err(bad(format!(
                        "{WHAT}: messages[{i}].role '{}' is not one of {}",
                        m.role,
                        ROLES.join(", ")
                    )));
                }
                Ok(m)
            })
            .collect::<Result<Vec<_>>>()?,
        _ => return Err(bad(format!("{WHAT} needs a non-empty messages array"))),
    };
    f.only_default("logprobs", |v| v == &Value::Bool(false), "false")?;
    let (generate, stream, include_usage) = f.common(f.count("max_completion_tokens")?)?;
    let mut chat = ChatOptions::default();
    let kw = match f.get("chat_template_kwargs") {
        None => None,
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "enable_thinking") {
                return Err(bad(format!(
                    "chat_template_kwargs.{k} is not supported (enable_thinking is)"
                )));
            }
            o.get("enable_thinking").filter(|v| !v.is_null())
        }
        Some(_) => return Err(bad("chat_template_kwargs must be an object".into())),
    };
    if let Some(v) = f.get("enable_thinking").or(kw) {
        chat.enable_thinking = Some(
            v.as_bool()
                .ok_or_else(|| bad("enable_thinking must be true or false".into()))?,
        );
    }
    if let Some(v) = f.get("continue_final_message").filter(|v| !v.is_null()) {
        chat.continue_final_message = v
            .as_bool()
            .ok_or_else(|| bad("continue_final_message must be true or false".into()))?;
    }
    let mut generate = generate;
    let tools = tools(WHAT, &f)?;
    let tool_calls = tools.as_ref().is_some_and(|t| t.choice != ToolChoice::None);
    if let Some(t) = tools {
        chat.tools = Some(t.tools.clone());
        if tool_calls {
            if generate.constraint.is_some() {
                return Err(bad(format!(
                    "{WHAT}: response_format and tool calls cannot be combined (give tool_choice 'none', or leave out response_format)"
                )));
            }
            generate.constraint = Some(Constraint::Tools(t));
        }
    }
    Ok(ChatRequest {
        model: f.string("model")?.map(str::to_string),
        messages,
        chat,
        generate,
        stream,
        include_usage,
        tool_calls,
    })
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request (None without tools).
fn tools(what: &str, f: &Fields) -> Result<Option<Tools>> {
    let list = match f.get("tools") {
        None => None,
        Some(Value::Array(a)) => Some(a.clone()),
        Some(_) => return Err(bad(format!("{what}: tools must be an array"))),
    };
    let choice = match f.get("tool_choice") {
        None => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "{what}: tool_choice '{other}' is not one of none, auto, required"
                )))
            }
        }),
        Some(Value::Object(o)) => {
            let name = (o.get("type").and_then(Value::as_str) == Some("function"))
                .then(|| o.get("function")?.get("name")?.as_str())
                .flatten()
                .ok_or_else(|| {
                    bad(format!(
                        "{what}: tool_choice must be none, auto, required or {{type: 'function', function: {{name}}}}"
                    ))
                })?;
            Some(ToolChoice::Function(name.to_string()))
        }
        Some(_) => {
            return Err(bad(format!(
                "{what}: tool_choice must be a string or an object"
            )))
        }
    };
    let parallel = f.flag("parallel_tool_calls")?.unwrap_or(true);
    let Some(list) = list else {
        if choice.is_some() {
            return Err(bad(format!("{what}: tool_choice needs tools")));
        }
        return Ok(None);
    };
    let functions = crate::chat::tools::functions(&list)
        .map_err(|e| bad(format!("{what}: {}", message(&e))))?;
    if let Some(ToolChoice::Function(n)) = &choice {
        if !functions.iter().any(|g| &g.name == n) {
            return Err(bad(format!(
                "{what}: tool_choice names '{n}', which is not one of the tools"
            )));
        }
    }
    Ok(Some(Tools {
        tools: list,
        choice: choice.unwrap_or_default(),
        parallel,
    }))
}

/// Parse a (text) completions body.
pub fn parse_completion(body: &Value) -> Result<CompletionRequest> {
    const WHAT: &str = "completions.create";
    let f = Fields::new(body, WHAT, &[COMMON, COMPLETION])?;
    let one_prompt = || {
        bad(format!(
            "{WHAT}: prompt must be a string, a list of one string, or a list of token ids"
        ))
    };
    let prompt = match f.get("prompt") {
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(_), ..] | [Value::String(_), ..] => {
                return Err(bad(format!("{WHAT}: one prompt per request is supported")))
            }
            ids => Prompt::Ids(
                ids.iter()
                    .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(one_prompt)?,
            ),
        },
        None => return Err(bad(format!("{WHAT} needs a prompt"))),
        Some(_) => return Err(one_prompt()),
    };
    if matches!(&prompt, Prompt::Ids(ids) if ids.is_empty()) {
        return Err(bad(format!("{WHAT}: the prompt has no tokens")));
    }
    f.only_default("echo", |v| v == &Value::Bool(false), "false")?;
    f.only_default("logprobs", |v| v == &Value::from(0), "null or 0")?;
    f.only_default("suffix", |v| v == &Value::from(""), "null")?;
    f.only_default("best_of", |v| v == &Value::from(1), "1")?;
    let (generate, stream, include_usage) = f.common(None)?;
    Ok(CompletionRequest {
        model: f.string("model")?.map(str::to_string),
        prompt,
        generate,
        stream,
        include_usage,
    })
}

/// How an embedding is written in the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodingFormat {
    /// A list of numbers.
    Float,
    /// The little-endian f32 bytes in base64 (what the official clients ask for by default).
    Base64,
}

/// `POST /v1/embeddings`, parsed.
#[derive(Clone, Debug)]
pub struct EmbeddingsRequest {
    pub model: Option<String>,
    pub input: Vec<String>,
    pub encoding_format: EncodingFormat,
    /// Only the model's own size is accepted (checked where the model is known).
    pub dimensions: Option<u64>,
}

/// Parse an embeddings body: `input` a string or a list of strings (an empty string embeds
/// as `[CLS] [SEP]`; token ids are refused).
pub fn parse_embeddings(body: &Value) -> Result<EmbeddingsRequest> {
    const WHAT: &str = "embeddings.create";
    let f = Fields::new(body, WHAT, &[EMBEDDINGS])?;
    let input = match f.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(format!("{WHAT}: input must be a string or a list of strings (token ids are not supported)")))?,
        Some(Value::Array(_)) => return Err(bad(format!("{WHAT}: input is an empty list"))),
        None => return Err(bad(format!("{WHAT} needs an input"))),
        Some(_) => return Err(bad(format!("{WHAT}: input must be a string or a list of strings (token ids are not supported)"))),
    };
    if input.len() > MAX_EMBEDDING_INPUTS {
        return Err(bad(format!(
            "{WHAT}: at most {MAX_EMBEDDING_INPUTS} inputs per request ({} given)",
            input.len()
        )));
    }
    let encoding_format = match f.string("encoding_format")? {
        None | Some("float") => EncodingFormat::Float,
        Some("base64") => EncodingFormat::Base64,
        Some(other) => {
            return Err(bad(format!(
                "{WHAT}: encoding_format '{other}' is not one of float, base64"
            )))
        }
    };
    f.string("user")?;
    Ok(EmbeddingsRequest {
        model: f.string("model")?.map(str::to_string),
        input,
        encoding_format,
        dimensions: f.count("dimensions")?,
    })
}

#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingsResponse {
    pub object: &'static str,
    pub data: Vec<EmbeddingObject>,
    pub model: String,
    pub usage: EmbeddingsUsage,
}

#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingObject {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingValue,
}

#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingsUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// The response of an embeddings request.
pub fn embeddings_response(
    model: &str,
    vectors: &[Vec<f32>],
    prompt_tokens: usize,
    format: EncodingFormat,
) -> EmbeddingsResponse {
    EmbeddingsResponse {
        object: "list",
        data: vectors
            .iter()
            .enumerate()
            .map(|(index, v)| EmbeddingObject {
                object: "embedding",
                index,
                embedding: match format {
                    EncodingFormat::Float => EmbeddingValue::Float(v.clone()),
                    EncodingFormat::Base64 => EmbeddingValue::Base64(base64(
                        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
                    )),
                },
            })
            .collect(),
        model: model.to_string(),
        usage: EmbeddingsUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    }
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(A[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `finish_reason` as OpenAI names it (a full context window ends with `length`).
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

/// `usage` of a response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose keys and values came from the KV cache (not computed again).
    pub cached_tokens: usize,
}

impl From<&crate::generate::Usage> for Usage {
    fn from(u: &crate::generate::Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.prompt_tokens.saturating_sub(u.prefill_tokens),
            },
        }
    }
}

/// What every response and chunk of one request carries.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub finish_reason: &'static str,
    pub logprobs: Option<()>,
    /// kerze: with a `choices` constraint, each choice's log-likelihood and probability.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice_scores: Option<Vec<crate::score::ChoiceScore>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null only when the reply is tool calls alone.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One call in a reply: `{id, type: 'function', function: {name, arguments}}`.
#[derive(Clone, Debug, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// The id of a reply's call `index`: `call_<the reply id's tail>_<index>`.
pub fn call_id(meta: &Meta, index: usize) -> String {
    let tail = meta.id.rsplit('-').next().unwrap_or(&meta.id);
    format!("call_{tail}_{index}")
}

/// `finish_reason` of a reply that made `calls` tool calls.
fn finish_of(finish: FinishReason, calls: usize) -> &'static str {
    match finish {
        FinishReason::Stop if calls > 0 => "tool_calls",
        f => finish_reason(f),
    }
}

/// The whole reply of a chat completion (`<think>…</think>` as `reasoning_content`; with
/// `tool_calls`, calls as `tool_calls`).
pub fn chat_completion(
    meta: &Meta,
    text: &str,
    finish: FinishReason,
    usage: &crate::generate::Usage,
    tool_calls: bool,
) -> ChatCompletion {
    let mut split = ThinkSplitter::default();
    let (mut reasoning, mut content) = split.push(text);
    let (r, c) = split.end();
    reasoning.push_str(&r);
    content.push_str(&c);
    let (content, calls) = if tool_calls {
        crate::chat::tools::split_calls(&content)
    } else {
        (Some(content), Vec::new())
    };
    let n = calls.len();
    let calls: Vec<ToolCall> = calls
        .into_iter()
        .enumerate()
        .map(|(i, c)| ToolCall {
            id: call_id(meta, i),
            kind: "function",
            function: FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    let content = match content {
        None if n == 0 => Some(String::new()),
        c => c,
    };
    ChatCompletion {
        id: meta.id.clone(),
        object: "chat.completion",
        created: meta.created,
        model: meta.model.clone(),
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content,
                reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                tool_calls: (n > 0).then_some(calls),
            },
            finish_reason: finish_of(finish, n),
            logprobs: None,
            choice_scores: usage.choices.clone(),
        }],
        usage: usage.into(),
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<()>,
    /// On the finish chunk: as [`ChatChoice::choice_scores`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice_scores: Option<Vec<crate::score::ChoiceScore>>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaCall>>,
}

/// A piece of a streamed call: the first of each has its id, type and name (arguments
/// empty), the later ones more of its arguments.
#[derive(Clone, Debug, Serialize)]
pub struct DeltaCall {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: DeltaFunction,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeltaFunction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// The chunks of a streamed chat completion: a first one with the role, one per piece of
/// reasoning, answer or call, one with `finish_reason`, and with `include_usage` a last one
/// with `usage` and no choices.
pub struct ChatStream {
    meta: Meta,
    include_usage: bool,
    split: ThinkSplitter,
    /// With tool calls: the answer split into content and calls.
    calls: Option<CallSplitter>,
}

impl ChatStream {
    pub fn new(meta: Meta, include_usage: bool) -> Self {
        Self {
            meta,
            include_usage,
            split: ThinkSplitter::default(),
            calls: None,
        }
    }

    /// The reply may hold tool calls: they stream as `tool_calls` deltas.
    pub fn with_tool_calls(mut self, on: bool) -> Self {
        self.calls = on.then(CallSplitter::default);
        self
    }

    fn frame(
        &self,
        delta: Option<Delta>,
        finish: Option<&'static str>,
        usage: Option<Usage>,
    ) -> ChatChunk {
        ChatChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices: delta
                .map(|delta| ChunkChoice {
                    index: 0,
                    delta,
                    finish_reason: finish,
                    logprobs: None,
                    choice_scores: None,
                })
                .into_iter()
                .collect(),
            usage,
        }
    }

    /// The first chunk: `{role: 'assistant', content: ''}`.
    pub fn start(&self) -> ChatChunk {
        self.frame(
            Some(Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Delta::default()
            }),
            None,
            None,
        )
    }

    fn deltas(&mut self, (reasoning, content): (String, String), end: bool) -> Vec<ChatChunk> {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            let d = Delta {
                reasoning_content: Some(reasoning),
                ..Delta::default()
            };
            out.push(self.frame(Some(d), None, None));
        }
        let parts = match self.calls.as_mut() {
            Some(s) => {
                let mut p = s.push(&content);
                if end {
                    p.extend(s.end());
                }
                p
            }
            None => vec![Part::Content(content)],
        };
        for p in parts {
            let d = match p {
                Part::Content(c) if c.is_empty() => continue,
                Part::Content(c) => Delta {
                    content: Some(c),
                    ..Delta::default()
                },
                Part::Start { index, name } => Delta {
                    tool_calls: Some(vec![DeltaCall {
                        index,
                        id: Some(call_id(&self.meta, index)),
                        kind: Some("function"),
                        function: DeltaFunction {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    }]),
                    ..Delta::default()
                },
                Part::Arguments { index, text } => Delta {
                    tool_calls: Some(vec![DeltaCall {
                        index,
                        id: None,
                        kind: None,
                        function: DeltaFunction {
                            name: None,
                            arguments: text,
                        },
                    }]),
                    ..Delta::default()
                },
            };
            out.push(self.frame(Some(d), None, None));
        }
        out
    }

    /// The chunks for the next piece of generated text (none while a tag is undecided).
    pub fn push(&mut self, text: &str) -> Vec<ChatChunk> {
        let parts = self.split.push(text);
        self.deltas(parts, false)
    }

    /// The last chunks: what the splitter held back, the finish reason, the usage.
    pub fn finish(
        &mut self,
        finish: FinishReason,
        usage: &crate::generate::Usage,
    ) -> Vec<ChatChunk> {
        let parts = self.split.end();
        let mut out = self.deltas(parts, true);
        let calls = self.calls.as_ref().map_or(0, CallSplitter::calls);
        let mut end = self.frame(Some(Delta::default()), Some(finish_of(finish, calls)), None);
        if let Some(c) = end.choices.first_mut() {
            c.choice_scores.clone_from(&usage.choices);
        }
        out.push(end);
        if self.include_usage {
            out.push(self.frame(None, None, Some(usage.into())));
        }
        out
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<()>,
    /// kerze: with a `choices` constraint, each choice's log-likelihood and probability (the
    /// whole response; not in a stream's chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice_scores: Option<Vec<crate::score::ChoiceScore>>,
}

/// A text completion, whole (`finish` and `usage` set) or one chunk of its stream (`finish`
/// on the last text chunk; the usage chunk has no choices).
pub fn text_completion(
    meta: &Meta,
    text: Option<&str>,
    finish: Option<FinishReason>,
    usage: Option<&crate::generate::Usage>,
) -> TextCompletion {
    TextCompletion {
        id: meta.id.clone(),
        object: "text_completion",
        created: meta.created,
        model: meta.model.clone(),
        choices: text
            .map(|t| TextChoice {
                index: 0,
                text: t.to_string(),
                finish_reason: finish.map(finish_reason),
                logprobs: None,
                choice_scores: usage.and_then(|u| u.choices.clone()),
            })
            .into_iter()
            .collect(),
        usage: usage.map(Usage::from),
    }
}

/// An error body: `{"error": {"code", "message", "type", "param"}}` (`code` the HTTP status,
/// as llama-server writes it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: u16,
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
}

impl ErrorBody {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            405 => "invalid_request_error",
            408 | 504 => "timeout_error",
            429 => "rate_limit_error",
            503 => "unavailable_error",
            _ => "server_error",
        };
        Self {
            error: ErrorDetail {
                code: status,
                message: message.into(),
                kind: kind.into(),
                param: None,
            },
        }
    }
}

/// Splits a reply that opens with `<think>…</think>` into reasoning and answer as the pieces
/// of a stream arrive (the same states as the JS package's `ThinkSplitter`): `push` returns
/// `(reasoning, content)` for what is certain so far, `end` the rest.
#[derive(Clone, Debug, Default)]
pub struct ThinkSplitter {
    state: Phase,
    held: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Start,
    /// Just after `<think>`: leading newlines are dropped.
    ThinkOpen,
    Think,
    /// Just after `</think>`: leading newlines are dropped.
    AnswerOpen,
    Answer,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ThinkSplitter {
    pub fn push(&mut self, text: &str) -> (String, String) {
        let (mut reasoning, mut content) = (String::new(), String::new());
        self.held.push_str(text);
        loop {
            match self.state {
                Phase::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = Phase::ThinkOpen;
                        continue;
                    }
                    if OPEN.starts_with(t) {
                        break; // undecided
                    }
                    self.state = Phase::Answer;
                }
                Phase::ThinkOpen | Phase::AnswerOpen => {
                    self.held = self.held.trim_start_matches('\n').to_string();
                    if self.held.is_empty() {
                        break;
                    }
                    self.state = if self.state == Phase::ThinkOpen {
                        Phase::Think
                    } else {
                        Phase::Answer
                    };
                }
                Phase::Think => {
                    if let Some(end) = self.held.find(CLOSE) {
                        let r = &self.held[..end];
                        reasoning.push_str(r.strip_suffix('\n').unwrap_or(r));
                        self.held = self.held[end + CLOSE.len()..].to_string();
                        self.state = Phase::AnswerOpen;
                        continue;
                    }
                    // Keep back what could be the start of `</think>` (and a newline before it).
                    let h = &self.held;
                    let mut keep = (1..CLOSE.len().min(h.len() + 1))
                        .rev()
                        .find(|&k| {
                            h.is_char_boundary(h.len() - k) && CLOSE.starts_with(&h[h.len() - k..])
                        })
                        .unwrap_or(0);
                    if h[..h.len() - keep].ends_with('\n') {
                        keep += 1;
                    }
                    let cut = h.len() - keep;
                    reasoning.push_str(&h[..cut]);
                    self.held = h[cut..].to_string();
                    break;
                }
                Phase::Answer => {
                    content.push_str(&self.held);
                    self.held.clear();
                    break;
                }
            }
        }
        (reasoning, content)
    }

    pub fn end(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.held);
        match self.state {
            // What was held back (a newline, a partial `</think>`) is reasoning after all.
            Phase::Think => (rest, String::new()),
            Phase::ThinkOpen => (rest.trim_start_matches('\n').to_string(), String::new()),
            Phase::AnswerOpen => (String::new(), String::new()),
            Phase::Start | Phase::Answer => (String::new(), rest),
        }
    }
}
