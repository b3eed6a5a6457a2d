// Model storage in the Cache API, behind { match, put, delete, list, clear }. Entries are
// keyed by the file's sha256 (or its URL when no sha256 was given) and written only after the
// whole file arrived and its sha256 was checked, so a partial or corrupt download is never
// stored as complete. Where there is no Cache API (file:, some private modes) or it fails,
// `openModelCache` returns null and the caller goes on without a cache.

const CACHE_NAME = 'kerze-models-v1';
// Keys only: the Cache API never fetches them, and `.invalid` can never resolve.
const KEY_BASE = 'https://kerze.invalid/model/';

/**
 * @typedef {{ key: string, url: string, sha256: string, bytes: number, name: string,
 *             storedAt: string }} CachedModel
 */

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

  /** Store `bytes` (already verified) under `key`. Throws on quota errors. */
  async put(key, bytes, meta) {
    const full = { ...meta, key, bytes: bytes.byteLength, storedAt: new Date().toISOString() };
    const response = new Response(bytes, {
      headers: {
        'content-type': 'application/octet-stream',
        'content-length': String(bytes.byteLength),
        'x-kerze-meta': encodeURIComponent(JSON.stringify(full)),
      },
    });
    await this.cache.put(requestFor(key), response);
    return full;
  }

  async delete(key) {
    return this.cache.delete(requestFor(key));
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
