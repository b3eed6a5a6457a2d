//! The file's Jinja chat template, rendered with `minijinja` the way Hugging Face
//! `transformers` renders it (`apply_chat_template`: jinja2 with `trim_blocks` and
//! `lstrip_blocks`, Python string/dict/list methods, `raise_exception`, `strftime_now`, a
//! `tojson` that writes Python's `json.dumps(…, ensure_ascii=False)`), then tokenized with
//! control tokens parsed and no <bos> added (the template writes it).
//!
//! Message content is user text: before rendering, every control-token string inside it (as
//! the tokenizer would match it) is swapped for a private-use sentinel character, which no
//! template method touches; after rendering, the text between sentinels is tokenized with
//! control tokens and each sentinel's original string as plain user text.

use super::{ChatOptions, Content, Message};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};

/// A rendered chat prompt.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The template's output, message content as the caller gave it.
    pub text: String,
    /// Its tokens: template text with control tokens, message content as user text.
    pub ids: Vec<u32>,
}

/// Sentinels are U+F0000 + k (Supplementary Private Use Area-A, 65 534 code points).
const SENTINEL0: u32 = 0xF0000;
const SENTINELS: u32 = 0xFFFE;

fn is_sentinel(c: char) -> bool {
    (SENTINEL0..SENTINEL0 + SENTINELS).contains(&(c as u32))
}

/// The strings swapped out of message content, by sentinel index.
#[derive(Default)]
struct Escapes {
    originals: Vec<String>,
}

impl Escapes {
    fn sentinel(&mut self, original: &str) -> Result<char> {
        let k = match self.originals.iter().position(|o| o == original) {
            Some(k) => k,
            None => {
                self.originals.push(original.to_string());
                self.originals.len() - 1
            }
        };
        u32::try_from(k)
            .ok()
            .filter(|&k| k < SENTINELS)
            .and_then(|k| char::from_u32(SENTINEL0 + k))
            .ok_or_else(|| {
                Error::InvalidArgument("too many control-token strings in the messages".into())
            })
    }

    /// `text` with every control-token string (and any sentinel character a user typed)
    /// swapped for a sentinel.
    fn escape(&mut self, tok: &Tokenizer, text: &str) -> Result<String> {
        let mut pieces: Vec<String> = tok
            .encode_raw(text, false)?
            .into_iter()
            .filter(|&id| tok.is_control(id))
            .filter_map(|id| tok.token(id))
            .filter(|p| !p.is_empty())
            .collect();
        let typed: Vec<String> = text
            .chars()
            .filter(|&c| is_sentinel(c))
            .map(String::from)
            .collect();
        if pieces.is_empty() && typed.is_empty() {
            return Ok(text.to_string());
        }
        pieces.extend(typed);
        // Longest first, so a control string inside a longer one is not split.
        pieces.sort_by_key(|p| std::cmp::Reverse(p.len()));
        pieces.dedup();
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        'outer: while !rest.is_empty() {
            for p in &pieces {
                if let Some(after) = rest.strip_prefix(p.as_str()) {
                    out.push(self.sentinel(p)?);
                    rest = after;
                    continue 'outer;
                }
            }
            let c = rest.chars().next().unwrap_or_default();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        Ok(out)
    }

    /// The sentinel-free text: each sentinel back to its original.
    fn restore(&self, text: &str) -> String {
        text.chars()
            .map(|c| {
                if is_sentinel(c) {
                    let k = (c as u32 - SENTINEL0) as usize;
                    self.originals.get(k).cloned().unwrap_or_default()
                } else {
                    c.to_string()
                }
            })
            .collect()
    }
}

/// A message as the template sees it (content escaped).
fn message_value(m: &Message, esc: &mut Escapes, tok: &Tokenizer) -> Result<serde_json::Value> {
    let mut obj = serde_json::Map::new();
    obj.insert("role".into(), m.role.clone().into());
    let content = match &m.content {
        Content::Text(s) => serde_json::Value::String(esc.escape(tok, s)?),
        Content::Parts(parts) => {
            let mut v = Vec::with_capacity(parts.len());
            for p in parts {
                let mut part = serde_json::Map::new();
                part.insert("type".into(), p.kind.clone().into());
                if let Some(t) = &p.text {
                    part.insert("text".into(), esc.escape(tok, t)?.into());
                }
                v.push(serde_json::Value::Object(part));
            }
            serde_json::Value::Array(v)
        }
    };
    obj.insert("content".into(), content);
    if let Some(r) = &m.reasoning_content {
        obj.insert("reasoning_content".into(), esc.escape(tok, r)?.into());
    }
    if let Some(calls) = &m.tool_calls {
        // As given (arguments a JSON string, as OpenAI clients send them), strings escaped.
        let calls = calls
            .iter()
            .map(|c| escape_strings(c, esc, tok))
            .collect::<Result<Vec<_>>>()?;
        obj.insert("tool_calls".into(), calls.into());
    }
    if let Some(id) = &m.tool_call_id {
        obj.insert("tool_call_id".into(), esc.escape(tok, id)?.into());
    }
    if let Some(n) = &m.name {
        obj.insert("name".into(), esc.escape(tok, n)?.into());
    }
    Ok(serde_json::Value::Object(obj))
}

/// `v` with every string in it escaped as message content is.
fn escape_strings(
    v: &serde_json::Value,
    esc: &mut Escapes,
    tok: &Tokenizer,
) -> Result<serde_json::Value> {
    use serde_json::Value as J;
    Ok(match v {
        J::String(s) => J::String(esc.escape(tok, s)?),
        J::Array(a) => J::Array(
            a.iter()
                .map(|x| escape_strings(x, esc, tok))
                .collect::<Result<_>>()?,
        ),
        J::Object(o) => J::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), escape_strings(x, esc, tok)?)))
                .collect::<Result<_>>()?,
        ),
        other => other.clone(),
    })
}

/// Render the Jinja chat template `source` (the file's, or one the caller brings) for
/// `messages` and tokenize the result.
pub fn render(
    tok: &Tokenizer,
    source: &str,
    messages: &[Message],
    opts: &ChatOptions,
) -> Result<Rendered> {
    let mut esc = Escapes::default();
    let msgs = messages
        .iter()
        .map(|m| message_value(m, &mut esc, tok))
        .collect::<Result<Vec<_>>>()?;
    let today = match &opts.date {
        Some(d) => Date::parse(d)?,
        None => Date::today(),
    };
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function(
        "strftime_now",
        move |fmt: String| -> std::result::Result<String, minijinja::Error> {
            today
                .format(&fmt)
                .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e))
        },
    );
    env.add_filter("tojson", tojson);
    let template = env.template_from_str(source).map_err(|e| {
        Error::InvalidArgument(format!("the model's chat template does not parse: {e}"))
    })?;
    let piece = |id: Option<u32>| id.and_then(|i| tok.token(i)).unwrap_or_default();
    let mut ctx = serde_json::Map::new();
    ctx.insert("messages".into(), serde_json::Value::Array(msgs));
    ctx.insert(
        "add_generation_prompt".into(),
        opts.add_generation_prompt.into(),
    );
    ctx.insert("bos_token".into(), piece(tok.bos()).into());
    ctx.insert("eos_token".into(), piece(tok.eos()).into());
    if let Some(t) = opts.enable_thinking {
        ctx.insert("enable_thinking".into(), t.into());
    }
    if let Some(tools) = opts.tools.as_ref().filter(|t| !t.is_empty()) {
        let tools = tools
            .iter()
            .map(|t| escape_strings(t, &mut esc, tok))
            .collect::<Result<Vec<_>>>()?;
        ctx.insert("tools".into(), tools.into());
    }
    let escaped = template
        .render(Value::from_serialize(&ctx))
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => Error::InvalidArgument(format!(
                "the model's chat template refused these messages: {}",
                e.detail().unwrap_or("no reason given")
            )),
            _ => Error::InvalidArgument(format!("the model's chat template failed: {e}")),
        })?;
    let mut ids = Vec::new();
    let mut seg = String::new();
    for c in escaped.chars() {
        if is_sentinel(c) {
            if !seg.is_empty() {
                ids.extend(tok.encode_raw(&seg, false)?);
                seg.clear();
            }
            let k = (c as u32 - SENTINEL0) as usize;
            let original = esc.originals.get(k).map(String::as_str).unwrap_or("");
            ids.extend(tok.encode_user(original, false)?);
        } else {
            seg.push(c);
        }
    }
    if !seg.is_empty() {
        ids.extend(tok.encode_raw(&seg, false)?);
    }
    Ok(Rendered {
        text: esc.restore(&escaped),
        ids,
    })
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`; Python's separators (`", "`, `": "`; `","`
/// between items when indenting).
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
struct Date {
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

    fn today() -> Self {
        #[cfg(target_arch = "wasm32")]
        let ms = js_sys::Date::now();
        #[cfg(not(target_arch = "wasm32"))]
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        Self::from_days((ms / 86_400_000.0).floor() as i64)
    }

    fn parse(s: &str) -> Result<Self> {
        let bad = || Error::InvalidArgument(format!("date `{s}` is not YYYY-MM-DD"));
        let mut it = s.splitn(3, '-');
        let mut num = || -> Result<i64> { it.next().and_then(|x| x.parse().ok()).ok_or_else(bad) };
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
    fn format(&self, fmt: &str) -> std::result::Result<String, String> {
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
    }

    #[test]
    fn tojson_writes_python_json() {
        let env = Environment::new();
        let mut env = env;
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
