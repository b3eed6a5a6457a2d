//! The OpenAI shapes of chat and text completions: a request body → kerze's options, and a
//! generation → the response object or the stream's chunks. `kerze serve` speaks through this
//! module; the JS package's `pkg/openai.js` keeps the same shapes, and both are checked
//! against the same cases (`tests/fixtures/openai/`).
//!
//! Requests are checked field by field, so a wrong type or an unknown field is an
//! [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) that names the field (the
//! server answers 400 with it).
//!
//! - `fields.rs`: a request body's fields read with typed errors, `response_format` as a
//!   constraint;
//! - `request.rs`: the parsed requests (chat, completions, embeddings) and their parsers;
//! - `response.rs`: whole responses (chat, text, embeddings), `usage` and the error body;
//! - `stream.rs`: the chunks of a streamed chat completion;
//! - `think.rs`: the split of a reply into reasoning and answer as its pieces arrive.

mod fields;
mod request;
mod response;
mod stream;
mod think;

pub use fields::response_format;
pub use request::{
    parse_chat, parse_completion, parse_embeddings, ChatRequest, CompletionRequest,
    EmbeddingsRequest, EncodingFormat, GenerateRequest, Prompt, MAX_EMBEDDING_INPUTS,
};
pub use response::{
    base64, call_id, chat_completion, embeddings_response, finish_reason, text_completion,
    AssistantMessage, ChatChoice, ChatCompletion, EmbeddingObject, EmbeddingValue,
    EmbeddingsResponse, EmbeddingsUsage, ErrorBody, ErrorDetail, FunctionCall, Meta,
    PromptTokensDetails, TextChoice, TextCompletion, ToolCall, Usage,
};
pub use stream::{ChatChunk, ChatStream, ChunkChoice, Delta, DeltaCall, DeltaFunction};
pub use think::ThinkSplitter;
