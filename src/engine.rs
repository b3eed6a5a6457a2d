//! The engine: the one place that matches on the device. It probes, picks a backend, loads
//! the model onto it and hands out the generic [`Session`] for that backend.

use crate::config::ModelConfig;
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::generate::{Chunk, Event, GenerateOptions, Generation};
use crate::gguf::{ByteSource, Gguf, SyncReads};
use crate::model::Model;
use crate::session::Session;
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
    /// With `auto`: the caller already looked for a GPU in this context and found none, and
    /// why (the package's check in the page); the engine does not look again.
    pub no_gpu: Option<String>,
}

/// What the engine runs and why.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineInfo {
    /// `webgpu`, `cpu-simd` (wasm with simd128), `cpu-simd-threads`, `cpu-native`.
    pub backend: &'static str,
    /// Why this backend was chosen.
    pub reason: String,
    /// The CPU kernels' instruction set: `relaxed-simd` (the relaxed wasm builds: int8 ONNX
    /// products on 7-bit activations), `simd128`, natively `avx2` or `portable`.
    pub simd: &'static str,
    /// The engine's version (a saved prompt prefix is used only by the same one).
    pub version: &'static str,
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
    /// The model family (`gemma3`, `llama`, `qwen2`, `qwen3`).
    pub family: crate::config::Family,
    /// Tensors per type in the file (`{"Q4_1": 210, "Q8_0": 1, "F32": 61}`): the quant mix.
    pub quants: std::collections::BTreeMap<String, usize>,
    /// Where chat prompts get their format: `file` (its `tokenizer.chat_template`),
    /// `builtin-gemma`, or none.
    pub chat_template: Option<crate::chat::TemplateSource>,
}

/// Usable wasm memory: 4 GiB less room for the code, tokenizer and activations.
const WASM_MEMORY_BUDGET: u64 = (4 << 30) - (384 << 20);

/// The bytes the CPU backend holds for this model: its weights as it keeps them (int8 with
/// f32 scales, 4-bit codes packed) plus the KV cache at `cfg.n_ctx`. The device check compares
/// it with the memory there is.
pub fn cpu_resident_bytes(g: &Gguf, cfg: &ModelConfig) -> u64 {
    g.tensors
        .iter()
        .map(|t| cpu_tensor_bytes(t, cfg))
        .sum::<u64>()
        .saturating_add(cfg.kv_cache_bytes())
}

/// The weight bytes a decoder's step reads on the CPU backend: every tensor as it is held
/// there ([`cpu_resident_bytes`]), but for token embeddings apart from the LM head, of which
/// a step reads one row.
pub fn cpu_step_bytes(g: &Gguf, cfg: &ModelConfig) -> u64 {
    g.tensors
        .iter()
        .filter(|t| t.name != "token_embd.weight" || is_head(&t.name, cfg))
        .map(|t| cpu_tensor_bytes(t, cfg))
        .sum()
}

/// The LM head: `output.weight`, or the embeddings where they are tied to it.
fn is_head(name: &str, cfg: &ModelConfig) -> bool {
    name == "output.weight"
        || (name == "token_embd.weight"
            && (!cfg.untied_output || cfg.family == crate::config::Family::Gemma3)
            && cfg.family != crate::config::Family::Bert)
}

fn cpu_tensor_bytes(t: &crate::gguf::TensorInfo, cfg: &ModelConfig) -> u64 {
    let n = t.dims.iter().product::<u64>();
    let cols = t.dims.first().copied().unwrap_or(0);
    crate::cpu::resident_bytes(t.ty, cols, n, is_head(&t.name, cfg))
}

/// A typed error before any weight is read when the CPU backend would need more than
/// `budget` bytes (wasm: its 4 GiB address space) for the weights as it holds them plus the
/// KV cache.
pub fn check_fits(g: &Gguf, cfg: &ModelConfig, budget: Option<u64>) -> Result<()> {
    let Some(budget) = budget else {
        return Ok(());
    };
    let resident = cpu_resident_bytes(g, cfg);
    if resident > budget {
        return Err(Error::ModelTooLarge {
            need_mb: resident >> 20,
            limit_mb: budget >> 20,
            what: "of wasm memory for its weights and KV cache",
        });
    }
    Ok(())
}

/// What the GPU did so far (see [`Engine::gpu_counters`]).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct GpuCounters {
    pub encode_ms: f64,
    pub submits: u64,
    pub bytes_read: u64,
    pub buffers_created: u64,
    pub bind_groups_created: u64,
    pub dispatches: u64,
}

/// A loaded model on its device. While it runs on the GPU it keeps the model file at hand:
/// if the device is lost or fails mid-generation, it loads the weights onto the CPU and the
/// same generation continues there (every id so far is run again), reporting the switch.
pub struct Engine {
    run: Run,
    info: EngineInfo,
    /// The model file, kept while the engine runs on the GPU (the CPU loads from it).
    source: Option<Box<dyn ByteSource>>,
    /// Why the engine moved to the CPU, until [`Engine::take_switch`] takes it.
    switched: Option<String>,
}

/// The session, on whichever device holds it. One per page or process: the size
/// difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Run {
    Cpu(Session<CpuBackend>),
    #[cfg(feature = "gpu")]
    Gpu(Session<crate::gpu::backend::GpuBackend>),
}

/// `$body` with `$s` bound to the session, whichever device holds it.
macro_rules! on_session {
    ($run:expr, $s:ident => $body:expr) => {
        match $run {
            Run::Cpu($s) => $body,
            #[cfg(feature = "gpu")]
            Run::Gpu($s) => $body,
        }
    };
}

/// Run `$call` (with `$s` bound to the session); when the GPU fails, move to the CPU
/// (`$on_switch` adjusts the caller's state) and run it again there.
macro_rules! recovering {
    ($self:ident, $s:ident => $call:expr $(, $on_switch:expr)?) => {
        loop {
            match on_session!(&mut $self.run, $s => $call) {
                Err(Error::Device(why)) if $self.on_gpu() => {
                    $self.fall_back(why)?;
                    $($on_switch;)?
                }
                r => break r,
            }
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
        crate::gguf::now(Self::load_cpu(&SyncReads(src), opts, reason, progress))?.map(Self::wrap)
    }

    /// Parse, validate and load a GGUF model on the device `opts.device` asks for: `auto`
    /// takes a GPU when there is an adapter that is not a software renderer and the model
    /// fits it, else the CPU; `webgpu` takes any adapter or fails. The decision is
    /// [`choose`] (and [`after_gpu_failure`]); [`EngineInfo::reason`] says why. On the GPU
    /// the engine keeps `src` to fall back to the CPU.
    pub async fn load_async(
        src: Box<dyn ByteSource>,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Self, EngineInfo)> {
        #[cfg(feature = "gpu")]
        let (probe, backend) = if opts.device == Device::Cpu {
            (GpuProbe::NotAsked, None)
        } else if let (Device::Auto, Some(why)) = (opts.device, &opts.no_gpu) {
            (GpuProbe::Declined(why.clone()), None)
        } else {
            use crate::gpu::backend::GpuBackend;
            match GpuBackend::new(&crate::gpu::GpuOptions::default()).await {
                Ok(Some(be)) => {
                    let info = &be.gpu.info;
                    let probe = GpuProbe::Adapter {
                        name: format!("{} ({:?})", info.name, info.backend),
                        software: info.device_type == wgpu::DeviceType::Cpu,
                    };
                    (probe, Some(be))
                }
                Ok(None) => (GpuProbe::NoAdapter, None),
                Err(e) => (GpuProbe::Failed(e.to_string()), None),
            }
        };
        #[cfg(not(feature = "gpu"))]
        let probe = GpuProbe::NotBuilt;
        match choose(opts.device, &probe)? {
            Choice::Cpu(reason) => Self::load_cpu(src.as_ref(), opts, reason, progress)
                .await
                .map(Self::wrap),
            #[cfg(feature = "gpu")]
            Choice::Gpu(name) => {
                let Some(be) = backend else {
                    return Err(Error::Backend("the GPU adapter went away".into()));
                };
                match Self::load_gpu(src.as_ref(), opts, be, name, progress).await {
                    Ok((run, info)) => {
                        let mut e = Self::wrap((run, info));
                        src.release();
                        e.0.source = Some(src);
                        Ok(e)
                    }
                    Err(e) => match after_gpu_failure(opts.device, &e) {
                        Some(reason) => Self::load_cpu(src.as_ref(), opts, reason, progress)
                            .await
                            .map(Self::wrap),
                        None => Err(e),
                    },
                }
            }
            #[cfg(not(feature = "gpu"))]
            Choice::Gpu(_) => Err(Error::Backend("no GPU backend in this build".into())),
        }
    }

    fn wrap((run, info): (Run, EngineInfo)) -> (Self, EngineInfo) {
        let e = Engine {
            run,
            info: info.clone(),
            source: None,
            switched: None,
        };
        (e, info)
    }

    /// What the engine runs on now, and why.
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Why the engine moved from the GPU to the CPU, once (then `None`).
    pub fn take_switch(&mut self) -> Option<String> {
        self.switched.take()
    }

    /// Replace the model file kept for a fall-back to the CPU (the browser keeps a cached
    /// `Blob` instead of the downloaded bytes). Nothing is kept on the CPU.
    pub fn keep_source(&mut self, src: Box<dyn ByteSource>) {
        if self.on_gpu() {
            src.release();
            self.source = Some(src);
        }
    }

    /// The GPU device while the engine runs there (tests destroy it).
    #[cfg(feature = "gpu")]
    pub fn gpu(&self) -> Option<&crate::gpu::Gpu> {
        match &self.run {
            Run::Gpu(s) => Some(&s.be.gpu),
            Run::Cpu(_) => None,
        }
    }

    /// GPU counters while the engine runs there: milliseconds spent recording commands,
    /// submissions, bytes read back, buffers and bind groups created, dispatches recorded
    /// (benchmarks report them per step).
    #[cfg(feature = "gpu")]
    pub fn gpu_counters(&self) -> Option<GpuCounters> {
        use std::sync::atomic::Ordering::Relaxed;
        match &self.run {
            Run::Gpu(s) => Some(GpuCounters {
                encode_ms: s.be.encode_ms(),
                submits: s.be.gpu.submits.load(Relaxed),
                bytes_read: s.be.gpu.bytes_read.load(Relaxed),
                buffers_created: s.be.gpu.buffers_created.load(Relaxed),
                bind_groups_created: s.be.bind_groups_created(),
                dispatches: s.be.dispatches(),
            }),
            Run::Cpu(_) => None,
        }
    }

    fn on_gpu(&self) -> bool {
        !matches!(self.run, Run::Cpu(_))
    }

    /// The GPU failed (`why`): load the weights onto the CPU from the kept file and continue
    /// there. The caller replays its generation (the new cache is empty).
    fn fall_back(&mut self, why: String) -> Result<()> {
        let t0 = crate::clock::now_ms();
        // The file stays kept until the CPU session stands: a failed read can be retried.
        let session = {
            let src = self.source.as_deref().ok_or_else(|| {
                Error::Device(format!(
                    "{why}; the model file is not at hand to continue on the CPU"
                ))
            })?;
            let cfg = self.config().clone();
            let g = Gguf::read(src)?;
            let tok = Tokenizer::from_gguf(&g)?;
            let mut be = CpuBackend::new();
            let model = Model::load(&mut be, &g, src, cfg, &mut |_, _| {})?;
            Session::new(be, model, tok)?
        };
        self.source = None;
        // The GPU session (and its device) goes here.
        self.run = Run::Cpu(session);
        let reason = format!("the GPU failed ({why}): continued on the CPU");
        self.info.backend = cpu_backend_name();
        self.info.reason = reason.clone();
        self.info.load_ms = crate::clock::now_ms() - t0;
        self.switched = Some(reason);
        Ok(())
    }

    /// Load onto the CPU, awaiting each weight read ([`ByteSource::read_at_async`]).
    async fn load_cpu(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        reason: String,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Run, EngineInfo)> {
        let (g, cfg, tok, mut info) = Self::prepare(src, opts)?;
        let t1 = crate::clock::now_ms();
        let mut be = CpuBackend::new();
        let model = Model::load_async(&mut be, &g, src, cfg, progress).await?;
        info.load_ms = crate::clock::now_ms() - t1;
        info.reason = reason;
        info.backend = cpu_backend_name();
        Ok((Run::Cpu(Session::new(be, model, tok)?), info))
    }

    /// Load onto the GPU; an out-of-memory or validation error of the upload, or a lost
    /// device, is an [`Error::Device`] (`auto` then takes the CPU).
    #[cfg(feature = "gpu")]
    async fn load_gpu(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        mut be: crate::gpu::backend::GpuBackend,
        name: String,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Run, EngineInfo)> {
        let (g, cfg, tok, mut info) = Self::prepare(src, opts)?;
        let t1 = crate::clock::now_ms();
        let device = be.gpu.device.clone();
        let (session, scoped) = crate::gpu::scoped(&device, move || {
            let model = Model::load(&mut be, &g, src, cfg, progress)?;
            Session::new(be, model, tok)
        });
        let mut session = session?;
        session.be.gpu.settle(scoped).await?;
        session.warm_up().await?;
        info.load_ms = crate::clock::now_ms() - t1;
        info.reason = format!("WebGPU adapter {name}");
        info.backend = "webgpu";
        Ok((Run::Gpu(session), info))
    }

    /// Header, config, the KV-cache budget and the tokenizer: everything but the weights.
    fn prepare(
        src: &dyn ByteSource,
        opts: &LoadOptions,
    ) -> Result<(Gguf, ModelConfig, Tokenizer, EngineInfo)> {
        let mut g = Gguf::read(src)?;
        let cfg = ModelConfig::from_gguf(&g, opts.n_ctx)?;
        let weight_bytes: u64 = g.tensors.iter().map(|t| t.n_bytes).sum();
        cfg.check_kv_cache(weight_bytes)?;
        check_fits(
            &g,
            &cfg,
            cfg!(target_arch = "wasm32").then_some(WASM_MEMORY_BUDGET),
        )?;
        let t0 = crate::clock::now_ms();
        let tok = Tokenizer::from_gguf(&g)?;
        let tokenizer_ms = crate::clock::now_ms() - t0;
        Tokenizer::drop_vocabulary(&mut g);
        let mut quants = std::collections::BTreeMap::new();
        for t in &g.tensors {
            *quants.entry(t.ty.name().to_string()).or_insert(0) += 1;
        }
        let info = EngineInfo {
            backend: "",
            reason: String::new(),
            simd: crate::cpu::Isa::best().name(),
            version: crate::prefix::ENGINE_VERSION,
            model: cfg.name.clone(),
            arch: cfg.arch.clone(),
            n_ctx: cfg.n_ctx,
            n_vocab: cfg.n_vocab,
            n_layer: cfg.n_layer,
            n_embd: cfg.n_embd,
            weight_bytes,
            tokenizer_ms,
            load_ms: 0.0,
            family: cfg.family,
            quants,
            chat_template: crate::chat::template_source(&tok),
        };
        Ok((g, cfg, tok, info))
    }

    pub fn tokenizer(&self) -> &std::sync::Arc<Tokenizer> {
        on_session!(&self.run, s => &s.tok)
    }

    pub fn config(&self) -> &ModelConfig {
        on_session!(&self.run, s => s.model.cfg())
    }

    /// See [`Session::start`].
    pub async fn start(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
    ) -> Result<Generation> {
        crate::generate::start(self, prompt_ids, opts, abort).await
    }

    /// See [`Session::begin`].
    pub fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation> {
        on_session!(&mut self.run, s => s.begin(prompt_ids, opts))
    }

    /// See [`Session::next`]: the generation loop's next turn. If the GPU fails, the
    /// generation continues on the CPU: the chunk of the failed step comes first, then the
    /// ids so far are run again there, a chunk a turn.
    pub async fn next(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Event>> {
        recovering!(self, s => s.next(g, abort).await, g.replay())
    }

    /// See [`Session::prefill_step`] (a turn of [`Engine::next`]); recovering as it does.
    pub async fn prefill_step(&mut self, g: &mut Generation) -> Result<bool> {
        recovering!(self, s => s.prefill_step(g).await, g.replay())
    }

    /// See [`Session::step`] (a turn of [`Engine::next`]); recovering as it does.
    pub async fn step(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Chunk>> {
        recovering!(self, s => s.step(g, abort).await, g.replay())
    }

    /// Generate to the end, calling `on_chunk` for every piece (see [`Session::generate`]).
    pub async fn generate(
        &mut self,
        prompt_ids: Vec<u32>,
        opts: &GenerateOptions,
        abort: &dyn Fn() -> bool,
        on_chunk: &mut dyn FnMut(&Chunk),
    ) -> Result<Generation> {
        crate::generate::generate(self, prompt_ids, opts, abort, on_chunk).await
    }

    /// See [`Session::logits_top_k`].
    pub async fn logits_top_k(
        &mut self,
        ids: &[u32],
        k: usize,
        first: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        recovering!(self, s => s.logits_top_k(ids, k, first).await)
    }

    /// See [`Session::logits_from`]: teacher-forced after what the KV cache holds.
    pub async fn logits_from(
        &mut self,
        ids: &[u32],
        k: usize,
        first: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        recovering!(self, s => s.logits_from(ids, k, first).await)
    }

    /// One vector per text from an encoder model (see [`crate::embed`]). If the GPU fails,
    /// the call runs again on the CPU.
    pub async fn embed(
        &mut self,
        texts: &[&str],
        opts: &crate::embed::EmbedOptions,
    ) -> Result<crate::embed::Embeddings> {
        recovering!(self, s => s.embed(texts, opts).await)
    }

    /// Labels and scores per text (see [`crate::classify`]). If the GPU fails, the call runs
    /// again on the CPU.
    pub async fn classify(
        &mut self,
        texts: &[&str],
        labels: &crate::classify::Labels,
        opts: &crate::classify::ClassifyOptions,
    ) -> Result<crate::classify::Classified> {
        recovering!(self, s => s.classify(texts, labels, opts).await)
    }

    /// A sequence-classification model's head outputs per text, before softmax (see
    /// [`Session::head_logits`]).
    pub async fn head_logits(
        &mut self,
        texts: &[&str],
    ) -> Result<(Vec<Vec<f64>>, crate::embed::EmbedUsage)> {
        recovering!(self, s => s.head_logits(texts).await)
    }

    /// Build the constraint engine's token trie now, so that the first constrained request
    /// does not wait for it (~1 s and ~120 MB for Gemma 3's vocabulary): the milliseconds.
    pub fn prepare_constraints(&self) -> Result<f64> {
        on_session!(&self.run, s => s.prepare_constraints())
    }

    /// Forget the KV cache.
    pub fn reset(&mut self) {
        on_session!(&mut self.run, s => s.reset())
    }

    /// How many of `ids` the KV cache holds already.
    pub fn cached_common(&self, ids: &[u32]) -> usize {
        on_session!(&self.run, s => s.cached_common(ids))
    }

    /// Who may use a snapshot this engine makes: the model named `model`, this backend.
    fn identity<'a>(&self, model: &'a str) -> crate::prefix::Identity<'a> {
        crate::prefix::Identity {
            model,
            backend: self.info.backend,
        }
    }

    /// Put a saved prefix (see [`crate::prefix`]) into the KV cache for a prompt of
    /// `prompt_ids`, which must start with it and go on past it: the number of ids restored.
    /// A snapshot of another model (`model`: its sha256), engine or backend, or a damaged one,
    /// is a [`Error::Snapshot`] and the cache is left empty.
    pub fn restore_prefix(
        &mut self,
        bytes: &[u8],
        model: &str,
        prompt_ids: &[u32],
    ) -> Result<usize> {
        let p = crate::prefix::Prefix::from_bytes(bytes, self.identity(model))?;
        if p.ids.len() >= prompt_ids.len() || !prompt_ids.starts_with(&p.ids) {
            return Err(Error::Snapshot(format!(
                "its {} ids are not the start of this prompt of {}",
                p.ids.len(),
                prompt_ids.len()
            )));
        }
        on_session!(&mut self.run, s => s.restore_prefix(&p))?;
        Ok(p.ids.len())
    }

    /// A snapshot of the KV cache as it is, as bytes for [`Engine::restore_prefix`].
    pub async fn save_prefix(&mut self, model: &str) -> Result<Vec<u8>> {
        let p = on_session!(&mut self.run, s => s.save_prefix().await)?;
        Ok(p.to_bytes(self.identity(model)))
    }

    /// The snapshot `g` made where [`GenerateOptions::save_prefix_at`] asked, as bytes for
    /// [`Engine::restore_prefix`] (None: not made, e.g. the prefix came from the cache).
    pub fn take_prefix(&self, g: &mut Generation, model: &str) -> Option<Vec<u8>> {
        g.take_prefix().map(|p| self.prefix_bytes(&p, model))
    }

    /// A snapshot as bytes for [`Engine::restore_prefix`]: `p` with who may use it (`model`:
    /// its sha256, this engine and backend).
    pub fn prefix_bytes(&self, p: &crate::prefix::Prefix, model: &str) -> Vec<u8> {
        p.to_bytes(self.identity(model))
    }

    /// A second engine on the same weights with its own KV cache (a server slot), as a
    /// [`Fork`] that can move to another thread. On the CPU only: a GPU engine's weights live
    /// on its device (load another engine there instead).
    pub fn fork(&self) -> Result<Fork> {
        match &self.run {
            Run::Cpu(s) => Ok(Fork {
                session: s.fork()?,
                info: self.info.clone(),
            }),
            #[cfg(feature = "gpu")]
            Run::Gpu(_) => Err(Error::InvalidArgument(
                "an engine on the GPU cannot share its weights: load another one".into(),
            )),
        }
    }
}

impl crate::generate::Steps for Engine {
    fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation> {
        Engine::begin(self, prompt_ids, opts)
    }
    async fn next(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Event>> {
        Engine::next(self, g, abort).await
    }
}

/// A CPU engine's second session on the same weights ([`Engine::fork`]): it may move to
/// another thread (an engine on the GPU may not), where [`Fork::into_engine`] makes it one.
pub struct Fork {
    session: Session<CpuBackend>,
    info: EngineInfo,
}

impl Fork {
    pub fn into_engine(self) -> Engine {
        Engine {
            run: Run::Cpu(self.session),
            info: self.info,
            source: None,
            switched: None,
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
const _: () = {
    const fn send<T: Send>() {}
    send::<Fork>()
};

/// What the device check found about a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuProbe {
    /// `device: 'cpu'`: not looked for.
    NotAsked,
    /// A build without the GPU backend.
    NotBuilt,
    NoAdapter,
    /// Opening the adapter or its device failed.
    Failed(String),
    /// The caller looked already and found no GPU to take, for this reason.
    Declined(String),
    Adapter {
        name: String,
        software: bool,
    },
}

/// Where to load, with the reason the engine reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Cpu(String),
    /// On the adapter named so.
    Gpu(String),
}

/// The device decision, pure: every reason the engine gives for its backend is written
/// here (and in [`after_gpu_failure`]).
pub fn choose(device: Device, probe: &GpuProbe) -> Result<Choice> {
    use GpuProbe as P;
    Ok(match (device, probe) {
        (Device::Cpu, _) => Choice::Cpu("device 'cpu' was asked for".into()),
        (Device::Webgpu, P::NotBuilt) => {
            return Err(Error::InvalidArgument(
                "device 'webgpu' is not available in this build: use 'auto' or 'cpu'".into(),
            ))
        }
        (Device::Webgpu, P::NoAdapter | P::NotAsked | P::Declined(_)) => {
            return Err(Error::Backend(
                "device 'webgpu' was asked for, but there is no WebGPU adapter".into(),
            ))
        }
        (Device::Webgpu, P::Failed(e)) => {
            return Err(Error::Backend(format!(
                "device 'webgpu' was asked for, but the GPU failed to open: {e}"
            )))
        }
        (Device::Webgpu, P::Adapter { name, .. }) => Choice::Gpu(name.clone()),
        (
            Device::Auto,
            P::Adapter {
                name,
                software: false,
            },
        ) => Choice::Gpu(name.clone()),
        (
            Device::Auto,
            P::Adapter {
                name,
                software: true,
            },
        ) => Choice::Cpu(format!(
            "the only GPU adapter, {name}, is a software renderer: the CPU engine is faster"
        )),
        (Device::Auto, P::NoAdapter) => Choice::Cpu("no WebGPU adapter: running on the CPU".into()),
        (Device::Auto, P::Failed(e)) => {
            Choice::Cpu(format!("the GPU failed to open ({e}): running on the CPU"))
        }
        (Device::Auto, P::NotBuilt | P::NotAsked) => {
            Choice::Cpu("no GPU backend in this build: running on the CPU".into())
        }
        (Device::Auto, P::Declined(why)) => Choice::Cpu(format!("{why}: running on the CPU")),
    })
}

/// After the model failed to load on the GPU with `e`: the reason to load it on the CPU
/// instead, or `None` to fail. What the GPU cannot do (a lost device, out of memory, a limit,
/// a weight type its kernels lack) leaves `auto` the CPU; a bad file fails there too, and
/// `webgpu` asked for the GPU only.
pub fn after_gpu_failure(device: Device, e: &Error) -> Option<String> {
    let gpu_side = matches!(
        e,
        Error::Device(_) | Error::Backend(_) | Error::UnsupportedTensorType { .. }
    );
    (device == Device::Auto && gpu_side)
        .then(|| format!("the model did not load on the GPU ({e}): running on the CPU"))
}

fn cpu_backend_name() -> &'static str {
    if cfg!(all(target_arch = "wasm32", feature = "threads")) {
        "cpu-simd-threads"
    } else if cfg!(target_arch = "wasm32") {
        "cpu-simd"
    } else {
        "cpu-native"
    }
}

#[cfg(test)]
mod choose_tests {
    use super::*;

    fn gpu(software: bool) -> GpuProbe {
        GpuProbe::Adapter {
            name: "Adapter (Vulkan)".into(),
            software,
        }
    }

    #[test]
    fn every_device_and_probe_has_one_answer() {
        let probes = [
            GpuProbe::NotAsked,
            GpuProbe::NotBuilt,
            GpuProbe::NoAdapter,
            GpuProbe::Failed("lost".into()),
            GpuProbe::Declined("no WebGPU adapter".into()),
            gpu(false),
            gpu(true),
        ];
        let want = |d: Device, p: &GpuProbe| -> std::result::Result<&str, &str> {
            match (d, p) {
                (Device::Cpu, _) => Ok("cpu: device 'cpu' was asked for"),
                (
                    Device::Auto,
                    GpuProbe::Adapter {
                        software: false, ..
                    },
                )
                | (Device::Webgpu, GpuProbe::Adapter { .. }) => Ok("gpu"),
                (Device::Auto, GpuProbe::Adapter { software: true, .. }) => {
                    Ok("cpu: the only GPU adapter")
                }
                (Device::Auto, GpuProbe::NoAdapter) => Ok("cpu: no WebGPU adapter"),
                (Device::Auto, GpuProbe::Failed(_)) => Ok("cpu: the GPU failed to open (lost)"),
                (Device::Auto, GpuProbe::Declined(_)) => Ok("cpu: no WebGPU adapter: running"),
                (Device::Auto, _) => Ok("cpu: no GPU backend in this build"),
                (Device::Webgpu, GpuProbe::NotBuilt) => Err("not available in this build"),
                (Device::Webgpu, GpuProbe::Failed(_)) => Err("failed to open: lost"),
                (Device::Webgpu, _) => Err("no WebGPU adapter"),
            }
        };
        for d in [Device::Auto, Device::Cpu, Device::Webgpu] {
            for p in &probes {
                let got = choose(d, p);
                match (want(d, p), got) {
                    (Ok("gpu"), Ok(Choice::Gpu(name))) => assert_eq!(name, "Adapter (Vulkan)"),
                    (Ok(w), Ok(Choice::Cpu(reason))) => {
                        assert!(
                            w.starts_with("cpu: ") && reason.starts_with(&w[5..]),
                            "{d:?} {p:?}: {reason}"
                        )
                    }
                    (Err(w), Err(e)) => assert!(e.to_string().contains(w), "{d:?} {p:?}: {e}"),
                    (w, g) => panic!("{d:?} {p:?}: want {w:?}, got {g:?}"),
                }
            }
        }
    }

    #[test]
    fn a_gpu_side_failure_falls_back_only_on_auto() {
        let lost = Error::Device("lost".into());
        assert!(after_gpu_failure(Device::Auto, &lost)
            .unwrap()
            .starts_with("the model did not load on the GPU"));
        assert_eq!(after_gpu_failure(Device::Webgpu, &lost), None);
        let bad = Error::Model("truncated".into());
        assert_eq!(after_gpu_failure(Device::Auto, &bad), None);
    }
}
