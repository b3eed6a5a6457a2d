//! The file's Jinja chat template: its context built here, rendered by src/jinja/ (minijinja,
//! the way Hugging Face `transformers` renders it; natively linked, in the browser the
//! template module the package loads at the first such chat), then tokenized here with
//! control tokens parsed and no <bos> added (the template writes it).
//!
//! Message content is user text: before rendering, every control-token string inside it (as
//! the tokenizer would match it) is swapped for a private-use sentinel character, which no
//! template method touches; after rendering, the text between sentinels is tokenized with
//! control tokens and each sentinel's original string as plain user text.

use super::{ChatOptions, Content, Message};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use kerze_jinja::{Date, RenderError};

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
        Some(d) => Date::parse(d).map_err(Error::InvalidArgument)?,
        None => Date::today(),
    };
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
    let escaped = render_text(source, &serde_json::Value::Object(ctx), today).map_err(|e| {
        Error::InvalidArgument(match e {
            RenderError::Parse(e) => format!("the model's chat template does not parse: {e}"),
            RenderError::Refused(why) => {
                format!("the model's chat template refused these messages: {why}")
            }
            RenderError::Failed(e) => format!("the model's chat template failed: {e}"),
        })
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

/// The template's text: rendered here (the `jinja` feature, every native build), or in the
/// browser by the template module the package loads at the first chat (src/jinja/), through
/// the function it hands the engine's module (`setTemplateRenderer`, src/wasm.rs).
fn render_text(
    source: &str,
    context: &serde_json::Value,
    today: Date,
) -> std::result::Result<String, RenderError> {
    #[cfg(feature = "jinja")]
    return kerze_jinja::render(source, context, today);
    #[cfg(all(not(feature = "jinja"), target_arch = "wasm32"))]
    return crate::bridge::render_template(source, context, today);
    #[cfg(all(not(feature = "jinja"), not(target_arch = "wasm32")))]
    {
        let _ = (source, context, today);
        Err(RenderError::Failed(
            "this build renders no chat templates (built without the `jinja` feature)".into(),
        ))
    }
}
