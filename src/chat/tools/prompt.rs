//! What the model is told: whether a template renders tools itself, and for one that does
//! not, the conversation written out in plain messages (the tool list and the call form in
//! the system message, earlier calls as the assistant's text, results as user turns).

use super::form::{call_text, py_json, Call, CALL_OPEN};
use super::request::{bad, functions};
use crate::chat::{Content, Message};
use crate::error::Result;
use serde_json::Value;

/// Whether a chat template renders tools itself (and teaches this module's call form).
pub fn template_renders_tools(source: &str) -> bool {
    source.contains(CALL_OPEN) && source.contains("tools")
}

/// The calls of an assistant message in the OpenAI shape (`[{id, type, function: {name,
/// arguments}}]`, arguments a JSON string or an object).
pub fn message_calls(calls: &[Value]) -> Result<Vec<Call>> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c.get("function").unwrap_or(c);
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("tool_calls[{i}].function.name must be a string")))?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(v) => py_json(v),
            };
            Ok(Call {
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}

/// The conversation for a template that does not render tools: the tool list and the call
/// form in the system message (one is added when there is none), an assistant's calls as its
/// text, and tool results as user turns (consecutive ones joined), so that roles still
/// alternate for templates that insist on it (Gemma's).
pub fn plain_messages(messages: &[Message], tools: &[Value]) -> Result<Vec<Message>> {
    let text = |s: String| Content::Text(s);
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    if !tools.is_empty() {
        let fs = functions(tools)?;
        let list: Vec<String> = fs
            .iter()
            .map(|f| {
                let mut o = serde_json::Map::new();
                o.insert("name".into(), f.name.clone().into());
                if let Some(d) = &f.description {
                    o.insert("description".into(), d.clone().into());
                }
                o.insert("parameters".into(), f.parameters.clone());
                py_json(&Value::Object(o))
            })
            .collect();
        let intro = format!(
            "You can call these tools (JSON Schema of each one's arguments):\n{}\n\n\
             To call a tool, answer with one line per call and nothing else:\n{}\n\
             Otherwise answer in plain text.",
            list.join("\n"),
            call_text("<name>", "<arguments as JSON>")
        );
        match messages.first() {
            Some(m) if m.role == "system" || m.role == "developer" => {
                let own = m.content.text(false)?;
                out.push(Message::new("system", text(format!("{own}\n\n{intro}"))));
                rest = &messages[1..];
            }
            _ => out.push(Message::new("system", text(intro))),
        }
    }
    for m in rest {
        match m.role.as_str() {
            "tool" => {
                let body = format!(
                    "<tool_response>\n{}\n</tool_response>",
                    m.content.text(false)?
                );
                match out.last_mut() {
                    Some(prev) if prev.role == "user" && prev.tool_results => {
                        let t = prev.content.text(false)?;
                        prev.content = text(format!("{t}\n{body}"));
                    }
                    _ => {
                        let mut u = Message::new("user", text(body));
                        u.tool_results = true;
                        out.push(u);
                    }
                }
            }
            "assistant" if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) => {
                let calls = message_calls(m.tool_calls.as_deref().unwrap_or_default())?;
                let mut t = m.content.text(false)?;
                for c in calls {
                    if !t.is_empty() {
                        t.push('\n');
                    }
                    t.push_str(&call_text(&c.name, &c.arguments));
                }
                out.push(Message::new("assistant", text(t)));
            }
            _ => {
                let mut c = m.clone();
                c.tool_calls = None;
                out.push(c);
            }
        }
    }
    Ok(out)
}
