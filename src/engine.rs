//! The engine: the one place that matches on the device. It probes, picks a backend, loads
//! the model onto it and hands out the generic [`Session`] for that backend.

use crate::config::ModelConfig;
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::generate::{Chunk, GenerateOptions, Generation, Session};
use crate::gguf::{ByteSource, Gguf};
use crate::model::gemma3::Gemma3;
use crate::tokenizer::Tokenizer;

/// Which device to run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// WebGPU when an adapter exists and the model fits it, else the CPU.
    #[default]
    Auto,
    Cpu,
    Webgpu,
}

/// Options of [`Engine::load`].
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LoadOptions {
    pub device: Device,
    /// Context window to run with (default: [`crate::config::DEFAULT_N_CTX`], capped by the model's).
    pub n_ctx: Option<usize>,
}

/// What the engine runs and why.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineInfo {
    /// `cpu-simd` (wasm with simd128), `cpu-native`, later `webgpu`.
    pub backend: &'static str,
    /// Why this backend was chosen.
    pub reason: String,
    pub model: String,
    pub arch: String,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_layer: usize,
    pub n_embd: usize,
    /// Bytes of tensor data in the file.
    pub weight_bytes: u64,
    /// Milliseconds to build the tokenizer.
    pub tokenizer_ms: f64,
    /// Milliseconds to copy the weights into place.
    pub load_ms: f64,
}

/// A loaded model on its device.
pub enum Engine {
    Cpu(Session<CpuBackend>),
}

impl Engine {
    /// Parse, validate and load a GGUF model. `progress(loaded, total)` reports weight bytes.
    pub fn load(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Self, EngineInfo)> {
        let g = Gguf::read(src)?;
        let cfg = ModelConfig::from_gguf(&g, opts.n_ctx)?;
        let weight_bytes: u64 = g.tensors.iter().map(|t| t.n_bytes).sum();
        cfg.check_kv_cache(weight_bytes)?;
        let t0 = crate::clock::now_ms();
        let tok = Tokenizer::from_gguf(&g)?;
        let tokenizer_ms = crate::clock::now_ms() - t0;
        let reason = match opts.device {
            Device::Cpu => "device 'cpu' was asked for".to_string(),
            Device::Auto => "no GPU backend in this build yet: running on the CPU".to_string(),
            Device::Webgpu => {
                return Err(Error::InvalidArgument(
                    "device 'webgpu' is not available in this build: use 'auto' or 'cpu'".into(),
                ))
            }
        };
        let t1 = crate::clock::now_ms();
        let mut be = CpuBackend::new();
        let model = Gemma3::load(&mut be, &g, src, cfg.clone(), progress)?;
        let load_ms = crate::clock::now_ms() - t1;
        let info = EngineInfo {
            backend: if cfg!(all(target_arch = "wasm32", feature = "threads")) {
                "cpu-simd-threads"
            } else if cfg!(target_arch = "wasm32") {
                "cpu-simd"
            } else {
                "cpu-native"
            },
            reason,
            model: cfg.name.clone(),
            arch: cfg.arch.clone(),
            n_ctx: cfg.n_ctx,
            n_vocab: cfg.n_vocab,
            n_layer: cfg.n_layer,
            n_embd: cfg.n_embd,
            weight_bytes,
            tokenizer_ms,
            load_ms,
        };
        Ok((Engine::Cpu(Session::new(be, model, tok)?), info))
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        match self {
            Engine::Cpu(s) => &s.tok,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            Engine::Cpu(s) => &s.model.cfg,
        }
    }

    /// See [`Session::start`].
    pub async fn start(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
    ) -> Result<Generation> {
        match self {
            Engine::Cpu(s) => s.start(prompt_ids, opts, abort).await,
        }
    }

    /// See [`Session::begin`].
    pub fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation> {
        match self {
            Engine::Cpu(s) => s.begin(prompt_ids, opts),
        }
    }

    /// See [`Session::prefill_step`].
    pub async fn prefill_step(&mut self, g: &mut Generation) -> Result<bool> {
        match self {
            Engine::Cpu(s) => s.prefill_step(g).await,
        }
    }

    /// See [`Session::step`].
    pub async fn step(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Chunk>> {
        match self {
            Engine::Cpu(s) => s.step(g, abort).await,
        }
    }

    /// See [`Session::generate`].
    pub async fn generate(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
        on_chunk: &mut dyn FnMut(&Chunk),
    ) -> Result<Generation> {
        match self {
            Engine::Cpu(s) => s.generate(prompt_ids, opts, abort, on_chunk).await,
        }
    }

    /// See [`Session::logits_top_k`].
    pub async fn logits_top_k(
        &mut self,
        ids: &[u32],
        k: usize,
        first: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        match self {
            Engine::Cpu(s) => s.logits_top_k(ids, k, first).await,
        }
    }

    /// Forget the KV cache.
    pub fn reset(&mut self) {
        match self {
            Engine::Cpu(s) => s.reset(),
        }
    }
}
