// The engine where it runs: in the worker (worker.js) or, with `worker: false`, in the page.
// Owns the loaded engine: its load (the build from wasm-load.js, the bytes from download.js,
// a stored file read through read-ahead.js), the prefix cache, and every request on it.
// Generation is driven step by step from here and yields to the event loop after every step,
// so an abort lands within one step and the thread never blocks for longer than one step.

import { KerzeError, abortError } from './protocol.js';
import { PREFIX_DEFAULTS } from './cache.js';
import { wasmUrl, jinjaUrl, guideUrl, loadWasm, probeGpu, ExtraModules } from './wasm-load.js';
import { lookUpCached, modelBytes, onnxCompanions, storeDownloaded } from './download.js';
import { readAheadOf } from './read-ahead.js';
import { PrefixCache } from './prefix-cache.js';

let channel = null;
const waiting = [];
/**
 * Resolve after the event loop had a turn (a macrotask: messages and aborts get in). The
 * generation loop yields once a turn: batching turns per 40 ms measured nothing (two threads
 * 57.1–57.8 → 57.9–58.4 tok/s) and would delay an abort.
 */
export function yieldToEventLoop() {
  if (typeof MessageChannel === 'undefined') return new Promise((r) => setTimeout(r, 0));
  if (!channel) {
    channel = new MessageChannel();
    channel.port1.onmessage = () => waiting.shift()?.();
  }
  return new Promise((resolve) => {
    waiting.push(resolve);
    channel.port2.postMessage(0);
  });
}

function throwIfAborted(signal) {
  if (signal?.aborted) throw abortError(signal);
}

export class Core {
  /**
   * @param {{ warn?: (message: string) => void, info?: (info: object) => void,
   *           wasm?: () => URL | Response | BufferSource | Promise<URL | Response | BufferSource>,
   *           jinja?: () => URL | Response | BufferSource | Promise<URL | Response | BufferSource>,
   *           guide?: () => URL | Response | BufferSource | Promise<URL | Response | BufferSource> }} hooks
   *   `info` is called with the new engine info when the engine moves from the GPU to the CPU.
   *   `wasm` gives the single-thread build's module (default: the file next to this one),
   *   `jinja` the chat-template module's and `guide` the constraint module's (default:
   *   wasm/jinja/ and wasm/guide/ next to this one).
   */
  constructor(hooks = {}) {
    this.warn = hooks.warn ?? ((m) => console.warn(`kerze: ${m}`));
    this.onInfo = hooks.info ?? (() => {});
    this.wasm = hooks.wasm ?? wasmUrl;
    this.customWasm = hooks.wasm != null;
    this.glue = null;
    /** The chat-template and constraint modules, loaded on first use (wasm-load.js). */
    this.modules = new ExtraModules(hooks.jinja ?? jinjaUrl, hooks.guide ?? guideUrl);
    this.engine = null;
    this.info = null;
    this.busy = false;
    /** The prompt-prefix cache (prefix-cache.js): its limits are set by the load. */
    this.prefixes = new PrefixCache(this.warn, () => this.info, () => this.glue);
  }

  /**
   * Load `args.model` (already resolved: { url, sha256?, bytes?, key, name } or { data }).
   * Returns the engine info.
   */
  async load(args, onProgress, signal) {
    if (this.engine) throw new KerzeError('EngineBusyError', 'this engine already holds a model');
    const t0 = performance.now();
    onProgress({ phase: 'compile', loaded: 0, total: 1 });
    this.prefixes.limits = args.prefixCache === false ? null : { ...PREFIX_DEFAULTS, ...(args.prefixCache ?? {}) };
    const spec = args.model;
    // The cache is opened and the model looked up while the module compiles.
    const lookup = !spec.data && args.cache !== false ? lookUpCached(spec) : null;
    // The WebGPU backend is in the single-thread build; the threads build is CPU only. On one
    // thread the build is the same either way: it compiles while the GPU is asked.
    const one = (args.threads ?? 0) <= 1;
    const [[gpu, noGpu], early] = await Promise.all([
      probeGpu(args.device ?? 'auto'),
      one ? loadWasm(0, this.warn, this.wasm, args.simd, this.customWasm) : null,
    ]);
    const loaded = early ?? await loadWasm(gpu ? 0 : args.threads, this.warn, this.wasm, args.simd, this.customWasm);
    this.glue = loaded.glue;
    onProgress({ phase: 'compile', loaded: 1, total: 1 });
    throwIfAborted(signal);
    let { bytes, source, store, streamed } = await modelBytes(spec, lookup, this.glue, this.warn, signal, onProgress);
    const fetchMs = performance.now() - t0;
    throwIfAborted(signal);
    const t1 = performance.now();
    // An ONNX export: its tokenizer.json and config.json go with it, converted in the engine.
    const onnx = spec.onnx ? await onnxCompanions(spec.onnx, signal) : null;
    // What the page's check found goes to the engine, which writes the reason (engine.rs choose).
    const opts = JSON.stringify({ device: args.device ?? 'auto', nCtx: args.nCtx ?? null, noGpu: gpu ? null : noGpu, onnx });
    const progress = (loaded, total) => onProgress({ phase: 'load', loaded, total });
    progress(0, bytes.size ?? bytes.byteLength);
    // A stored Blob is read ahead by a second worker while the engine unpacks.
    const ahead = typeof Blob === 'function' && bytes instanceof Blob ? readAheadOf(bytes) : null;
    let readAhead = null;
    try {
      this.engine = await this.glue.Engine.loadAsync(bytes, opts, progress, ahead?.readAhead);
    } catch (e) {
      // Stored on the way in, but not a model this engine runs: not kept.
      if (streamed) await store.delete(spec.key).catch(() => {});
      throw e;
    } finally {
      readAhead = ahead?.mode() ?? null;
      ahead?.close();
    }
    const readyMs = performance.now() - t1;
    await storeDownloaded(spec, bytes, { store, source, streamed }, this.warn);
    const engineInfo = JSON.parse(this.engine.info());
    if (store && source === 'network' && !streamed && engineInfo.backend === 'webgpu' && typeof FileReaderSync === 'function') {
      // On the GPU the engine keeps the model file to continue on the CPU if the device is
      // lost: keep the cached Blob (on disk) rather than the downloaded bytes.
      try {
        const hit = await store.match(spec.key);
        if (hit) this.engine.keepSource(await hit.response.blob());
      } catch {
        // keeps the bytes
      }
    }
    bytes = null;
    // The constraint engine's token trie, built now when asked (else at the first constraint).
    const prepare = args.prepareConstraints && engineInfo.family !== 'bert';
    if (prepare) await this.modules.forConstraints(this.glue);
    const constraintsMs = prepare ? this.engine.prepareConstraints() : null;
    this.info = {
      ...engineInfo,
      source,
      threads: loaded.threads,
      fetchMs,
      readyMs,
      readAhead,
      ...(constraintsMs != null ? { constraintsMs } : {}),
      sha256: spec.sha256 ?? null,
      memoryBytes: loaded.memory?.buffer.byteLength ?? null,
    };
    return this.info;
  }

  #need() {
    if (!this.engine) throw new KerzeError('DisposedError', 'no model is loaded (disposed, or load failed)');
    return this.engine;
  }

  /**
   * Prompt ids of `input`: { prompt } (user text), { ids } or { messages, chat? } (the model's
   * chat template; `chat`: { enableThinking?, addGenerationPrompt? }).
   */
  promptIds(input) {
    const engine = this.#need();
    if (Array.isArray(input.messages)) {
      return Array.from(engine.chatPrompt(JSON.stringify(input.messages), JSON.stringify(input.chat ?? {})));
    }
    if (Array.isArray(input.ids)) return input.ids;
    if (typeof input.prompt === 'string') return Array.from(engine.tokenize(input.prompt, false, true));
    throw new KerzeError('InvalidArgumentError', 'the prompt must be a string');
  }

  /**
   * Generate: yields { text, tokenId } chunks; returns { finishReason, usage, ids, prefix }
   * (`prefix`: { tokens, from: 'session' | 'storage' | 'computed' } when the prompt has a
   * shared prefix the prefix cache keeps). `options` are already checked by engineOptions() (options.js).
   */
  async *generate(input, options, signal) {
    const engine = this.#need();
    if (this.busy) {
      throw new KerzeError('EngineBusyError', 'a generation is already running on this engine: await it or abort it first');
    }
    this.busy = true;
    let finished = false;
    try {
      throwIfAborted(signal);
      await this.modules.forChat(this.glue, input, this.info?.chatTemplate);
      if (options?.constraint != null) await this.modules.forConstraints(this.glue);
      const ids = this.promptIds(input);
      const plan = await this.prefixes.before(engine, input, ids);
      throwIfAborted(signal);
      engine.begin(ids, JSON.stringify(plan?.save ? { ...options, savePrefixAt: plan.tokens } : options));
      // The engine's own loop (src/generate/), a turn at a time: a chunk of the prompt (or,
      // after a move to the CPU, of the tokens so far), else a piece of text. Between turns
      // the page's events and aborts get through.
      for (;;) {
        throwIfAborted(signal);
        const turn = await this.#switched(engine.next());
        if (turn === undefined) break;
        const { event, ...chunk } = JSON.parse(turn);
        if (event === 'chunk') yield chunk;
        else if (event === 'prefixSaved') this.prefixes.after(engine, plan, ids);
        await yieldToEventLoop();
      }
      finished = true;
      const result = JSON.parse(engine.finish());
      return plan ? { ...result, prefix: { tokens: plan.tokens, from: plan.from } } : result;
    } finally {
      if (!finished && this.engine) {
        try {
          engine.finish();
        } catch {
          // nothing was begun
        }
      }
      this.busy = false;
    }
  }

  /**
   * `pending`, then: if the engine moved from the GPU to the CPU meanwhile (the device was
   * lost; the generation went on there), the new info and a warning.
   */
  async #switched(pending) {
    try {
      return await pending;
    } finally {
      const why = this.engine?.takeSwitch();
      if (why) {
        this.info = { ...this.info, ...JSON.parse(this.engine.info()) };
        this.warn(why);
        this.onInfo(this.info);
      }
    }
  }

  tokenize(text, { special = false, bos = false } = {}) {
    return Array.from(this.#need().tokenize(text, special, bos));
  }

  detokenize(ids, { skipSpecial = false } = {}) {
    return this.#need().detokenize(Uint32Array.from(ids), skipSpecial);
  }

  /** Teacher-forced top-k from `first` on; the first `prefix` ids through the prefix cache. */
  async logitsTopK(ids, k, first, prefix = 0) {
    const engine = this.#need();
    if (this.busy) throw new KerzeError('EngineBusyError', 'a generation is running on this engine');
    const all = Uint32Array.from(ids);
    const plan = prefix > 0 && prefix <= first ? await this.prefixes.before(engine, { ids, prefixTokens: prefix }, ids) : null;
    if (!plan) return JSON.parse(await this.#switched(engine.logitsTopK(all, k, first)));
    this.busy = true;
    try {
      if (plan.save) {
        // The prefix alone first, so that the cache holds exactly it when it is saved.
        await this.#switched(engine.logitsFrom(all.subarray(0, plan.tokens), 1, plan.tokens - 1));
        this.prefixes.keep(ids.slice(0, plan.tokens), await this.#switched(engine.savePrefix(this.info.sha256)));
      }
      return JSON.parse(await this.#switched(engine.logitsFrom(all, k, first)));
    } finally {
      this.busy = false;
    }
  }

  /** Embeddings of `texts` (an encoder model): { dims, data: Float32Array (n × dims), usage }. */
  async embed(texts, options) {
    const engine = this.#need();
    if (this.busy) throw new KerzeError('EngineBusyError', 'a generation is running on this engine');
    const r = await this.#switched(engine.embed(JSON.stringify(texts), JSON.stringify(options ?? {})));
    return { dims: r.dims, data: r.data, usage: JSON.parse(r.usage) };
  }

  /** Labels and scores per text: { results: [[{ label, score }]], usage }. */
  async classify(texts, labels, options) {
    const engine = this.#need();
    if (this.busy) throw new KerzeError('EngineBusyError', 'a generation is running on this engine');
    return JSON.parse(await this.#switched(engine.classify(JSON.stringify(texts), JSON.stringify(labels ?? null),
      JSON.stringify(options ?? {}))));
  }

  reset() {
    this.#need().reset();
  }

  dispose() {
    if (this.engine) {
      this.engine.dispose();
      this.engine.free();
      this.engine = null;
    }
  }
}

/**
 * Run one request on `core`: the one dispatcher of both transports (the worker's side in
 * serve.js, and the in-page transport of transport.js).
 */
export async function dispatch(core, op, args, { onProgress, onChunk, signal } = {}) {
  switch (op) {
    case 'load':
      return core.load(args, onProgress ?? (() => {}), signal);
    case 'generate': {
      const it = core.generate(args.input, args.options, signal);
      for (;;) {
        const r = await it.next();
        if (r.done) return r.value;
        onChunk?.(r.value);
      }
    }
    case 'tokenize': return core.tokenize(args.text, args.options);
    case 'detokenize': return core.detokenize(args.ids, args.options);
    case 'logitsTopK': return core.logitsTopK(args.ids, args.k, args.first, args.prefix ?? 0);
    case 'embed': return core.embed(args.texts, args.options);
    case 'classify': return core.classify(args.texts, args.labels, args.options);
    case 'reset': return core.reset();
    case 'dispose': return core.dispose();
    default: throw new KerzeError('InvalidArgumentError', `unknown op ${op}`);
  }
}
