//! The form a call takes in text, one for every model:
//! `<tool_call>\n{"name": "NAME", "arguments": {…}}\n</tool_call>`, its JSON written with
//! Python's `json.dumps` separators as the templates render calls.

use serde_json::Value;

/// What opens and closes one call in the model's output.
pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";

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

/// JSON with Python's `json.dumps` separators (what the call form uses).
pub(super) fn py_json(v: &Value) -> String {
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
