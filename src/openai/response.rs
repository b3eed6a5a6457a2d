//! Whole responses: a chat completion, a text completion (or one chunk of its stream) and
//! embeddings, with the `usage`, `finish_reason` and error body they carry.

use super::request::EncodingFormat;
use super::think::ThinkSplitter;
use crate::generate::FinishReason;
use serde::{Deserialize, Serialize};

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
pub(super) fn finish_of(finish: FinishReason, calls: usize) -> &'static str {
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
