// The device check before any download: `probe({ model })` says whether this browser can run
// the model, on which backend, and why — from what the page can learn without the weights
// (the catalog's sizes, or a HEAD request for a URL): wasm SIMD, the GPU adapter and its
// limits, the device's memory, storage, cross-origin isolation, a bounded wasm memory grow,
// and a crash beacon (a flag set before a load and cleared after it: a tab killed while
// loading leaves it set, and the next probe says `risky`).

import { KerzeError } from './protocol.js';
import { openModelCache } from './cache.js';

/** (module (func (result v128) v128.const i32x4 0 0 0 0)): valid only where wasm has SIMD. */
export const SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0,
  10, 22, 1, 20, 0, 253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11]);
/**
 * A module using relaxed SIMD (`i32x4.relaxed_dot_i8x16_i7x16_add_s`): browsers that validate it
 * get the relaxed builds (pkg/wasm/relaxed, pkg/wasm/threads-relaxed).
 */
export const RELAXED_SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 61, 1, 59, 0, 253, 12, 0,
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  0, 0, 0, 253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 253, 147, 2, 11]);
/** What a tab can address: wasm32's 4 GiB, less the engine's own room (engine.rs). */
const WASM_BUDGET = 4 * 2 ** 30 - 384 * 2 ** 20;
const WASM_PAGE = 65536;
const BEACON = 'kerze-loading:';

/** Loads under way in this page or worker, by key (each one's lock release): their beacon is no crash. */
const loadingHere = new Map();

/**
 * The crash beacon for `key`: set before a load, cleared after it (also when it fails). A load
 * still under way (a second `createEngine` of the same model in this page, as React's strict
 * mode does in development, or in another tab of the site) also leaves it set: it holds a
 * shared Web Lock of the same name while it loads, which the browser lets go of when the tab
 * dies, so `check` tells a load in progress from one that was killed.
 */
export const beacon = Object.freeze({
  set(key) {
    const here = loadingHere.get(key) ?? [];
    let release = () => {};
    const locks = globalThis.navigator?.locks;
    if (locks?.request) {
      const held = new Promise((resolve) => { release = resolve; });
      try {
        locks.request(BEACON + key, { mode: 'shared' }, () => held).catch(() => {});
      } catch { /* no locks here */ }
    }
    loadingHere.set(key, [...here, release]);
    try { globalThis.localStorage?.setItem(BEACON + key, new Date().toISOString()); } catch { /* no storage */ }
  },
  clear(key) {
    const here = loadingHere.get(key) ?? [];
    here.shift()?.();
    if (here.length > 0) return;
    loadingHere.delete(key);
    try { globalThis.localStorage?.removeItem(BEACON + key); } catch { /* no storage */ }
  },
  /** When the beacon was set, if the load it marks did not finish and is not under way. */
  async check(key) {
    let at = null;
    try { at = globalThis.localStorage?.getItem(BEACON + key) ?? null; } catch { return null; }
    if (!at || loadingHere.has(key)) return null;
    const locks = globalThis.navigator?.locks;
    if (locks?.query) {
      try {
        const { held = [] } = await locks.query();
        if (held.some((l) => l.name === BEACON + key)) return null;
      } catch { /* no locks here: the beacon alone */ }
    }
    return at;
  },
});

/** A wasm memory of `bytes` can be had here (grown, then dropped); false when it cannot. */
function memoryGrows(bytes) {
  const pages = Math.min(65536, Math.ceil(bytes / WASM_PAGE));
  try {
    const m = new WebAssembly.Memory({ initial: 1, maximum: pages });
    m.grow(pages - 1);
    return true;
  } catch {
    return false;
  }
}

async function headBytes(url, signal) {
  try {
    const r = await fetch(url, { method: 'HEAD', signal });
    if (!r.ok) return { bytes: null, error: `HEAD ${url}: HTTP ${r.status}` };
    const n = Number(r.headers.get('content-length'));
    return { bytes: Number.isSafeInteger(n) && n > 0 ? n : null, error: null };
  } catch (e) {
    return { bytes: null, error: `HEAD ${url}: ${e?.message ?? e}` };
  }
}

/**
 * `spec` is a resolved model (model.js resolveModel): { key, url, sha256, bytes, peakBytes?,
 * largestTensorBytes? } or { data }. `device` as createEngine's. `overrides` (tests, the demo's
 * "weak device" switch): { deviceMemory, gpu: false, storage: { quota, usage } }.
 */
export async function probeSpec(spec, { device = 'auto', signal, overrides = {}, skipGpu = false } = {}) {
  const reasons = [];
  const problems = [];
  let verdict = 'yes';
  const worse = (v, why) => {
    reasons.push(why);
    problems.push(why);
    if (v === 'no' || verdict === 'yes') verdict = v;
  };
  // Sizes: the catalog's, the bytes given, or a HEAD.
  let downloadBytes = spec.bytes ?? (spec.data ? (spec.data.byteLength ?? spec.data.size ?? null) : null);
  let unreachable = null;
  if (downloadBytes == null && spec.url) {
    const h = await headBytes(spec.url, signal);
    downloadBytes = h.bytes;
    if (h.error) {
      unreachable = h.error;
      worse('no', `the model cannot be reached: ${h.error}`);
    }
  }
  // The catalog's number, or the engine's plan from the file's header (index.js: probe); else
  // (the header could not be read) 1.6× the file: int8 unpacking of 4-bit weights plus the KV
  // cache.
  const peakBytes = spec.peakBytes ?? (downloadBytes != null ? Math.round(downloadBytes * 1.6) : null);
  if (spec.plan) {
    const p = spec.plan;
    reasons.push(`memory from the file's header: ${mb(p.weightBytes)} MB of weights as the engine holds them, ${mb(p.kvBytes)} MB of KV cache at ${p.nCtx} tokens`);
  } else if (spec.peakBytes == null && downloadBytes != null) {
    reasons.push(`memory estimated from the file size${spec.planError ? ` (its header could not be read: ${spec.planError})` : ' (not a catalog model)'}`);
  }

  const simd = typeof WebAssembly === 'object' && WebAssembly.validate(SIMD_PROBE);
  if (!simd) worse('no', 'this browser has no WebAssembly SIMD (the CPU engine needs it)');
  const relaxedSimd = simd && WebAssembly.validate(RELAXED_SIMD_PROBE);
  if (relaxedSimd) reasons.push('relaxed SIMD: the faster int8 products of ONNX exports (7-bit activations)');
  if (peakBytes != null && peakBytes > WASM_BUDGET) {
    worse('no', `the model needs ${mb(peakBytes)} MB of wasm memory, more than the ${mb(WASM_BUDGET)} MB a tab has`);
  }

  // The GPU.
  let gpu = null;
  // createEngine leaves `auto`'s GPU choice to the engine's worker (which asks for the adapter
  // anyway): asking here too would only repeat it (and Chromium's warning when there is none).
  const askGpu = !(skipGpu && device === 'auto');
  if (askGpu && device !== 'cpu' && overrides.gpu !== false && globalThis.navigator?.gpu) {
    try {
      const a = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
      if (a) {
        gpu = {
          fallback: Boolean(a.info?.isFallbackAdapter),
          description: a.info?.description || a.info?.architecture || a.info?.vendor || 'unknown adapter',
          maxBufferSize: a.limits.maxBufferSize,
          maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
        };
      }
    } catch (e) {
      reasons.push(`WebGPU failed: ${e?.message ?? e}`);
    }
  }
  let backend;
  const isolated = globalThis.crossOriginIsolated === true;
  const cpu = isolated ? 'cpu-simd-threads' : 'cpu-simd';
  if (device === 'cpu') {
    backend = cpu;
    reasons.push("device 'cpu' was asked for");
  } else if (!askGpu) {
    backend = null;
    reasons.push('the engine chooses between WebGPU and the CPU when it loads');
  } else if (!gpu) {
    backend = cpu;
    if (device === 'webgpu') worse('no', "device 'webgpu' was asked for, but there is no WebGPU adapter");
    else reasons.push(globalThis.navigator?.gpu && overrides.gpu !== false ? 'no WebGPU adapter: the CPU engine runs it' : 'no WebGPU in this browser: the CPU engine runs it');
  } else if (spec.largestTensorBytes != null && spec.largestTensorBytes > gpu.maxBufferSize) {
    backend = cpu;
    const why = `its largest tensor (${mb(spec.largestTensorBytes)} MB) is beyond the GPU's buffer limit (${mb(gpu.maxBufferSize)} MB)`;
    if (device === 'webgpu') worse('no', why);
    else reasons.push(`${why}: the CPU engine runs it`);
  } else if (gpu.fallback && device === 'auto') {
    backend = cpu;
    reasons.push(`the WebGPU adapter (${gpu.description}) is a software fallback (slower than the CPU engine)`);
  } else {
    backend = 'webgpu';
    reasons.push(`WebGPU adapter ${gpu.description}`);
  }
  if (backend && backend !== 'webgpu') reasons.push(isolated ? 'cross-origin isolated: the threads build' : 'not cross-origin isolated: one thread');

  // Memory of the device.
  const deviceMemory = overrides.deviceMemory ?? globalThis.navigator?.deviceMemory ?? null;
  if (deviceMemory != null && peakBytes != null) {
    const have = deviceMemory * 2 ** 30;
    if (peakBytes > have / 2) worse('no', `the model needs ${mb(peakBytes)} MB; this device reports ${deviceMemory} GB of memory`);
    else if (peakBytes > have / 4) worse('risky', `the model needs ${mb(peakBytes)} MB of this device's ${deviceMemory} GB: other tabs may be closed, or this one killed`);
  }
  if (peakBytes != null && peakBytes <= WASM_BUDGET && backend !== 'webgpu' && !memoryGrows(peakBytes)) {
    worse('no', `a wasm memory of ${mb(peakBytes)} MB could not be had here`);
  }

  // Storage and the cache.
  let storage = overrides.storage ?? null;
  if (!storage && globalThis.navigator?.storage?.estimate) {
    try {
      const e = await navigator.storage.estimate();
      storage = { quota: e.quota ?? null, usage: e.usage ?? null };
    } catch { /* none */ }
  }
  let cached = false;
  if (spec.key) {
    try {
      const { store } = await openModelCache();
      const hit = store ? await store.match(spec.key) : null;
      cached = Boolean(hit && (!spec.sha256 || hit.meta.sha256 === spec.sha256));
    } catch { /* no cache */ }
  }
  if (!cached && storage?.quota != null && downloadBytes != null && storage.quota - (storage.usage ?? 0) < downloadBytes) {
    worse('risky', `${mb(downloadBytes)} MB do not fit the ${mb(storage.quota - (storage.usage ?? 0))} MB of storage left: the model downloads on every visit`);
  }
  const crashed = spec.key ? await beacon.check(spec.key) : null;
  if (crashed) worse('risky', `the last load of this model in this browser (${crashed}) did not finish: the tab may have been killed`);
  return {
    canRun: verdict,
    backend,
    reasons,
    problems,
    /** Set when the file itself cannot be had (a 404, no network): not the device's fault. */
    unreachable,
    downloadBytes: cached ? 0 : downloadBytes,
    modelBytes: downloadBytes,
    peakBytes,
    ...(spec.plan ? { plan: spec.plan } : {}),
    cached,
    storage,
    crossOriginIsolated: isolated,
    relaxedSimd,
    deviceMemory,
  };
}

function mb(b) {
  return Math.round(b / 1e6);
}

export function checkProbeOptions(opts) {
  for (const k of Object.keys(opts)) {
    if (!['model', 'device', 'signal', 'overrides', 'nCtx'].includes(k)) {
      throw new KerzeError('InvalidArgumentError', `probe: unknown option '${k}': known are model, device, signal, overrides, nCtx`);
    }
  }
}
