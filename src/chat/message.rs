//! The OpenAI message shape and the options of a chat prompt.

use crate::error::{Error, Result};

/// One message in the OpenAI shape: `content` is a string or a list of `{type:'text', text}`
/// (null or absent: empty, as in an assistant message that only calls tools).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default, deserialize_with = "nullable_content")]
    pub content: Content,
    /// An earlier assistant turn's thinking (Qwen3 templates read it).
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// An assistant's calls: `[{id, type: 'function', function: {name, arguments}}]`.
    #[serde(default)]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message: the call it answers, and (some clients) the function's name.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// A user turn made of tool results ([`super::tools::plain_messages`]), which the next result
    /// joins.
    #[serde(skip)]
    pub(crate) tool_results: bool,
}

impl Message {
    /// A message of `role` with `content` and nothing else.
    pub fn new(role: &str, content: Content) -> Self {
        Self {
            role: role.to_string(),
            content,
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
            tool_results: false,
        }
    }
}

fn nullable_content<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Content, D::Error> {
    use serde::Deserialize;
    Ok(Option::<Content>::deserialize(d)?.unwrap_or_default())
}

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Clone, Debug, serde::Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

impl Content {
    /// The text, parts joined as the template joins them (each part trimmed when `trim`).
    pub(crate) fn text(&self, trim: bool) -> Result<String> {
        let t = |s: &str| {
            if trim {
                s.trim().to_string()
            } else {
                s.to_string()
            }
        };
        match self {
            Content::Text(s) => Ok(t(s)),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(s)) => out.push_str(&t(s)),
                        ("text", None) => {
                            return Err(Error::InvalidArgument(
                                "a content part of type 'text' has no 'text'".into(),
                            ))
                        }
                        (other, _) => {
                            return Err(Error::InvalidArgument(format!(
                                "content parts of type '{other}' are not supported: only 'text'"
                            )))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// How a conversation becomes a prompt.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ChatOptions {
    /// End with the opening of the assistant's turn (default true).
    pub add_generation_prompt: bool,
    /// Qwen3's thinking switch; None: the template's default.
    pub enable_thinking: Option<bool>,
    /// The date `strftime_now` sees, `YYYY-MM-DD` (None: today). For reproducible prompts.
    pub date: Option<String>,
    /// The last message is the start of the assistant's answer: the prompt is the messages
    /// before it, the assistant's turn opened, and that text — the answer continues it (vLLM's
    /// `continue_final_message`; the package's fallback continues a broken-off local answer so).
    pub continue_final_message: bool,
    /// The request's tools (OpenAI's shape, see [`super::tools`]): a template that renders tools gets
    /// them, any other the plain form of [`super::tools::plain_messages`].
    pub tools: Option<Vec<serde_json::Value>>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            enable_thinking: None,
            date: None,
            continue_final_message: false,
            tools: None,
        }
    }
}
