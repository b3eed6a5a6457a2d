// Which model: the `model` option resolved to what the loader needs (a catalog id, a URL with
// its sha256, or the file's bytes), the devices a caller may ask for, the page's own support
// check, and this origin's model cache as the package exports it (`cache.list/delete/clear`).

import { KerzeError } from './protocol.js';
import { catalog } from './catalog.js';
import { openModelCache, openResponseStore, openPrefixStore } from './cache.js';
import { SIMD_PROBE } from './probe.js';

export const DEVICES = ['auto', 'cpu', 'webgpu'];
const SHA256 = /^[0-9a-f]{64}$/;

/** The device option checked. */
export function checkDevice(device) {
  if (!DEVICES.includes(device)) {
    throw new KerzeError('InvalidArgumentError', `device must be one of ${DEVICES.join(', ')}, got '${device}'`);
  }
}


export function baseUrl() {
  return globalThis.document?.baseURI ?? globalThis.location?.href;
}

/**
 * A model option → what the loader needs: { key, url, sha256, bytes, name } or { data }.
 * Catalog ids resolve to the catalog's URL; `{ url, sha256 }` works for any GGUF.
 */
export function resolveModel(model) {
  const spec = resolveFile(model);
  const onnx = onnxParts(model, spec);
  return onnx ? { ...spec, onnx } : spec;
}

/** An ONNX export's companions (`tokenizer`, `config`: URLs resolved, or parsed JSON), or null. */
function onnxParts(model, spec) {
  if (!model || typeof model !== 'object' || ArrayBuffer.isView(model) || model instanceof ArrayBuffer) return null;
  const named = model.tokenizer != null || model.config != null;
  const onnxUrl = spec.url != null && /\.onnx$/i.test(new URL(spec.url).pathname);
  if (!named && !onnxUrl) return null;
  const part = (v, what) => {
    if (typeof v === 'string') {
      try {
        return new URL(v, baseUrl()).href;
      } catch {
        throw new KerzeError('InvalidArgumentError', `model.${what} '${v}' is not a URL`);
      }
    }
    if (v && typeof v === 'object') return v;
    throw new KerzeError('InvalidArgumentError',
      `an ONNX model needs model.${what}: the URL of its ${what}.json, or the parsed JSON`);
  };
  return { tokenizer: part(model.tokenizer, 'tokenizer'), config: part(model.config, 'config') };
}

function resolveFile(model) {
  if (model && typeof model === 'object' && model.data != null && model.url == null) {
    const d = model.data;
    if (!(d instanceof ArrayBuffer || ArrayBuffer.isView(d))) {
      throw new KerzeError('InvalidArgumentError', 'model.data must be an ArrayBuffer or a typed array');
    }
    const data = d instanceof ArrayBuffer ? new Uint8Array(d) : new Uint8Array(d.buffer, d.byteOffset, d.byteLength);
    return { data, name: model.name ?? 'bytes' };
  }
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
    "model must be a catalog id (e.g. 'gemma-3-270m'), { url, sha256 }, { url, tokenizer, config } (ONNX), or the file's bytes");
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


/** `assetsUrl` as a folder URL (a trailing slash added), or InvalidArgumentError. */
export function folderUrl(url) {
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

/**
 * What kerze keeps in this origin: the model files (Cache API), the answers to
 * deterministic requests (IndexedDB) and the prompt prefixes' KV snapshots (Cache API): what
 * is stored, how much, and removing it.
 */
export const cache = Object.freeze({
  /** The cached models. @returns {Promise<Array<{ key, url, sha256, bytes, name, storedAt }>>} */
  async list() {
    const { store } = await openModelCache();
    return store ? store.list() : [];
  },
  /** Remove one model (catalog id, { url, sha256 }, or a key from list()). */
  async delete(model) {
    const { store } = await openModelCache();
    return store ? store.delete(cacheKeyOf(model)) : false;
  },
  /**
   * Remove what is cached: everything, or what `{ models, responses, prefixes }` names (true); resolves
   * to how many entries were removed.
   */
  async clear(what) {
    const all = what == null;
    let n = 0;
    if (all || what.models === true) {
      const { store } = await openModelCache();
      n += store ? await store.clear() : 0;
    }
    if (all || what.responses === true) {
      const { store } = await openResponseStore();
      n += store ? await store.clear() : 0;
    }
    if (all || what.prefixes === true) {
      const { store } = await openPrefixStore(null);
      n += store ? await store.clear() : 0;
    }
    return n;
  },
  /** `{ models, responses, prefixes }`, each `{ entries, bytes }`. */
  async size() {
    const models = await this.list();
    const { store } = await openResponseStore();
    const { store: prefixes } = await openPrefixStore(null);
    return {
      models: { entries: models.length, bytes: models.reduce((t, m) => t + (m.bytes ?? 0), 0) },
      responses: store ? await store.size() : { entries: 0, bytes: 0 },
      prefixes: prefixes ? await prefixes.size() : { entries: 0, bytes: 0 },
    };
  },
});
