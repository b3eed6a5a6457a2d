// The threads build's thread start, in a form both browsers and bundlers follow.
//
// `make` copies this file over wasm-bindgen-rayon's "no-bundler" helper snippet
// (pkg/wasm/threads/snippets/wasm-bindgen-rayon-*/src/workerHelpers.no-bundler.js), whose
// contract it keeps: the glue imports `startWorkers(module, memory, builder)`, which starts
// `builder.numThreads()` workers; each inits the glue on the shared memory and calls
// `wbg_rayon_start_worker(receiver)` (rayon-worker.js). Why not the crate's own helpers: its
// no-bundler one loads the glue from a URL computed at run time (bundlers cannot follow it:
// a bundled app's threads find no glue) and inits it with positional parameters (a
// deprecation warning per thread); its bundler one imports the directory `../../..`, which a
// browser cannot load unbundled.
//
// The worker itself is created by wasm-load.js (the spawner it registers under RAYON_SPAWN), not
// here: this file is part of every thread's own module graph (thread → glue → this file), and
// a worker whose graph starts itself again hangs Next.js's bundler (Turbopack 16.4).

const RAYON_SPAWN = Symbol.for('kerze.spawnRayonWorker');
const READY = 'wasm_bindgen_worker_ready';

// Held so that no browser collects a worker that shares the memory but has no other owner.
let workers = [];

export async function startWorkers(module, memory, builder) {
  const spawn = globalThis[RAYON_SPAWN];
  if (typeof spawn !== 'function') throw new Error('no thread spawner registered (wasm-load.js registers it)');
  const n = builder.numThreads();
  if (n === 0) throw new Error('the thread pool needs at least one thread');
  const init = { type: 'wasm_bindgen_worker_init', module, memory, receiver: builder.receiver() };
  workers = await Promise.all(Array.from({ length: n }, () => new Promise((resolve, reject) => {
    const worker = spawn();
    worker.addEventListener('message', function ready({ data }) {
      if (data?.type !== READY) return;
      worker.removeEventListener('message', ready);
      resolve(worker);
    });
    worker.addEventListener('error', (e) => {
      reject(new Error(`a thread did not start (${e.message || 'its script did not load'})`));
    }, { once: true });
    worker.postMessage(init);
  })));
  builder.build();
}
