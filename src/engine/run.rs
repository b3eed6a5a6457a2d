//! A loaded model on its device ([`Engine`]): the session on whichever device holds it, the
//! calls that reach it (`on_session!`), and the recovery that moves to the CPU when the GPU
//! fails mid-call (`recovering!`, `fall_back`); a CPU engine's [`Fork`].

#[cfg(feature = "gpu")]
use super::info::GpuCounters;
use super::info::{cpu_backend_name, EngineInfo};
use crate::config::ModelConfig;
use crate::cpu::CpuBackend;
use crate::error::{Error, Result};
use crate::generate::{Chunk, Event, GenerateOptions, Generation};
use crate::gguf::{ByteSource, Gguf};
use crate::model::Model;
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// A loaded model on its device. While it runs on the GPU it keeps the model file at hand:
/// if the device is lost or fails mid-generation, it loads the weights onto the CPU and the
/// same generation continues there (every id so far is run again), reporting the switch.
pub struct Engine {
    pub(super) run: Run,
    pub(super) info: EngineInfo,
    /// The model file, kept while the engine runs on the GPU (the CPU loads from it).
    pub(super) source: Option<Box<dyn ByteSource>>,
    /// Why the engine moved to the CPU, until [`Engine::take_switch`] takes it.
    pub(super) switched: Option<String>,
}

/// The session, on whichever device holds it. One per page or process: the size
/// difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Run {
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
