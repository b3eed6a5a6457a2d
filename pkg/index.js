// kerze — small quantized language models in the visitor's browser.
//
//   const engine = await createEngine({ model: 'gemma-3-270m', onProgress, signal });
//   for await (const c of engine.generate('Slogan for an e-bike:', { maxTokens: 48 })) out += c.text;
//
// The engine runs in a Web Worker (worker.js) unless `worker: false`; both ways give the same
// interface. Errors are KerzeError with `name` saying the kind (protocol.js).
//
// Here: createEngine (the options, the device check while the worker starts, the load, and
// where the fallback answers instead: route-policy.js) and probe. The Engine is engine.js.

import { KerzeError, abortError, ERROR_NAMES } from './protocol.js';
import { catalog } from './catalog.js';
import { checkCreateOptions, checkNCtx } from './options.js';
import { InThreadTransport, WorkerTransport, chooseThreads, _setWorkerUrl } from './transport.js';
import { checkDevice, resolveModel, checkSupport, folderUrl, cache } from './model.js';
import { beacon, checkProbeOptions, probeSpec } from './probe.js';
import { planFromHeader } from './memory-plan.js';
import { RemoteTransport, fallbackOptions } from './route.js';
import { afterCheck, startFailed, whileLoading, loadFailed } from './route-policy.js';
import { ThinkSplitter } from './openai.js';
import { Engine } from './engine.js';

export { KerzeError, ERROR_NAMES, catalog, ThinkSplitter, _setWorkerUrl, resolveModel, checkSupport, cache, Engine };

/**
 * The device check, before any download: can this browser run `model`, on which backend, and
 * why — `{ canRun: 'yes' | 'risky' | 'no', backend, reasons, downloadBytes, peakBytes, cached,
 * storage: { quota, usage }, plan }`. Nothing leaves the page but, for a GGUF URL the
 * catalog does not know, its header (an HTTP range of the first MB: `plan`, the memory the
 * engine will hold for it at `nCtx`, memory-plan.js). `overrides: { deviceMemory, gpu:
 * false, storage }` simulates a weaker device.
 */
export async function probe(options = {}) {
  checkProbeOptions(options);
  const { model = 'gemma-3-270m', device = 'auto', signal, overrides, nCtx } = options;
  checkDevice(device);
  checkNCtx(nCtx);
  let spec = resolveModel(model);
  // A GGUF the catalog does not know: its memory from its header (memory-plan.js), not from
  // the file's size.
  if (spec.peakBytes == null && spec.url && !spec.onnx) {
    try {
      const plan = await planFromHeader(spec.url, { nCtx, signal });
      spec = { ...spec, peakBytes: plan.peakBytes, plan };
    } catch (e) {
      if (e?.name === 'AbortError') throw e;
      spec = { ...spec, planError: e?.message ?? String(e) };
    }
  }
  return probeSpec(spec, { device, signal, overrides });
}

/**
 * Load a model and return an Engine.
 * @param {import('./index.js').CreateEngineOptions} options
 */
export async function createEngine(options = {}) {
  const {
    model = 'gemma-3-270m', device = 'auto', onProgress, onWarning, signal, worker = true,
    threads = 'auto', nCtx, cache = true, assetsUrl, fallback, onRoute, probeOverrides, responseCache, prefixCache,
    prepareConstraints = false, simd = 'auto',
  } = options;
  const { responses, prefixes } = checkCreateOptions({ device, nCtx, onRoute, responseCache, prefixCache, prepareConstraints, simd });
  const f = fallbackOptions(fallback);
  const cloud = f ? new RemoteTransport(f) : null;
  if (signal?.aborted) throw abortError(signal);
  const warn = onWarning ?? ((m) => console.warn(`kerze: ${m}`));
  // An engine that answers through the fallback only (the local model cannot), and why.
  const cloudOnly = (reason) => new Engine(null, null, warn, { cloud, onRoute, notLocal: reason, responses });
  const spec = resolveModel(model);
  const assets = assetsUrl == null ? null : folderUrl(assetsUrl);
  // The device check before any download (bytes given: nothing to download), while the
  // engine's worker starts (a cached model's check and the worker's start take about as long
  // each). A worker the check turns down is ended unused.
  let check = null;
  let starting = null;
  const start = () => (worker ? WorkerTransport.start(warn, assets) : Promise.resolve(new InThreadTransport(warn, assets)))
    .then((transport) => ({ transport }), (error) => ({ error }));
  try {
    checkSupport();
    starting = start();
    check = spec.data ? null : await probeSpec(spec, { device, signal, overrides: probeOverrides, skipGpu: true });
  } catch (e) {
    if (e?.name !== 'UnsupportedDeviceError') {
      starting?.then((s) => s.transport?.terminate());
      throw e;
    }
    check = { canRun: 'no', problems: [e.message] };
  }
  if (check?.unreachable || check?.canRun === 'no') starting?.then((s) => s.transport?.terminate());
  const away = afterCheck(cloud, check);
  if (away) return cloudOnly(away);
  if (check?.canRun === 'risky') warn(`the model may not run well here: ${check.problems.join('; ')}`);
  const { transport, error } = await (starting ?? start());
  if (error) {
    const why = startFailed(cloud, error);
    if (why) return cloudOnly(why);
    throw error;
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
      const info = await transport.request('load', { model: spec, device, nCtx, threads: nThreads, cache, prefixCache: prefixes ?? false, prepareConstraints, simd },
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
  const loading = whileLoading(cloud, check);
  if (loading) return new Engine(transport, null, warn, { cloud, onRoute, notLocal: loading, ready: load(), responses });
  let info;
  try {
    info = await load();
  } catch (e) {
    transport.terminate();
    const why = loadFailed(cloud, e);
    if (why) return cloudOnly(why);
    throw e;
  }
  return new Engine(transport, info, warn, { cloud, onRoute, responses });
}

export default { createEngine, probe, cache, catalog, KerzeError, Engine };
