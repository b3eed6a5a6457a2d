// The worker side: owns a Core (the wasm engine and the model) and answers the page's
// messages (protocol.js). Started by the worker entries: worker.js (the package's worker
// script, and what bundlers emit from it), embed.js (dist/kerze.js serving as its own worker)
// and inline-worker.js (the self-contained copy for bundles that left the package's files
// behind).

import { Core } from './core.js';
import { serializeError } from './protocol.js';

/**
 * Answer messages on `scope` (a DedicatedWorkerGlobalScope). `wasm`, where given, provides
 * the single-thread build's module (see Core).
 */
export function serve(scope, { wasm } = {}) {
  const core = new Core({
    warn: (message) => scope.postMessage({ type: 'warning', message }),
    info: (info) => scope.postMessage({ type: 'info', info }),
    wasm,
  });
  const running = new Map();
  let queue = Promise.resolve();

  async function handle(id, op, args, signal) {
    const post = (m) => scope.postMessage({ id, ...m });
    switch (op) {
      case 'load':
        return core.load(args, (progress) => post({ type: 'progress', progress }), signal);
      case 'generate': {
        const it = core.generate(args.input, args.options, signal);
        for (;;) {
          const r = await it.next();
          if (r.done) return r.value;
          post({ type: 'chunk', chunk: r.value });
        }
      }
      case 'tokenize':
        return core.tokenize(args.text, args.options);
      case 'detokenize':
        return core.detokenize(args.ids, args.options);
      case 'logitsTopK':
        return core.logitsTopK(args.ids, args.k, args.first);
      case 'embed':
        return core.embed(args.texts, args.options);
      case 'reset':
        return core.reset();
      case 'dispose':
        return core.dispose();
      default:
        throw new Error(`unknown op ${op}`);
    }
  }

  scope.onmessage = (ev) => {
    const { id, op, args } = ev.data ?? {};
    if (op === 'abort') {
      running.get(args?.target)?.abort();
      return;
    }
    const ctl = new AbortController();
    running.set(id, ctl);
    // One op at a time, in order; aborts (above) get through while one runs.
    queue = queue.then(async () => {
      try {
        const value = await handle(id, op, args, ctl.signal);
        scope.postMessage({ id, type: 'result', value });
      } catch (e) {
        scope.postMessage({ id, type: 'error', error: serializeError(e) });
      } finally {
        running.delete(id);
      }
    });
  };
  scope.postMessage({ type: 'hello' });
}
