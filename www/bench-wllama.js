// The peer's half of the side-by-side benchmark: @wllama/wllama (llama.cpp compiled to wasm,
// a dev dependency served from /node_modules/) on the same file, prompt and token counts as
// bench.js; its own llama-server timings (prompt_per_second, predicted_per_second).
import { Wllama } from '../node_modules/@wllama/wllama/esm/index.js';
import { catalog } from '../pkg/index.js';

const q = new URLSearchParams(location.search);
const threads = Number(q.get('threads') ?? 1);
const file = q.get('file') ?? catalog[q.get('model') ?? 'gemma-3-270m'].file;
// A longer prompt than bench.js's default (?prompt=N, as there) needs a longer context;
// ?gen=N greedy tokens as there (default 64).
const genTokens = Number(q.get('gen') ?? 64);
const nCtx = Math.max(1024, Number(q.get('prompt') ?? 0) + genTokens + 64);
const quiet = { debug() {}, log() {}, warn() {}, error: (...a) => console.error(...a) };

window.runWllama = async (promptText) => {
  const t0 = performance.now();
  const blob = await (await fetch(`../models/${file}`)).blob();
  const fetchMs = performance.now() - t0;
  const wllama = new Wllama({ default: new URL('../node_modules/@wllama/wllama/esm/wasm/wllama.wasm', location.href).href },
    { logger: quiet, suppressNativeLog: true });
  wllama.setCompat(null);
  const t1 = performance.now();
  await wllama.loadModel([blob], { n_threads: threads, n_ctx: nCtx, n_batch: 512, n_gpu_layers: 0 });
  const readyMs = performance.now() - t1;
  const r = await wllama.createCompletion({
    prompt: promptText, max_tokens: genTokens, temperature: 0, ignore_eos: true, cache_prompt: false,
  });
  const t = r.timings;
  const result = {
    engine: 'wllama', version: '3.13.0', threads,
    prompt_tokens: t.prompt_n, gen_tokens: t.predicted_n,
    prefill_tokens_per_s: t.prompt_per_second, decode_tokens_per_s: t.predicted_per_second,
    fetch_ms: fetchMs, blob_to_ready_ms: readyMs,
  };
  window.benchWllama = wllama; // kept loaded, so the renderer's memory can be read after load
  document.getElementById('status').textContent = 'done';
  document.getElementById('result').textContent = JSON.stringify(result, null, 2);
  return result;
};
