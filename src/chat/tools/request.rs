//! The tools of a request and the choice among them ([`Tools`], [`ToolChoice`]), and the
//! check of its `tools` array into [`Function`]s (with OpenAI's strict mode).

use crate::error::{Error, Result};
use serde_json::Value;

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

pub(super) fn bad(msg: String) -> Error {
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

#[cfg(test)]
mod tests {
    use super::*;

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
