//! Tool calls (OpenAI's `tools` / `tool_choice`): what the model is told, the form its calls
//! take, the grammar that holds it to that form, and the splitting of its output back into
//! content and calls.
//!
//! One text form for every model: a call is
//! `<tool_call>\n{"name": "NAME", "arguments": {…}}\n</tool_call>`, several calls one per
//! line — the form Qwen's and Hermes' templates teach their models. A template that renders
//! tools itself (it mentions `<tool_call>`) gets `tools`, the assistant's `tool_calls` and
//! the `tool` messages as Hugging Face `transformers` passes them. Any other template (Gemma,
//! SmolLM2, …) gets the same conversation written out in plain messages: the tool list and
//! the call form in the system message, earlier calls as the assistant's text, results as
//! user turns in `<tool_response>` tags.
//!
//! Under a tool constraint the output can only be such calls (`required`, a named function)
//! or text without `<tool_call>` and calls (`auto`), each call's arguments valid against its
//! function's `parameters` schema.

use super::{Content, Message};
use crate::error::{Error, Result};
use serde_json::Value;

/// What opens and closes one call in the model's output.
pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";

/// The most tools a request may give.
pub const MAX_TOOLS: usize = 128;

/// Which calls the model may or must make.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolChoice {
    /// No call: the tools are shown, the answer is text.
    None,
    /// Text or calls, as the model picks (OpenAI's default when tools are given).
    #[default]
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// The tools of a request and the choice among them: a constraint on the output
/// ([`crate::constrain::Constraint::Tools`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tools {
    /// Each tool as the request gave it: `{type: 'function', function: {name, description?,
    /// parameters?}}` (the template renders them as given, in their key order).
    pub tools: Vec<Value>,
    #[serde(default)]
    pub choice: ToolChoice,
    /// Several calls in one answer (OpenAI's `parallel_tool_calls`, default true).
    #[serde(default = "yes")]
    pub parallel: bool,
}

fn yes() -> bool {
    true
}

/// One function of a request's tools, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of its arguments (an object).
    pub parameters: Value,
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// Check a request's `tools` array: each `{type: 'function', function: {name, description?,
/// parameters?, strict?}}`, names of 1 to 64 letters, digits, `_`, `-` or `.`, unique.
pub fn functions(tools: &[Value]) -> Result<Vec<Function>> {
    if tools.is_empty() || tools.len() > MAX_TOOLS {
        return Err(bad(format!(
            "tools: give 1 to {MAX_TOOLS} tools, not {}",
            tools.len()
        )));
    }
    let mut out: Vec<Function> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = t
            .as_object()
            .ok_or_else(|| bad(format!("{at} must be an object")))?;
        if let Some(k) = o
            .keys()
            .find(|k| !["type", "function"].contains(&k.as_str()))
        {
            return Err(bad(format!("{at}.{k} is not supported")));
        }
        if o.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("{at}.type must be 'function'")));
        }
        let f = o
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(format!("{at}.function must be an object")))?;
        if let Some(k) = f
            .keys()
            .find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
        {
            return Err(bad(format!("{at}.function.{k} is not supported")));
        }
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.function.name must be a string")))?;
        let ok = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !ok {
            return Err(bad(format!(
                "{at}.function.name '{name}' must be 1 to 64 letters, digits, '_', '-' or '.'"
            )));
        }
        if out.iter().any(|g| g.name == name) {
            return Err(bad(format!("{at}.function.name '{name}' is given twice")));
        }
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad(format!("{at}.function.description must be a string"))),
        };
        let parameters = match f.get("parameters") {
            // No parameters: the function takes none.
            None | Some(Value::Null) => serde_json::json!({
                "type": "object", "properties": {}, "additionalProperties": false
            }),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(bad(format!(
                    "{at}.function.parameters must be a JSON schema (an object)"
                )))
            }
        };
        let parameters = match f.get("strict") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => parameters,
            // OpenAI's strict mode: no keys but the ones the schema names.
            Some(Value::Bool(true)) => closed(parameters),
            Some(_) => return Err(bad(format!("{at}.function.strict must be true or false"))),
        };
        out.push(Function {
            name: name.to_string(),
            description,
            parameters,
        });
    }
    Ok(out)
}

/// `schema` with `additionalProperties: false` on every object schema that leaves it out.
fn closed(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        let object = o.get("type").is_some_and(|t| {
            t == "object"
                || t.as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "object"))
        }) || o.contains_key("properties");
        if object && !o.contains_key("additionalProperties") {
            o.insert("additionalProperties".into(), Value::Bool(false));
        }
        for (k, v) in o.iter_mut() {
            match (k.as_str(), v) {
                (
                    "properties" | "$defs" | "definitions" | "patternProperties",
                    Value::Object(m),
                ) => {
                    for x in m.values_mut() {
                        *x = closed(std::mem::take(x));
                    }
                }
                ("items" | "additionalProperties" | "not", x @ Value::Object(_)) => {
                    *x = closed(std::mem::take(x));
                }
                ("anyOf" | "oneOf" | "allOf" | "prefixItems" | "items", Value::Array(a)) => {
                    for x in a.iter_mut() {
                        *x = closed(std::mem::take(x));
                    }
                }
                _ => {}
            }
        }
    }
    schema
}

impl Tools {
    /// The Lark grammar (llguidance's dialect) the output must follow.
    pub(crate) fn grammar(&self) -> Result<String> {
        let fs = functions(&self.tools)?;
        let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let mut g = String::from("%llguidance {}\n");
        let picked: Vec<&Function> = match &self.choice {
            ToolChoice::None => {
                return Err(bad(
                    "tool_choice 'none' makes no tool constraint: the answer is text".into(),
                ))
            }
            ToolChoice::Function(n) => {
                let f = fs.iter().find(|f| &f.name == n).ok_or_else(|| {
                    bad(format!(
                        "tool_choice names '{n}', which is not one of the tools"
                    ))
                })?;
                vec![f]
            }
            _ => fs.iter().collect(),
        };
        let more = if self.parallel {
            " (\"\\n\" call)*"
        } else {
            ""
        };
        let open = lit(CALL_OPEN);
        match self.choice {
            // Text that never opens a call, or text up to the first call and then calls.
            ToolChoice::Auto => g.push_str(&format!(
                "start: PLAIN | head body{more}\n\
                 PLAIN: /(?s:.*)/ & ~/(?s:.*){CALL_OPEN}(?s:.*)/\n\
                 head[lazy]: /(?s:.*){CALL_OPEN}/\n\
                 call: {open} body\n"
            )),
            _ => g.push_str(&format!("start: call{more}\ncall: {open} body\n")),
        }
        let bodies: Vec<String> = (0..picked.len()).map(|i| format!("body_{i}")).collect();
        g.push_str(&format!("body: {}\n", bodies.join(" | ")));
        for (i, f) in picked.iter().enumerate() {
            let mut schema = f.parameters.clone();
            if let Value::Object(m) = &mut schema {
                // The separators of Python's json.dumps, as the templates render calls.
                m.insert(
                    "x-guidance".into(),
                    serde_json::json!({
                        "whitespace_flexible": false,
                        "item_separator": ", ",
                        "key_separator": ": ",
                    }),
                );
            }
            g.push_str(&format!(
                "body_{i}: {} args_{i} {}\nargs_{i}: %json {}\n",
                lit(&format!("\n{{\"name\": {}, \"arguments\": ", lit(&f.name))),
                lit(&format!("}}\n{CALL_CLOSE}")),
                serde_json::to_string(&schema).unwrap_or_default(),
            ));
        }
        Ok(g)
    }
}

/// Whether a chat template renders tools itself (and teaches this module's call form).
pub fn template_renders_tools(source: &str) -> bool {
    source.contains(CALL_OPEN) && source.contains("tools")
}

/// One call as the model wrote it (arguments: its JSON text).
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// A call as the template and the model write it.
pub fn call_text(name: &str, arguments: &str) -> String {
    let name = serde_json::to_string(name).unwrap_or_default();
    format!("{CALL_OPEN}\n{{\"name\": {name}, \"arguments\": {arguments}}}\n{CALL_CLOSE}")
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

/// JSON with Python's `json.dumps` separators (what the call form uses).
fn py_json(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("[{}]", a.iter().map(py_json).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), py_json(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        v => v.to_string(),
    }
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

/// What a piece of output is, once split ([`CallSplitter`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Answer text.
    Content(String),
    /// Call `index` begins: its function's name.
    Start { index: usize, name: String },
    /// More of call `index`'s arguments (JSON text).
    Arguments { index: usize, text: String },
}

#[derive(Clone, Debug, Default)]
enum Split {
    #[default]
    Text,
    /// After `<tool_call>`: the name is being read.
    Head,
    /// In a call's arguments: a JSON value read as it comes (its nesting depth, whether in a
    /// string and after a backslash there), so that neither a `}` nor `</tool_call>` inside
    /// it is taken for the call's end.
    Args {
        depth: usize,
        string: bool,
        escape: bool,
    },
    /// The arguments are whole: the rest of the call (`}` and `</tool_call>`) is skipped.
    Tail,
}

/// Splits output into content and calls as the pieces of a stream arrive (the JS package's
/// `CallSplitter` is the same): `push` returns what is certain so far, `end` the rest. Text
/// between and after calls that is only whitespace is dropped.
#[derive(Clone, Debug, Default)]
pub struct CallSplitter {
    state: Split,
    held: String,
    calls: usize,
}

/// The length of the longest suffix of `s` that is a proper prefix of `pat`.
fn partial_suffix(s: &str, pat: &str) -> usize {
    (1..pat.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && pat.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

/// `{"name": "N", "arguments": ` (or `"parameters"`) at the start of `s`: the name and the
/// bytes read; `Ok(None)` while `s` may still become that; `Err` when it cannot.
fn head(s: &str) -> std::result::Result<Option<(String, usize)>, ()> {
    let mut i = 0;
    let b = s.as_bytes();
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Each step: whitespace, then this literal (a prefix of it at the end is "not yet").
    let lit = |i: &mut usize, l: &str| -> std::result::Result<bool, ()> {
        ws(i);
        let rest = &s[*i..];
        if rest.starts_with(l) {
            *i += l.len();
            Ok(true)
        } else if l.starts_with(rest) {
            Ok(false)
        } else {
            Err(())
        }
    };
    if !lit(&mut i, "{")? || !lit(&mut i, "\"name\"")? || !lit(&mut i, ":")? || !lit(&mut i, "\"")?
    {
        return Ok(None);
    }
    let start = i;
    let Some(len) = s[start..].find('"') else {
        return Ok(None);
    };
    let name = s[start..start + len].to_string();
    if name.contains('\\') {
        return Err(());
    }
    i = start + len + 1;
    if !lit(&mut i, ",")? {
        return Ok(None);
    }
    ws(&mut i);
    let rest = &s[i..];
    let key = ["\"arguments\"", "\"parameters\""]
        .into_iter()
        .find(|k| rest.starts_with(k));
    match key {
        Some(k) => i += k.len(),
        None if ["\"arguments\"", "\"parameters\""]
            .iter()
            .any(|k| k.starts_with(rest)) =>
        {
            return Ok(None)
        }
        None => return Err(()),
    }
    if !lit(&mut i, ":")? {
        return Ok(None);
    }
    ws(&mut i);
    if i == s.len() {
        return Ok(None);
    }
    Ok(Some((name, i)))
}

impl CallSplitter {
    /// How many calls have begun.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn content(&self, out: &mut Vec<Part>, text: &str) {
        if text.is_empty() || (self.calls > 0 && text.trim().is_empty()) {
            return;
        }
        match out.last_mut() {
            Some(Part::Content(c)) => c.push_str(text),
            _ => out.push(Part::Content(text.to_string())),
        }
    }

    fn args(&self, out: &mut Vec<Part>, text: &str) {
        if text.is_empty() {
            return;
        }
        let index = self.calls - 1;
        match out.last_mut() {
            Some(Part::Arguments { index: j, text: t }) if *j == index => t.push_str(text),
            _ => out.push(Part::Arguments {
                index,
                text: text.to_string(),
            }),
        }
    }

    /// The parts of the next piece of output.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                Split::Text => {
                    if let Some(at) = self.held.find(CALL_OPEN) {
                        let before = self.held[..at].to_string();
                        self.content(&mut out, &before);
                        self.held.drain(..at + CALL_OPEN.len());
                        self.state = Split::Head;
                        continue;
                    }
                    let keep = partial_suffix(&self.held, CALL_OPEN);
                    let cut = self.held.len() - keep;
                    // Whitespace after a call is held: it is dropped unless text follows.
                    let cut = if self.calls > 0 {
                        self.held[..cut].trim_end().len()
                    } else {
                        cut
                    };
                    let emit: String = self.held.drain(..cut).collect();
                    self.content(&mut out, &emit);
                    break;
                }
                Split::Head => match head(&self.held) {
                    Ok(Some((name, n))) => {
                        self.held.drain(..n);
                        self.calls += 1;
                        out.push(Part::Start {
                            index: self.calls - 1,
                            name,
                        });
                        self.state = Split::Args {
                            depth: 0,
                            string: false,
                            escape: false,
                        };
                    }
                    Ok(None) => break,
                    Err(()) => {
                        // Not a call after all: it was text.
                        let t = format!("{CALL_OPEN}{}", std::mem::take(&mut self.held));
                        self.content(&mut out, &t);
                        self.state = Split::Text;
                        break;
                    }
                },
                Split::Args {
                    mut depth,
                    mut string,
                    mut escape,
                } => {
                    // Up to where the value closes (an object or array back to depth 0).
                    let begun = depth > 0;
                    let mut end = None;
                    for (i, c) in self.held.char_indices() {
                        match c {
                            _ if escape => escape = false,
                            '\\' if string => escape = true,
                            '"' => string = !string,
                            '{' | '[' if !string => depth += 1,
                            '}' | ']' if !string => {
                                depth = depth.saturating_sub(1);
                                if depth == 0 {
                                    end = Some(i + 1);
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                    let cut = end.unwrap_or(self.held.len());
                    let emit: String = self.held.drain(..cut).collect();
                    self.args(&mut out, if begun { &emit } else { emit.trim_start() });
                    if end.is_some() {
                        self.state = Split::Tail;
                        continue;
                    }
                    self.state = Split::Args {
                        depth,
                        string,
                        escape,
                    };
                    break;
                }
                Split::Tail => match self.held.find(CALL_CLOSE) {
                    Some(at) => {
                        self.held.drain(..at + CALL_CLOSE.len());
                        self.state = Split::Text;
                    }
                    None => break,
                },
            }
        }
        out
    }

    /// What was held back, once the output has ended (a call cut short keeps what it has).
    pub fn end(&mut self) -> Vec<Part> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match std::mem::take(&mut self.state) {
            Split::Text => self.content(&mut out, &held),
            Split::Head => self.content(&mut out, &format!("{CALL_OPEN}{held}")),
            Split::Args { .. } => self.args(&mut out, held.trim_start()),
            Split::Tail => {}
        }
        out
    }
}

/// Output split whole: the content (None when there is none) and the calls.
pub fn split_calls(text: &str) -> (Option<String>, Vec<Call>) {
    let mut s = CallSplitter::default();
    let mut parts = s.push(text);
    parts.extend(s.end());
    let mut content = String::new();
    let mut calls: Vec<Call> = Vec::new();
    for p in parts {
        match p {
            Part::Content(t) => content.push_str(&t),
            Part::Start { name, .. } => calls.push(Call {
                name,
                arguments: String::new(),
            }),
            Part::Arguments { index, text } => {
                if let Some(c) = calls.get_mut(index) {
                    c.arguments.push_str(&text);
                }
            }
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(pieces: &[&str]) -> Vec<Part> {
        let mut s = CallSplitter::default();
        let mut out = Vec::new();
        for p in pieces {
            out.extend(s.push(p));
        }
        out.extend(s.end());
        out
    }

    fn joined(parts: &[Part]) -> (String, Vec<(String, String)>) {
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for p in parts {
            match p {
                Part::Content(t) => content.push_str(t),
                Part::Start { index, name } => {
                    assert_eq!(*index, calls.len());
                    calls.push((name.clone(), String::new()));
                }
                Part::Arguments { index, text } => calls[*index].1.push_str(text),
            }
        }
        (content, calls)
    }

    #[test]
    fn calls_split_from_text_in_any_pieces() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": {\"a\": 1}}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>\n";
        let want = (
            "Let me look.\n".to_string(),
            vec![
                (
                    "get_weather".to_string(),
                    "{\"city\": \"Paris\", \"n\": {\"a\": 1}}".to_string(),
                ),
                ("time".to_string(), "{}".to_string()),
            ],
        );
        // Every split into two pieces, and one character at a time.
        for at in 0..=text.len() {
            let got = joined(&all(&[&text[..at], &text[at..]]));
            assert_eq!(got, want, "split at {at}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(joined(&all(&refs)), want);
        let (c, calls) = split_calls(text);
        assert_eq!(c.as_deref(), Some("Let me look.\n"));
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn text_that_only_looks_like_a_call_stays_text() {
        let (c, calls) = split_calls("Use <tool_call> tags like <tool_call>this");
        assert!(calls.is_empty());
        assert_eq!(
            c.as_deref(),
            Some("Use <tool_call> tags like <tool_call>this")
        );
        let (c, calls) = split_calls("a <tool_cal");
        assert!(calls.is_empty());
        assert_eq!(c.as_deref(), Some("a <tool_cal"));
    }

    #[test]
    fn a_call_cut_short_keeps_its_arguments_so_far() {
        let (c, calls) = split_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"ab");
        assert_eq!(c, None);
        assert_eq!(
            calls,
            vec![Call {
                name: "f".into(),
                arguments: "{\"q\": \"ab".into()
            }]
        );
    }

    #[test]
    fn braces_and_the_closing_tag_inside_arguments_are_arguments() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"a}</tool_call>b\\\"}\", \"n\": [1, {\"m\": 2}]}}\n</tool_call>\nAfter.";
        let args = "{\"q\": \"a}</tool_call>b\\\"}\", \"n\": [1, {\"m\": 2}]}";
        for at in 0..=text.len() {
            if !text.is_char_boundary(at) {
                continue;
            }
            let got = joined(&all(&[&text[..at], &text[at..]]));
            assert_eq!(
                got,
                (
                    "\nAfter.".to_string(),
                    vec![("f".to_string(), args.to_string())]
                ),
                "split at {at}"
            );
        }
        // Cut by max_tokens right after the arguments: they are whole, no stray brace.
        let (_, calls) = split_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
        assert_eq!(calls[0].arguments, "{\"a\": 1}");
        let (_, calls) =
            split_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_");
        assert_eq!(calls[0].arguments, "{\"a\": 1}");
    }

    #[test]
    fn tools_are_checked() {
        let f = |v: Value| functions(v.as_array().unwrap());
        assert!(f(serde_json::json!([])).is_err());
        assert!(f(serde_json::json!([{"type": "function", "function": {"name": "a b"}}])).is_err());
        assert!(f(serde_json::json!([{"type": "retrieval"}])).is_err());
        assert!(f(
            serde_json::json!([{"type": "function", "function": {"name": "a", "parameters": 3}}])
        )
        .is_err());
        let two = serde_json::json!([
            {"type": "function", "function": {"name": "a"}},
            {"type": "function", "function": {"name": "a"}}
        ]);
        assert!(f(two).is_err());
        let ok = f(serde_json::json!([{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}])).unwrap();
        assert_eq!(ok[0].name, "get_weather");
        // strict: every object closed, unless it says otherwise.
        let strict = f(serde_json::json!([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {
            "type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "c": {"type": "array", "items": {"type": "object"}}, "d": {"type": "object", "additionalProperties": true}}}}}])).unwrap();
        let p = &strict[0].parameters;
        assert_eq!(p["additionalProperties"], false);
        assert_eq!(p["properties"]["a"]["additionalProperties"], false);
        assert_eq!(p["properties"]["c"]["items"]["additionalProperties"], false);
        assert_eq!(p["properties"]["d"]["additionalProperties"], true);
    }
}
