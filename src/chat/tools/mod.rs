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
//!
//! The files: `form.rs` (the call form), `request.rs` (the request's tools, checked),
//! `grammar.rs` (the constraint), `prompt.rs` (what the model is told), `split.rs` (the
//! output split into content and calls).

mod form;
mod grammar;
mod prompt;
mod request;
mod split;

pub use form::{call_text, Call, CALL_CLOSE, CALL_OPEN};
pub use prompt::{message_calls, plain_messages, template_renders_tools};
pub use request::{functions, Function, ToolChoice, Tools, MAX_TOOLS};
pub use split::{split_calls, CallSplitter, Part};
