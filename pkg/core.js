// The engine where it runs: in the worker (worker.js) or, with `worker: false`, in the page.
// Owns the wasm module, the model bytes while they load, the download (streamed, hashed as it
// arrives, checked before first use) and the cache. Generation is driven step by step from
// here and yields to the event loop after every step, so an abort lands within one step and
// the thread never blocks for longer than one step.

import { KerzeError, abortError } from './protocol.js';
import { openModelCache, openPrefixStore, PREFIX_DEFAULTS } from './cache.js';
import { wasmUrl, jinjaUrl, guideUrl, loadWasm, probeGpu, ExtraModules } from './wasm-load.js';

/** The wasm-bindgen glue can address at most 4 GiB; nothing this size fits in a tab anyway. */
const MAX_MODEL_BYTES = 2 ** 32 - 1;
/** Progress messages at most this often (bytes). */
const PROGRESS_STEP = 1 << 20;

/** Option names of generate(), as JS spells them → as the engine spells them. */
const GENERATE_OPTIONS = {
  maxTokens: 'maxTokens', temperature: 'temperature', topK: 'topK', topP: 'topP', minP: 'minP',
  repetitionPenalty: 'repetitionPenalty', presencePenalty: 'presencePenalty', frequencyPenalty: 'frequencyPenalty',
  penaltyLastN: 'penaltyLastN', seed: 'seed', stop: 'stop', stopTokens: 'stopTokens',
  constraint: 'constraint', jsonWhitespace: 'jsonWhitespace',
};

/** The shorthands of a constraint in generate()'s options → the engine's constraint. */
const CONSTRAINTS = {
  schema: (v) => {
    if (!v || typeof v !== 'object' || Array.isArray(v)) throw new KerzeError('InvalidArgumentError', 'schema must be a JSON schema (an object)');
    return { jsonSchema: v };
  },
  regex: (v) => {
    if (v instanceof RegExp) {
      if (v.flags.replace(/[uv]/g, '')) throw new KerzeError('InvalidArgumentError', `regex: the flags '${v.flags}' are not supported (the match is of the whole output)`);
      return { regex: v.source };
    }
    if (typeof v !== 'string') throw new KerzeError('InvalidArgumentError', 'regex must be a string or a RegExp');
    return { regex: v };
  },
  grammar: (v) => {
    if (typeof v !== 'string') throw new KerzeError('InvalidArgumentError', 'grammar must be a string (a Lark grammar)');
    return { grammar: v };
  },
  choices: (v) => {
    if (!Array.isArray(v) || !v.every((c) => typeof c === 'string')) throw new KerzeError('InvalidArgumentError', 'choices must be an array of strings');
    return { choices: v };
  },
};

/** Generate options checked and converted for the engine (JSON). */
export function engineOptions(options = {}) {
  const out = {};
  for (const [k, v] of Object.entries(options)) {
    if (k === 'signal' || v === undefined) continue;
    if (k in CONSTRAINTS) {
      if (out.constraint !== undefined) {
        throw new KerzeError('InvalidArgumentError', `one constraint per request: ${Object.keys(CONSTRAINTS).join(', ')}`);
      }
      out.constraint = CONSTRAINTS[k](v);
      continue;
    }
    if (!(k in GENERATE_OPTIONS)) {
      throw new KerzeError('InvalidArgumentError',
        `unknown generate option '${k}': known are ${[...Object.keys(GENERATE_OPTIONS), ...Object.keys(CONSTRAINTS)].join(', ')}, signal`);
    }
    out[GENERATE_OPTIONS[k]] = v;
  }
  if (typeof out.stop === 'string') out.stop = [out.stop];
  if (out.seed === undefined) out.seed = randomSeed();
  for (const k of ['maxTokens', 'topK', 'penaltyLastN', 'seed']) {
    if (k in out && !(Number.isSafeInteger(out[k]) && out[k] >= 0)) {
      throw new KerzeError('InvalidArgumentError', `${k} must be a non-negative integer, got ${out[k]}`);
    }
  }
  for (const k of ['temperature', 'topP', 'minP', 'repetitionPenalty', 'presencePenalty', 'frequencyPenalty']) {
    if (k in out && !(typeof out[k] === 'number' && Number.isFinite(out[k]))) {
      throw new KerzeError('InvalidArgumentError', `${k} must be a finite number, got ${out[k]}`);
    }
  }
  return out;
}

function randomSeed() {
  const a = new Uint32Array(1);
  crypto.getRandomValues(a);
  return a[0];
}

let channel = null;
const waiting = [];
/** Resolve after the event loop had a turn (a macrotask: messages and aborts get in). */
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

/** Why a cache write failed, for a warning: 'storage quota' or the error's message. */
function whyNotStored(e) {
  return e?.name === 'QuotaExceededError' ? 'storage quota' : e?.message ?? e;
}

/**
 * Whether the origin's storage has room for a file of `bytes` (unknown: assume so). Where it
 * has not, the download goes into memory, and the cache write that follows fails with a
 * warning, as it would have anyway.
 */
async function roomFor(bytes) {
  if (bytes == null || !globalThis.navigator?.storage?.estimate) return true;
  try {
    const { quota, usage } = await navigator.storage.estimate();
    return quota == null || usage == null || quota - usage > bytes;
  } catch {
    return true;
  }
}

/**
 * Start downloading `spec.url`: the body as a {@link CheckedBody}. Throws DownloadError (network,
 * HTTP status, a declared length that is not the model's) or AbortError.
 */
async function openDownload(spec, glue, signal, onProgress) {
  let res;
  try {
    res = await fetch(spec.url, { signal });
  } catch (e) {
    if (signal?.aborted) throw abortError(signal);
    throw new KerzeError('DownloadError',
      `could not fetch ${spec.url}: ${e?.message ?? e} (offline, or the server does not allow cross-origin requests)`);
  }
  if (!res.ok) {
    throw new KerzeError('DownloadError', `HTTP ${res.status} ${res.statusText} fetching ${spec.url}`);
  }
  // A compressed response's content-length counts compressed bytes.
  const header = res.headers.get('content-encoding') ? NaN : Number(res.headers.get('content-length'));
  const declared = Number.isSafeInteger(header) && header > 0 ? header : null;
  if (spec.bytes != null && declared != null && declared !== spec.bytes) {
    throw new KerzeError('DownloadError',
      `${spec.url} is ${declared} bytes, the model is ${spec.bytes}: wrong file`);
  }
  const expected = spec.bytes ?? declared;
  if (expected != null && expected > MAX_MODEL_BYTES) {
    throw new KerzeError('DownloadError', `${spec.url} is ${expected} bytes: more than the 4 GiB a tab can load`);
  }
  return new CheckedBody(res, spec, expected, glue, signal, onProgress);
}

/**
 * A download's body, chunk by chunk, hashed and counted as it arrives, with `download`
 * progress. `read()` gives the next chunk, or null at the end once the length and the sha256
 * were checked (then `sha256` is set). Throws DownloadError, IntegrityError or AbortError.
 */
class CheckedBody {
  constructor(res, spec, expected, glue, signal, onProgress) {
    this.spec = spec;
    this.expected = expected;
    this.signal = signal;
    this.onProgress = onProgress;
    this.reader = res.body.getReader();
    this.hasher = new glue.Sha256();
    this.n = 0;
    this.reported = 0;
    this.sha256 = null;
  }

  async read() {
    const { spec, expected } = this;
    let r;
    try {
      r = await this.reader.read();
    } catch (e) {
      if (this.signal?.aborted) throw abortError(this.signal);
      throw new KerzeError('DownloadError', `the download of ${spec.url} broke off after ${this.n} bytes: ${e?.message ?? e}`);
    }
    if (r.done) {
      this.#finish();
      return null;
    }
    const chunk = r.value;
    if (expected != null && this.n + chunk.length > expected) {
      throw new KerzeError('DownloadError', `${spec.url} sent more than the ${expected} bytes expected`);
    }
    if (this.n + chunk.length > MAX_MODEL_BYTES) {
      throw new KerzeError('DownloadError', `${spec.url} is more than the 4 GiB a tab can load`);
    }
    this.hasher.update(chunk);
    this.n += chunk.length;
    if (this.n - this.reported >= PROGRESS_STEP) {
      this.reported = this.n;
      this.onProgress({ phase: 'download', loaded: this.n, total: expected ?? 0 });
    }
    return chunk;
  }

  #finish() {
    const { spec, expected, n } = this;
    if (expected != null && n !== expected) {
      throw new KerzeError('DownloadError', `${spec.url} is truncated: ${n} of ${expected} bytes arrived`);
    }
    this.onProgress({ phase: 'download', loaded: n, total: expected ?? n });
    const sha256 = this.hasher.finishHex();
    if (spec.sha256 && sha256 !== spec.sha256) {
      throw new KerzeError('IntegrityError',
        `${spec.url} has sha256 ${sha256}, expected ${spec.sha256}: the file is corrupt or not this model`);
    }
    this.sha256 = sha256;
  }

  /** Stop the download (if it still runs) and free the hasher. */
  close() {
    if (this.hasher) {
      this.reader.cancel().catch(() => {});
      this.hasher.free();
      this.hasher = null;
    }
  }
}

/** Download `spec.url` into one buffer: { bytes, sha256 }. Throws as {@link CheckedBody}. */
async function download(spec, glue, signal, onProgress) {
  const body = await openDownload(spec, glue, signal, onProgress);
  let buf = new Uint8Array(body.expected ?? 16 << 20);
  let n = 0;
  try {
    for (let chunk; (chunk = await body.read()) !== null;) {
      if (n + chunk.length > buf.length) {
        // No declared length (read() stops at the expected one): grow.
        const bigger = new Uint8Array(Math.min(MAX_MODEL_BYTES, Math.max(buf.length * 2, n + chunk.length)));
        bigger.set(buf.subarray(0, n));
        buf = bigger;
      }
      buf.set(chunk, n);
      n += chunk.length;
    }
  } finally {
    body.close();
  }
  return { bytes: n === buf.length ? buf : buf.slice(0, n), sha256: body.sha256 };
}

/**
 * Download `spec.url` straight into the model cache, through the checks: the file is never
 * held whole in JS (a first visit then peaks as a cached load does, ~250 MB lower than
 * through one buffer). A failed check errors the body, so the Cache API stores nothing.
 * Returns { blob, sha256 } (the stored file, which the engine reads piece by piece), or
 * { refused } when the cache did not take the write (quota…): then nothing is stored.
 * Throws DownloadError, IntegrityError or AbortError.
 */
async function downloadToCache(spec, store, glue, signal, onProgress) {
  const body = await openDownload(spec, glue, signal, onProgress);
  let failure = null;
  const stream = new ReadableStream({
    async pull(controller) {
      try {
        const chunk = await body.read();
        if (chunk === null) controller.close();
        else controller.enqueue(chunk);
      } catch (e) {
        failure = e;
        controller.error(e);
      }
    },
    cancel() {
      body.close();
    },
  });
  const meta = { url: spec.url, sha256: spec.sha256 ?? null, name: spec.name };
  try {
    await store.put(spec.key, stream, { ...meta, bytes: body.expected });
  } catch (e) {
    if (failure) throw failure;
    if (signal?.aborted) throw abortError(signal);
    return { refused: e };
  } finally {
    body.close();
  }
  // Where the length or the sha256 were not known before the download, the entry says them now.
  if (body.expected == null || !spec.sha256) {
    const hit = await store.match(spec.key);
    if (hit) await store.put(spec.key, await hit.response.blob(), { ...meta, sha256: body.sha256 });
  }
  const hit = await store.match(spec.key);
  const blob = hit && await hit.response.blob();
  if (!blob || blob.size !== body.n) return { refused: new Error('the stored model could not be read back') };
  return { blob, sha256: body.sha256 };
}

/** Bytes per window the reader hands the engine, and windows read ahead of the one in use. */
const AHEAD_WINDOW = 4 << 20;
const AHEAD_DEPTH = 2;
/** How long the reader may take to say it started before its windows are read here instead. */
const READER_START_MS = 3000;

/**
 * Reads windows of `blob` in the order asked, through one byte stream (BYOB) into buffers the
 * engine gives back: `read(start, end)` resolves to a Uint8Array of the window, `giveBack(buf)`
 * returns a window's buffer once the engine is done with it. In Chromium 156 a cached 253 MB
 * model read so in 113–130 ms, against 330–440 ms through FileReaderSync or `arrayBuffer()`
 * (a fresh buffer per window: the time goes to faulting in new pages). Where the stream has
 * no BYOB reader, each window is read with `arrayBuffer()`. Self-contained: it is also the
 * source of the reader worker (READER_SOURCE).
 */
export function windowReader(blob, windowBytes) {
  let reader = null;
  let pos = -1;
  let byob = true;
  let closed = false;
  const spare = [];
  let chain = Promise.resolve();
  const readWindow = async (start, end) => {
    if (closed) throw new Error('the model reader was closed');
    const n = end - start;
    if (byob && start !== pos) {
      reader?.cancel().catch(() => {});
      reader = null;
      try {
        reader = blob.slice(start).stream().getReader({ mode: 'byob' });
        pos = start;
      } catch {
        byob = false;
      }
    }
    if (!byob) return new Uint8Array(await blob.slice(start, end).arrayBuffer());
    let buf = spare.pop() ?? new ArrayBuffer(Math.max(n, windowBytes));
    if (buf.byteLength < n) buf = new ArrayBuffer(n);
    pos = -1;
    let off = 0;
    while (off < n) {
      const { value, done } = await reader.read(new Uint8Array(buf, off, n - off));
      if (done || !value) throw new Error(`the stored model ended at ${start + off} of ${blob.size} bytes`);
      buf = value.buffer;
      off += value.byteLength;
    }
    pos = end;
    return new Uint8Array(buf, 0, n);
  };
  return {
    read(start, end) {
      const got = chain.then(() => readWindow(start, end));
      chain = got.catch(() => {});
      return got;
    },
    giveBack(buf) {
      if (byob && !closed && buf.byteLength >= windowBytes && spare.length < 4) spare.push(buf);
    },
    close() {
      closed = true;
      reader?.cancel().catch(() => {});
      reader = null;
      pos = -1;
      spare.length = 0;
    },
  };
}

// The reader worker: windowReader in a second worker, each window's buffer handed over and
// given back (transferred, not copied).
const READER_SOURCE = `let r = null;
onmessage = (e) => {
  const d = e.data;
  if (d.blob) { r = (${windowReader})(d.blob, d.windowBytes); postMessage({ started: true }); return; }
  if (d.giveBack) { r.giveBack(d.giveBack); return; }
  r.read(d.start, d.end)
    .then((v) => postMessage({ id: d.id, bytes: v }, [v.buffer]))
    .catch((err) => postMessage({ id: d.id, error: String((err && err.message) || err) }));
};`;

/**
 * What the engine's load from a stored Blob reads through (Engine.loadAsync's `readAhead`):
 * `readAhead(offset)` resolves to `{ start, bytes }`, the window of the file that holds
 * `offset`, while the next AHEAD_DEPTH windows are being read by a second worker; a window
 * the load has passed goes back to the reader to be filled again. The load unpacks one
 * window while the next is read. Where no worker starts (a page's policy), or it does not
 * say so within READER_START_MS, or it fails, the windows are read here, asynchronously.
 * `close()` ends the reader.
 */
export function readAheadOf(blob) {
  const size = blob.size;
  const pending = new Map();
  let worker = null;
  let url = null;
  let nextId = 0;
  let used = false;
  let startTimer = null;
  let local = null;
  const inThread = (start, end) => (local ??= windowReader(blob, AHEAD_WINDOW)).read(start, end);
  // The worker is dropped for good: what it was asked for is read here.
  const giveUpWorker = () => {
    clearTimeout(startTimer);
    worker?.terminate();
    worker = null;
    for (const [id, p] of pending) {
      pending.delete(id);
      inThread(p.start, p.end).then(p.resolve, p.reject);
    }
  };
  // Started at the first window asked for: a load onto the GPU reads plainly and asks none.
  const startWorker = () => {
    try {
      url = URL.createObjectURL(new Blob([READER_SOURCE], { type: 'text/javascript' }));
      worker = new Worker(url, { name: 'kerze-reader' });
      worker.onmessage = (e) => {
        if (e.data.started) {
          clearTimeout(startTimer);
          return;
        }
        if (e.data.error) {
          giveUpWorker();
          return;
        }
        const p = pending.get(e.data.id);
        if (!p) return;
        pending.delete(e.data.id);
        p.resolve(e.data.bytes);
      };
      worker.onerror = (e) => {
        e.preventDefault?.();
        giveUpWorker();
      };
      worker.onmessageerror = giveUpWorker;
      // A worker the page's policy blocks fires `error`; one that neither starts nor fails
      // (seen nowhere, but a load must not hang on it) is given up after a while.
      startTimer = setTimeout(giveUpWorker, READER_START_MS);
      worker.postMessage({ blob, windowBytes: AHEAD_WINDOW });
    } catch {
      worker = null;
    }
  };
  const read = (start, end) => {
    if (!worker) return inThread(start, end);
    const id = nextId++;
    return new Promise((resolve, reject) => {
      pending.set(id, { start, end, resolve, reject });
      worker.postMessage({ id, start, end });
    });
  };
  // A window the load is done with: its buffer goes back to whoever reads.
  const giveBack = (bytes) => {
    const buf = bytes.buffer;
    if (worker) worker.postMessage({ giveBack: buf }, [buf]);
    else local?.giveBack(buf);
  };
  // The windows asked for, in the file's order: the first holds the load's position.
  let queue = [];
  const issue = (start) => {
    const end = Math.min(size, start + AHEAD_WINDOW);
    const promise = read(start, end);
    promise.catch(() => {});
    queue.push({ start, end, promise });
  };
  const drop = (w) => w.promise.then(giveBack, () => {});
  return {
    readAhead(offset) {
      if (!used) startWorker();
      used = true;
      while (queue.length && queue[0].end <= offset) drop(queue.shift());
      if (!queue.length || queue[0].start > offset) {
        // Not where the reading went on (the load went back or far ahead): start over here.
        queue.forEach(drop);
        queue = [];
        issue(offset);
      }
      while (queue.length <= AHEAD_DEPTH && queue[queue.length - 1].end < size) issue(queue[queue.length - 1].end);
      const w = queue[0];
      return w.promise.then((bytes) => ({ start: w.start, bytes }));
    },
    /**
     * null if the engine read nothing through it (a GPU load reads plainly), else 'worker'
     * while the second worker reads, 'thread' where it could not start or failed.
     */
    mode() {
      if (!used) return null;
      return worker ? 'worker' : 'thread';
    },
    close() {
      clearTimeout(startTimer);
      worker?.terminate();
      worker = null;
      local?.close();
      if (url) URL.revokeObjectURL(url);
      for (const p of pending.values()) p.reject(new Error('the model reader was closed'));
      pending.clear();
      queue = [];
    },
  };
}

/**
 * The model cache (`store`, or `reason` why there is none) and its entry for `spec` (`hit`,
 * or `error` if the lookup failed). Never rejects: it runs beside the module's compilation.
 */
async function lookUpCached(spec) {
  const opened = await openModelCache();
  if (!opened.store) return { ...opened, hit: null, error: null };
  try {
    return { ...opened, hit: await opened.store.match(spec.key), error: null };
  } catch (e) {
    return { ...opened, hit: null, error: e };
  }
}

/** Read a cached entry into one buffer with `cache` progress. */
async function readCached(hit, signal, onProgress) {
  const total = hit.meta.bytes;
  const buf = new Uint8Array(total);
  let n = 0;
  let reported = 0;
  const reader = hit.response.body.getReader();
  try {
    for (;;) {
      throwIfAborted(signal);
      const r = await reader.read();
      if (r.done) break;
      if (n + r.value.length > total) return null;
      buf.set(r.value, n);
      n += r.value.length;
      if (n - reported >= PROGRESS_STEP) {
        reported = n;
        onProgress({ phase: 'cache', loaded: n, total });
      }
    }
  } finally {
    reader.releaseLock();
  }
  if (n !== total) return null;
  onProgress({ phase: 'cache', loaded: n, total });
  return buf;
}


/** An ONNX export's tokenizer.json and config.json as text: fetched when given as URLs. */
async function onnxCompanions(parts, signal) {
  const text = async (v, what) => {
    if (typeof v !== 'string') return JSON.stringify(v);
    let r;
    try {
      r = await fetch(v, { signal });
    } catch (e) {
      if (e?.name === 'AbortError') throw e;
      throw new KerzeError('ModelError', `the ONNX model's ${what}.json could not be fetched from ${v}: ${e?.message ?? e}`);
    }
    if (!r.ok) throw new KerzeError('ModelError', `the ONNX model's ${what}.json: HTTP ${r.status} from ${v}`);
    return r.text();
  };
  return { tokenizer: await text(parts.tokenizer, 'tokenizer'), config: await text(parts.config, 'config') };
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
    /** The prefix cache's limits (null: off), its store once opened, its last write. */
    this.prefixLimits = null;
    this.prefixesOpen = null;
    this.prefixWrite = null;
  }

  /**
   * Load `args.model` (already resolved: { url, sha256?, bytes?, key, name } or { data }).
   * Returns the engine info.
   */
  async load(args, onProgress, signal) {
    if (this.engine) throw new KerzeError('EngineBusyError', 'this engine already holds a model');
    const t0 = performance.now();
    onProgress({ phase: 'compile', loaded: 0, total: 1 });
    this.prefixLimits = args.prefixCache === false ? null : { ...PREFIX_DEFAULTS, ...(args.prefixCache ?? {}) };
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
    let bytes = null;
    let source = 'memory';
    let store = null;
    // Downloaded straight into the cache: `bytes` is the stored Blob.
    let streamed = false;
    if (spec.data) {
      bytes = spec.data instanceof Uint8Array ? spec.data : new Uint8Array(spec.data);
    } else {
      const found = lookup ? await lookup : null;
      if (found) {
        store = found.store;
        if (!store) this.warn(`models will not be cached: ${found.reason}`);
      }
      if (store) {
        try {
          if (found.error) throw found.error;
          const { hit } = found;
          if (hit && (!spec.sha256 || hit.meta.sha256 === spec.sha256)) {
            if (typeof FileReaderSync === 'function') {
              // In a worker: the engine reads the stored file piece by piece, so it is never
              // held whole in the JS heap (~250 MB less at peak than reading it out).
              const blob = await hit.response.blob();
              if (blob.size === hit.meta.bytes) {
                onProgress({ phase: 'cache', loaded: blob.size, total: blob.size });
                bytes = blob;
              }
            } else {
              bytes = await readCached(hit, signal, onProgress);
            }
            if (bytes) {
              source = 'cache';
              // Checked when it was stored: the model's identity, for what is kept per model.
              spec.sha256 ??= hit.meta.sha256 ?? null;
            } else {
              await store.delete(spec.key);
            }
          }
        } catch (e) {
          if (e?.name === 'AbortError') throw e;
          this.warn(`reading the model cache failed, downloading instead: ${e?.message ?? e}`);
        }
      }
      if (!bytes && store && typeof FileReaderSync === 'function' && await roomFor(spec.bytes)) {
        // In a worker the download goes through the checks into the cache, and the engine
        // reads the stored file piece by piece, as on a later visit.
        const got = await downloadToCache(spec, store, this.glue, signal, onProgress);
        if (got.blob) {
          bytes = got.blob;
          spec.sha256 = got.sha256;
          source = 'network';
          streamed = true;
        } else {
          this.warn(`the model was not cached (${whyNotStored(got.refused)}): downloading it again into memory; it will download again next time`);
          store = null;
        }
      }
      if (!bytes) {
        const got = await download(spec, this.glue, signal, onProgress);
        bytes = got.bytes;
        spec.sha256 = got.sha256;
        source = 'network';
      }
    }
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
    if (store && source === 'network' && !streamed) {
      try {
        await store.put(spec.key, bytes, { url: spec.url, sha256: spec.sha256, name: spec.name });
      } catch (e) {
        await store.delete(spec.key).catch(() => {});
        this.warn(`the model was not cached (${whyNotStored(e)}): it will download again next time`);
      }
    }
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
   * How many of `ids` stay the same from request to request: a chat's messages before its
   * last user message (as the template renders them), or a prompt's `prefix` option.
   */
  #sharedPrefix(engine, input, ids) {
    if (Array.isArray(input.messages)) {
      return engine.sharedPrefixLen(JSON.stringify(input.messages), JSON.stringify(input.chat ?? {}), Uint32Array.from(ids));
    }
    if (typeof input.prefixText === 'string' && typeof input.prompt === 'string') {
      if (!input.prompt.startsWith(input.prefixText)) {
        throw new KerzeError('InvalidArgumentError', 'prefix: the prompt does not start with it');
      }
      const p = engine.tokenize(input.prefixText, false, true);
      let n = 0;
      while (n < p.length && n < ids.length && p[n] === ids[n]) n += 1;
      return n;
    }
    if (Number.isSafeInteger(input.prefixTokens) && Array.isArray(input.ids)) return Math.min(input.prefixTokens, ids.length);
    return 0;
  }

  /** The prefix store (opened once), or null: off, no Cache API, or a model without sha256. */
  #prefixStore() {
    this.prefixesOpen ??= (async () => {
      if (!this.prefixLimits) return null;
      if (!this.info?.sha256) {
        this.warn('prompt prefixes are not kept across visits: the model was given as bytes, its sha256 unknown');
        return null;
      }
      const hasher = new this.glue.Sha256();
      const hashIds = (ids) => {
        const a = Uint32Array.from(ids);
        hasher.update(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
        return hasher.finishHex();
      };
      const opened = await openPrefixStore(hashIds, this.prefixLimits);
      if (!opened.store) this.warn(`prompt prefixes are not kept across visits: ${opened.reason}`);
      return opened.store;
    })();
    return this.prefixesOpen;
  }

  /** Where the entries of this model, backend and engine are. */
  #prefixScope() {
    return `${this.info.sha256}.${this.info.backend}.${this.info.version}`;
  }

  /**
   * Before a generation of `ids`: the shared prefix (see #sharedPrefix) from the session's
   * cache, else from the store (restored into the cache). Returns { tokens, from, save }:
   * `save` when the prefix is computed by this generation and should be kept.
   */
  async #prefixBefore(engine, input, ids) {
    if (!this.prefixLimits || input.prefixCache === false) return null;
    const n = this.#sharedPrefix(engine, input, ids);
    if (n < this.prefixLimits.minTokens || n >= ids.length) return null;
    if (engine.cachedCommon(Uint32Array.from(ids)) >= n) return { tokens: n, from: 'session', save: false };
    const store = await this.#prefixStore();
    if (!store) return { tokens: n, from: 'computed', save: false };
    await this.prefixWrite;
    let found = null;
    try {
      found = await store.find(this.#prefixScope(), ids);
    } catch (e) {
      this.warn(`the prompt prefix store could not be read (${e?.message ?? e}): computing the prefix`);
    }
    if (found) {
      try {
        const got = engine.restorePrefix(found.bytes, this.info.sha256, Uint32Array.from(ids));
        if (got >= n) return { tokens: got, from: 'storage', save: false };
      } catch (e) {
        this.warn(`a saved prompt prefix was dropped and is computed again: ${e?.message ?? e}`);
        await store.delete(found.key).catch(() => {});
      }
    }
    return { tokens: n, from: 'computed', save: true };
  }

  /**
   * After the prefill: keep the snapshot the engine made at the prefix. The write goes on
   * while the answer is generated (the next lookup waits for it).
   */
  #prefixAfter(engine, plan, ids) {
    if (!plan?.save) return;
    const bytes = engine.takePrefix(this.info.sha256);
    if (bytes) this.#keepPrefix(ids.slice(0, plan.tokens), bytes);
  }

  #keepPrefix(ids, bytes) {
    const scope = this.#prefixScope();
    this.prefixWrite = (async () => {
      await this.prefixWrite;
      try {
        const store = await this.#prefixStore();
        await store?.put(scope, ids, bytes);
      } catch (e) {
        this.warn(`the prompt prefix was not kept (${whyNotStored(e)}): it is computed again next time`);
      }
    })();
  }

  /**
   * Generate: yields { text, tokenId } chunks; returns { finishReason, usage, ids, prefix }
   * (`prefix`: { tokens, from: 'session' | 'storage' | 'computed' } when the prompt has a
   * shared prefix the prefix cache keeps). `options` are already checked by engineOptions().
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
      const plan = await this.#prefixBefore(engine, input, ids);
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
        else if (event === 'prefixSaved') this.#prefixAfter(engine, plan, ids);
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
    const plan = prefix > 0 && prefix <= first ? await this.#prefixBefore(engine, { ids, prefixTokens: prefix }, ids) : null;
    if (!plan) return JSON.parse(await this.#switched(engine.logitsTopK(all, k, first)));
    this.busy = true;
    try {
      if (plan.save) {
        // The prefix alone first, so that the cache holds exactly it when it is saved.
        await this.#switched(engine.logitsFrom(all.subarray(0, plan.tokens), 1, plan.tokens - 1));
        this.#keepPrefix(ids.slice(0, plan.tokens), await this.#switched(engine.savePrefix(this.info.sha256)));
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
 * serve.js, and the in-page transport of index.js).
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
