//! A request body's fields, read with typed errors that name the field, and
//! `response_format` read as a constraint.

use crate::constrain::Constraint;
use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// The most stop strings a request may give, and their longest length in bytes.
const MAX_STOP: usize = 16;
const MAX_STOP_BYTES: usize = 1024;

/// A request body's fields, read with typed errors that name the field. `null` is absent.
pub(super) struct Fields<'a> {
    map: &'a Map<String, Value>,
    pub(super) what: &'static str,
}

impl<'a> Fields<'a> {
    pub(super) fn new(body: &'a Value, what: &'static str, known: &[&[&str]]) -> Result<Self> {
        let map = body
            .as_object()
            .ok_or_else(|| bad(format!("{what}: the body must be a JSON object")))?;
        if let Some(k) = map
            .keys()
            .find(|k| !known.iter().any(|list| list.contains(&k.as_str())))
        {
            return Err(bad(format!("{what}: '{k}' is not supported")));
        }
        Ok(Self { map, what })
    }

    pub(super) fn get(&self, k: &str) -> Option<&'a Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }

    pub(super) fn number(&self, k: &str) -> Result<Option<f64>> {
        self.get(k)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| bad(format!("{}: {k} must be a number", self.what)))
            })
            .transpose()
    }

    pub(super) fn count(&self, k: &str) -> Result<Option<u64>> {
        self.get(k)
            .map(|v| {
                // 2.0 is 2, as in JS (and Python's json writes ints as ints anyway).
                v.as_u64()
                    .or_else(|| {
                        v.as_f64()
                            .filter(|f| {
                                f.fract() == 0.0 && (0.0..9.007_199_254_740_992e15).contains(f)
                            })
                            .map(|f| f as u64)
                    })
                    .ok_or_else(|| {
                        bad(format!("{}: {k} must be a non-negative integer", self.what))
                    })
            })
            .transpose()
    }

    pub(super) fn flag(&self, k: &str) -> Result<Option<bool>> {
        self.get(k)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| bad(format!("{}: {k} must be true or false", self.what)))
            })
            .transpose()
    }

    pub(super) fn string(&self, k: &str) -> Result<Option<&'a str>> {
        self.get(k)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| bad(format!("{}: {k} must be a string", self.what)))
            })
            .transpose()
    }

    /// `stop`: a string or a list of (non-empty) strings.
    pub(super) fn stop(&self) -> Result<Option<Vec<String>>> {
        let Some(v) = self.get("stop") else {
            return Ok(None);
        };
        let list: Vec<String> = match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    bad(format!(
                        "{}: stop must be a string or a list of strings",
                        self.what
                    ))
                })?,
            _ => {
                return Err(bad(format!(
                    "{}: stop must be a string or a list of strings",
                    self.what
                )))
            }
        };
        if list.len() > MAX_STOP {
            return Err(bad(format!(
                "{}: stop takes at most {MAX_STOP} strings",
                self.what
            )));
        }
        if list
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(bad(format!(
                "{}: a stop string must have 1 to {MAX_STOP_BYTES} bytes",
                self.what
            )));
        }
        Ok(Some(list))
    }

    /// A field that is accepted only at its OpenAI default.
    pub(super) fn only_default(
        &self,
        k: &str,
        ok: impl Fn(&Value) -> bool,
        default: &str,
    ) -> Result<()> {
        match self.get(k) {
            Some(v) if !ok(v) => Err(bad(format!(
                "{}: {k} is not supported (only {default})",
                self.what
            ))),
            _ => Ok(()),
        }
    }
}

pub(super) fn bad(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// `response_format` as a constraint: OpenAI's `{ type: 'text' }` (none), `{ type:
/// 'json_object' }` and `{ type: 'json_schema', json_schema: { name, schema, strict } }`;
/// WebLLM's `{ type: 'json_object', schema }` (the schema as an object or a JSON string) and
/// `{ type: 'grammar', grammar }` (here a Lark grammar); kerze's `{ type: 'regex', regex }`
/// and `{ type: 'choices', choices }`. The JS package reads it the same way (pkg/openai.js).
pub fn response_format(what: &str, v: Option<&Value>) -> Result<Option<Constraint>> {
    let Some(v) = v else { return Ok(None) };
    let f = format!("{what}: response_format");
    let o = v
        .as_object()
        .ok_or_else(|| bad(format!("{f} must be an object")))?;
    let ty = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{f}.type must be a string")))?;
    let allow = |keys: &[&str]| match o
        .keys()
        .find(|k| *k != "type" && !keys.contains(&k.as_str()))
    {
        Some(k) => Err(bad(format!("{f}.{k} is not supported with type '{ty}'"))),
        None => Ok(()),
    };
    let schema = |v: &Value, at: &str| -> Result<Value> {
        let s = match v {
            Value::String(text) => {
                serde_json::from_str(text).map_err(|e| bad(format!("{f}.{at} is not JSON: {e}")))?
            }
            other => other.clone(),
        };
        if !s.is_object() {
            return Err(bad(format!("{f}.{at} must be a JSON schema (an object)")));
        }
        Ok(s)
    };
    let text = |k: &str| -> Result<String> {
        o.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| bad(format!("{f}.{k} must be a string")))
    };
    Ok(match ty {
        "text" => {
            allow(&[])?;
            None
        }
        "json_object" => {
            allow(&["schema"])?;
            match o.get("schema").filter(|v| !v.is_null()) {
                Some(v) => Some(Constraint::JsonSchema(schema(v, "schema")?)),
                None => Some(Constraint::JsonObject),
            }
        }
        "json_schema" => {
            allow(&["json_schema"])?;
            let js = o
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad(format!("{f}.json_schema must be an object")))?;
            if let Some(k) = js
                .keys()
                .find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
            {
                return Err(bad(format!("{f}.json_schema.{k} is not supported")));
            }
            let s = js
                .get("schema")
                .ok_or_else(|| bad(format!("{f}.json_schema.schema is missing")))?;
            Some(Constraint::JsonSchema(schema(s, "json_schema.schema")?))
        }
        "grammar" => {
            allow(&["grammar"])?;
            Some(Constraint::Grammar(text("grammar")?))
        }
        "regex" => {
            allow(&["regex"])?;
            Some(Constraint::Regex(text("regex")?))
        }
        "choices" => {
            allow(&["choices"])?;
            let c = o
                .get("choices")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad(format!("{f}.choices must be an array of strings")))?;
            Some(Constraint::Choices(c))
        }
        other => {
            return Err(bad(format!(
                "{f}.type '{other}' is not supported: text, json_object, json_schema, grammar, regex or choices"
            )))
        }
    })
}

/// An error's message without its kind.
pub(super) fn message(e: &Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.clone(),
        e => e.to_string(),
    }
}
