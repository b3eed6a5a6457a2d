// `make bench-peers`: kerze and llama.cpp's wasm build (@wllama/wllama, a dev dependency) side
// by side in headless Chromium on the same file (Gemma 3 270M Q4_K_M by default), the same
// 128-token prompt and 64 greedy tokens (end of sequence ignored), timed the same way, the two
// engines alternating, each run in a fresh browser (a new profile, nothing cached):
// - kerze: a first visit (download, hash, cache write, load: its peak memory), then the
//   measured page, which loads from the Cache API (www/bench.html);
// - wllama: the file fetched as a Blob and loaded (www/bench-wllama.html).
// Wall: from navigation to the 64th token (load + prompt + decode), measured here. The
// renderer's RSS (the largest renderer of that browser, read from /proc every 50 ms) after
// load and at its peak. Medians per engine and thread count, and the kerze / wllama ratios.
// KERZE_PEERS_RUNS (default 5), KERZE_PEERS_THREADS (default 1,2), KERZE_BENCH_MODEL.
// Prints JSON lines (each run) and a JSON summary (last line).
import fs from 'node:fs';
import { serve, stopServers, launch, rendererRssMb } from './lib.mjs';

const RUNS = Number(process.env.KERZE_PEERS_RUNS ?? 5);
const THREADS = (process.env.KERZE_PEERS_THREADS ?? '1,2').split(',').map(Number);
const MODEL = process.env.KERZE_BENCH_MODEL ?? 'gemma-3-270m';
const median = (xs) => {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};
const loadavg = () => fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);

/** Samples the largest renderer's RSS of the browser whose ancestor is this process. */
function sampler() {
  let peak = 0;
  const tick = () => { peak = Math.max(peak, rendererRssMb(process.pid).page); };
  const t = setInterval(tick, 50);
  return { peak: () => { tick(); return peak; }, reset: () => { peak = 0; }, stop: () => clearInterval(t) };
}

const origin = await serve('.', ['--only', 'www,pkg,dist,models,node_modules', '--coop-coep']);

/** One run of `engine` with `threads` in a fresh browser. */
async function runOnce(engine, threads, promptText) {
  const browser = await launch();
  const rss = sampler();
  try {
    const page = await (await browser.newContext()).newPage();
    const m = `&model=${encodeURIComponent(MODEL)}`;
    let firstVisitPeak = null;
    let result;
    let t0;
    if (engine === 'kerze') {
      await page.goto(`${origin}/www/bench.html?warm=1&threads=${threads}${m}`);
      await page.waitForFunction(() => window.benchResult, null, { timeout: 600000 });
      firstVisitPeak = rss.peak();
      await page.goto('about:blank');
      await page.waitForTimeout(1000);
      rss.reset();
      t0 = performance.now();
      await page.goto(`${origin}/www/bench.html?threads=${threads}${m}`);
      await page.waitForFunction(() => window.benchResult, null, { timeout: 600000 });
      result = await page.evaluate(() => window.benchResult);
    } else {
      await page.goto(`${origin}/www/bench-wllama.html?threads=${threads}${m}`);
      t0 = performance.now();
      result = await page.evaluate((text) => window.runWllama(text), promptText);
    }
    const wallMs = performance.now() - t0;
    if (result.error) throw new Error(`${engine}: ${result.error}`);
    const peak = rss.peak();
    // After load and the run, once the garbage of loading could be collected.
    await page.waitForTimeout(3000);
    const after = rendererRssMb(process.pid).page;
    return {
      engine,
      threads,
      prefill_tok_s: result.prefill_tokens_per_s,
      decode_tok_s: result.decode_tokens_per_s,
      wall_s: wallMs / 1000,
      ready_s: (engine === 'kerze' ? result.create_engine_ms : result.fetch_ms + result.blob_to_ready_ms) / 1000,
      rss_after_mib: Math.round(after),
      peak_rss_mib: Math.round(peak),
      ...(firstVisitPeak != null ? { first_visit_peak_rss_mib: Math.round(firstVisitPeak) } : {}),
      prompt_tokens: result.prompt_tokens,
      gen_tokens: result.gen_tokens,
      prompt_text: result.prompt_text,
    };
  } finally {
    rss.stop();
    await browser.close();
  }
}

const summary = { model: MODEL, date: new Date().toISOString().slice(0, 10), runs: RUNS, load_before: loadavg(), results: {} };
try {
  let promptText = null;
  for (const threads of THREADS) {
    const runs = { kerze: [], wllama: [] };
    for (let i = 0; i < RUNS; i++) {
      // Alternate which engine goes first, so that neither always meets a warmer machine.
      const order = i % 2 === 0 ? ['kerze', 'wllama'] : ['wllama', 'kerze'];
      for (const engine of order) {
        const r = await runOnce(engine, threads, promptText);
        promptText ??= r.prompt_text;
        delete r.prompt_text;
        console.log(`KERZE_PEERS_RUN ${JSON.stringify(r)}`);
        runs[engine].push(r);
      }
    }
    const med = (xs, k) => median(xs.map((x) => x[k]));
    const keys = ['prefill_tok_s', 'decode_tok_s', 'wall_s', 'ready_s', 'rss_after_mib', 'peak_rss_mib', 'first_visit_peak_rss_mib'];
    const of = (xs) => Object.fromEntries(keys.map((k) => [k, med(xs, k)]).filter(([, v]) => v != null));
    const k = of(runs.kerze);
    const w = of(runs.wllama);
    const ratio = (a, b) => (a != null && b ? Math.round((a / b) * 100) / 100 : null);
    summary.results[`${threads}_thread${threads > 1 ? 's' : ''}`] = {
      kerze: k,
      wllama: w,
      // kerze / wllama: above 1 is better for speeds, below 1 for time and memory.
      ratio: {
        prefill: ratio(k.prefill_tok_s, w.prefill_tok_s),
        decode: ratio(k.decode_tok_s, w.decode_tok_s),
        wall: ratio(k.wall_s, w.wall_s),
        ready: ratio(k.ready_s, w.ready_s),
        rss_after: ratio(k.rss_after_mib, w.rss_after_mib),
        peak_rss_cached: ratio(k.peak_rss_mib, w.peak_rss_mib),
        peak_rss_first_visit: ratio(k.first_visit_peak_rss_mib, w.peak_rss_mib),
      },
    };
  }
} finally {
  stopServers();
}
summary.load_after = loadavg();
console.log(JSON.stringify(summary));
