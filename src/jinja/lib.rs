//! kerze's chat-template renderer: a model file's Jinja `tokenizer.chat_template` rendered
//! with `minijinja` the way Hugging Face `transformers` renders it (`apply_chat_template`:
//! jinja2 with `trim_blocks` and `lstrip_blocks`, Python string/dict/list methods,
//! `raise_exception`, `strftime_now`, a `tojson` that writes Python's `json.dumps(…,
//! ensure_ascii=False)`). What goes in (the messages with their content escaped) and what
//! comes out (tokens) is kerze's `chat/template.rs`; this crate only renders.
//!
//! Natively kerze links it (the `render` feature). In the browser it is a wasm module of its
//! own (the `module` feature, built as a cdylib; pkg/core.js loads it at the first chat that
//! needs a template): the engine's module, which every page loads, does not carry the
//! template engine. Without `render` this crate holds only [`Date`] and [`RenderError`], the
//! parts the engine needs to hand a template over.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

use std::fmt;

#[cfg(feature = "render")]
use minijinja::{
    value::{Kwargs, Value},
    ErrorKind,
};

/// Why a template did not render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenderError {
    /// The template does not parse.
    Parse(String),
    /// The template refused the messages (`raise_exception`, or an operation it rejects).
    Refused(String),
    /// Rendering failed otherwise.
    Failed(String),
}

impl RenderError {
    /// The kind's name, as the browser module's errors carry it (`Error.name`).
    pub fn name(&self) -> &'static str {
        match self {
            RenderError::Parse(_) => "TemplateParseError",
            RenderError::Refused(_) => "TemplateRefusedError",
            RenderError::Failed(_) => "TemplateError",
        }
    }

    /// The error of kind `name` (as [`RenderError::name`] gives it) with `message`.
    pub fn from_name(name: &str, message: String) -> Self {
        match name {
            "TemplateParseError" => RenderError::Parse(message),
            "TemplateRefusedError" => RenderError::Refused(message),
            _ => RenderError::Failed(message),
        }
    }

    pub fn message(&self) -> &str {
        match self {
            RenderError::Parse(m) | RenderError::Refused(m) | RenderError::Failed(m) => m,
        }
    }
}

/// Render the Jinja template `source` with `context` (an object: `messages`, `bos_token`,
/// `add_generation_prompt`, …); `strftime_now` formats `today`.
#[cfg(feature = "render")]
pub fn render(
    source: &str,
    context: &serde_json::Value,
    today: Date,
) -> Result<String, RenderError> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function(
        "strftime_now",
        move |fmt: String| -> Result<String, minijinja::Error> {
            today
                .format(&fmt)
                .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e))
        },
    );
    env.add_filter("tojson", tojson);
    let template = env
        .template_from_str(source)
        .map_err(|e| RenderError::Parse(e.to_string()))?;
    template
        .render(Value::from_serialize(context))
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => {
                RenderError::Refused(e.detail().unwrap_or("no reason given").to_string())
            }
            _ => RenderError::Failed(e.to_string()),
        })
}

/// The browser module's one export: `render(source, context JSON, today 'YYYY-MM-DD')`, the
/// text or an `Error` named by [`RenderError::name`].
#[cfg(all(feature = "module", target_arch = "wasm32"))]
mod module {
    use wasm_bindgen::prelude::*;

    fn error(e: super::RenderError) -> JsValue {
        let v = js_sys::Error::new(e.message());
        v.set_name(e.name());
        v.into()
    }

    #[wasm_bindgen]
    pub fn render(source: &str, context: &str, today: &str) -> Result<String, JsValue> {
        let bad = |m: String| error(super::RenderError::Failed(m));
        let context: serde_json::Value =
            serde_json::from_str(context).map_err(|e| bad(format!("context: {e}")))?;
        let today = super::Date::parse(today).map_err(bad)?;
        super::render(source, &context, today).map_err(error)
    }
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`; Python's separators (`", "`, `": "`; `","`
/// between items when indenting).
#[cfg(feature = "render")]
fn tojson(v: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&v)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let (item, key) = match &separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let mut out = String::new();
    py_json(
        &json,
        indent,
        0,
        &item,
        &key,
        sort_keys.unwrap_or(false),
        &mut out,
    );
    Ok(Value::from_safe_string(out))
}

#[cfg(feature = "render")]
fn py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    level: usize,
    item: &str,
    key: &str,
    sort: bool,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => out.push_str(&n.to_string()),
        J::String(s) => out.push_str(&serde_json::Value::String(s.clone()).to_string()),
        J::Array(a) if a.is_empty() => out.push_str("[]"),
        J::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, level + 1);
                py_json(x, indent, level + 1, item, key, sort, out);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(o) if o.is_empty() => out.push_str("{}"),
        J::Object(o) => {
            let mut entries: Vec<(&String, &J)> = o.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, level + 1);
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push_str(key);
                py_json(x, indent, level + 1, item, key, sort, out);
            }
            newline(out, level);
            out.push('}');
        }
    }
}

/// A calendar date (UTC) for `strftime_now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Date {
    year: i64,
    month: u32,
    day: u32,
    /// 0 = Monday.
    weekday: u32,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

impl fmt::Display for Date {
    /// `YYYY-MM-DD`, as [`Date::parse`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

impl Date {
    /// Days since 1970-01-01 → date (Howard Hinnant's civil_from_days).
    fn from_days(z: i64) -> Self {
        let weekday = (z + 3).rem_euclid(7) as u32; // 1970-01-01 was a Thursday
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Self {
            year,
            month,
            day,
            weekday,
        }
    }

    fn days(year: i64, month: u32, day: u32) -> i64 {
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let m = i64::from(month);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// Today (UTC).
    pub fn today() -> Self {
        #[cfg(target_arch = "wasm32")]
        let ms = js_sys::Date::now();
        #[cfg(not(target_arch = "wasm32"))]
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        Self::from_days((ms / 86_400_000.0).floor() as i64)
    }

    /// `YYYY-MM-DD`; the error says what was wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("date `{s}` is not YYYY-MM-DD");
        let mut it = s.splitn(3, '-');
        let mut num =
            || -> Result<i64, String> { it.next().and_then(|x| x.parse().ok()).ok_or_else(bad) };
        let (y, m, d) = (num()?, num()?, num()?);
        if !(1..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return Err(bad());
        }
        let date = Self::from_days(Self::days(y, m as u32, d as u32));
        if date.day != d as u32 {
            return Err(bad());
        }
        Ok(date)
    }

    /// Python's `strftime` for the date directives templates use (the time is midnight).
    pub fn format(&self, fmt: &str) -> std::result::Result<String, String> {
        let mut out = String::new();
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let month = MONTHS[(self.month - 1) as usize];
            let day = DAYS[self.weekday as usize];
            match chars.next() {
                Some('d') => out.push_str(&format!("{:02}", self.day)),
                Some('m') => out.push_str(&format!("{:02}", self.month)),
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&format!("{:02}", self.year % 100)),
                Some('B') => out.push_str(month),
                Some('b') => out.push_str(&month[..3]),
                Some('A') => out.push_str(day),
                Some('a') => out.push_str(&day[..3]),
                Some('H') | Some('M') | Some('S') => out.push_str("00"),
                Some('%') => out.push('%'),
                other => {
                    return Err(format!(
                        "strftime_now: %{} is not supported",
                        other.map(String::from).unwrap_or_default()
                    ))
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_and_format_as_python() {
        let d = Date::parse("2026-12-01").unwrap();
        assert_eq!((d.year, d.month, d.day), (2026, 12, 1));
        assert_eq!(d.format("%d %b %Y, %A").unwrap(), "01 Dec 2026, Tuesday");
        assert_eq!(
            Date::parse("2024-07-26")
                .unwrap()
                .format("%d %B %Y %a")
                .unwrap(),
            "26 July 2024 Fri"
        );
        assert_eq!(
            Date::from_days(0).format("%Y-%m-%d %A").unwrap(),
            "1970-01-01 Thursday"
        );
        assert!(Date::parse("2025-02-29").is_err());
        assert!(Date::parse("yesterday").is_err());
        assert!(Date::today().year >= 2024);
        let d = Date::parse("0987-03-04").unwrap();
        assert_eq!(Date::parse(&d.to_string()).unwrap(), d);
    }

    #[test]
    fn error_kinds_cross_by_name() {
        for e in [
            RenderError::Parse("p".into()),
            RenderError::Refused("r".into()),
            RenderError::Failed("f".into()),
        ] {
            assert_eq!(RenderError::from_name(e.name(), e.message().into()), e);
        }
        assert_eq!(
            RenderError::from_name("TypeError", "x".into()),
            RenderError::Failed("x".into())
        );
    }

    #[cfg(feature = "render")]
    #[test]
    fn render_maps_minijinja_errors() {
        let ctx = serde_json::json!({ "messages": [] });
        let day = Date::parse("2026-12-01").unwrap();
        assert!(matches!(
            render("{% if %}", &ctx, day),
            Err(RenderError::Parse(_))
        ));
        assert_eq!(
            render("{{ raise_exception('no') }}", &ctx, day),
            Err(RenderError::Refused("no".into()))
        );
        assert_eq!(
            render(
                "{{ strftime_now('%Y') }}|{{ messages | length }}",
                &ctx,
                day
            ),
            Ok("2026|0".into())
        );
    }

    #[cfg(feature = "render")]
    #[test]
    fn tojson_writes_python_json() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let t = env
            .template_from_str("{{ x | tojson }}|{{ x | tojson(indent=2) }}")
            .unwrap();
        let x: serde_json::Value =
            serde_json::from_str(r#"{"name":"f","args":[1,"ä<b>"],"e":{}}"#).unwrap();
        let out = t.render(minijinja::context! { x => x }).unwrap();
        assert_eq!(
            out,
            "{\"name\": \"f\", \"args\": [1, \"ä<b>\"], \"e\": {}}|{\n  \"name\": \"f\",\n  \"args\": [\n    1,\n    \"ä<b>\"\n  ],\n  \"e\": {}\n}"
        );
    }
}
