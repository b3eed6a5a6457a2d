// Model storage in the Cache API, behind { match, put, delete, list, clear }. Entries are
// keyed by the file's sha256 (or its URL when no sha256 was given) and committed only once
// the whole file arrived and its sha256 was checked (a download streamed into the cache errors
// its body when a check fails, and the Cache API then stores nothing), so a partial or
// corrupt download is never stored as complete. Where there is no Cache API (file:, some
// private modes) or it fails, `openModelCache` returns null and the caller goes on without a
// cache.

const CACHE_NAME = 'kerze-models-v1';
// Keys only: the Cache API never fetches them, and `.invalid` can never resolve.
const KEY_BASE = 'https://kerze.invalid/model/';

/**
 * @typedef {{ key: string, url: string, sha256: string, bytes: number, name: string,
 *             storedAt: string }} CachedModel
 */

// Where the note of a refused write is kept (`noteRefused`): not a model, so `list` skips it.
const REFUSED_NOTE = 'https://kerze.invalid/note/refused';
/** How long a refused write is remembered: storage changes (a cleared site, more quota). */
const REFUSED_FOR_MS = 24 * 3600 * 1000;

function requestFor(key) {
  return new Request(KEY_BASE + encodeURIComponent(key));
}

function metaOf(response) {
  const raw = response.headers.get('x-kerze-meta');
  if (!raw) return null;
  try {
    return JSON.parse(decodeURIComponent(raw));
  } catch {
    return null;
  }
}

/** The cache, or null (with the reason) when this context has none. */
export async function openModelCache() {
  if (typeof caches === 'undefined') {
    return { store: null, reason: 'the Cache API is not available here (insecure context, file: or private mode)' };
  }
  let cache;
  try {
    cache = await caches.open(CACHE_NAME);
  } catch (e) {
    return { store: null, reason: `the Cache API refused to open: ${e?.message ?? e}` };
  }
  return { store: new ModelCache(cache), reason: null };
}

class ModelCache {
  constructor(cache) {
    this.cache = cache;
  }

  /** The stored entry for `key`: its metadata and a Response whose body is the file. */
  async match(key) {
    const response = await this.cache.match(requestFor(key));
    if (!response) return null;
    const meta = metaOf(response);
    if (!meta) {
      await this.cache.delete(requestFor(key));
      return null;
    }
    return { meta, response };
  }

  /**
   * Store `body` under `key`: bytes or a Blob already verified, or a ReadableStream that
   * errors when its check fails (then nothing is stored; `meta.bytes` gives its length where
   * known). Throws on quota errors.
   */
  async put(key, body, meta) {
    const bytes = body instanceof ReadableStream ? meta.bytes ?? null : body.byteLength ?? body.size;
    const full = { ...meta, key, bytes, storedAt: new Date().toISOString() };
    const headers = {
      'content-type': 'application/octet-stream',
      'x-kerze-meta': encodeURIComponent(JSON.stringify(full)),
    };
    if (bytes != null) headers['content-length'] = String(bytes);
    await this.cache.put(requestFor(key), new Response(body, { headers }));
    return full;
  }

  async delete(key) {
    return this.cache.delete(requestFor(key));
  }

  /**
   * The smallest file this cache refused to store in the last day (bytes), or null. Off the
   * record Chromium's Cache API refuses a file of some hundred MB ("Unexpected internal
   * error") only once it arrived whole: a later visit then downloads it once, into memory,
   * not twice.
   */
  async refusedFrom() {
    try {
      const r = await this.cache.match(new Request(REFUSED_NOTE));
      if (!r) return null;
      const { bytes, at } = await r.json();
      return Number.isSafeInteger(bytes) && Date.now() - at < REFUSED_FOR_MS ? bytes : null;
    } catch {
      return null;
    }
  }

  /** Note that a file of `bytes` was refused ({@link ModelCache#refusedFrom}). */
  async noteRefused(bytes) {
    if (!Number.isSafeInteger(bytes) || bytes <= 0) return;
    const before = await this.refusedFrom();
    const note = JSON.stringify({ bytes: Math.min(bytes, before ?? bytes), at: Date.now() });
    try {
      await this.cache.put(new Request(REFUSED_NOTE), new Response(note));
    } catch {
      // Not even the note fits: the next visit tries the cache again.
    }
  }

  /** @returns {Promise<CachedModel[]>} */
  async list() {
    const out = [];
    for (const req of await this.cache.keys()) {
      const res = await this.cache.match(req);
      const meta = res && metaOf(res);
      if (meta) out.push(meta);
    }
    return out;
  }

  async clear() {
    let n = 0;
    for (const req of await this.cache.keys()) {
      if (await this.cache.delete(req)) n += 1;
    }
    return n;
  }
}

/** Why a cache write failed, for a warning: 'storage quota' or the error's message. */
export function whyNotStored(e) {
  return e?.name === 'QuotaExceededError' ? 'storage quota' : e?.message ?? e;
}

// ---------------------------------------------------------------------------------------
// Embeddings of page content, across visits: IndexedDB `kerze-embeddings-v1`, one record per
// (model sha256, text sha256) → Float32Array. A returning visitor's index costs no forward
// pass for the texts it has seen. Without IndexedDB (some private modes) or crypto.subtle
// (an insecure context) `openEmbeddingStore` returns null and the index embeds every time.

const EMBED_DB = 'kerze-embeddings-v1';
const EMBED_STORE = 'vectors';

function idbRequest(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/** The store, or null with the reason. */
export async function openEmbeddingStore() {
  if (typeof indexedDB === 'undefined') return { store: null, reason: 'IndexedDB is not available here' };
  if (!globalThis.crypto?.subtle) return { store: null, reason: 'crypto.subtle is not available (an insecure context)' };
  try {
    const open = indexedDB.open(EMBED_DB, 1);
    open.onupgradeneeded = () => open.result.createObjectStore(EMBED_STORE);
    return { store: new EmbeddingStore(await idbRequest(open)), reason: null };
  } catch (e) {
    return { store: null, reason: `IndexedDB refused to open: ${e?.message ?? e}` };
  }
}

/** sha256 of a text's UTF-8, hex. */
export async function textHash(text) {
  const d = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  return Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, '0')).join('');
}

class EmbeddingStore {
  constructor(db) {
    this.db = db;
  }

  /** Stored vectors for `keys`: an array with a Float32Array or undefined per key. */
  async getMany(keys) {
    const tx = this.db.transaction(EMBED_STORE, 'readonly');
    const st = tx.objectStore(EMBED_STORE);
    return Promise.all(keys.map((k) => idbRequest(st.get(k))));
  }

  /** Store [key, Float32Array] pairs in one transaction. */
  async putMany(entries) {
    const tx = this.db.transaction(EMBED_STORE, 'readwrite');
    const st = tx.objectStore(EMBED_STORE);
    for (const [k, v] of entries) st.put(v, k);
    await new Promise((resolve, reject) => {
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error ?? new Error('aborted'));
    });
  }

  async count() {
    return idbRequest(this.db.transaction(EMBED_STORE, 'readonly').objectStore(EMBED_STORE).count());
  }

  async clear() {
    const tx = this.db.transaction(EMBED_STORE, 'readwrite');
    tx.objectStore(EMBED_STORE).clear();
    await new Promise((resolve, reject) => {
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
    });
  }
}

// ---------------------------------------------------------------------------------------
// Answers to deterministic requests (temperature 0, or a fixed seed), across visits:
// IndexedDB `kerze-responses-v1`, one record per request key (the sha256 of the answering
// model's identity and the canonical request) → the answer's pieces and result, with its
// expiry and size. Entries past their TTL are dropped when met; beyond `maxBytes` the least
// recently used go first. Without IndexedDB or crypto.subtle `openResponseStore` returns null
// and every request is answered afresh.

const RESPONSE_DB = 'kerze-responses-v1';
const RESPONSE_STORE = 'responses';

/** Default TTL and size cap of the response cache. */
export const RESPONSE_DEFAULTS = Object.freeze({ ttlMs: 24 * 3600 * 1000, maxBytes: 8 * 1024 * 1024 });

/** The store, or null with the reason. */
export async function openResponseStore(limits = RESPONSE_DEFAULTS) {
  if (typeof indexedDB === 'undefined') return { store: null, reason: 'IndexedDB is not available here' };
  if (!globalThis.crypto?.subtle) return { store: null, reason: 'crypto.subtle is not available (an insecure context)' };
  try {
    const open = indexedDB.open(RESPONSE_DB, 1);
    open.onupgradeneeded = () => {
      const st = open.result.createObjectStore(RESPONSE_STORE, { keyPath: 'key' });
      st.createIndex('used', 'used');
    };
    return { store: new ResponseStore(await idbRequest(open), { ...RESPONSE_DEFAULTS, ...limits }), reason: null };
  } catch (e) {
    return { store: null, reason: `IndexedDB refused to open: ${e?.message ?? e}` };
  }
}

/** JSON with every object's keys sorted: the same request gives the same text. */
export function canonicalJson(v) {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v).filter((k) => v[k] !== undefined).sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v ?? null);
}

function done(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = resolve;
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error ?? new Error('aborted'));
  });
}

class ResponseStore {
  constructor(db, limits) {
    this.db = db;
    this.limits = limits;
  }

  /** The live entry for `key` ({ pieces, result, stored }), or null; an expired one is dropped. */
  async get(key) {
    const tx = this.db.transaction(RESPONSE_STORE, 'readwrite');
    const st = tx.objectStore(RESPONSE_STORE);
    const e = await idbRequest(st.get(key));
    let out = null;
    if (e && e.expires > Date.now()) {
      e.used = Date.now();
      st.put(e);
      out = { pieces: e.pieces, result: e.result, stored: e.stored };
    } else if (e) {
      st.delete(key);
    }
    await done(tx);
    return out;
  }

  /** Store an answer; then the least recently used go until the store is under `maxBytes`. */
  async put(key, pieces, result) {
    const bytes = JSON.stringify({ pieces, result }).length + key.length;
    if (bytes > this.limits.maxBytes) return;
    const now = Date.now();
    const tx = this.db.transaction(RESPONSE_STORE, 'readwrite');
    const st = tx.objectStore(RESPONSE_STORE);
    st.put({ key, pieces, result, bytes, stored: now, used: now, expires: now + this.limits.ttlMs });
    await done(tx);
    await this.#evict();
  }

  async #evict() {
    const tx = this.db.transaction(RESPONSE_STORE, 'readwrite');
    const st = tx.objectStore(RESPONSE_STORE);
    const all = await idbRequest(st.index('used').getAll());
    let total = all.reduce((n, e) => n + e.bytes, 0);
    const now = Date.now();
    for (const e of all) {
      if (e.expires <= now || total > this.limits.maxBytes) {
        st.delete(e.key);
        total -= e.bytes;
      }
    }
    await done(tx);
  }

  /** { entries, bytes } of the live entries. */
  async size() {
    const all = await idbRequest(this.db.transaction(RESPONSE_STORE, 'readonly').objectStore(RESPONSE_STORE).getAll());
    const live = all.filter((e) => e.expires > Date.now());
    return { entries: live.length, bytes: live.reduce((n, e) => n + e.bytes, 0) };
  }

  /** Remove every entry; resolves to how many there were. */
  async clear() {
    const tx = this.db.transaction(RESPONSE_STORE, 'readwrite');
    const st = tx.objectStore(RESPONSE_STORE);
    const n = await idbRequest(st.count());
    st.clear();
    await done(tx);
    return n;
  }
}

// ---------------------------------------------------------------------------------------
// Prompt prefixes across visits: the KV snapshot of a fixed system prompt or few-shot prefix
// (src/prefix.rs), in the Cache API `kerze-prefixes-v1`. An entry's key names the model's
// sha256, the backend, the engine version, the prefix's length and the sha256 of its ids, so
// a prompt finds the entries it starts with by hashing its own first ids; the engine checks
// the snapshot again (its header and digest) before it uses one. Beyond `maxBytes` or
// `maxEntries` the oldest entries go first.

const PREFIX_CACHE = 'kerze-prefixes-v1';
const PREFIX_BASE = 'https://kerze.invalid/prefix/';

/** Default limits of the prefix store: prefixes shorter than `minTokens` are not kept. */
export const PREFIX_DEFAULTS = Object.freeze({ minTokens: 32, maxBytes: 256 * 1024 * 1024, maxEntries: 16 });

/** The store, or null with the reason. `hashIds(ids)` gives the hex sha256 of ids. */
export async function openPrefixStore(hashIds, limits = PREFIX_DEFAULTS) {
  if (typeof caches === 'undefined') {
    return { store: null, reason: 'the Cache API is not available here (insecure context, file: or private mode)' };
  }
  try {
    return { store: new PrefixStore(await caches.open(PREFIX_CACHE), hashIds, { ...PREFIX_DEFAULTS, ...limits }), reason: null };
  } catch (e) {
    return { store: null, reason: `the Cache API refused to open: ${e?.message ?? e}` };
  }
}

/** The entries of the prefix store: { key, scope, n, idsHash, bytes, stored }. */
async function prefixEntries(cache) {
  const out = [];
  for (const req of await cache.keys()) {
    const path = req.url.startsWith(PREFIX_BASE) ? req.url.slice(PREFIX_BASE.length).split('/') : [];
    if (path.length !== 3) continue;
    const [scope, n, idsHash] = path.map(decodeURIComponent);
    const res = await cache.match(req);
    out.push({
      req, scope, n: Number(n), idsHash,
      bytes: Number(res?.headers.get('content-length') ?? 0),
      stored: Number(res?.headers.get('x-kerze-stored') ?? 0),
    });
  }
  return out;
}

class PrefixStore {
  constructor(cache, hashIds, limits) {
    this.cache = cache;
    this.hashIds = hashIds;
    this.limits = limits;
  }

  /** `scope`'s longest entry that `ids` starts with and goes on past: { key, n, bytes } or null. */
  async find(scope, ids) {
    const mine = (await prefixEntries(this.cache))
      .filter((e) => e.scope === scope && e.n > 0 && e.n < ids.length)
      .sort((a, b) => b.n - a.n);
    const hashes = new Map();
    for (const e of mine) {
      if (!hashes.has(e.n)) hashes.set(e.n, this.hashIds(ids.slice(0, e.n)));
      if (hashes.get(e.n) !== e.idsHash) continue;
      const res = await this.cache.match(e.req);
      if (!res) continue;
      return { key: e.req, n: e.n, bytes: new Uint8Array(await res.arrayBuffer()) };
    }
    return null;
  }

  /** Keep `bytes`, the snapshot of `ids` in `scope`; then the oldest go past the limits. */
  async put(scope, ids, bytes) {
    if (bytes.byteLength > this.limits.maxBytes) return false;
    const key = PREFIX_BASE + [scope, String(ids.length), this.hashIds(ids)].map(encodeURIComponent).join('/');
    await this.cache.put(key, new Response(bytes, {
      headers: {
        'content-type': 'application/octet-stream',
        'content-length': String(bytes.byteLength),
        'x-kerze-stored': String(Date.now()),
      },
    }));
    const all = (await prefixEntries(this.cache)).sort((a, b) => b.stored - a.stored);
    let total = 0;
    for (const [i, e] of all.entries()) {
      total += e.bytes;
      if (i >= this.limits.maxEntries || total > this.limits.maxBytes) await this.cache.delete(e.req);
    }
    return true;
  }

  async delete(key) {
    return this.cache.delete(key);
  }

  /** { entries, bytes }. */
  async size() {
    const all = await prefixEntries(this.cache);
    return { entries: all.length, bytes: all.reduce((n, e) => n + e.bytes, 0) };
  }

  /** Remove every entry; resolves to how many there were. */
  async clear() {
    let n = 0;
    for (const req of await this.cache.keys()) {
      if (await this.cache.delete(req)) n += 1;
    }
    return n;
  }
}
