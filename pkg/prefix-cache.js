// The prompt-prefix cache on the worker's side: which leading tokens of a prompt repeat (a
// chat's messages before its last user message, or a prompt's `prefix`), whether the engine's
// KV cache still holds them, else a snapshot restored from the store (cache.js
// openPrefixStore), else computed by this request and kept. Not here: the store itself
// (cache.js) and the generation that computes the prefix (core.js).

import { KerzeError } from './protocol.js';
import { openPrefixStore, whyNotStored } from './cache.js';

/**
 * One Core's prefix cache. `info()` and `glue()` give the Core's engine info and wasm glue at
 * the time of asking (the info changes when the engine moves from the GPU to the CPU).
 */
export class PrefixCache {
  #info;
  #glue;

  constructor(warn, info, glue) {
    this.warn = warn;
    this.#info = info;
    this.#glue = glue;
    /** Its limits (null: off; set by each load), its store once opened, its last write. */
    this.limits = null;
    this.opened = null;
    this.write = null;
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
  #store() {
    this.opened ??= (async () => {
      if (!this.limits) return null;
      if (!this.#info()?.sha256) {
        this.warn('prompt prefixes are not kept across visits: the model was given as bytes, its sha256 unknown');
        return null;
      }
      const hasher = new (this.#glue().Sha256)();
      const hashIds = (ids) => {
        const a = Uint32Array.from(ids);
        hasher.update(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
        return hasher.finishHex();
      };
      const opened = await openPrefixStore(hashIds, this.limits);
      if (!opened.store) this.warn(`prompt prefixes are not kept across visits: ${opened.reason}`);
      return opened.store;
    })();
    return this.opened;
  }

  /** Where the entries of this model, backend and engine are. */
  #scope() {
    const info = this.#info();
    return `${info.sha256}.${info.backend}.${info.version}`;
  }

  /**
   * Before a generation of `ids`: the shared prefix (see #sharedPrefix) from the session's
   * cache, else from the store (restored into the cache). Returns { tokens, from, save }:
   * `save` when the prefix is computed by this generation and should be kept.
   */
  async before(engine, input, ids) {
    if (!this.limits || input.prefixCache === false) return null;
    const n = this.#sharedPrefix(engine, input, ids);
    if (n < this.limits.minTokens || n >= ids.length) return null;
    if (engine.cachedCommon(Uint32Array.from(ids)) >= n) return { tokens: n, from: 'session', save: false };
    const store = await this.#store();
    if (!store) return { tokens: n, from: 'computed', save: false };
    await this.write;
    let found = null;
    try {
      found = await store.find(this.#scope(), ids);
    } catch (e) {
      this.warn(`the prompt prefix store could not be read (${e?.message ?? e}): computing the prefix`);
    }
    if (found) {
      try {
        const got = engine.restorePrefix(found.bytes, this.#info().sha256, Uint32Array.from(ids));
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
  after(engine, plan, ids) {
    if (!plan?.save) return;
    const bytes = engine.takePrefix(this.#info().sha256);
    if (bytes) this.keep(ids.slice(0, plan.tokens), bytes);
  }

  /** Keep `bytes`, the engine's snapshot after `ids`, in the store (one write after another). */
  keep(ids, bytes) {
    const scope = this.#scope();
    this.write = (async () => {
      await this.write;
      try {
        const store = await this.#store();
        await store?.put(scope, ids, bytes);
      } catch (e) {
        this.warn(`the prompt prefix was not kept (${whyNotStored(e)}): it is computed again next time`);
      }
    })();
  }
}
