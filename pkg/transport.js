// The transports: the same requests (core.js dispatch) answered by a Core in this thread
// (InThreadTransport) or in a Web Worker (WorkerTransport: the package's worker script, the
// bundler's copy, a blob: trampoline to another origin, or the inline copy), and where that
// worker comes from. Both have `request(op, args, { onProgress, onChunk, signal })`,
// `terminate()`, `kind` and `onInfo`. The third, route.js RemoteTransport, answers the
// `generate` op through the fallback endpoint, with the same pieces and result.

import { KerzeError, deserializeError, abortError } from './protocol.js';
import { Core, dispatch } from './core.js';
import { wasmUrl } from './wasm-load.js';
import { HERE } from './here.js';

let ownWorkerUrl = null;
/** Where the worker script is (the single-file build points this at itself). @internal */
export function _setWorkerUrl(url) {
  ownWorkerUrl = new URL(url);
}


/**
 * Worker threads for the threads build: only where it can run. Its rayon workers start from
 * the package's files next to the engine's worker, so that worker must be a script of this
 * origin (not the inline copy, not a trampoline to another origin).
 */
export function chooseThreads(threads, transport) {
  if (threads === false || threads === 1 || threads === 0) return 0;
  const isolated = globalThis.crossOriginIsolated === true && typeof SharedArrayBuffer !== 'undefined';
  if (!isolated || transport.kind !== 'script' || transport.crossOrigin) return 0;
  if (typeof threads === 'number') return Math.max(0, Math.floor(threads));
  return Math.min(navigator.hardwareConcurrency || 1, 8);
}

// ---------------------------------------------------------------------------------------
// Transports: the same requests, answered by a Core in this thread or in a worker.

export class InThreadTransport {
  /** How the engine's worker was started: there is none. */
  kind = null;

  /** `assets`: the folder of the package's files, when self-hosted. */
  constructor(onWarning, assets) {
    if (!assets && packageLayout() === 'left-behind') {
      throw new KerzeError('InvalidArgumentError',
        "worker: false needs the package's wasm file, which this bundle did not emit (esbuild and Rollup copy "
        + "no file a package names): serve the package's files and pass their folder as assetsUrl, or keep the "
        + 'worker (its inline copy needs no file)');
    }
    this.core = new Core({
      warn: onWarning,
      info: (info) => this.onInfo?.(info),
      wasm: assets ? () => new URL('wasm/kerze_bg.wasm', assets) : undefined,
    });
  }

  request(op, args, hooks = {}) {
    return dispatch(this.core, op, args, hooks);
  }

  terminate() {
    this.core.dispose();
  }
}

// ---------------------------------------------------------------------------------------
// Where the worker comes from.

/**
 * How the package reached the page: 'files' (its modules each at its own URL: served as they
 * are, or by a bundler that keeps module URLs, webpack), 'bundled' (merged into the app's
 * script by a bundler that emitted the worker and the wasm and rewrote their URLs: Vite,
 * Next.js) or 'left-behind' (merged by one that copies no file that `new URL('…',
 * import.meta.url)` names: esbuild, Rollup; neither worker.js nor the wasm is there). Told
 * apart without a request: merged modules share one import.meta.url.
 */
function packageLayout() {
  try {
    const own = import.meta.url;
    if (own !== HERE) return 'files';
    // Merged: wasm-load.js shares this URL; did the bundler rewrite wasm-load.js's wasm URL?
    return wasmUrl().href === new URL('./wasm/kerze_bg.wasm', own).href ? 'left-behind' : 'bundled';
  } catch {
    return 'left-behind'; // no import.meta.url at all (an IIFE or CommonJS bundle)
  }
}

/** The package's worker.js — or the worker a bundler built from it (keep this literal form). */
function spawnBundled() {
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module', name: 'kerze' });
  return { worker, blobUrl: null, crossOrigin: false };
}

/** A module worker from `url`; another origin goes through a blob: trampoline. */
function spawnAt(url) {
  if (url.origin === globalThis.location?.origin) {
    return { worker: new Worker(url, { type: 'module', name: 'kerze' }), blobUrl: null, crossOrigin: false };
  }
  const blob = new Blob([`import ${JSON.stringify(url.href)};\n`], { type: 'text/javascript' });
  const blobUrl = URL.createObjectURL(blob);
  return { worker: new Worker(blobUrl, { type: 'module', name: 'kerze' }), blobUrl, crossOrigin: true };
}

/** The self-contained worker (engine, single-thread wasm inside), from a blob: URL. */
async function spawnInline() {
  const { workerSource } = await import('./wasm/inline/index.js');
  const blobUrl = URL.createObjectURL(new Blob([await workerSource()], { type: 'text/javascript' }));
  return { worker: new Worker(blobUrl, { type: 'module', name: 'kerze' }), blobUrl, crossOrigin: false };
}

/**
 * The ways to start the worker, best first, as [kind, spawn]: a worker script (`assetsUrl`'s,
 * the single-file build's own, the package's or the one a bundler built) unless a bundler
 * left it behind, then the inline copy.
 */
function workerPlan(assetsUrl) {
  const plan = [];
  if (assetsUrl != null) {
    plan.push(['script', () => spawnAt(new URL('worker.js', assetsUrl))]);
  } else if (ownWorkerUrl) {
    plan.push(['script', () => spawnAt(ownWorkerUrl)]);
  } else {
    const layout = packageLayout();
    let here = null;
    try {
      if (layout === 'files') here = new URL(import.meta.url);
    } catch {
      // no URL of its own: the bundler's worker
    }
    if (here && /^https?:$/.test(here.protocol) && here.origin !== globalThis.location?.origin) {
      // The package's own files on another origin (a CDN): through the trampoline.
      plan.push(['script', () => spawnAt(new URL('./worker.js', here))]);
    } else if (layout !== 'left-behind') {
      plan.push(['script', spawnBundled]);
    }
  }
  plan.push(['inline', spawnInline]);
  return plan;
}

/** Resolves when the worker said hello; rejects when its script failed to load or run. */
function handshake({ worker, blobUrl }) {
  return new Promise((resolve, reject) => {
    const fail = (ev) => {
      if (blobUrl) URL.revokeObjectURL(blobUrl);
      worker.terminate();
      reject(new KerzeError('WorkerError',
        `the kerze worker did not start (${ev?.message || 'blocked by a Content-Security-Policy, or the script is unreachable'})`));
    };
    worker.addEventListener('error', fail, { once: true });
    worker.addEventListener('message', function hello(ev) {
      if (ev.data?.type !== 'hello') return;
      worker.removeEventListener('message', hello);
      worker.removeEventListener('error', fail);
      if (blobUrl) URL.revokeObjectURL(blobUrl);
      resolve();
    });
  });
}

export class WorkerTransport {
  /** Start the worker by the first way of workerPlan() that works. */
  static async start(onWarning, assetsUrl) {
    const failures = [];
    for (const [kind, spawn] of workerPlan(assetsUrl)) {
      let spawned;
      try {
        spawned = await spawn();
        await handshake(spawned);
      } catch (e) {
        failures.push(`${kind}: ${e instanceof KerzeError ? e.message : `could not start the kerze worker: ${e?.message ?? e}`}`);
        continue;
      }
      if (failures.length) {
        onWarning(`${failures.join('; ')} — running the package's inline copy of the engine (one thread) instead`);
      }
      const t = new WorkerTransport(spawned.worker, onWarning);
      t.kind = kind;
      t.crossOrigin = spawned.crossOrigin;
      return t;
    }
    throw new KerzeError('WorkerError', failures.join('; then '));
  }

  constructor(worker, onWarning) {
    this.worker = worker;
    this.nextId = 1;
    this.pending = new Map();
    this.dead = null;
    worker.onmessage = (ev) => this.#onMessage(ev.data);
    worker.onerror = (ev) => {
      ev.preventDefault?.();
      this.#die(new KerzeError('WorkerError', `the kerze worker failed: ${ev.message || 'unknown error'}`));
    };
    worker.onmessageerror = () => this.#die(new KerzeError('WorkerError', 'a message from the worker could not be read'));
    this.onWarning = onWarning;
  }

  #onMessage(m) {
    if (m?.type === 'warning') {
      this.onWarning(m.message);
      return;
    }
    if (m?.type === 'info') {
      this.onInfo?.(m.info);
      return;
    }
    const p = this.pending.get(m?.id);
    if (!p) return;
    if (m.type === 'progress') p.onProgress?.(m.progress);
    else if (m.type === 'chunk') p.onChunk?.(m.chunk);
    else {
      this.pending.delete(m.id);
      p.unlink();
      if (m.type === 'result') p.resolve(m.value);
      else p.reject(deserializeError(m.error));
    }
  }

  /** @internal For tests: the worker ends as a crash would end it. */
  crash() {
    this.#die(new KerzeError('EngineCrashedError', 'the engine\'s worker stopped'));
  }

  #die(err) {
    this.dead = err;
    for (const p of this.pending.values()) {
      p.unlink();
      p.reject(err);
    }
    this.pending.clear();
    this.worker.terminate();
  }

  request(op, args, { onProgress, onChunk, signal } = {}) {
    if (this.dead) return Promise.reject(this.dead);
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const onAbort = () => this.worker.postMessage({ id: this.nextId++, op: 'abort', args: { target: id } });
      signal?.addEventListener('abort', onAbort, { once: true });
      const unlink = () => signal?.removeEventListener('abort', onAbort);
      this.pending.set(id, { resolve, reject, onProgress, onChunk, unlink });
      this.worker.postMessage({ id, op, args });
    });
  }

  terminate() {
    this.#die(new KerzeError('DisposedError', 'the engine was disposed'));
  }
}
