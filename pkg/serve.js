// The worker side: owns a Core (the wasm engine and the model) and answers the page's
// messages (protocol.js). Started by the worker entries: worker.js (the package's worker
// script, and what bundlers emit from it), embed.js (dist/kerze.js serving as its own worker)
// and inline-worker.js (the self-contained copy for bundles that left the package's files
// behind).

import { Core, dispatch } from './core.js';
import { serializeError } from './protocol.js';

/**
 * Answer messages on `scope` (a DedicatedWorkerGlobalScope). `wasm`, `jinja` and `guide`,
 * where given, provide the single-thread build's module, the chat-template module's and the
 * constraint module's (see Core).
 */
export function serve(scope, { wasm, jinja, guide } = {}) {
  const core = new Core({
    warn: (message) => scope.postMessage({ type: 'warning', message }),
    info: (info) => scope.postMessage({ type: 'info', info }),
    wasm,
    jinja,
    guide,
  });
  const running = new Map();
  let queue = Promise.resolve();

  function handle(id, op, args, signal) {
    const post = (m) => scope.postMessage({ id, ...m });
    return dispatch(core, op, args, {
      onProgress: (progress) => post({ type: 'progress', progress }),
      onChunk: (chunk) => post({ type: 'chunk', chunk }),
      signal,
    });
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
