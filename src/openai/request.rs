//! The requests: a chat completion, a (text) completion and embeddings, each parsed from its
//! JSON body and checked field by field; [`GenerateRequest`] is the sampling and stopping
//! they share.

use super::fields::{bad, message, response_format, Fields};
use crate::chat::tools::{ToolChoice, Tools};
use crate::chat::{ChatOptions, Message};
use crate::constrain::Constraint;
use crate::error::Result;
use crate::generate::GenerateOptions;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// The fields both endpoints share.
fn common(f: &Fields, max_tokens: Option<u64>) -> Result<(GenerateRequest, bool, bool)> {
    if let Some(n) = f.count("n")? {
        if n != 1 {
            return Err(bad(format!("{}: only n = 1 is supported", f.what)));
        }
    }
    f.string("user")?;
    let stream = f.flag("stream")?.unwrap_or(false);
    f.flag("cache")?; // a boolean; serve's response cache reads it
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                return Err(bad(format!(
                    "{}: stream_options.{k} is not supported",
                    f.what
                )));
            }
            match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(bad(format!(
                        "{}: stream_options.include_usage must be true or false",
                        f.what
                    )))
                }
            }
        }
        Some(_) => return Err(bad(format!("{}: stream_options must be an object", f.what))),
    };
    let generate = GenerateRequest {
        max_tokens: max_tokens.or(f.count("max_tokens")?),
        temperature: f.number("temperature")?,
        top_p: f.number("top_p")?,
        top_k: f.count("top_k")?,
        min_p: f.number("min_p")?,
        seed: f.count("seed")?,
        presence_penalty: f.number("presence_penalty")?,
        frequency_penalty: f.number("frequency_penalty")?,
        repetition_penalty: f.number("repetition_penalty")?,
        stop: f.stop()?,
        constraint: response_format(f.what, f.get("response_format"))?,
    };
    // The ranges (temperature ≥ 0, top_p in (0, 1], …) as the sampler checks them.
    generate
        .options()
        .map_err(|e| bad(format!("{}: {}", f.what, message(&e))))?;
    Ok((generate, stream, include_usage))
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
    let (generate, stream, include_usage) = common(&f, f.count("max_completion_tokens")?)?;
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
    let (generate, stream, include_usage) = common(&f, None)?;
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
