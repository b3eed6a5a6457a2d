// Prefill/decode tokens/s of a 128-token prompt (?prompt=N for another length) + 64 greedy
// tokens (?gen=N), and the time from cached bytes to ready. Prints JSON into #result and to the
// console ("KERZE_BENCH {...}").
import { createEngine, catalog } from '../pkg/index.js';

const q = new URLSearchParams(location.search);
const threads = Number(q.get('threads') ?? 1);
const device = q.get('device') ?? 'auto';
const worker = q.get('worker') !== '0';
// kerze's wasm build: 'auto' (the relaxed-SIMD twin where the browser has it), 'simd128'.
const simd = q.get('simd') ?? 'auto';
// Prompt tokens: the default's 128, or a long context's attention (?prompt=1600).
const promptTokens = Number(q.get('prompt') ?? 128);
// Greedy tokens after it (?gen=N: fewer for the large shapes of make bench-scale).
const genTokens = Number(q.get('gen') ?? 64);
// ?ctx=N: the context (default: the engine's, 4096 for a decoder). bench-peers.mjs passes the
// one the peer's page (bench-wllama.js) gives llama.cpp, so that neither engine holds a larger
// KV cache (kerze's default held ~100 MB more on a 1B shape).
const nCtx = q.get('ctx') ? Number(q.get('ctx')) : undefined;
// ?model=<catalog id> (default gemma-3-270m) or ?file=<name> (any file there), from ../models/.
const modelId = q.get('model') ?? 'gemma-3-270m';
const file = q.get('file') ?? catalog[modelId].file;
const model = q.get('file')
  ? { url: new URL(`../models/${file}`, location.href).href }
  : { id: modelId, url: new URL(`../models/${file}`, location.href).href };
// The same text as Tokenizer::bench_prompt (src/tokenizer/mod.rs), so both benchmarks run
// the same 128 ids.
const BENCH_TEXT = 'The history of the city begins with a small settlement on the river, where traders met to exchange salt, grain and cloth. ';

async function run() {
  if (q.get('warm') === '1') {
    // Only fill the cache, so that the measured page loads once, from the cache.
    const first = await createEngine({ model, device, threads, worker, simd, nCtx });
    await first.dispose();
    return { warmed: true };
  }
  const t0 = performance.now();
  const engine = await createEngine({ model, device, threads, worker, simd, nCtx });
  const createMs = performance.now() - t0;
  if (engine.info.family === 'bert') {
    // An encoder: sentences/s as `kerze bench` measures them natively.
    const result = {
      backend: engine.info.backend,
      threads: engine.info.threads,
      model: engine.info.model,
      create_engine_ms: createMs,
      cached_bytes_to_ready_ms: engine.info.readyMs,
      embed: await benchEmbed(engine),
    };
    window.benchEngine = engine;
    return result;
  }
  // ~25 tokens a sentence: enough of them for the prompt.
  const text = BENCH_TEXT.repeat(Math.ceil(promptTokens / 20) + 4);
  const ids = (await engine.tokenize(text, { bos: true })).slice(0, promptTokens);
  const r = await engine.complete(ids, { maxTokens: genTokens, temperature: 0, stopTokens: [] });
  const result = {
    backend: engine.info.backend,
    simd: engine.info.simd,
    threads: engine.info.threads,
    source: engine.info.source,
    prompt_tokens: r.usage.promptTokens,
    gen_tokens: r.usage.completionTokens,
    prefill_tokens_per_s: r.usage.prefillTokensPerS,
    decode_tokens_per_s: r.usage.decodeTokensPerS,
    cached_bytes_to_ready_ms: engine.info.readyMs,
    cache_read_ms: engine.info.fetchMs,
    create_engine_ms: createMs,
    tokenizer_ms: engine.info.tokenizerMs,
    wasm_memory_bytes: engine.info.memoryBytes,
    // The prompt tokens as text: the peer page (bench-wllama.html) runs the same text.
    prompt_text: await engine.detokenize(ids, { skipSpecial: true }),
  };
  // Kept loaded, so the renderer's memory can be read after load (tests/browser/bench.mjs).
  window.benchEngine = engine;
  return result;
}

/** Sentences/s and ms per sentence at 16, 64, 128 and 256 tokens, one and 32 per call. */
async function benchEmbed(engine) {
  const all = await engine.tokenize(BENCH_TEXT.repeat(32), { bos: true });
  const rows = [];
  for (const len of [16, 64, 128, 256]) {
    let n = len - 2;
    let text;
    for (;;) {
      text = await engine.detokenize(all.slice(1, 1 + n), { skipSpecial: true });
      if ((await engine.tokenize(text, { bos: true })).length <= len || n === 1) break;
      n -= 1;
    }
    for (const batch of [1, 32]) {
      const texts = Array(batch).fill(text);
      await engine.embed(texts);
      const t0 = performance.now();
      let runs = 0;
      while (runs < 3 || (performance.now() - t0 < 1000 && runs < 200)) {
        await engine.embed(texts);
        runs += 1;
      }
      const perS = (runs * batch * 1000) / (performance.now() - t0);
      rows.push({ tokens: (await engine.tokenize(text, { bos: true })).length, batch, sentences_per_s: perS, ms_per_sentence: 1000 / perS });
    }
  }
  return rows;
}

// The result as `window.benchResult` and, for a harness to await (tests/browser/lib.mjs
// `benchResult`), the promise `window.benchDone`.
window.benchDone = run().then((result) => {
  document.getElementById('status').textContent = 'done';
  document.getElementById('result').textContent = JSON.stringify(result, null, 2);
  console.log(`KERZE_BENCH ${JSON.stringify(result)}`);
  window.benchResult = result;
  return result;
}, (e) => {
  document.getElementById('status').textContent = `${e.name}: ${e.message}`;
  console.log(`KERZE_BENCH_ERROR ${e.name}: ${e.message}`);
  window.benchResult = { error: `${e.name}: ${e.message}` };
  return window.benchResult;
});
