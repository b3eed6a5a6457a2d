//! Text ⇄ token ids, built from the GGUF's own vocabulary with the `tokenizers` crate.
//!
//! Owns: the two constructions that give the same ids as the model's Hugging Face
//! `tokenizer.json` — SentencePiece-style (`tokenizer.ggml.model = llama`: merges derived from
//! the scores, byte fallback) and GPT-2 byte-level BPE (`gpt2`: merges in the file, the
//! pre-tokenizer chosen by `tokenizer.ggml.pre`) —, the rule that user text never turns into
//! control tokens, and streaming decode in whole UTF-8 characters. Does not own: chat
//! templates (chat/) or stop conditions (generate/).

mod bpe;
mod encoding;
mod from_gguf;
mod pipeline;
mod stream;
pub mod wordpiece;

pub use encoding::Tokenizer;
pub use pipeline::byte_chars;
pub use stream::StreamDecoder;
