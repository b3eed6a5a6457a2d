//! GGUF: header, metadata and tensor index, read from any byte source.
//!
//! Owns: parsing and validating the container, and writing it (for the synthetic test
//! models). Does not own: what the metadata means (config.rs, tokenizer/) or where tensors
//! go (the backends). Every count, length, offset and size is checked against the bytes that
//! are really there before anything is allocated, so a truncated or hostile file is an
//! [`Error::Gguf`](crate::error::Error::Gguf), never a panic, a hang or an allocation beyond
//! a small multiple of the bytes really there (tests/bad_input.rs holds it to 3×).
//!
//! The files: `source.rs` (where the bytes come from), `header.rs` (the parse and the tensor
//! index), `value.rs` (metadata values), `types.rs` (ggml types), `writer.rs`, and `js.rs`
//! (the browser's byte sources).

mod header;
mod source;
mod types;
mod value;
mod writer;

pub use header::{Gguf, TensorInfo};
#[cfg(not(target_arch = "wasm32"))]
pub use source::FileSource;
pub use source::{now, read_end, ByteSource, ReadFuture, SyncReads};
pub use types::GgmlType;
pub use value::{Array, Strings, Value};
pub use writer::Writer;

#[cfg(target_arch = "wasm32")]
pub mod js;
