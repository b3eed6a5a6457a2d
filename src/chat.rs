//! Chat messages → prompt ids with the Gemma chat template. Owns: the template and its rules
//! (roles alternate, a leading system message joins the first user turn, content trimmed).
//! Template text is tokenized with control tokens; message content as user text, so a visitor
//! who types `<end_of_turn>` gets those characters, not a turn boundary.

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// One message in the OpenAI shape: `content` is a string or a list of `{type:'text', text}`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Content,
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

impl Content {
    /// The text, parts joined as the template joins them (each part trimmed when `trim`).
    fn text(&self, trim: bool) -> Result<String> {
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

/// The prompt ids for `messages`, ending with the opening of the model's turn.
pub fn prompt_ids(tok: &Tokenizer, messages: &[Message]) -> Result<Vec<u32>> {
    let (system, turns) = match messages.split_first() {
        None => return Err(Error::InvalidArgument("messages is empty".into())),
        Some((first, rest)) if first.role == "system" => {
            // The template takes the first part only when the system content is a list.
            let text = match &first.content {
                Content::Text(s) => s.clone(),
                Content::Parts(p) => {
                    Content::Parts(p.iter().take(1).cloned().collect()).text(false)?
                }
            };
            (Some(text), rest)
        }
        Some(_) => (None, messages),
    };
    if turns.is_empty() {
        return Err(Error::InvalidArgument(
            "messages has a system message but no user message".into(),
        ));
    }
    let mut ids = Vec::new();
    ids.extend(tok.bos());
    for (i, m) in turns.iter().enumerate() {
        let role = match (m.role.as_str(), i % 2) {
            ("user", 0) => "user",
            ("assistant", 1) => "model",
            (r, _) if !matches!(r, "user" | "assistant" | "system") => {
                return Err(Error::InvalidArgument(format!(
                    "message {i} has role '{r}': roles are 'system' (first only), 'user' and 'assistant'"
                )))
            }
            _ => {
                return Err(Error::InvalidArgument(
                    "roles must alternate user/assistant/user/… after an optional first system message"
                        .into(),
                ))
            }
        };
        ids.extend(tok.encode_raw(&format!("<start_of_turn>{role}\n"), false)?);
        let mut text = String::new();
        if i == 0 {
            if let Some(s) = &system {
                text.push_str(s);
                text.push_str("\n\n");
            }
        }
        text.push_str(&m.content.text(true)?);
        ids.extend(tok.encode_user(&text, false)?);
        ids.extend(tok.encode_raw("<end_of_turn>\n", false)?);
    }
    ids.extend(tok.encode_raw("<start_of_turn>model\n", false)?);
    Ok(ids)
}
