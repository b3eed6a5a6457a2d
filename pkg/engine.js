// The Engine: one loaded model (or the fallback alone) behind the package's methods —
// generate/complete, the OpenAI-shaped chat.completions and embeddings, embed, classify,
// index, tokenize, logitsTopK. Every answer goes through one generation path (#stream) on
// the route route-policy.js decides, the response cache in front (#answer). Not here:
// createEngine and the device check (index.js), the options' checks (options.js), the
// transports (transport.js, route.js).

import { KerzeError, abortError } from './protocol.js';
import { engineOptions, deterministic, withCaching, promptInput, textList, classifyArgs } from './options.js';
import { openResponseStore, canonicalJson, textHash } from './cache.js';
import { SearchIndex } from './search.js';
import { decide, slowMidway, slowAfter, takeOver, didNotLoad } from './route-policy.js';
import {
  chatOptions, chatTemplateOptions, streamOptions, completionId, chatCompletion, ChatStream, hasToolCalls,
  embeddingsOptions, embeddingsResponse,
} from './openai.js';

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

/**
 * The pieces of one `generate` request on transport `t` as an async generator whose result is
 * the request's; ending it early aborts the request and waits until the engine is free.
 */
async function* pieces(t, args, outer) {
  const link = linkSignals(outer);
  const queue = [];
  let wake = null;
  let done = false;
  let error = null;
  let result;
  const running = t.request('generate', args, {
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
      // Stopped early (the consumer, or a switch of route): stop this request too.
      link.abort();
      await running;
    }
    link.unlink();
  }
}

/** A loaded model. Create with createEngine(). */
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
  /** The response cache's limits ({ ttlMs, maxBytes }), or null: off. */
  #responseLimits = null;
  #responses = null;

  /**
   * `transport` null: the local model cannot run (the fallback answers); `route.ready` a
   * promise of the local load still running (the fallback answers meanwhile).
   */
  /**
   * `loaded`: the local model's info (core.js load), or null while it does not answer (the
   * fallback does: `route.notLocal` says why, `route.ready` the load still running).
   */
  constructor(transport, loaded, warn = (m) => console.warn(`kerze: ${m}`), route = {}) {
    this.#t = transport;
    this.#warn = warn;
    this.#cloud = route.cloud ?? null;
    this.#onRoute = route.onRoute ?? null;
    this.#notLocal = route.notLocal ?? null;
    this.#responseLimits = route.responses ?? null;
    /**
     * What runs and why: { backend, reason, model, nCtx, ..., worker, route }. Replaced when
     * the engine moves from the GPU to the CPU (the device was lost; generation goes on
     * there), and when a model loading in the background is ready.
     */
    this.info = this.#describe(loaded);
    if (transport) {
      transport.onInfo = (next) => {
        this.info = Object.freeze({ ...this.info, ...next });
      };
    }
    if (route.ready) {
      this.#ready = route.ready.then((ready) => {
        this.#notLocal = null;
        this.info = this.#describe(ready);
        this.#report({ route: 'local', reason: `the model is ready (${ready.backend})` });
      }, (e) => {
        this.#notLocal = didNotLoad(e);
        this.#t = null;
        transport.terminate();
        this.info = this.#describe(null);
        this.#report({ route: 'cloud', reason: this.#notLocal });
      });
    }
    this.chat = Object.freeze({
      completions: Object.freeze({ create: (body, req) => this.#chatCreate(body, req) }),
    });
    /** OpenAI's embeddings API on an encoder model: `create({ input, encoding_format })`. */
    this.embeddings = Object.freeze({ create: (body) => this.#embeddingsCreate(body) });
  }

  /** The engine info: the local model's, or the fallback's while the local one does not answer. */
  #describe(loaded) {
    const worker = this.#t?.kind ?? null;
    if (loaded) return Object.freeze({ ...loaded, worker, route: 'local' });
    return Object.freeze({ backend: 'cloud', reason: this.#notLocal, model: this.#cloud?.model ?? null, worker, route: 'cloud' });
  }

  /**
   * One vector per text from an encoder model (all-MiniLM-L6-v2, BERT…): `Float32Array[]`,
   * unit length unless `normalize: false`. A text longer than the model's sequence length is
   * truncated there (`overflow: 'error'` refuses it, `'chunk'` averages windows).
   */
  async embed(texts, { normalize = true, overflow = 'truncate' } = {}) {
    this.#check();
    const list = textList('embed', texts);
    const r = await this.#embedRaw(list, { normalize, overflow });
    return r.vectors;
  }

  /**
   * Labels and scores per text: `classify(text, { labels })` → [{ label, score }] best
   * first, summing to 1; an array of texts → one such list per text. `labels` an array of
   * names or descriptions (zero-shot), left out on a sequence-classification model (its own
   * labels, scored by its head), or an object label → example texts (few-shot,
   * `method: 'centroid' | 'logistic'`). On an encoder the label embeddings are computed once
   * and kept; on a decoder each label is scored by its calibrated log-likelihood after a
   * prompt (`prompt` with {labels} and {text}; `calibrate: false` for the raw scores). The
   * result's `usage` (not enumerable): { textsEncoded, labelsEncoded, promptTokens,
   * decoderPasses, ms }.
   */
  async classify(texts, { labels, ...options } = {}) {
    this.#check();
    const { one, list } = classifyArgs(texts, labels, options);
    const r = await this.#t.request('classify', { texts: list, labels: labels ?? null, options });
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

  /** Where a request goes, and why (`asked`: the request's route). */
  #decide(asked = 'auto') {
    return decide(asked, {
      cloud: this.#cloud, local: Boolean(this.#t), notLocal: this.#notLocal, slow: this.#slow, backend: this.info.backend,
    });
  }

  /** The route of a generation: waits for a loading model when 'local' is asked for. */
  async #routeOf(asked) {
    if (this.#disposed) throw new KerzeError('DisposedError', 'this engine was disposed');
    if (this.#notLocal?.startsWith('loading') && asked === 'local') await this.#ready;
    return this.#decide(asked);
  }

  #check() {
    if (this.#disposed) throw new KerzeError('DisposedError', 'this engine was disposed');
    if (!this.#t) {
      throw new KerzeError('UnsupportedDeviceError',
        `the local model does not run here (${this.#notLocal}); the fallback answers generation only`);
    }
  }

  /**
   * Stream the continuation of `prompt`: an AsyncIterable of { text, tokenId, kerze }, whose
   * result is { finishReason, usage, ids, kerze }. `route: 'auto' | 'local' | 'cloud'`.
   */
  generate(prompt, { route = 'auto', cache = true, prefix, ...options } = {}) {
    return this.#generate(prompt, route, cache, prefix, options);
  }

  async *#generate(prompt, route, cache, prefix, options) {
    const input = withCaching(promptInput(prompt), cache, prefix);
    const given = { ...options };
    const opts = engineOptions(options);
    return yield* this.#answer(await this.#routeOf(route), input, opts, options.signal, null, cache && deterministic(given));
  }

  /**
   * An answer from the response cache when this deterministic request was answered before
   * (`cacheable`), streamed as a fresh one and tagged `cached: true`; else the generation,
   * stored when it ends.
   */
  async *#answer(d, input, opts, signal, wire, cacheable) {
    const store = cacheable ? await this.#responseStore() : null;
    const key = store ? await this.#responseKey(d, input, opts) : null;
    if (key) {
      const hit = await store.get(key).catch((e) => {
        this.#warn(`the response cache could not be read (${e?.message ?? e}): answering afresh`);
        return null;
      });
      if (hit) {
        const was = hit.result.kerze ?? d;
        const kerze = Object.freeze({ route: was.route, reason: `cached: this request was answered before (${was.reason})`, cached: true });
        for (const p of hit.pieces) {
          if (signal?.aborted) throw abortError(signal);
          yield { ...p, kerze };
        }
        const u = hit.result.usage ?? {};
        const usage = { ...u, prefillTokens: 0, prefillMs: 0, decodeMs: 0 };
        return { ...hit.result, usage, kerze };
      }
    }
    const it = this.#stream(d, input, opts, signal, wire);
    const pieces = [];
    try {
      for (;;) {
        const r = await it.next();
        if (r.done) {
          if (key) {
            const { finishReason, usage, ids, kerze, choices } = r.value;
            await store.put(key, pieces, { finishReason, usage, ids, kerze, ...(choices ? { choices } : {}) }).catch((e) => {
              this.#warn(`the answer was not cached (${e?.message ?? e})`);
            });
          }
          return r.value;
        }
        if (key) pieces.push(r.value.tokenId != null ? { text: r.value.text, tokenId: r.value.tokenId } : { text: r.value.text });
        yield r.value;
      }
    } finally {
      await it.return(undefined);
    }
  }

  /** The response cache's key of a request on route `d`, or null when it has no identity. */
  async #responseKey(d, input, opts) {
    const who = d.route === 'cloud' ? this.#cloud?.identity
      : this.info.sha256 && `${this.info.sha256}|${this.info.backend}|${this.info.nCtx}`;
    if (!who || !globalThis.crypto?.subtle) return null;
    const { seed, ...rest } = opts;
    const sampling = opts.temperature === 0 ? rest : opts;
    // How the prompt is cached does not change the answer.
    const { prefixText: _p, prefixTokens: _n, prefixCache: _c, ...request } = input;
    return textHash(canonicalJson({ v: 1, who, input: request, sampling }));
  }

  async #responseStore() {
    if (!this.#responseLimits) return null;
    this.#responses ??= openResponseStore(this.#responseLimits).then(({ store, reason }) => {
      if (!store) this.#warn(`answers are not cached: ${reason}`);
      return store;
    });
    return this.#responses;
  }

  /**
   * The one generation path of every answer. It starts on route `d` (a promise); when the
   * local run fails, also midway, or decodes under the `slow` threshold, and the fallback
   * covers that, the endpoint continues from the text so far. Each piece says its route.
   */
  async *#stream(d, input, opts, signal, wire) {
    let at = await d;
    const link = linkSignals(signal);
    let text = '';
    let done = 0;
    try {
      for (;;) {
        const local = at.route === 'local';
        const t = local ? this.#t : this.#cloud;
        if (local) this.#check();
        this.#report(at);
        const kerze = Object.freeze({ route: at.route, reason: at.reason });
        const args = local ? { input, options: opts } : { input, options: opts, wire, prefix: text, done };
        const it = pieces(t, args, link.signal);
        let first = null;
        let n = 0;
        let next = null;
        try {
          for (;;) {
            const r = await it.next();
            if (r.done) {
              const usage = done ? { ...r.value.usage, completionTokens: (r.value.usage?.completionTokens ?? 0) + done } : r.value.usage;
              if (local) this.#slow = slowAfter(this.#cloud, usage) ?? this.#slow;
              return { ...r.value, usage, kerze };
            }
            text += r.value.text ?? '';
            n += 1;
            yield { ...r.value, kerze };
            if (local && this.#cloud) {
              first ??= performance.now();
              const slow = slowMidway(this.#cloud, n, performance.now() - first, input, opts);
              if (slow) {
                this.#slow = slow;
                next = { route: 'cloud', reason: slow };
                break;
              }
            }
          }
        } catch (e) {
          const why = local ? takeOver(this.#cloud, e, input, opts, text) : null;
          if (!why) throw e;
          next = { route: 'cloud', reason: why };
        } finally {
          await it.return(undefined);
        }
        done += n;
        at = next;
      }
    } finally {
      link.unlink();
    }
  }

  /** Generate to the end: { text, finishReason, usage, ids, kerze, prefix? }. */
  async complete(prompt, options = {}) {
    return this.#collect(this.generate(prompt, options));
  }

  async #collect(it) {
    let text = '';
    for (;;) {
      const r = await it.next();
      if (r.done) {
        const { finishReason, usage, ids, kerze, prefix, choices } = r.value;
        return { text, finishReason, usage, ids, kerze, ...(prefix ? { prefix } : {}), ...(choices ? { choices } : {}) };
      }
      text += r.value.text;
    }
  }

  /** OpenAI's chat completion, whole or streamed, on whichever route answers. */
  async #chatCreate(body, req = {}) {
    if (this.#disposed) throw new KerzeError('DisposedError', 'this engine was disposed');
    if (!body || typeof body !== 'object' || Array.isArray(body)) chatOptions(body); // throws
    const { route = 'auto', cache = true, ...rest } = body;
    const options = { ...chatOptions(rest), signal: req.signal ?? rest.signal }; // the same checks on both routes
    const cacheable = cache !== false && deterministic(options);
    const input = withCaching({ messages: rest.messages, chat: chatTemplateOptions(rest) }, cache);
    const d = await this.#routeOf(route);
    const { signal: _s, ...wire } = rest;
    const model = d.route === 'cloud' ? this.#cloud.model : this.info.model;
    const meta = { id: completionId(), created: Math.floor(Date.now() / 1000), model };
    const opts = engineOptions(options);
    const inner = this.#answer(d, input, opts, options.signal, wire, cacheable);
    if (!rest.stream) {
      const r = await this.#collect(inner);
      return Object.assign(chatCompletion(meta, r.text, r.finishReason, r.usage, hasToolCalls(rest)), { kerze: r.kerze });
    }
    const frames = new ChatStream(meta, streamOptions(rest).includeUsage, hasToolCalls(rest));
    const tagged = (list, kerze) => list.map((f) => Object.assign(f, { kerze }));
    async function* chunks() {
      // The role frame carries the first piece's tag (a cached answer says so from the start).
      let r = await inner.next();
      yield tagged([frames.start()], r.value.kerze)[0];
      for (;; r = await inner.next()) {
        if (r.done) {
          yield* tagged(frames.finish(r.value.finishReason, r.value.usage), r.value.kerze);
          return;
        }
        if (r.value.text) yield* tagged(frames.push(r.value.text), r.value.kerze);
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
  async logitsTopK(ids, { k = 5, first = 0, prefix } = {}) {
    this.#check();
    if (prefix != null && !(Number.isSafeInteger(prefix) && prefix >= 0)) {
      throw new KerzeError('InvalidArgumentError', 'prefix must be a number of tokens');
    }
    return this.#t.request('logitsTopK', { ids: Array.from(ids), k, first, prefix });
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
