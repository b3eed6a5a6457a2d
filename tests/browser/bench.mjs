// `make bench-browser`: www/bench.html in headless Chromium through the package (worker,
// cache), 1 thread and then the threads build with 2; adds the renderer's resident memory
// after load (all renderer processes of this browser, read from /proc). Prints JSON lines.
// KERZE_BENCH_MODEL=<catalog id> benchmarks another catalog model (default gemma-3-270m),
// KERZE_BENCH_FILE=<name> any file in models/ (e.g. the synthetic Qwen2.5-0.5B-like one of
// `kerze synth --like qwen2.5-0.5b-q4_k_m`). KERZE_BENCH_PROMPT=<tokens> runs a longer prompt
// than the default 128 (the peer gets the same text).
// Beside each kerze run, the peer (www/bench-wllama.html: @wllama/wllama, llama.cpp's wasm
// build) on the same file, prompt text and token counts in the same browser, and the ratios
// (KERZE_BENCH_PEER=0 skips it).
import { serve, stopServers, launch, rendererRssMb, benchResult } from './lib.mjs';

const origin = await serve('.', ['--only', 'www,pkg,dist,models,node_modules', '--coop-coep']);
const browser = await launch();
try {
  for (const threads of (process.env.KERZE_BENCH_THREADS ?? '1,2').split(',')) {
    const context = await browser.newContext();
    const warm = await context.newPage();
    const m = process.env.KERZE_BENCH_FILE
      ? `&file=${encodeURIComponent(process.env.KERZE_BENCH_FILE)}`
      : `&model=${encodeURIComponent(process.env.KERZE_BENCH_MODEL ?? 'gemma-3-270m')}`;
    await warm.goto(`${origin}/www/bench.html?warm=1${m}`);
    await benchResult(warm);
    await warm.close();
    const page = await context.newPage();
    const prompt = process.env.KERZE_BENCH_PROMPT ? `&prompt=${Number(process.env.KERZE_BENCH_PROMPT)}` : '';
    await page.goto(`${origin}/www/bench.html?threads=${threads}${m}${prompt}`);
    const result = await benchResult(page);
    const pid = browser.process?.()?.pid;
    // Playwright's chromium.launch has no process handle in all versions: fall back to
    // every renderer of a chromium whose parent is this node process.
    // Let the worker's garbage (the chunks the file was read in) be collected first.
    await page.waitForTimeout(Number(process.env.KERZE_BENCH_SETTLE ?? 3000));
    const rss = rendererRssMb(pid ?? process.pid);
    result.renderer_rss_mb = Math.round(rss.page);
    result.all_renderers_rss_mb = Math.round(rss.all);
    console.log(`KERZE_BENCH ${JSON.stringify({ ...result, prompt_text: undefined })}`);
    await context.close();
    // Encoders have no wasm peer here yet (transformers.js: the ONNX issue's bench page).
    if (process.env.KERZE_BENCH_PEER === '0' || result.embed) continue;
    const peerContext = await browser.newContext();
    const peer = await peerContext.newPage();
    await peer.goto(`${origin}/www/bench-wllama.html?threads=${threads}${m}${prompt}`);
    const w = await peer.evaluate((text) => window.runWllama(text), result.prompt_text);
    await peer.waitForTimeout(Number(process.env.KERZE_BENCH_SETTLE ?? 3000));
    const wrss = rendererRssMb(pid ?? process.pid);
    w.renderer_rss_mb = Math.round(wrss.page);
    console.log(`KERZE_BENCH_PEER ${JSON.stringify(w)}`);
    const ratio = (a, b) => Math.round((a / b) * 100) / 100;
    console.log(`KERZE_BENCH_RATIO ${JSON.stringify({
      threads: Number(threads),
      prefill: ratio(result.prefill_tokens_per_s, w.prefill_tokens_per_s),
      decode: ratio(result.decode_tokens_per_s, w.decode_tokens_per_s),
      renderer_rss: ratio(result.renderer_rss_mb, w.renderer_rss_mb),
    })}`);
    await peerContext.close();
  }
} finally {
  await browser.close();
  stopServers();
}
