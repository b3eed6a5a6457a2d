//! Slots: one thread per slot, each with its own engine (on the CPU, forks of the first one:
//! the weights once, a KV cache each), taking jobs from one queue. A job's events go back to
//! its HTTP handler over a channel; when the handler is gone (the client disconnected) the
//! slot stops the generation at the next step and takes the next job. Admission is counted
//! so that at most `slots + queue` requests are in the house; the next gets a 429.

use crate::chat::{ChatOptions, Message};
use crate::engine::{Engine, EngineInfo, LoadOptions};
use crate::error::{Error, Result};
use crate::generate::{Event as Step, FinishReason, GenerateOptions, Usage};
use crate::server::prefixes::PrefixStore;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What a job runs on.
pub enum Input {
    /// A conversation, through the model's chat template.
    Chat {
        messages: Vec<Message>,
        chat: ChatOptions,
    },
    /// A raw prompt, tokenized as `kerze generate` does (`<bos>` when the model wants it).
    Text(String),
    Ids(Vec<u32>),
    /// Texts to embed (an encoder model).
    Embed {
        texts: Vec<String>,
        opts: crate::embed::EmbedOptions,
    },
}

/// One request for a slot.
pub struct Job {
    pub input: Input,
    pub opts: GenerateOptions,
    pub events: UnboundedSender<Event>,
    /// The request's deadline (from its arrival; queueing counts).
    pub deadline: Instant,
    /// Its place in the house: given back when the slot is done with it.
    pub ticket: Ticket,
}

/// What a slot reports about a job, in this order: `Started` or `Failed`/`TimedOut`, then
/// `Chunk`s, then `Done` (or `Failed`/`TimedOut`); an embedding job: `Embedded` or `Failed`.
pub enum Event {
    Started,
    /// An embedding job's result (its only event).
    Embedded(crate::embed::Embeddings),
    Chunk(String),
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    Failed(Error),
    TimedOut,
}

/// Counts the requests admitted (running or queued) against a limit.
pub struct Admission {
    limit: usize,
    n: AtomicUsize,
}

/// One admitted request; dropping it gives the place back.
pub struct Ticket(Arc<Admission>);

impl Admission {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            n: AtomicUsize::new(0),
        })
    }

    /// A place, or `None` when `limit` requests are in already.
    pub fn admit(self: &Arc<Self>) -> Option<Ticket> {
        self.n
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Ticket(Arc::clone(self)))
    }

    pub fn in_house(&self) -> usize {
        self.n.load(Ordering::Acquire)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The running slots.
pub struct Pool {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// How a slot gets its engine: slot 0 loads one, the others fork it (CPU) or load their own
/// (GPU: weights live on the device).
enum Init {
    Fork(Box<crate::engine::Fork>),
    Load,
    /// Slot 0 failed to load: nothing to run.
    Quit,
}

impl Pool {
    /// Start `n` slot threads; slot 0 loads the model from `path` and reports the engine's
    /// info (or the load error) on the returned channel once every slot has its engine.
    pub fn start(
        path: PathBuf,
        load: LoadOptions,
        n: usize,
        prefixes: Option<Arc<PrefixStore>>,
        prepare_constraints: bool,
    ) -> (Arc<Pool>, mpsc::Receiver<Result<EngineInfo>>) {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut init_txs = Vec::new();
        let mut threads = Vec::new();
        let (slot_ready_tx, slot_ready_rx) = mpsc::channel::<Result<()>>();
        for i in 1..n {
            let (tx, rx) = mpsc::channel::<Init>();
            init_txs.push(tx);
            let (path, load, jobs, ready, prefixes) = (
                path.clone(),
                load.clone(),
                Arc::clone(&job_rx),
                slot_ready_tx.clone(),
                prefixes.clone(),
            );
            threads.push(spawn(i, move || {
                let engine = match rx.recv() {
                    Ok(Init::Fork(f)) => Ok(f.into_engine()),
                    Ok(Init::Load) => {
                        let device = crate::engine::Device::Webgpu;
                        open(&path, &LoadOptions { device, ..load }).map(|(e, _)| e)
                    }
                    Ok(Init::Quit) | Err(_) => return,
                };
                match engine {
                    Ok(mut e) => {
                        let _ = ready.send(Ok(()));
                        serve_jobs(&mut e, &jobs, prefixes.as_deref());
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            }));
        }
        drop(slot_ready_tx);
        let jobs = Arc::clone(&job_rx);
        threads.insert(
            0,
            spawn(0, move || {
                let (mut engine, info) = match open(&path, &load) {
                    Ok(e) => e,
                    Err(e) => {
                        for tx in &init_txs {
                            let _ = tx.send(Init::Quit);
                        }
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let on_gpu = info.backend == "webgpu";
                if prepare_constraints && !engine.config().family.is_encoder() {
                    // Before the forks, which share it (a GPU slot's own engine builds its own
                    // at its first constraint).
                    match engine.prepare_constraints() {
                        Ok(ms) => eprintln!("kerze serve: constraint engine ready in {ms:.0} ms"),
                        Err(e) => eprintln!(
                            "kerze serve: warning: the constraint engine did not start: {e}"
                        ),
                    }
                }
                for tx in &init_txs {
                    let init = if on_gpu {
                        Ok(Init::Load)
                    } else {
                        engine.fork().map(|f| Init::Fork(Box::new(f)))
                    };
                    match init {
                        Ok(i) => {
                            let _ = tx.send(i);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    }
                }
                drop(init_txs);
                // Every other slot has its engine before the server says it is ready.
                for _ in 1..n {
                    let r = slot_ready_rx.recv().unwrap_or_else(|_| {
                        Err(Error::Backend("a slot stopped while loading".into()))
                    });
                    if let Err(e) = r {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(info));
                serve_jobs(&mut engine, &jobs, prefixes.as_deref());
            }),
        );
        let pool = Arc::new(Pool {
            jobs: Mutex::new(Some(job_tx)),
            threads: Mutex::new(threads),
        });
        (pool, ready_rx)
    }

    /// Queue a job (admitted already); `false` when the pool has stopped.
    pub fn submit(&self, job: Job) -> bool {
        let guard = self.jobs.lock();
        match guard.as_ref().ok().and_then(|g| g.as_ref()) {
            Some(tx) => tx.send(job).is_ok(),
            None => false,
        }
    }

    /// Stop taking jobs; the slots finish what they run and exit. Waits for them.
    pub fn stop(&self) {
        if let Ok(mut g) = self.jobs.lock() {
            g.take();
        }
        let threads = self
            .threads
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for t in threads {
            let _ = t.join();
        }
    }
}

fn spawn(i: usize, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("kerze-slot-{i}"))
        .spawn(f)
        .unwrap_or_else(|e| panic!("cannot start slot thread {i}: {e}"))
}

fn open(path: &std::path::Path, load: &LoadOptions) -> Result<(Engine, EngineInfo)> {
    let src = crate::catalog::open(&path.to_string_lossy(), &mut |_| {})?;
    pollster::block_on(Engine::load_async(src, load, &mut |_, _| {}))
}

/// `KERZE_TEST_FAIL_AFTER=N`: every generation fails after N pieces, as an engine that breaks
/// midway (a lost device, a bug) does; the gateway's tests continue such answers upstream.
fn fail_after() -> Option<usize> {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("KERZE_TEST_FAIL_AFTER")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// Take jobs until the queue closes.
fn serve_jobs(
    engine: &mut Engine,
    jobs: &Mutex<mpsc::Receiver<Job>>,
    prefixes: Option<&PrefixStore>,
) {
    loop {
        let job = {
            let Ok(rx) = jobs.lock() else { return };
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        // A panic is a bug; it must not take the slot (and every later request) with it.
        let events = job.events.clone();
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(engine, job, prefixes)));
        if r.is_err() {
            engine.reset();
            let _ = events.send(Event::Failed(Error::Backend(
                "the generation failed (a bug: the slot was reset)".into(),
            )));
        }
    }
}

/// Run one job to its end, reporting as it goes; stop early when the client is gone or the
/// deadline passes. A prompt's prefix comes from `prefixes` when the slot's cache lacks it; a
/// chat's shared prefix, once computed, goes there.
fn run(engine: &mut Engine, job: Job, prefixes: Option<&PrefixStore>) {
    let Job {
        input,
        opts,
        events,
        deadline,
        ticket,
    } = job;
    let send = |e: Event| events.send(e).is_ok();
    // The last event gives the place back first: a client that has read it and asks again
    // (or asks /health) finds the place free.
    let mut ticket = Some(ticket);
    let mut last = |e: Event| {
        ticket.take();
        events.send(e).is_ok()
    };
    if events.is_closed() {
        return; // it left while queued
    }
    if Instant::now() >= deadline {
        last(Event::TimedOut);
        return;
    }
    let ids = match input {
        Input::Embed { texts, opts } => {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            last(match pollster::block_on(engine.embed(&refs, &opts)) {
                Ok(e) => Event::Embedded(e),
                Err(e) => Event::Failed(e),
            });
            return;
        }
        Input::Chat { messages, chat } => {
            let tok = engine.tokenizer();
            crate::chat::prompt_ids_with(tok, &messages, &chat).and_then(|ids| {
                let shared = crate::chat::shared_prefix_len(tok, &messages, &chat, &ids)?;
                Ok((ids, shared))
            })
        }
        Input::Text(t) => engine.tokenizer().encode_user(&t, true).map(|ids| (ids, 0)),
        Input::Ids(ids) => Ok((ids, 0)),
    };
    let begun = ids.and_then(|(ids, shared)| {
        let plan = prefixes.map(|p| p.before(engine, &ids, shared));
        let opts = GenerateOptions {
            save_prefix_at: plan.and_then(|p| p.save_at),
            ..opts
        };
        engine.begin(ids, &opts)
    });
    let mut g = match begun {
        Ok(g) => g,
        Err(e) => {
            last(Event::Failed(e));
            return;
        }
    };
    if !send(Event::Started) {
        return;
    }
    let abort = || events.is_closed() || Instant::now() >= deadline;
    let mut pieces = 0usize;
    let outcome = pollster::block_on(async {
        while let Some(event) = engine.next(&mut g, &abort).await? {
            match event {
                Step::Prefilled => {}
                Step::PrefixSaved => {
                    // The store asked for it (its plan set `save_prefix_at`); the answer goes
                    // on while it is written.
                    if let (Some(store), Some(p)) = (prefixes, g.take_prefix()) {
                        let bytes = engine.prefix_bytes(&p, store.model());
                        store.after(engine.info().backend, &p.ids, bytes);
                    }
                }
                Step::Chunk(c) => {
                    if !c.text.is_empty() && !send(Event::Chunk(c.text)) {
                        return Err(Error::Aborted);
                    }
                    pieces += 1;
                    if fail_after().is_some_and(|n| pieces >= n) {
                        return Err(Error::Backend(format!(
                            "the generation failed after {pieces} pieces (KERZE_TEST_FAIL_AFTER)"
                        )));
                    }
                }
            }
        }
        Ok(())
    });
    match outcome {
        Ok(()) => {
            last(Event::Done {
                finish: g.finish().unwrap_or(FinishReason::Stop),
                usage: g.usage.clone(),
            });
        }
        Err(Error::Aborted) if events.is_closed() => {}
        Err(Error::Aborted) => {
            last(Event::TimedOut);
        }
        Err(e) => {
            last(Event::Failed(e));
        }
    }
}
