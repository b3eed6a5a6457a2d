//! kerze: small quantized language models in the visitor's browser — WebGPU when the device
//! has it, SIMD CPU otherwise — from GGUF files.
//!
//! The crate owns: GGUF parsing and validation ([`gguf`]), model configs ([`config`]), the
//! tokenizer ([`tokenizer`]), sampling ([`sampler`]), the forward pass written once per
//! architecture ([`model`]) over the [`Backend`] trait, the CPU backend ([`cpu`]), generation
//! ([`generate`]) and the device choice ([`engine`]). It does not own: downloading in the
//! browser, caching, workers or UI (the JS package in `pkg/`), nor model files.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

#[cfg(all(target_arch = "wasm32", not(target_feature = "simd128")))]
compile_error!(
    "kerze for wasm32 needs SIMD: build with -C target-feature=+simd128 (set in .cargo/config.toml; \
     an exported RUSTFLAGS, even an empty one, replaces it)"
);

pub mod backend;
pub mod chat;
pub mod classify;
pub mod clock;
pub mod config;
pub mod constrain;
pub mod convert;
pub mod cpu;
pub mod embed;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod logits;
pub mod model;
pub mod onnx;
pub mod openai;
pub mod prefix;
pub mod quant;
pub mod rng;
pub mod sampler;
pub mod score;
pub mod session;
pub mod synth;
pub mod tokenizer;

#[cfg(not(target_arch = "wasm32"))]
pub mod catalog;
#[cfg(not(target_arch = "wasm32"))]
pub mod cli;
#[cfg(not(target_arch = "wasm32"))]
pub mod server;

/// The browser builds' bridges to the template and constraint modules (loaded on first use).
#[cfg(all(
    target_arch = "wasm32",
    any(not(feature = "jinja"), not(feature = "guide"))
))]
mod bridge;
#[cfg(target_arch = "wasm32")]
pub mod wasm;

pub use backend::{AttnParams, Backend};
pub use config::{Family, ModelConfig};
pub use engine::{Device, Engine, EngineInfo, GpuCounters, LoadOptions};
pub use error::{Error, Result};
pub use generate::{Chunk, Event, FinishReason, GenerateOptions, Generation, Usage};
pub use gguf::{ByteSource, GgmlType, Gguf, TensorInfo};
pub use sampler::{Sampler, SamplerConfig};
pub use session::Session;
pub use tokenizer::Tokenizer;
