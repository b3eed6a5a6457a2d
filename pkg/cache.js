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
