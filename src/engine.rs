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
    /// `webgpu`, `cpu-simd` (wasm with simd128), `cpu-simd-threads`, `cpu-native`.
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

/// A loaded model on its device. One per page or process: the size difference between the
/// variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Engine {
    Cpu(Session<CpuBackend>),
    #[cfg(feature = "gpu")]
    Gpu(Session<crate::gpu::backend::GpuBackend>),
}

/// `$body` with `$s` bound to the session, whichever device holds it.
macro_rules! on_session {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            Engine::Cpu($s) => $body,
            #[cfg(feature = "gpu")]
            Engine::Gpu($s) => $body,
        }
    };
}

impl Engine {
    /// Parse, validate and load a GGUF model on the CPU (`device: 'webgpu'` needs
    /// [`Engine::load_async`]). `progress(loaded, total)` reports weight bytes.
    pub fn load(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Self, EngineInfo)> {
        let reason = match opts.device {
            Device::Cpu => "device 'cpu' was asked for".to_string(),
            Device::Auto => "loaded without probing for a GPU: running on the CPU".to_string(),
            Device::Webgpu => {
                return Err(Error::InvalidArgument(
                    "device 'webgpu' needs the asynchronous load (Engine::load_async)".into(),
                ))
            }
        };
        Self::load_cpu(src, opts, reason, progress)
    }

    /// Parse, validate and load a GGUF model on the device `opts.device` asks for: `auto`
    /// takes a GPU when there is an adapter that is not a software renderer, else the CPU;
    /// `webgpu` takes any adapter or fails. [`EngineInfo::reason`] says why.
    pub async fn load_async(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Self, EngineInfo)> {
        #[cfg(feature = "gpu")]
        if opts.device != Device::Cpu {
            use crate::gpu::backend::GpuBackend;
            use crate::gpu::GpuOptions;
            let probe = GpuBackend::new(&GpuOptions::default()).await;
            let reason = match probe {
                Ok(Some(be)) => {
                    let info = &be.gpu.info;
                    let software = info.device_type == wgpu::DeviceType::Cpu;
                    let name = format!("{} ({:?})", info.name, info.backend);
                    if opts.device == Device::Webgpu || !software {
                        return Self::load_gpu(src, opts, be, name, progress);
                    }
                    format!("the only GPU adapter, {name}, is a software renderer: the CPU engine is faster")
                }
                Ok(None) if opts.device == Device::Webgpu => {
                    return Err(Error::Backend(
                        "device 'webgpu' was asked for, but there is no WebGPU adapter".into(),
                    ))
                }
                Ok(None) => "no WebGPU adapter: running on the CPU".to_string(),
                Err(e) if opts.device == Device::Webgpu => return Err(e),
                Err(e) => format!("the GPU failed to open ({e}): running on the CPU"),
            };
            return Self::load_cpu(src, opts, reason, progress);
        }
        let reason = match opts.device {
            Device::Cpu => "device 'cpu' was asked for".to_string(),
            Device::Auto => "no GPU backend in this build: running on the CPU".to_string(),
            Device::Webgpu => {
                return Err(Error::InvalidArgument(
                    "device 'webgpu' is not available in this build: use 'auto' or 'cpu'".into(),
                ))
            }
        };
        Self::load_cpu(src, opts, reason, progress)
    }

    fn load_cpu(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        reason: String,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Self, EngineInfo)> {
        let (g, cfg, tok, mut info) = Self::prepare(src, opts)?;
        let t1 = crate::clock::now_ms();
        let mut be = CpuBackend::new();
        let model = Gemma3::load(&mut be, &g, src, cfg, progress)?;
        info.load_ms = crate::clock::now_ms() - t1;
        info.reason = reason;
        info.backend = if cfg!(all(target_arch = "wasm32", feature = "threads")) {
            "cpu-simd-threads"
        } else if cfg!(target_arch = "wasm32") {
            "cpu-simd"
        } else {
            "cpu-native"
        };
        Ok((Engine::Cpu(Session::new(be, model, tok)?), info))
    }

    #[cfg(feature = "gpu")]
    fn load_gpu(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        mut be: crate::gpu::backend::GpuBackend,
        name: String,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Self, EngineInfo)> {
        let (g, cfg, tok, mut info) = Self::prepare(src, opts)?;
        let t1 = crate::clock::now_ms();
        let model = Gemma3::load(&mut be, &g, src, cfg, progress)?;
        info.load_ms = crate::clock::now_ms() - t1;
        info.reason = format!("WebGPU adapter {name}");
        info.backend = "webgpu";
        Ok((Engine::Gpu(Session::new(be, model, tok)?), info))
    }

    /// Header, config, the KV-cache budget and the tokenizer: everything but the weights.
    fn prepare(
        src: &dyn ByteSource,
        opts: &LoadOptions,
    ) -> Result<(Gguf, ModelConfig, Tokenizer, EngineInfo)> {
        let g = Gguf::read(src)?;
        let cfg = ModelConfig::from_gguf(&g, opts.n_ctx)?;
        let weight_bytes: u64 = g.tensors.iter().map(|t| t.n_bytes).sum();
        cfg.check_kv_cache(weight_bytes)?;
        let t0 = crate::clock::now_ms();
        let tok = Tokenizer::from_gguf(&g)?;
        let tokenizer_ms = crate::clock::now_ms() - t0;
        let info = EngineInfo {
            backend: "",
            reason: String::new(),
            model: cfg.name.clone(),
            arch: cfg.arch.clone(),
            n_ctx: cfg.n_ctx,
            n_vocab: cfg.n_vocab,
            n_layer: cfg.n_layer,
            n_embd: cfg.n_embd,
            weight_bytes,
            tokenizer_ms,
            load_ms: 0.0,
        };
        Ok((g, cfg, tok, info))
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        on_session!(self, s => &s.tok)
    }

    pub fn config(&self) -> &ModelConfig {
        on_session!(self, s => &s.model.cfg)
    }

    /// See [`Session::start`].
    pub async fn start(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
    ) -> Result<Generation> {
        on_session!(self, s => s.start(prompt_ids, opts, abort).await)
    }

    /// See [`Session::begin`].
    pub fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation> {
        on_session!(self, s => s.begin(prompt_ids, opts))
    }

    /// See [`Session::prefill_step`].
    pub async fn prefill_step(&mut self, g: &mut Generation) -> Result<bool> {
        on_session!(self, s => s.prefill_step(g).await)
    }

    /// See [`Session::step`].
    pub async fn step(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Chunk>> {
        on_session!(self, s => s.step(g, abort).await)
    }

    /// See [`Session::generate`].
    pub async fn generate(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
        on_chunk: &mut dyn FnMut(&Chunk),
    ) -> Result<Generation> {
        on_session!(self, s => s.generate(prompt_ids, opts, abort, on_chunk).await)
    }

    /// See [`Session::logits_top_k`].
    pub async fn logits_top_k(
        &mut self,
        ids: &[u32],
        k: usize,
        first: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        on_session!(self, s => s.logits_top_k(ids, k, first).await)
    }

    /// Forget the KV cache.
    pub fn reset(&mut self) {
        on_session!(self, s => s.reset())
    }
}
