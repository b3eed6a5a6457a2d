//! Loading: the header, config and tokenizer checked before any weight ([`Engine::load`],
//! [`Engine::load_async`]), then the weights onto the device [`choose`] picked, the CPU when
//! the GPU cannot take them.

#[cfg(feature = "gpu")]
use super::device::after_gpu_failure;
use super::device::{choose, Choice, Device, GpuProbe};
use super::info::{cpu_backend_name, EngineInfo, LoadOptions};
use super::memory::{check_fits, WASM_MEMORY_BUDGET};
use super::run::{Engine, Run};
use crate::config::ModelConfig;
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, Gguf, SyncReads};
use crate::model::Model;
use crate::session::Session;
use crate::tokenizer::Tokenizer;

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

    /// Load onto the CPU, awaiting each weight read ([`ByteSource::read_at_async`]).
    async fn load_cpu(
        src: &dyn ByteSource,
        opts: &LoadOptions,
        reason: String,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Run, EngineInfo)> {
        let (g, cfg, tok, mut info) = Self::prepare(src, opts)?;
        let t1 = crate::clock::now_ms();
        // Encoders stay exact: an embedding's cosine to the float64 reference drops from
        // 0.99999 to 0.998 on 8-bit activations (all-MiniLM-L6-v2 Q8_0), and they are small
        // enough that the 8-bit path's speed matters less than search's ranking.
        let exact = opts.exact || cfg.family == crate::config::Family::Bert;
        let mut be = CpuBackend::with_exact(exact);
        info.activations = be.activations();
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
            activations: "16-bit",
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
}
