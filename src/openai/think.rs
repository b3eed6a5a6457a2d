//! The split of a reply that opens with `<think>…</think>` into reasoning and answer, piece
//! by piece as a stream brings it.

/// Splits a reply that opens with `<think>…</think>` into reasoning and answer as the pieces
/// of a stream arrive (the same states as the JS package's `ThinkSplitter`): `push` returns
/// `(reasoning, content)` for what is certain so far, `end` the rest.
#[derive(Clone, Debug, Default)]
pub struct ThinkSplitter {
    state: Phase,
    held: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Start,
    /// Just after `<think>`: leading newlines are dropped.
    ThinkOpen,
    Think,
    /// Just after `</think>`: leading newlines are dropped.
    AnswerOpen,
    Answer,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ThinkSplitter {
    pub fn push(&mut self, text: &str) -> (String, String) {
        let (mut reasoning, mut content) = (String::new(), String::new());
        self.held.push_str(text);
        loop {
            match self.state {
                Phase::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = Phase::ThinkOpen;
                        continue;
                    }
                    if OPEN.starts_with(t) {
                        break; // undecided
                    }
                    self.state = Phase::Answer;
                }
                Phase::ThinkOpen | Phase::AnswerOpen => {
                    self.held = self.held.trim_start_matches('\n').to_string();
                    if self.held.is_empty() {
                        break;
                    }
                    self.state = if self.state == Phase::ThinkOpen {
                        Phase::Think
                    } else {
                        Phase::Answer
                    };
                }
                Phase::Think => {
                    if let Some(end) = self.held.find(CLOSE) {
                        let r = &self.held[..end];
                        reasoning.push_str(r.strip_suffix('\n').unwrap_or(r));
                        self.held = self.held[end + CLOSE.len()..].to_string();
                        self.state = Phase::AnswerOpen;
                        continue;
                    }
                    // Keep back what could be the start of `</think>` (and a newline before it).
                    let h = &self.held;
                    let mut keep = (1..CLOSE.len().min(h.len() + 1))
                        .rev()
                        .find(|&k| {
                            h.is_char_boundary(h.len() - k) && CLOSE.starts_with(&h[h.len() - k..])
                        })
                        .unwrap_or(0);
                    if h[..h.len() - keep].ends_with('\n') {
                        keep += 1;
                    }
                    let cut = h.len() - keep;
                    reasoning.push_str(&h[..cut]);
                    self.held = h[cut..].to_string();
                    break;
                }
                Phase::Answer => {
                    content.push_str(&self.held);
                    self.held.clear();
                    break;
                }
            }
        }
        (reasoning, content)
    }

    pub fn end(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.held);
        match self.state {
            // What was held back (a newline, a partial `</think>`) is reasoning after all.
            Phase::Think => (rest, String::new()),
            Phase::ThinkOpen => (rest.trim_start_matches('\n').to_string(), String::new()),
            Phase::AnswerOpen => (String::new(), String::new()),
            Phase::Start | Phase::Answer => (String::new(), rest),
        }
    }
}
