//! Tiny synthetic models (random weights, real architectures, a 400-token vocabulary), made
//! by our own code for fast golden tests natively and in wasm: a Gemma 3 ([`tiny_gemma3`]) and
//! one of each Llama-block family ([`tiny_decoder`]: Llama with its own LM head and Llama 3
//! frequency factors, Qwen2 with q/k/v biases, Qwen3 with QK-norm and a head size apart from
//! n_embd / n_head). Deterministic on every target: the weights come from
//! [`crate::rng::Rng`], quantized by candle into the types asked for.
//!
//! - `tiny.rs`: the tiny models and their dimensions;
//! - `vocab.rs`: their vocabularies (SentencePiece, GPT-2 byte-level) and ChatML template;
//! - `like.rs`: random weights in a real model's shape, for speed measurements where its
//!   file cannot go ([`shaped_like`], [`qwen25_05b_like`]);
//! - `weights.rs`: random weights, drawn and quantized.

mod like;
mod tiny;
mod vocab;
mod weights;

pub use crate::tokenizer::byte_chars;
pub use like::{q4_k_m_type, qwen25_05b_like, shaped_like, SHAPED_MAX_BYTES};
pub use tiny::{
    decoder_dims, tiny_decoder, tiny_decoder_with, tiny_gemma3, Quants, HEAD_DIM, N_CTX, N_EMBD,
    N_FF, N_HEAD, N_HEAD_KV, N_LAYER, SLIDING_WINDOW,
};
pub use vocab::{byte_level_vocab, vocab, CHATML_TEMPLATE};
