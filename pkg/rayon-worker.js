// One thread of the threads build's rayon pool (started by rayon-start.js through the spawner
// wasm-load.js registers): init the threads glue on the shared memory, then run rayon's loop.
// Waits for its one init message; the type is prefixed, so nothing else is mistaken for it.
// The spawner (wasm-load.js) says first which twin runs: 'relaxed' (pkg/wasm/threads-relaxed) or
// 'simd128' (pkg/wasm/threads); both imports are literal, so that bundlers follow them.

function initMessage() {
  return new Promise((resolve) => {
    globalThis.addEventListener('message', function onMessage({ data }) {
      if (data?.type !== 'wasm_bindgen_worker_init') return;
      globalThis.removeEventListener('message', onMessage);
      resolve(data);
    });
  });
}

if (typeof WorkerGlobalScope !== 'undefined' && globalThis instanceof WorkerGlobalScope) {
  let build = 'simd128';
  globalThis.addEventListener('message', function onBuild({ data }) {
    if (data?.type !== 'kerze_rayon_build') return;
    globalThis.removeEventListener('message', onBuild);
    build = data.build;
  });
  initMessage().then(async ({ module, memory, receiver }) => {
    const glue = build === 'relaxed' ? await import('./wasm/threads-relaxed/kerze.js') : await import('./wasm/threads/kerze.js');
    await glue.default({ module_or_path: module, memory });
    globalThis.postMessage({ type: 'wasm_bindgen_worker_ready' });
    glue.wbg_rayon_start_worker(receiver);
  });
}
