//! The built-in Gemma chat format, for Gemma files that carry no `tokenizer.chat_template`
//! (the 270M base model's GGUF has none): the rules of Gemma 3's own template (roles
//! alternate, a leading system message joins the first user turn, content trimmed), written
//! out. Template text is tokenized with control tokens; message content as user text.

use super::{Content, Message};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// The prompt ids for `messages`, ending with the opening of the model's turn when
/// `add_generation_prompt`.
pub fn prompt_ids(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<Vec<u32>> {
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
    if add_generation_prompt {
        ids.extend(tok.encode_raw("<start_of_turn>model\n", false)?);
    }
    Ok(ids)
}
