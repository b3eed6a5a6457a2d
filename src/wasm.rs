//! The wasm-bindgen boundary: conversions only, no logic. The model file stays in a JS
//! `Uint8Array` outside wasm memory; each tensor is copied once from it into its final place.
//! Options and results cross as JSON strings (the JS side owns their shape: pkg/protocol.js);
//! errors cross as JS `Error`s whose `name` is [`Error::kind`].
//!
//! The methods that compute return promises and take the state out while they run, so a
//! second call during one (a bug on the JS side) gets an `EngineBusyError`, never a
//! re-entrant borrow, and a future GPU backend can await its readbacks on the event loop.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Function, Promise, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::future_to_promise;

use crate::chat::{self, Message};
use crate::engine::{Engine, EngineInfo, LoadOptions};
use crate::error::{Error, Result};
use crate::generate::{GenerateOptions, Generation};
use crate::gguf::ByteSource;

pub use crate::gguf::js::{JsBlob, JsBytes};

fn js_error(name: &str, message: &str) -> JsValue {
    let e = js_sys::Error::new(message);
    e.set_name(name);
    e.into()
}

/// The error as a JS `Error` named by its kind, with its fields (`needed`, `nCtx`, …) set.
fn to_js(e: Error) -> JsValue {
    let v = js_error(e.kind(), &e.to_string());
    for (k, f) in e.fields() {
        let f = match f {
            serde_json::Value::Number(n) => JsValue::from_f64(n.as_f64().unwrap_or(f64::NAN)),
            serde_json::Value::String(s) => JsValue::from_str(&s),
            _ => continue,
        };
        // Setting a property on a fresh Error cannot fail; if it did, the message stays.
        let _ = js_sys::Reflect::set(&v, &JsValue::from_str(k), &f);
    }
    v
}

fn json<T: serde::Serialize>(v: &T) -> std::result::Result<String, JsValue> {
    serde_json::to_string(v).map_err(|e| js_error("InvalidArgumentError", &e.to_string()))
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, s: &str) -> std::result::Result<T, JsValue> {
    serde_json::from_str(s).map_err(|e| to_js(Error::InvalidArgument(format!("{what}: {e}"))))
}

struct State {
    engine: Engine,
    generation: Option<Generation>,
}

/// A loaded model. JS drives generation step by step: `begin`, `prefillStep` until it gives
/// `true`, `step` until it gives `undefined`, then `finish`.
#[wasm_bindgen(js_name = Engine)]
pub struct WasmEngine {
    state: Rc<RefCell<Option<State>>>,
    disposed: Rc<std::cell::Cell<bool>>,
    /// The engine's info as of its last call (readable while a call runs), and a move to
    /// the CPU not yet reported to JS.
    info: Rc<RefCell<EngineInfo>>,
    switched: Rc<RefCell<Option<String>>>,
}

impl WasmEngine {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> Result<R>) -> std::result::Result<R, JsValue> {
        let mut slot = self.state.borrow_mut();
        let st = slot.as_mut().ok_or_else(busy)?;
        f(st).map_err(to_js)
    }

    /// Run `f` on the state taken out of its slot, and put it back when done.
    fn run<F, Fut>(&self, f: F) -> Promise
    where
        F: FnOnce(State) -> Fut + 'static,
        Fut: std::future::Future<Output = (State, Result<JsValue>)> + 'static,
    {
        let slot = self.state.clone();
        let disposed = self.disposed.clone();
        let (info, switched) = (self.info.clone(), self.switched.clone());
        future_to_promise(async move {
            let st = slot.borrow_mut().take().ok_or_else(busy)?;
            let (mut st, r) = f(st).await;
            if let Some(why) = st.engine.take_switch() {
                *info.borrow_mut() = st.engine.info().clone();
                *switched.borrow_mut() = Some(why);
            }
            if !disposed.get() {
                *slot.borrow_mut() = Some(st);
            }
            r.map_err(to_js)
        })
    }
}

fn busy() -> JsValue {
    js_error(
        "EngineBusyError",
        "the engine is busy with another call, or was disposed",
    )
}

impl WasmEngine {
    fn new(engine: Engine, info: EngineInfo) -> WasmEngine {
        WasmEngine {
            state: Rc::new(RefCell::new(Some(State {
                engine,
                generation: None,
            }))),
            disposed: Rc::new(std::cell::Cell::new(false)),
            info: Rc::new(RefCell::new(info)),
            switched: Rc::new(RefCell::new(None)),
        }
    }
}

/// The `onnx` field of the load options: an ONNX export's tokenizer.json and config.json.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct OnnxParts {
    onnx: Option<OnnxText>,
}

#[derive(serde::Deserialize)]
struct OnnxText {
    tokenizer: String,
    config: String,
}

#[wasm_bindgen(js_class = Engine)]
impl WasmEngine {
    /// Load on the device `options.device` asks for (`auto`: a WebGPU adapter that is not a
    /// software fallback, else the CPU; `webgpu`: any adapter or an error). `source` is the
    /// file as a `Uint8Array` or a `Blob` (workers only). With a `Blob`, `readAhead` (if a
    /// function) reads it ahead of the load: `readAhead(offset)` resolves to `{ start, bytes }`,
    /// a window of the file (a `Uint8Array` from `start`) that holds `offset`; the weights
    /// are then unpacked while the next window is read. Resolves to the engine.
    #[wasm_bindgen(js_name = loadAsync)]
    pub async fn load_async(
        source: JsValue,
        options: String,
        on_progress: Function,
        read_ahead: JsValue,
    ) -> std::result::Result<WasmEngine, JsValue> {
        console_error_panic_hook::set_once();
        let opts: LoadOptions = parse("load options", &options)?;
        let onnx: OnnxParts = parse("load options", &options)?;
        let mut src: Box<dyn ByteSource> = if source.is_instance_of::<web_sys::Blob>() {
            let blob: web_sys::Blob = source.unchecked_into();
            match read_ahead.dyn_into::<Function>() {
                Ok(f) => Box::new(JsBlob::reading_ahead(blob, f)),
                Err(_) => Box::new(JsBlob::new(blob)),
            }
        } else if source.is_instance_of::<Uint8Array>() {
            Box::new(JsBytes(source.unchecked_into()))
        } else {
            return Err(to_js(Error::InvalidArgument(
                "the model must be a Uint8Array or a Blob".into(),
            )));
        };
        if let Some(parts) = onnx.onnx {
            // An ONNX export: read whole, converted to the GGUF the engine loads; the ONNX
            // bytes are dropped before the weights are copied.
            let gguf = (|| -> Result<Vec<u8>> {
                let n = usize::try_from(src.len())
                    .map_err(|_| Error::Onnx("the file is larger than wasm memory".into()))?;
                let mut bytes = Vec::new();
                bytes
                    .try_reserve_exact(n)
                    .map_err(|_| Error::ModelTooLarge {
                        need_mb: (n >> 20) as u64,
                        limit_mb: 4096,
                        what: "to read the ONNX file",
                    })?;
                bytes.resize(n, 0);
                src.read_at(0, &mut bytes)?;
                crate::convert::convert_onnx(
                    &bytes,
                    parts.tokenizer.as_bytes(),
                    parts.config.as_bytes(),
                    None,
                )
            })()
            .map_err(to_js)?;
            src = Box::new(gguf);
        }
        let mut progress = |loaded: u64, total: u64| {
            let _ = on_progress.call2(
                &JsValue::NULL,
                &JsValue::from_f64(loaded as f64),
                &JsValue::from_f64(total as f64),
            );
        };
        let (engine, info) = Engine::load_async(src, &opts, &mut progress)
            .await
            .map_err(to_js)?;
        Ok(WasmEngine::new(engine, info))
    }

    /// JSON of the engine info (it changes when the engine moves from the GPU to the CPU).
    pub fn info(&self) -> std::result::Result<String, JsValue> {
        json(&*self.info.borrow())
    }

    /// Why the engine moved from the GPU to the CPU during the last calls, once (then
    /// `undefined`): the generation went on there, nothing was lost.
    #[wasm_bindgen(js_name = takeSwitch)]
    pub fn take_switch(&self) -> Option<String> {
        self.switched.borrow_mut().take()
    }

    /// Keep `blob` (the cached model file, workers only) instead of the bytes the engine was
    /// loaded from, for a move to the CPU if the GPU fails: the bytes can then be freed.
    #[wasm_bindgen(js_name = keepSource)]
    pub fn keep_source(&self, blob: web_sys::Blob) -> std::result::Result<(), JsValue> {
        self.with(|st| {
            st.engine.keep_source(Box::new(JsBlob::new(blob)));
            Ok(())
        })
    }

    /// Token ids of `text`; `special`: parse control tokens like `<start_of_turn>` (else they
    /// are plain text); `bos`: put `<bos>` in front.
    pub fn tokenize(
        &self,
        text: &str,
        special: bool,
        bos: bool,
    ) -> std::result::Result<Vec<u32>, JsValue> {
        self.with(|st| {
            let tok = st.engine.tokenizer();
            if special {
                tok.encode_raw(text, bos)
            } else {
                tok.encode_user(text, bos)
            }
        })
    }

    /// Text of `ids` (control tokens skipped when `skip_special`).
    pub fn detokenize(
        &self,
        ids: &[u32],
        skip_special: bool,
    ) -> std::result::Result<String, JsValue> {
        self.with(|st| st.engine.tokenizer().decode(ids, skip_special))
    }

    /// Prompt ids of a chat with the model's template: `messages` is JSON of
    /// `[{ role, content, reasoning_content? }]`, `options` JSON of
    /// `{ addGenerationPrompt?, enableThinking?, date? }` (may be empty).
    #[wasm_bindgen(js_name = chatPrompt)]
    pub fn chat_prompt(
        &self,
        messages: &str,
        options: Option<String>,
    ) -> std::result::Result<Vec<u32>, JsValue> {
        let messages: Vec<Message> = parse("messages", messages)?;
        let opts: chat::ChatOptions = match options.as_deref() {
            None | Some("") => chat::ChatOptions::default(),
            Some(o) => parse("chat options", o)?,
        };
        self.with(|st| chat::prompt_ids_with(st.engine.tokenizer(), &messages, &opts))
    }

    /// Set up a generation of `prompt_ids` (`options`: JSON of the generate options). Replaces
    /// one that was not finished.
    pub fn begin(&self, prompt_ids: Vec<u32>, options: &str) -> std::result::Result<(), JsValue> {
        let opts: GenerateOptions = parse("generate options", options)?;
        self.with(|st| {
            st.generation = None;
            st.generation = Some(st.engine.begin(prompt_ids, &opts)?);
            Ok(())
        })
    }

    /// How many of a chat's prompt ids (`ids`, from `chatPrompt` with the same `messages` and
    /// `options`) stay the same while its last user message changes: the part a prefix cache
    /// keeps (see `chat::shared_prefix_len`).
    #[wasm_bindgen(js_name = sharedPrefixLen)]
    pub fn shared_prefix_len(
        &self,
        messages: &str,
        options: Option<String>,
        ids: Vec<u32>,
    ) -> std::result::Result<usize, JsValue> {
        let messages: Vec<Message> = parse("messages", messages)?;
        let opts: chat::ChatOptions = match options.as_deref() {
            None | Some("") => chat::ChatOptions::default(),
            Some(o) => parse("chat options", o)?,
        };
        self.with(|st| chat::shared_prefix_len(st.engine.tokenizer(), &messages, &opts, &ids))
    }

    /// How many of `ids` the KV cache holds already (a generation would not compute them).
    #[wasm_bindgen(js_name = cachedCommon)]
    pub fn cached_common(&self, ids: Vec<u32>) -> std::result::Result<usize, JsValue> {
        self.with(|st| Ok(st.engine.cached_common(&ids)))
    }

    /// Put a saved prefix (bytes `takePrefix` gave, for the model whose sha256 is `model`)
    /// into the KV cache for a prompt of `ids`: the number of ids restored. A damaged or
    /// foreign snapshot throws SnapshotError and leaves the cache empty.
    #[wasm_bindgen(js_name = restorePrefix)]
    pub fn restore_prefix(
        &self,
        bytes: &[u8],
        model: &str,
        ids: Vec<u32>,
    ) -> std::result::Result<usize, JsValue> {
        self.with(|st| {
            st.generation = None;
            st.engine.restore_prefix(bytes, model, &ids)
        })
    }

    /// The snapshot the options' `savePrefixAt` asked for, once `next` reported
    /// `prefixSaved` (for the model whose sha256 is `model`), else `undefined`.
    #[wasm_bindgen(js_name = takePrefix)]
    pub fn take_prefix(&self, model: &str) -> std::result::Result<Option<Vec<u8>>, JsValue> {
        self.with(|st| {
            let g = st.generation.as_mut().ok_or_else(no_generation)?;
            Ok(st.engine.take_prefix(g, model))
        })
    }

    /// The generation loop's next turn (the engine's `next`): resolves to the JSON of its
    /// event, `{ event: 'prefilled' }` (a chunk of the prompt, or after a move from the GPU to
    /// the CPU of the tokens so far, went in), `{ event: 'prefixSaved' }` (the same, and the
    /// snapshot the options asked for is ready: `takePrefix`) or `{ event: 'chunk', text,
    /// tokenId }`, or to `undefined` at the end.
    pub fn next(&self) -> Promise {
        self.run(|mut st| async move {
            let r = match st.generation.as_mut() {
                Some(g) => match st.engine.next(g, &|| false).await {
                    Ok(Some(event)) => serde_json::to_string(&event)
                        .map(|s| JsValue::from_str(&s))
                        .map_err(|e| Error::Backend(e.to_string())),
                    Ok(None) => Ok(JsValue::UNDEFINED),
                    Err(e) => Err(e),
                },
                None => Err(no_generation()),
            };
            (st, r)
        })
    }

    /// End the generation: JSON of `{ finishReason, usage, ids }` (`finishReason` null when
    /// it was cut short, e.g. aborted).
    pub fn finish(&self) -> std::result::Result<String, JsValue> {
        self.with(|st| {
            let g = st.generation.take().ok_or_else(no_generation)?;
            let mut r = serde_json::json!({
                "finishReason": g.finish(),
                "usage": g.usage,
                "ids": g.generated(),
            });
            if let Some(c) = &g.usage.choices {
                r["choices"] = serde_json::json!(c);
            }
            serde_json::to_string(&r).map_err(|e| Error::Backend(e.to_string()))
        })
    }

    /// Teacher-forced: JSON of, for each position of `ids` from `first` on, the `k` best
    /// `[id, logit]` of the next token.
    #[wasm_bindgen(js_name = logitsTopK)]
    pub fn logits_top_k(&self, ids: Vec<u32>, k: usize, first: usize) -> Promise {
        self.run(move |mut st| async move {
            st.generation = None;
            let r = st
                .engine
                .logits_top_k(&ids, k, first)
                .await
                .and_then(|v| serde_json::to_string(&v).map_err(|e| Error::Backend(e.to_string())))
                .map(|s| JsValue::from_str(&s));
            (st, r)
        })
    }

    /// `logitsTopK` computing only what the KV cache does not hold of `ids` before `first`
    /// (a restored prefix).
    #[wasm_bindgen(js_name = logitsFrom)]
    pub fn logits_from(&self, ids: Vec<u32>, k: usize, first: usize) -> Promise {
        self.run(move |mut st| async move {
            st.generation = None;
            let r = st
                .engine
                .logits_from(&ids, k, first)
                .await
                .and_then(|v| serde_json::to_string(&v).map_err(|e| Error::Backend(e.to_string())))
                .map(|s| JsValue::from_str(&s));
            (st, r)
        })
    }

    /// A snapshot of the KV cache as it is (for the model whose sha256 is `model`): resolves
    /// to the bytes `restorePrefix` takes.
    #[wasm_bindgen(js_name = savePrefix)]
    pub fn save_prefix(&self, model: String) -> Promise {
        self.run(move |mut st| async move {
            st.generation = None;
            let r = st
                .engine
                .save_prefix(&model)
                .await
                .map(|b| js_sys::Uint8Array::from(&b[..]).into());
            (st, r)
        })
    }

    /// Embeddings of `texts` (JSON of an array of strings) from an encoder model, `options`
    /// JSON of `{ normalize?, overflow? }`: resolves to `{ dims, data, usage }` — `data` one
    /// Float32Array of `texts.length × dims` values, row-major; `usage` JSON.
    pub fn embed(&self, texts: &str, options: &str) -> Promise {
        let texts: std::result::Result<Vec<String>, JsValue> = parse("texts", texts);
        let opts: std::result::Result<crate::embed::EmbedOptions, JsValue> =
            parse("embed options", options);
        self.run(move |mut st| async move {
            let r = async {
                let texts = texts.map_err(|_| {
                    Error::InvalidArgument("embed: texts must be an array of strings".into())
                })?;
                let opts = opts.map_err(|_| {
                    Error::InvalidArgument(
                        "embed: options are { normalize?: boolean, overflow?: 'truncate' | 'error' | 'chunk' }"
                            .into(),
                    )
                })?;
                st.generation = None;
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let e = st.engine.embed(&refs, &opts).await?;
                let dims = e.data.first().map_or(0, Vec::len);
                let flat: Vec<f32> = e.data.concat();
                let o = js_sys::Object::new();
                let set = |k: &str, v: &JsValue| js_sys::Reflect::set(&o, &JsValue::from_str(k), v);
                let usage = serde_json::to_string(&e.usage).map_err(|e| Error::Backend(e.to_string()))?;
                set("dims", &JsValue::from(dims as u32))
                    .and_then(|_| set("data", &js_sys::Float32Array::from(&flat[..]).into()))
                    .and_then(|_| set("usage", &JsValue::from_str(&usage)))
                    .map_err(|_| Error::Backend("embed: cannot build the result".into()))?;
                Ok(JsValue::from(o))
            }
            .await;
            (st, r)
        })
    }

    /// Labels and scores per text (see [`crate::classify`]): `texts` JSON of an array of
    /// strings, `labels` JSON of an array of names or an object label → example texts,
    /// `options` JSON of `{ method?, temperature?, labelTemplate?, prompt?, calibrate? }`.
    /// Resolves to JSON `{ results: [[{ label, score }]], usage }`.
    pub fn classify(&self, texts: &str, labels: &str, options: &str) -> Promise {
        let texts: std::result::Result<Vec<String>, JsValue> = parse("texts", texts);
        let labels: std::result::Result<serde_json::Value, JsValue> = parse("labels", labels);
        let opts: std::result::Result<crate::classify::ClassifyOptions, JsValue> =
            parse("classify options", options);
        self.run(move |mut st| async move {
            let r = async {
                let texts = texts.map_err(|_| {
                    Error::InvalidArgument("classify: texts must be an array of strings".into())
                })?;
                let labels = crate::classify::labels_from_json(&labels.map_err(|_| {
                    Error::InvalidArgument("classify: labels must be JSON".into())
                })?)?;
                let opts = opts.map_err(|_| {
                    Error::InvalidArgument(
                        "classify: options are { method?: 'centroid' | 'logistic', temperature?: number, labelTemplate?: string, prompt?: string, calibrate?: boolean }"
                            .into(),
                    )
                })?;
                st.generation = None;
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let c = st.engine.classify(&refs, &labels, &opts).await?;
                serde_json::to_string(&c)
                    .map(|s| JsValue::from_str(&s))
                    .map_err(|e| Error::Backend(e.to_string()))
            }
            .await;
            (st, r)
        })
    }

    /// Build the constraint engine's token trie now (see `Engine::prepare_constraints`): the
    /// milliseconds it took.
    #[wasm_bindgen(js_name = prepareConstraints)]
    pub fn prepare_constraints(&self) -> std::result::Result<f64, JsValue> {
        self.with(|st| st.engine.prepare_constraints())
    }

    /// Forget the KV cache.
    pub fn reset(&self) -> std::result::Result<(), JsValue> {
        self.with(|st| {
            st.generation = None;
            st.engine.reset();
            Ok(())
        })
    }

    /// Free the model now (the JS object may live on; later calls fail).
    pub fn dispose(&self) {
        self.disposed.set(true);
        if let Ok(mut slot) = self.state.try_borrow_mut() {
            *slot = None;
        }
    }
}

/// Incremental SHA-256, so a download is hashed as it arrives (`crypto.subtle` has no
/// streaming digest and is missing on insecure origins).
#[wasm_bindgen]
pub struct Sha256(sha2::Sha256);

#[wasm_bindgen]
impl Sha256 {
    #[wasm_bindgen(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Sha256 {
        Sha256(sha2::Digest::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        sha2::Digest::update(&mut self.0, bytes);
    }

    /// The lowercase hex digest; the hasher starts over.
    #[wasm_bindgen(js_name = finishHex)]
    pub fn finish_hex(&mut self) -> String {
        let d = sha2::Digest::finalize_reset(&mut self.0);
        d.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The memory a model will need in this build, from its file's first bytes (`prefix`, of a
/// file of `fileLen` bytes) before the download: JSON of the engine's `MemoryPlan` at
/// `options.nCtx` (absent: the default context), or `undefined` where the header runs past
/// `prefix` (then read more of it). Errors as the load's (a file that is not a GGUF model).
#[wasm_bindgen(js_name = planMemory)]
pub fn plan_memory(
    prefix: &[u8],
    file_len: f64,
    options: &str,
) -> std::result::Result<Option<String>, JsValue> {
    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct PlanOptions {
        n_ctx: Option<usize>,
    }
    let opts: PlanOptions = parse("plan options", options)?;
    if !(file_len.is_finite() && file_len >= 0.0) {
        return Err(to_js(Error::InvalidArgument(format!(
            "fileLen {file_len} is not a length"
        ))));
    }
    crate::engine::plan_prefix(prefix, file_len as u64, opts.n_ctx)
        .map_err(to_js)?
        .map(|p| json(&p))
        .transpose()
}

/// This build's SIMD kernels against the portable ones (`cpu::check_kernels`): the
/// number of outputs compared, or an error naming what differed. For the browser tests.
#[wasm_bindgen(js_name = checkKernels)]
pub fn check_kernels() -> std::result::Result<u32, JsValue> {
    crate::cpu::check_kernels()
        .map(|n| n as u32)
        .map_err(|e| JsValue::from_str(&e))
}

fn no_generation() -> Error {
    Error::InvalidArgument("no generation in progress: call begin first".into())
}

/// The threads build: start `n` workers for the row-parallel kernels (wasm-bindgen-rayon),
/// each hosting one helper of the team (`cpu/team.rs`) beside the calling thread.
#[cfg(feature = "threads")]
pub use wasm_bindgen_rayon::init_thread_pool;
