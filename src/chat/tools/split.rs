//! The model's output split back into content and calls, as the pieces of a stream arrive
//! ([`CallSplitter`]) or whole ([`split_calls`]).

use super::form::{Call, CALL_CLOSE, CALL_OPEN};

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
}
