// kerze — small quantized language models in the visitor's browser.
//
//   const engine = await createEngine({ model: 'gemma-3-270m', onProgress, signal });
//   for await (const c of engine.generate('Slogan for an e-bike:', { maxTokens: 48 })) out += c.text;
//
// The engine runs in a Web Worker (worker.js) unless `worker: false`; both ways give the same
// interface. Errors are KerzeError with `name` saying the kind (protocol.js).

import { KerzeError, abortError, ERROR_NAMES } from './protocol.js';
import { catalog } from './catalog.js';
import { engineOptions } from './core.js';
import { InThreadTransport, WorkerTransport, chooseThreads, _setWorkerUrl } from './transport.js';
import { openModelCache } from './cache.js';
import { SearchIndex } from './search.js';
import { SIMD_PROBE, beacon, checkProbeOptions, probeSpec } from './probe.js';
import { Cloud, fallbackOptions } from './route.js';
import {
  chatOptions, chatTemplateOptions, streamOptions, completionId, chatCompletion, ChatStream, ThinkSplitter,
  embeddingsOptions, embeddingsResponse,
} from './openai.js';

export { KerzeError, ERROR_NAMES, catalog, ThinkSplitter, _setWorkerUrl };

const DEVICES = ['auto', 'cpu', 'webgpu'];
const SHA256 = /^[0-9a-f]{64}$/;

function baseUrl() {
  return globalThis.document?.baseURI ?? globalThis.location?.href;
}

/**
 * A model option → what the loader needs: { key, url, sha256, bytes, name } or { data }.
 * Catalog ids resolve to the catalog's URL; `{ url, sha256 }` works for any GGUF.
 */
export function resolveModel(model) {
  if (typeof model === 'string') {
    const e = catalog[model];
    if (!e) {
      throw new KerzeError('InvalidArgumentError',
        `unknown model id '${model}': known ids are ${Object.keys(catalog).join(', ')}; or pass { url, sha256 }`);
    }
    if (!e.url) {
      throw new KerzeError('InvalidArgumentError',
        `catalog model '${model}' has no public URL kerze verified: host ${e.file} yourself and pass { id: '${model}', url } (its size and sha256 come from the catalog)`);
    }
    return {
      key: e.sha256, url: e.url, sha256: e.sha256, bytes: e.bytes, name: model,
      peakBytes: e.peakBytes, largestTensorBytes: e.largestTensorBytes,
    };
  }
  if (model instanceof ArrayBuffer || ArrayBuffer.isView(model)) {
    const data = model instanceof ArrayBuffer ? new Uint8Array(model)
      : new Uint8Array(model.buffer, model.byteOffset, model.byteLength);
    return { data, name: 'bytes' };
  }
  if (model && typeof model === 'object' && typeof model.url === 'string') {
    let url;
    try {
      url = new URL(model.url, baseUrl()).href;
    } catch {
      throw new KerzeError('InvalidArgumentError', `model.url '${model.url}' is not a URL`);
    }
    const known = model.id != null ? catalog[model.id] : null;
    const sha256 = (model.sha256 ?? known?.sha256 ?? null)?.toLowerCase() ?? null;
    if (sha256 != null && !SHA256.test(sha256)) {
      throw new KerzeError('InvalidArgumentError', 'model.sha256 must be 64 hex digits');
    }
    const bytes = model.bytes ?? known?.bytes ?? null;
    if (bytes != null && !(Number.isSafeInteger(bytes) && bytes > 0)) {
      throw new KerzeError('InvalidArgumentError', 'model.bytes must be a positive integer');
    }
    const name = model.name ?? model.id ?? decodeURIComponent(new URL(url).pathname.split('/').pop() || url);
    const same = known && (sha256 == null || sha256 === known.sha256);
    return {
      key: sha256 ?? url, url, sha256, bytes, name,
      peakBytes: same ? known.peakBytes : undefined, largestTensorBytes: same ? known.largestTensorBytes : undefined,
    };
  }
  throw new KerzeError('InvalidArgumentError',
    "model must be a catalog id (e.g. 'gemma-3-270m'), { url, sha256 }, or the file's bytes");
}

/** Throws UnsupportedDeviceError where the engine cannot run at all. */
export function checkSupport() {
  if (typeof WebAssembly !== 'object' || typeof WebAssembly.validate !== 'function') {
    throw new KerzeError('UnsupportedDeviceError', 'this browser has no WebAssembly');
  }
  if (!WebAssembly.validate(SIMD_PROBE)) {
    throw new KerzeError('UnsupportedDeviceError',
      'this browser lacks WebAssembly SIMD (Chrome 91+, Firefox 89+, Safari 16.4+ have it)');
  }
}

// ---------------------------------------------------------------------------------------

function linkSignals(outer) {
  const ctl = new AbortController();
  const onAbort = () => ctl.abort(outer.reason);
  if (outer?.aborted) ctl.abort(outer.reason);
  else outer?.addEventListener('abort', onAbort, { once: true });
  return { signal: ctl.signal, abort: () => ctl.abort(), unlink: () => outer?.removeEventListener('abort', onAbort) };
}

/**
 * `outer`, whose return() (breaking out of a for-await loop over it) also ends `inner`, the
 * stream it reads with next() — a generation goes on otherwise.
 */
function closing(outer, inner) {
  const ret = outer.return.bind(outer);
  outer.return = async (v) => {
    await inner.return(undefined);
    return ret(v);
  };
  return outer;
}

function promptInput(prompt) {
  if (typeof prompt === 'string') return { prompt };
  if (Array.isArray(prompt) && prompt.every((x) => Number.isInteger(x) && x >= 0 && x < 2 ** 32)) return { ids: prompt };
  if (prompt instanceof Uint32Array) return { ids: Array.from(prompt) };
  throw new KerzeError('InvalidArgumentError', 'the prompt must be a string (or an array of token ids)');
}

/** A loaded model. Create with createEngine(). */
/** Options of classify besides labels (src/classify.rs ClassifyOptions). */
const CLASSIFY_OPTIONS = new Set(['method', 'temperature', 'labelTemplate', 'prompt', 'calibrate']);

export class Engine {
  #t;
  #disposed = false;
  #warn;

  #cloud = null;
  #onRoute = null;
  /** Why the local model does not answer ('unsupported: …', 'error: …', 'loading: …'), or null. */
  #notLocal = null;
  #ready = null;
  #slow = null;
  #lastRoute = null;

  /**
   * `transport` null: the local model cannot run (the fallback answers); `route.ready` a
   * promise of the local load still running (the fallback answers meanwhile).
   */
  constructor(transport, info, warn = (m) => console.warn(`kerze: ${m}`), route = {}) {
    this.#t = transport;
    this.#warn = warn;
    this.#cloud = route.cloud ?? null;
    this.#onRoute = route.onRoute ?? null;
    this.#notLocal = route.notLocal ?? null;
    /**
     * What runs and why: { backend, reason, model, nCtx, ... }. Replaced when the engine
     * moves from the GPU to the CPU (the device was lost; generation goes on there).
     */
    this.info = Object.freeze(info);
    if (transport) {
      transport.onInfo = (next) => {
        this.info = Object.freeze({ ...this.info, ...next });
      };
    }
    if (route.ready) {
      this.#ready = route.ready.then((loaded) => {
        this.info = Object.freeze({ ...loaded, worker: transport.kind });
        this.#notLocal = null;
        this.#report({ route: 'local', reason: `the model is ready (${loaded.backend})` });
      }, (e) => {
        this.#notLocal = `error: the model did not load (${e?.name}: ${e?.message})`;
        this.#t = null;
        transport.terminate();
        this.#report({ route: 'cloud', reason: this.#notLocal });
      });
    }
    this.chat = Object.freeze({
      completions: Object.freeze({ create: (body, req) => this.#chatCreate(body, req) }),
    });
    /** OpenAI's embeddings API on an encoder model: `create({ input, encoding_format })`. */
    this.embeddings = Object.freeze({ create: (body) => this.#embeddingsCreate(body) });
  }

  /**
   * One vector per text from an encoder model (all-MiniLM-L6-v2, BERT…): `Float32Array[]`,
   * unit length unless `normalize: false`. A text longer than the model's sequence length is
   * truncated there (`overflow: 'error'` refuses it, `'chunk'` averages windows).
   */
  async embed(texts, { normalize = true, overflow = 'truncate' } = {}) {
    this.#check();
    const list = typeof texts === 'string' ? [texts] : texts;
    if (!Array.isArray(list) || list.length === 0 || !list.every((t) => typeof t === 'string')) {
      throw new KerzeError('InvalidArgumentError', 'embed: texts must be a string or a non-empty array of strings');
    }
    const r = await this.#embedRaw(list, { normalize, overflow });
    return r.vectors;
  }

  /**
   * Labels and scores per text: `classify(text, { labels })` → [{ label, score }] best
   * first, summing to 1; an array of texts → one such list per text. `labels` an array of
   * names or descriptions (zero-shot), or an object label → example texts (few-shot,
   * `method: 'centroid' | 'logistic'`). On an encoder the label embeddings are computed once
   * and kept; on a decoder each label is scored by its calibrated log-likelihood after a
   * prompt (`prompt` with {labels} and {text}; `calibrate: false` for the raw scores). The
   * result's `usage` (not enumerable): { textsEncoded, labelsEncoded, promptTokens,
   * decoderPasses, ms }.
   */
  async classify(texts, { labels, ...options } = {}) {
    this.#check();
    for (const k of Object.keys(options)) {
      if (!CLASSIFY_OPTIONS.has(k)) {
        throw new KerzeError('InvalidArgumentError',
          `classify: unknown option '${k}': known are labels, ${[...CLASSIFY_OPTIONS].join(', ')}`);
      }
    }
    const one = typeof texts === 'string';
    const list = one ? [texts] : texts;
    if (!Array.isArray(list) || list.length === 0 || !list.every((t) => typeof t === 'string')) {
      throw new KerzeError('InvalidArgumentError', 'classify: texts must be a string or a non-empty array of strings');
    }
    const isNames = Array.isArray(labels);
    const isExamples = labels && typeof labels === 'object' && !isNames
      && Object.values(labels).every((v) => Array.isArray(v) || typeof v === 'string');
    if (!isNames && !isExamples) {
      throw new KerzeError('InvalidArgumentError',
        'classify: labels must be an array of names or an object label → example texts');
    }
    const r = await this.#t.request('classify', { texts: list, labels, options });
    const out = one ? r.results[0] : r.results;
    Object.defineProperty(out, 'usage', { value: Object.freeze(r.usage) });
    return out;
  }

  /**
   * A semantic-search index over `docs` (strings or objects with a `text`): `search(query,
   * { topK })` → [{ doc, score, index }]. Embeddings are cached across visits in IndexedDB,
   * keyed by the model's sha256 and each text's (`cache: false` to not). `key` names a doc's
   * identity for `remove` (a property name or a function; default its text).
   */
  async index(docs, { key, cache = true } = {}) {
    this.#check();
    return SearchIndex.create({
      embed: async (texts) => (await this.#embedRaw(texts, { normalize: true })).vectors,
      model: this.info.sha256 ?? null,
      key,
    }, docs, { cache, onWarning: this.#warn });
  }

  async #embedRaw(texts, options) {
    const r = await this.#t.request('embed', { texts, options });
    const vectors = [];
    for (let i = 0; i < texts.length; i++) vectors.push(r.data.slice(i * r.dims, (i + 1) * r.dims));
    return { vectors, usage: r.usage };
  }

  async #embeddingsCreate(body) {
    this.#check();
    const req = embeddingsOptions(body);
    if (req.dimensions !== undefined && req.dimensions !== this.info.nEmbd) {
      throw new KerzeError('InvalidArgumentError',
        `embeddings.create: dimensions ${req.dimensions}: this model gives ${this.info.nEmbd} (no other size)`);
    }
    const r = await this.#embedRaw(req.input, { normalize: true });
    return embeddingsResponse(this.info.model, r.vectors, r.usage.promptTokens, req.encodingFormat);
  }

  #report(r) {
    if (this.#lastRoute?.route === r.route && this.#lastRoute?.reason === r.reason) return;
    this.#lastRoute = r;
    try {
      this.#onRoute?.(r);
    } catch (e) {
      this.#warn(`onRoute threw: ${e?.message ?? e}`);
    }
  }

  /** Where a chat request goes, and why (`asked`: the request's route). */
  #decide(asked) {
    const cloud = this.#cloud;
    if (asked === 'cloud') {
      if (!cloud) throw new KerzeError('InvalidArgumentError', "route 'cloud' needs a fallback endpoint (createEngine({ fallback }))");
      return { route: 'cloud', reason: "route 'cloud' was asked for" };
    }
    if (asked === 'local') {
      if (!this.#t) throw new KerzeError('UnsupportedDeviceError', `route 'local': ${this.#notLocal}`);
      return { route: 'local', reason: "route 'local' was asked for" };
    }
    if (!this.#t) return { route: 'cloud', reason: this.#notLocal };
    if (this.#notLocal && cloud?.when.has('loading')) return { route: 'cloud', reason: this.#notLocal };
    if (this.#slow && cloud?.when.has('slow')) return { route: 'cloud', reason: this.#slow };
    return { route: 'local', reason: `on this device (${this.info.backend})` };
  }

  #check() {
    if (this.#disposed) throw new KerzeError('DisposedError', 'this engine was disposed');
    if (!this.#t) {
      throw new KerzeError('UnsupportedDeviceError',
        `the local model does not run here (${this.#notLocal}); the fallback answers chat.completions.create only`);
    }
  }

  /** Stream the continuation of `prompt`: an AsyncIterable of { text, tokenId }. */
  generate(prompt, options = {}) {
    return this.#stream(prompt, options, null);
  }

  async *#stream(prompt, options, input) {
    this.#check();
    const opts = engineOptions(options);
    input ??= promptInput(prompt);
    const link = linkSignals(options.signal);
    const queue = [];
    let wake = null;
    let done = false;
    let error = null;
    let result;
    const running = this.#t.request('generate', { input, options: opts }, {
      signal: link.signal,
      onChunk: (c) => {
        queue.push(c);
        wake?.();
      },
    }).then((r) => {
      result = r;
    }, (e) => {
      error = e;
    }).finally(() => {
      done = true;
      wake?.();
    });
    try {
      for (;;) {
        if (link.signal.aborted) {
          // Chunks the worker produced before it saw the abort are dropped; wait until the
          // engine is free, so the next call finds it idle.
          await running;
          throw abortError(link.signal);
        }
        if (queue.length) {
          yield queue.shift();
          continue;
        }
        if (done) {
          if (error) throw error;
          return result;
        }
        await new Promise((r) => {
          wake = r;
        });
        wake = null;
      }
    } finally {
      if (!done) {
        // The consumer stopped early: stop the engine too, and wait until it is free.
        link.abort();
        await running;
      }
      link.unlink();
    }
  }

  /** Generate to the end: { text, finishReason, usage, ids }. */
  async complete(prompt, options = {}) {
    return this.#collect(this.#stream(prompt, options, null));
  }

  async #collect(it, onText = null) {
    let text = '';
    for (;;) {
      const r = await it.next();
      if (r.done) return { text, finishReason: r.value.finishReason, usage: r.value.usage, ids: r.value.ids };
      text += r.value.text;
      onText?.(r.value.text);
    }
  }

  async #chatCreate(body, req = {}) {
    if (this.#disposed) throw new KerzeError('DisposedError', 'this engine was disposed');
    if (!body || typeof body !== 'object') return this.#localChat(body, req);
    const { route: asked = 'auto', ...rest } = body;
    if (!['auto', 'local', 'cloud'].includes(asked)) {
      throw new KerzeError('InvalidArgumentError', `route must be 'auto', 'local' or 'cloud', not '${asked}'`);
    }
    chatOptions(rest); // the same checks on both routes
    if (this.#notLocal?.startsWith('loading') && asked === 'local') await this.#ready;
    const d = this.#decide(asked);
    if (d.route === 'cloud') return this.#cloudChat(rest, req, d, '');
    if (!this.#cloud) return this.#tag(await this.#localChat(rest, req), d, rest.stream);
    return this.#guarded(rest, req, d);
  }

  /** `kerze: { route, reason }` on a completion, or on every chunk of a stream. */
  #tag(r, d, stream) {
    this.#report(d);
    const kz = Object.freeze({ route: d.route, reason: d.reason });
    if (!stream) return Object.assign(r, { kerze: kz });
    const it = r;
    const next = it.next.bind(it);
    it.next = async (...a) => {
      const x = await next(...a);
      if (!x.done && x.value) x.value.kerze = kz;
      return x;
    };
    return it;
  }

  /** The cloud's answer (`prefix`: the local answer so far, which the cloud continues). */
  async #cloudChat(body, req, d, prefix) {
    const { signal: _s, ...send } = body;
    const signal = req.signal ?? body.signal;
    const wire = prefix
      ? { ...send, messages: [...send.messages, { role: 'assistant', content: prefix }], continue_final_message: true }
      : send;
    this.#report(d);
    const kz = Object.freeze({ route: 'cloud', reason: d.reason });
    if (!body.stream) {
      const r = await this.#cloud.complete(wire, signal);
      if (prefix && r.choices?.[0]?.message) r.choices[0].message.content = prefix + (r.choices[0].message.content ?? '');
      return Object.assign(r, { kerze: kz });
    }
    const inner = this.#cloud.stream(wire, signal);
    async function* chunks() {
      for await (const c of inner) {
        // A continuation's role frame was sent already by the local part.
        if (prefix && c.choices?.[0]?.delta?.role && !c.choices[0].delta.content) continue;
        c.kerze = kz;
        yield c;
      }
    }
    return chunks();
  }

  /** The local answer, with the fallback taking over when it cannot give it (`context`,
   * `error`, also midway) and noting a slow device (`slow`). */
  async #guarded(body, req, d) {
    const cloud = this.#cloud;
    const takeOver = (e) => {
      if (e?.name === 'AbortError' || e?.name === 'InvalidArgumentError' || e?.name === 'DisposedError') return null;
      if (e?.name === 'ContextFullError') return cloud.when.has('context') ? `context: ${e.message}` : null;
      return cloud.when.has('error') ? `error: the local answer failed (${e?.name}: ${e?.message})` : null;
    };
    const noteSpeed = (usage) => {
      const tps = usage?.decodeTokensPerS;
      if (cloud.when.has('slow') && usage?.completionTokens >= 8 && tps != null && tps < cloud.slowTokensPerS) {
        this.#slow = `slow: the local model decoded ${tps.toFixed(1)} tokens/s here (under ${cloud.slowTokensPerS})`;
      }
    };
    if (!body.stream) {
      let text = '';
      const r = await this.#localChat(body, req, (t) => { text += t; }, noteSpeed).catch((e) => ({ failed: e }));
      if (!r.failed) return this.#tag(r, d, false);
      const why = takeOver(r.failed);
      if (!why) throw r.failed;
      return this.#cloudChat(body, req, { route: 'cloud', reason: why }, text);
    }
    const local = await this.#localChat(body, req, null, noteSpeed);
    const self = this;
    const kzLocal = Object.freeze({ route: 'local', reason: d.reason });
    this.#report(d);
    async function* chunks() {
      let text = '';
      for (;;) {
        let x;
        try {
          x = await local.next();
        } catch (e) {
          const why = takeOver(e);
          if (!why) throw e;
          yield* await self.#cloudChat(body, req, { route: 'cloud', reason: why }, text);
          return;
        }
        if (x.done) return;
        text += x.value.choices?.[0]?.delta?.content ?? '';
        x.value.kerze = kzLocal;
        yield x.value;
      }
    }
    return closing(chunks(), local);
  }

  /** The local chat completion (`onText`: each piece as it comes; `onUsage`: at the end). */
  async #localChat(body, req = {}, onText = null, onUsage = null) {
    this.#check();
    const options = { ...chatOptions(body), signal: req.signal ?? body.signal };
    const input = { messages: body.messages, chat: chatTemplateOptions(body) };
    const meta = { id: completionId(), created: Math.floor(Date.now() / 1000), model: this.info.model };
    if (!body.stream) {
      const r = await this.#collect(this.#stream(null, options, input), onText);
      onUsage?.(r.usage);
      return chatCompletion(meta, r.text, r.finishReason, r.usage);
    }
    const frames = new ChatStream(meta, streamOptions(body).includeUsage);
    const inner = this.#stream(null, options, input);
    async function* chunks() {
      yield frames.start();
      for (;;) {
        const r = await inner.next();
        if (r.done) {
          onUsage?.(r.value.usage);
          yield* frames.finish(r.value.finishReason, r.value.usage);
          return;
        }
        if (r.value.text) yield* frames.push(r.value.text);
      }
    }
    return closing(chunks(), inner);
  }

  /** Token ids of `text` (`special`: parse control tokens; `bos`: add <bos>). */
  async tokenize(text, options = {}) {
    this.#check();
    return this.#t.request('tokenize', { text: String(text), options });
  }

  /** Text of token ids. */
  async detokenize(ids, options = {}) {
    this.#check();
    return this.#t.request('detokenize', { ids: Array.from(ids), options });
  }

  /**
   * Teacher-forced diagnostics: for every position of `ids` from `first` on, the `k` best
   * [id, logit] pairs of the next token.
   */
  async logitsTopK(ids, { k = 5, first = 0 } = {}) {
    this.#check();
    return this.#t.request('logitsTopK', { ids: Array.from(ids), k, first });
  }

  /** Forget the KV cache (the next prompt is computed from scratch). */
  async reset() {
    this.#check();
    return this.#t.request('reset', {});
  }

  /** @internal For tests: kill the local engine's worker as a crash would. */
  _crash() {
    this.#t?.crash?.();
  }

  /** Free the model and stop the worker. Later calls throw DisposedError. */
  async dispose() {
    if (this.#disposed) return;
    this.#disposed = true;
    await this.#ready?.catch(() => {});
    if (!this.#t) return;
    try {
      await this.#t.request('dispose', {});
    } catch {
      // already gone
    }
    this.#t.terminate();
  }
}

/**
 * The device check, before any download: can this browser run `model`, on which backend, and
 * why — `{ canRun: 'yes' | 'risky' | 'no', backend, reasons, downloadBytes, peakBytes, cached,
 * storage: { quota, usage } }`. Nothing but a HEAD request (for a URL without a catalog
 * size) leaves the page. `overrides: { deviceMemory, gpu: false, storage }` simulates a
 * weaker device.
 */
export async function probe(options = {}) {
  checkProbeOptions(options);
  const { model = 'gemma-3-270m', device = 'auto', signal, overrides } = options;
  if (!DEVICES.includes(device)) {
    throw new KerzeError('InvalidArgumentError', `device must be one of ${DEVICES.join(', ')}, got '${device}'`);
  }
  return probeSpec(resolveModel(model), { device, signal, overrides });
}

/**
 * Load a model and return an Engine.
 * @param {import('./index.js').CreateEngineOptions} options
 */
export async function createEngine(options = {}) {
  const {
    model = 'gemma-3-270m', device = 'auto', onProgress, onWarning, signal, worker = true,
    threads = 'auto', nCtx, cache = true, assetsUrl, fallback, onRoute, probeOverrides,
  } = options;
  if (!DEVICES.includes(device)) {
    throw new KerzeError('InvalidArgumentError', `device must be one of ${DEVICES.join(', ')}, got '${device}'`);
  }
  if (nCtx != null && !(Number.isSafeInteger(nCtx) && nCtx > 0)) {
    throw new KerzeError('InvalidArgumentError', 'nCtx must be a positive integer');
  }
  if (onRoute != null && typeof onRoute !== 'function') throw new KerzeError('InvalidArgumentError', 'onRoute must be a function');
  const f = fallbackOptions(fallback);
  const cloud = f ? new Cloud(f) : null;
  if (signal?.aborted) throw abortError(signal);
  const warn = onWarning ?? ((m) => console.warn(`kerze: ${m}`));
  // An engine that answers through the fallback only (the local model cannot), and why.
  const cloudOnly = (reason) => new Engine(null, { backend: 'cloud', reason, model: f.model, route: 'cloud' }, warn,
    { cloud, onRoute, notLocal: reason });
  const spec = resolveModel(model);
  // The device check before any download (bytes given: nothing to download).
  let check = null;
  try {
    checkSupport();
    check = spec.data ? null : await probeSpec(spec, { device, signal, overrides: probeOverrides, skipGpu: true });
  } catch (e) {
    if (e?.name !== 'UnsupportedDeviceError') throw e;
    check = { canRun: 'no', problems: [e.message] };
  }
  if (check?.unreachable) {
    // The file cannot be had: a download error, whatever the device.
    if (cloud?.when.has('error')) return cloudOnly(`error: the model cannot be downloaded (DownloadError: ${check.unreachable})`);
    throw new KerzeError('DownloadError', `the model cannot be downloaded: ${check.unreachable}`);
  }
  if (check?.canRun === 'no') {
    if (cloud?.when.has('unsupported')) return cloudOnly(`unsupported: ${check.problems.join('; ')}`);
    const e = new KerzeError('UnsupportedDeviceError', `this device cannot run the model: ${check.problems.join('; ')}`);
    e.probe = check;
    throw e;
  }
  if (check?.canRun === 'risky') warn(`the model may not run well here: ${check.problems.join('; ')}`);
  const assets = assetsUrl == null ? null : folderUrl(assetsUrl);
  let transport;
  try {
    transport = worker ? await WorkerTransport.start(warn, assets) : new InThreadTransport(warn, assets);
  } catch (e) {
    if (cloud?.when.has('error')) return cloudOnly(`error: the engine did not start (${e?.name}: ${e?.message})`);
    throw e;
  }
  // Rayon blocks with Atomics.wait, which the page's main thread may not: threads need the worker.
  const nThreads = worker ? chooseThreads(threads, transport) : 0;
  const report = (p) => {
    try {
      onProgress?.(p);
    } catch (e) {
      warn(`onProgress threw: ${e?.message ?? e}`);
    }
  };
  const load = async () => {
    // Set while loading: a tab killed meanwhile leaves it, and the next probe says so.
    if (spec.key) beacon.set(spec.key);
    try {
      const info = await transport.request('load', { model: spec, device, nCtx, threads: nThreads, cache },
        { onProgress: report, signal });
      report({ phase: 'ready', loaded: 1, total: 1 });
      return info;
    } catch (e) {
      if (signal?.aborted && e?.name !== 'AbortError') throw abortError(signal);
      throw e;
    } finally {
      if (spec.key) beacon.clear(spec.key);
    }
  };
  // First visit with `loading`: the fallback answers while the model downloads.
  if (cloud?.when.has('loading') && check && !check.cached) {
    const mb = check.downloadBytes != null ? ` (${Math.round(check.downloadBytes / 1e6)} MB)` : '';
    return new Engine(transport, { backend: 'cloud', reason: 'loading', model: f.model, route: 'cloud', worker: transport.kind },
      warn, { cloud, onRoute, notLocal: `loading: the model is downloading${mb}`, ready: load() });
  }
  let info;
  try {
    info = await load();
  } catch (e) {
    transport.terminate();
    if (e?.name !== 'AbortError' && cloud?.when.has('error')) {
      return cloudOnly(`error: the model did not load (${e?.name}: ${e?.message})`);
    }
    throw e;
  }
  return new Engine(transport, { ...info, worker: transport.kind }, warn, { cloud, onRoute });
}

/** `assetsUrl` as a folder URL (a trailing slash added), or InvalidArgumentError. */
function folderUrl(url) {
  let u;
  try {
    u = new URL(String(url), baseUrl());
  } catch {
    throw new KerzeError('InvalidArgumentError', `assetsUrl '${url}' is not a URL`);
  }
  if (!u.pathname.endsWith('/')) u.pathname += '/';
  return u;
}

function cacheKeyOf(model) {
  if (typeof model === 'string' && SHA256.test(model)) return model;
  if (typeof model === 'string' && !(model in catalog)) return model;
  return resolveModel(model).key;
}

/** The model cache of this origin: what is stored, and removing it. */
export const cache = Object.freeze({
  /** @returns {Promise<Array<{ key, url, sha256, bytes, name, storedAt }>>} */
  async list() {
    const { store } = await openModelCache();
    return store ? store.list() : [];
  },
  /** Remove one model (catalog id, { url, sha256 }, or a key from list()). */
  async delete(model) {
    const { store } = await openModelCache();
    return store ? store.delete(cacheKeyOf(model)) : false;
  },
  /** Remove every cached model; resolves to how many were removed. */
  async clear() {
    const { store } = await openModelCache();
    return store ? store.clear() : 0;
  },
});

export default { createEngine, probe, cache, catalog, KerzeError, Engine };
