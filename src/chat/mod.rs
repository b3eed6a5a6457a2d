//! Chat messages → prompt ids. Owns: the OpenAI message shape, the choice of format (the
//! file's own Jinja `tokenizer.chat_template`, through template.rs; Gemma's built-in format
//! for Gemma files without one) and the rule that message content is user text in every
//! template: a visitor who types `<|im_end|>` or `<end_of_turn>` gets those characters, not a
//! turn boundary. Stop tokens come from the file's ids (tokenizer/).

mod gemma;
mod message;
mod template;
pub mod tools;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

pub use message::{ChatOptions, Content, Message, Part};
pub use template::{render, Rendered};

/// Where a chat prompt's format comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TemplateSource {
    /// The file's `tokenizer.chat_template`.
    File,
    /// kerze's built-in Gemma format (a Gemma file without a template).
    BuiltinGemma,
}

/// The format this tokenizer's chats use: the file's template, else Gemma's built-in one
/// when the vocabulary is Gemma's, else none (a typed error when a chat is asked for).
pub fn template_source(tok: &Tokenizer) -> Option<TemplateSource> {
    if tok.chat_template().is_some() {
        Some(TemplateSource::File)
    } else if tok.token_id("<start_of_turn>").is_some() && tok.token_id("<end_of_turn>").is_some() {
        Some(TemplateSource::BuiltinGemma)
    } else {
        None
    }
}

/// The prompt ids for `messages` with the default options (ending with the assistant's turn).
pub fn prompt_ids(tok: &Tokenizer, messages: &[Message]) -> Result<Vec<u32>> {
    prompt_ids_with(tok, messages, &ChatOptions::default())
}

/// The prompt ids for `messages`.
pub fn prompt_ids_with(
    tok: &Tokenizer,
    messages: &[Message],
    opts: &ChatOptions,
) -> Result<Vec<u32>> {
    if messages.is_empty() {
        return Err(Error::InvalidArgument("messages is empty".into()));
    }
    if opts.continue_final_message {
        let (last, head) = messages.split_last().unwrap_or_else(|| unreachable!());
        if last.role != "assistant" || head.is_empty() {
            return Err(Error::InvalidArgument(
                "continue_final_message: the last message must be the assistant's, after at least one other".into(),
            ));
        }
        let open = ChatOptions {
            add_generation_prompt: true,
            continue_final_message: false,
            ..opts.clone()
        };
        let mut ids = prompt_ids_with(tok, head, &open)?;
        ids.extend(tok.encode_user(&last.content.text(false)?, false)?);
        return Ok(ids);
    }
    let tools = opts.tools.as_deref().unwrap_or_default();
    let source = tok.chat_template().unwrap_or_default();
    let uses_tools = !tools.is_empty()
        || messages
            .iter()
            .any(|m| m.role == "tool" || m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()));
    let plain;
    let messages = if uses_tools && !tools::template_renders_tools(source) {
        plain = tools::plain_messages(messages, tools)?;
        &plain[..]
    } else {
        messages
    };
    match template_source(tok) {
        Some(TemplateSource::File) => Ok(render(tok, source, messages, opts)?.ids),
        Some(TemplateSource::BuiltinGemma) => {
            gemma::prompt_ids(tok, messages, opts.add_generation_prompt)
        }
        None => Err(Error::InvalidArgument(
            "this model file has no chat template (tokenizer.chat_template): use generate with a prompt of your own".into(),
        )),
    }
}

/// How many of the prompt ids of `messages` (`ids`, from [`prompt_ids_with`]) stay the same
/// while the last user message changes: the system prompt, few-shot turns and the conversation
/// before that turn, as the template renders them. What a prefix cache saves and looks up
/// (0: no user message). Found by rendering the chat again with other text in that message,
/// so it holds for any template, also one that folds the system prompt into the first turn.
pub fn shared_prefix_len(
    tok: &Tokenizer,
    messages: &[Message],
    opts: &ChatOptions,
    ids: &[u32],
) -> Result<usize> {
    let Some(at) = messages.iter().rposition(|m| m.role == "user") else {
        return Ok(0);
    };
    let mut other = messages.to_vec();
    let text = other[at].content.text(false)?;
    other[at].content = Content::Text(if text.starts_with('\u{1}') {
        "\u{2}".into()
    } else {
        "\u{1}".into()
    });
    let alt = prompt_ids_with(tok, &other, opts)?;
    Ok(ids.iter().zip(&alt).take_while(|(a, b)| a == b).count())
}

/// A reply that opens with `<think>…</think>` (Qwen3 and other reasoning models) as
/// (reasoning, answer), as llama-server's `reasoning_content` does: the newlines next to the
/// tags dropped. Any other reply is all answer. (The JS package's ThinkSplitter does the same
/// on a stream.)
pub fn split_reasoning(text: &str) -> (Option<String>, String) {
    let t = text.trim_start();
    let Some(rest) = t.strip_prefix("<think>") else {
        return (None, text.to_string());
    };
    match rest.find("</think>") {
        Some(end) => {
            let reasoning = rest[..end].trim_start_matches('\n');
            let reasoning = reasoning.strip_suffix('\n').unwrap_or(reasoning);
            let answer = rest[end + "</think>".len()..].trim_start_matches('\n');
            (Some(reasoning.to_string()), answer.to_string())
        }
        None => (
            Some(rest.trim_start_matches('\n').to_string()),
            String::new(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::split_reasoning;

    #[test]
    fn reasoning_is_split_from_the_answer() {
        let s = |t: &str| split_reasoning(t);
        assert_eq!(
            s("<think>\nplan it\n</think>\n\nAnswer."),
            (Some("plan it".into()), "Answer.".into())
        );
        assert_eq!(
            s("<think>\n\n</think>\n\nHi"),
            (Some(String::new()), "Hi".into())
        );
        assert_eq!(
            s("Answer, <think> is text."),
            (None, "Answer, <think> is text.".into())
        );
        assert_eq!(
            s("<think>\nunfinished"),
            (Some("unfinished".into()), String::new())
        );
    }
}
