// Where the model's bytes come from: given, the model cache, or the network. A download is
// streamed, hashed as it arrives and checked (length, sha256) before first use; in a worker it
// goes through the checks straight into the Cache API (a failed check stores nothing), else
// into one buffer that is stored once the engine loaded it. Not here: the stores themselves
// (cache.js), reading a stored file into the engine (read-ahead.js), the load (core.js).

import { KerzeError, abortError } from './protocol.js';
import { openModelCache, whyNotStored } from './cache.js';

/** The wasm-bindgen glue can address at most 4 GiB; nothing this size fits in a tab anyway. */
const MAX_MODEL_BYTES = 2 ** 32 - 1;
/** Progress messages at most this often (bytes). */
const PROGRESS_STEP = 1 << 20;

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

/** An opened download (`body`, {@link CheckedBody}) into one buffer: { bytes, sha256 }. Throws as it does. */
async function download(body) {
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
 * Stream an opened download (`body`, {@link CheckedBody}) straight into the model cache, through the checks: the file is never
 * held whole in JS (a first visit then peaks as a cached load does, ~250 MB lower than
 * through one buffer). A failed check errors the body, so the Cache API stores nothing.
 * Returns { blob, sha256 } (the stored file, which the engine reads piece by piece), or
 * { refused } when the cache did not take the write (quota…): then nothing is stored.
 * Throws DownloadError, IntegrityError or AbortError.
 */
async function downloadToCache(body, spec, store, signal) {
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


/**
 * The model cache (`store`, or `reason` why there is none) and its entry for `spec` (`hit`,
 * or `error` if the lookup failed). Never rejects: it runs beside the module's compilation.
 */
export async function lookUpCached(spec) {
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
      if (signal?.aborted) throw abortError(signal);
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
export async function onnxCompanions(parts, signal) {
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

/**
 * The model's bytes for the load: given (`spec.data`), from the model cache, downloaded
 * through the checks into the cache (in a worker: `bytes` is then the stored Blob) or into
 * memory. `lookup`: lookUpCached's answer (a promise: it runs beside the module's
 * compilation), null without the cache. Returns { bytes, source, store, streamed }
 * (`store`: the model cache where it is used; `streamed`: downloaded straight into it); sets
 * `spec.sha256` to what was checked.
 */
export async function modelBytes(spec, lookup, glue, warn, signal, onProgress) {
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
      if (!store) warn(`models will not be cached: ${found.reason}`);
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
        warn(`reading the model cache failed, downloading instead: ${e?.message ?? e}`);
      }
    }
    if (!bytes) {
      let body = await openDownload(spec, glue, signal, onProgress);
      const size = body.expected;
      // A file as large as one this cache refused within a day goes into memory at once,
      // and is not offered to the cache again.
      const refused = store && size != null ? await store.refusedFrom() : null;
      if (refused != null && size >= refused) {
        warn(`the model is not cached: this browser's cache refused a file of ${Math.round(refused / 1e6)} MB before (a private window?); it downloads on every visit`);
        store = null;
      }
      if (store && typeof FileReaderSync === 'function' && await roomFor(size)) {
        // In a worker the download goes through the checks into the cache, and the engine
        // reads the stored file piece by piece, as on a later visit.
        const got = await downloadToCache(body, spec, store, signal);
        if (got.blob) {
          bytes = got.blob;
          spec.sha256 = got.sha256;
          source = 'network';
          streamed = true;
        } else {
          // The body is spent: the file is downloaded again, this once (the cache said no only
          // once it had it all); noted, so that the next visit downloads it once.
          await store.noteRefused(size ?? body.n);
          warn(`the model was not cached (${whyNotStored(got.refused)}): downloading it again into memory; next time it downloads once, into memory`);
          store = null;
          body = await openDownload(spec, glue, signal, onProgress);
        }
      }
      if (!bytes) {
        const got = await download(body);
        bytes = got.bytes;
        spec.sha256 = got.sha256;
        source = 'network';
      }
    }
  }
  return { bytes, source, store, streamed };
}

/**
 * After the load: bytes downloaded into memory go into the model cache (`store`) now that the
 * engine took them; a failed write is a warning and leaves nothing.
 */
export async function storeDownloaded(spec, bytes, { store, source, streamed }, warn) {
  if (store && source === 'network' && !streamed) {
    try {
      await store.put(spec.key, bytes, { url: spec.url, sha256: spec.sha256, name: spec.name });
    } catch (e) {
      await store.delete(spec.key).catch(() => {});
      warn(`the model was not cached (${whyNotStored(e)}): it will download again next time`);
    }
  }
}
