//! The chunks of a streamed chat completion: the role, the pieces of reasoning, answer and
//! tool calls as they arrive, the finish reason and the usage.

use super::response::{call_id, finish_of, Meta, Usage};
use super::think::ThinkSplitter;
use crate::chat::tools::{CallSplitter, Part};
use crate::generate::FinishReason;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<&'static str>,
    pub logprobs: Option<()>,
    /// On the finish chunk: as [`ChatChoice::choice_scores`](super::response::ChatChoice::choice_scores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice_scores: Option<Vec<crate::score::ChoiceScore>>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaCall>>,
}

/// A piece of a streamed call: the first of each has its id, type and name (arguments
/// empty), the later ones more of its arguments.
#[derive(Clone, Debug, Serialize)]
pub struct DeltaCall {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: DeltaFunction,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeltaFunction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// The chunks of a streamed chat completion: a first one with the role, one per piece of
/// reasoning, answer or call, one with `finish_reason`, and with `include_usage` a last one
/// with `usage` and no choices.
pub struct ChatStream {
    meta: Meta,
    include_usage: bool,
    split: ThinkSplitter,
    /// With tool calls: the answer split into content and calls.
    calls: Option<CallSplitter>,
}

impl ChatStream {
    pub fn new(meta: Meta, include_usage: bool) -> Self {
        Self {
            meta,
            include_usage,
            split: ThinkSplitter::default(),
            calls: None,
        }
    }

    /// The reply may hold tool calls: they stream as `tool_calls` deltas.
    pub fn with_tool_calls(mut self, on: bool) -> Self {
        self.calls = on.then(CallSplitter::default);
        self
    }

    fn frame(
        &self,
        delta: Option<Delta>,
        finish: Option<&'static str>,
        usage: Option<Usage>,
    ) -> ChatChunk {
        ChatChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices: delta
                .map(|delta| ChunkChoice {
                    index: 0,
                    delta,
                    finish_reason: finish,
                    logprobs: None,
                    choice_scores: None,
                })
                .into_iter()
                .collect(),
            usage,
        }
    }

    /// The first chunk: `{role: 'assistant', content: ''}`.
    pub fn start(&self) -> ChatChunk {
        self.frame(
            Some(Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Delta::default()
            }),
            None,
            None,
        )
    }

    fn deltas(&mut self, (reasoning, content): (String, String), end: bool) -> Vec<ChatChunk> {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            let d = Delta {
                reasoning_content: Some(reasoning),
                ..Delta::default()
            };
            out.push(self.frame(Some(d), None, None));
        }
        let parts = match self.calls.as_mut() {
            Some(s) => {
                let mut p = s.push(&content);
                if end {
                    p.extend(s.end());
                }
                p
            }
            None => vec![Part::Content(content)],
        };
        for p in parts {
            let d = match p {
                Part::Content(c) if c.is_empty() => continue,
                Part::Content(c) => Delta {
                    content: Some(c),
                    ..Delta::default()
                },
                Part::Start { index, name } => Delta {
                    tool_calls: Some(vec![DeltaCall {
                        index,
                        id: Some(call_id(&self.meta, index)),
                        kind: Some("function"),
                        function: DeltaFunction {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    }]),
                    ..Delta::default()
                },
                Part::Arguments { index, text } => Delta {
                    tool_calls: Some(vec![DeltaCall {
                        index,
                        id: None,
                        kind: None,
                        function: DeltaFunction {
                            name: None,
                            arguments: text,
                        },
                    }]),
                    ..Delta::default()
                },
            };
            out.push(self.frame(Some(d), None, None));
        }
        out
    }

    /// The chunks for the next piece of generated text (none while a tag is undecided).
    pub fn push(&mut self, text: &str) -> Vec<ChatChunk> {
        let parts = self.split.push(text);
        self.deltas(parts, false)
    }

    /// The last chunks: what the splitter held back, the finish reason, the usage.
    pub fn finish(
        &mut self,
        finish: FinishReason,
        usage: &crate::generate::Usage,
    ) -> Vec<ChatChunk> {
        let parts = self.split.end();
        let mut out = self.deltas(parts, true);
        let calls = self.calls.as_ref().map_or(0, CallSplitter::calls);
        let mut end = self.frame(Some(Delta::default()), Some(finish_of(finish, calls)), None);
        if let Some(c) = end.choices.first_mut() {
            c.choice_scores.clone_from(&usage.choices);
        }
        out.push(end);
        if self.include_usage {
            out.push(self.frame(None, None, Some(usage.into())));
        }
        out
    }
}
