// `make bench-peers`: kerze beside the peers that run the same models in the browser, in
// headless Chromium, each run in a fresh browser (a new profile on disk, as a visitor's, nothing
// cached), the engines
// alternating. Two sections (KERZE_PEERS_ONLY=decoder|encoder runs one; default both):
//
// Decoder: kerze and llama.cpp's wasm build (@wllama/wllama, a dev dependency) on the same
// file (Gemma 3 270M Q4_K_M by default), the same 128-token prompt and 64 greedy tokens (end
// of sequence ignored), timed the same way. kerze runs twice: 'auto' (the relaxed-SIMD build
// in Chromium) and its simd128 build (`relaxed_over_simd128` in the JSON):
// - kerze: a first visit (download, hash, cache write, load: its peak memory), then the
//   measured page, which loads from the Cache API (www/bench.html);
// - wllama: the file fetched as a Blob and loaded (www/bench-wllama.html).
// Wall: from navigation to the 64th token (load + prompt + decode), measured here. The
// renderer's RSS (the largest renderer of that browser, read from /proc every 50 ms) after
// load and at its peak. Medians per engine and thread count, and the kerze / wllama ratios.
// KERZE_PEERS_RUNS (default 5), KERZE_PEERS_THREADS (default 1,2), KERZE_BENCH_MODEL (a
// catalog id, or a .gguf path: a file outside models/ is linked there, as the pages load from
// /models/), KERZE_PEERS_DECODER_ENGINES (default kerze,kerze-simd128,wllama),
// KERZE_PEERS_PROMPT and KERZE_PEERS_GEN (the tokens, default 128 and 64). wllama loads a file
// as one ArrayBuffer, at most 2 GiB (its README: split larger files with llama-gguf-split):
// above that it is left out, and the summary says so (`wllama_skipped`).
//
// Encoder: kerze and transformers.js (@huggingface/transformers, a dev dependency;
// onnxruntime-web's wasm backend) on the same ONNX file of all-MiniLM-L6-v2 (`make
// onnx-models`): (f32) model.onnx in both; (q8) model_quantized.onnx in both (transformers.js
// dtype 'q8'; kerze keeps the int8 weights, on 16- or 7-bit activations: see below). www/bench-encoder.html
// loads the engine (ready: import to ready, the files from this server, no Cache API) and
// times ms per sentence at 16, 64, 128 and 256 tokens ([CLS] and [SEP] included, the same
// texts in both, every text of a size exactly that long, so a batch has no padding), one text
// and 32 different texts per call, mean pooled and normalized: one warm-up call per size and
// batch (all before the first timing), then KERZE_PEERS_ENCODER_REPS (default 3) timed calls
// of 32 texts and KERZE_PEERS_ENCODER_REPS1 (default 5) of one text, their median. RSS after
// load and at its peak as above. KERZE_PEERS_ENCODER_RUNS browsers per engine, pair and thread count (default
// 1: about 8 minutes on a 2-core machine), KERZE_PEERS_THREADS as above. Ratios:
// transformers.js / kerze (above 1: kerze is faster, or lighter). On the int8 file kerze runs
// twice: 'auto' (the relaxed-SIMD build in Chromium: 7-bit activations) and `simd=simd128`
// (16-bit activations), both beside the same transformers.js runs.
//
// Scaling (KERZE_PEERS_ONLY=scaling, not in the default): how two threads decode against one,
// each engine of KERZE_PEERS_SCALING (default kerze; kerze,wllama adds llama.cpp's) alone, on
// the decoder's file, prompt and timing, one and two threads alternating in KERZE_PEERS_RUNS
// pairs (which goes first flips each pair), so that the two runs of a pair meet the same
// machine: the medians, their ratio and each pair's (a shared host moves a two-thread figure
// by 20% within an hour; ~2 min for 5 pairs of kerze on 2 cores). No RSS is sampled there.
//
// Prints JSON lines (each run), the encoder's table, and a JSON summary (last line: the
// decoder's medians and ratios as `results`, the encoder's under `encoder`, the scaling
// section's under `scaling`).
import fs from 'node:fs';
import path from 'node:path';
import { serve, stopServers, launch, launchProfile, rendererRssMb, benchResult, ROOT } from './lib.mjs';

const RUNS = Number(process.env.KERZE_PEERS_RUNS ?? 5);
const THREADS = (process.env.KERZE_PEERS_THREADS ?? '1,2').split(',').map(Number);
const MODEL = process.env.KERZE_BENCH_MODEL ?? 'gemma-3-270m';
const PROMPT = Number(process.env.KERZE_PEERS_PROMPT ?? 128);
const GEN = Number(process.env.KERZE_PEERS_GEN ?? 64);
/** The pages' query for the model: `model=<id>`, or `file=<path under models/>` for a .gguf path. */
function modelQuery() {
  if (!MODEL.endsWith('.gguf')) return { query: `model=${encodeURIComponent(MODEL)}`, bytes: null };
  const abs = path.resolve(MODEL);
  const models = path.join(ROOT, 'models');
  let rel = path.relative(models, abs);
  if (rel.startsWith('..')) {
    // Linked beside the catalog's files (models/*.gguf is ignored by git); serve.py follows it.
    rel = path.basename(abs);
    const link = path.join(models, rel);
    if (!fs.existsSync(link)) fs.symlinkSync(abs, link);
    else if (fs.realpathSync(link) !== fs.realpathSync(abs)) throw new Error(`models/${rel} exists and is another file than ${abs}`);
  }
  return { query: `file=${encodeURIComponent(rel)}`, bytes: fs.statSync(abs).size };
}
const { query: MODEL_QUERY, bytes: MODEL_BYTES } = modelQuery();
const TOKENS_QUERY = `&prompt=${PROMPT}&gen=${GEN}`;
const ONLY = process.env.KERZE_PEERS_ONLY ?? '';
if (!['', 'decoder', 'encoder', 'scaling'].includes(ONLY)) throw new Error(`KERZE_PEERS_ONLY=${ONLY}: decoder, encoder or scaling (or unset: decoder and encoder)`);
const SCALING = (process.env.KERZE_PEERS_SCALING ?? 'kerze').split(',');
if (!SCALING.every((e) => ['kerze', 'kerze-simd128', 'wllama'].includes(e)) || SCALING[0] === 'wllama') {
  // wllama runs on the prompt text of kerze's first run.
  throw new Error(`KERZE_PEERS_SCALING=${SCALING}: kerze, kerze-simd128, wllama, a kerze one first`);
}
const ENC_RUNS = Number(process.env.KERZE_PEERS_ENCODER_RUNS ?? 1);
const ENC_REPS = Number(process.env.KERZE_PEERS_ENCODER_REPS ?? 3);
const ENC_REPS1 = Number(process.env.KERZE_PEERS_ENCODER_REPS1 ?? 5);
const ENC_PAIRS = ['f32', 'q8'];
const ENC_ENGINES = ['kerze', 'transformers'];
// On the int8 file kerze also runs its simd128 build (16-bit activations, exact) beside the
// relaxed-SIMD one that 'auto' takes in Chromium (7-bit activations).
const ENC_ENGINES_Q8 = [...ENC_ENGINES, 'kerze-simd128'];
// The decoder's engines: kerze 'auto' (the relaxed-SIMD build in Chromium: the LM head's
// 7-bit filter), kerze's simd128 build (every product on 16-bit activations), wllama.
const DEC_ENGINES = (process.env.KERZE_PEERS_DECODER_ENGINES ?? 'kerze,kerze-simd128,wllama').split(',')
  .filter((e) => e !== 'wllama' || !(MODEL_BYTES >= 2 ** 31));
if (!DEC_ENGINES.every((e) => ['kerze', 'kerze-simd128', 'wllama'].includes(e))) {
  throw new Error(`KERZE_PEERS_DECODER_ENGINES=${DEC_ENGINES}: kerze, kerze-simd128, wllama`);
}
const WLLAMA_SKIPPED = MODEL_BYTES >= 2 ** 31 ? `${MODEL_BYTES} bytes: more than the 2 GiB wllama loads as one piece` : null;
const median = (xs) => {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};
/** a / b to two decimals (null when either is missing). */
const ratio = (a, b) => (a != null && b ? Math.round((a / b) * 100) / 100 : null);
const loadavg = () => fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);

/** Samples the largest renderer's RSS of the browser whose ancestor is this process. */
function sampler() {
  let peak = 0;
  const tick = () => { peak = Math.max(peak, rendererRssMb(process.pid).page); };
  const t = setInterval(tick, 50);
  return { peak: () => { tick(); return peak; }, reset: () => { peak = 0; }, stop: () => clearInterval(t) };
}

/**
 * One run of `engine` with `threads` in a fresh browser. `memory: false` (the scaling section,
 * which reports speed only) leaves the RSS sampler off: it reads /proc every 50 ms, a cost
 * on a 2-core host that two threads feel more than one.
 */
async function runOnce(engine, threads, promptText, { memory = true } = {}) {
  // A profile on disk, as a visitor's: the Cache API keeps a 1B file there (see launchProfile).
  const browser = await launchProfile();
  const rss = memory ? sampler() : { peak: () => null, reset() {}, stop() {} };
  try {
    const page = await browser.context.newPage();
    const m = `&${MODEL_QUERY}${TOKENS_QUERY}`;
    let firstVisitPeak = null;
    let result;
    let t0;
    if (engine.startsWith('kerze')) {
      // The context bench-wllama.js gives llama.cpp: the same KV cache in both.
      const ctx = Math.max(1024, PROMPT + GEN + 64);
      const m = `&${MODEL_QUERY}${TOKENS_QUERY}&ctx=${ctx}${engine === 'kerze-simd128' ? '&simd=simd128' : ''}`;
      await page.goto(`${origin}/www/bench.html?warm=1&threads=${threads}${m}`);
      await benchResult(page);
      firstVisitPeak = rss.peak();
      await page.goto('about:blank');
      await page.waitForTimeout(1000);
      rss.reset();
      t0 = performance.now();
      await page.goto(`${origin}/www/bench.html?threads=${threads}${m}`);
      result = await benchResult(page);
    } else {
      await page.goto(`${origin}/www/bench-wllama.html?threads=${threads}${m}`);
      t0 = performance.now();
      result = await page.evaluate((text) => window.runWllama(text), promptText);
    }
    const wallMs = performance.now() - t0;
    if (result.error) throw new Error(`${engine}: ${result.error}`);
    const peak = rss.peak();
    // After load and the run, once the garbage of loading could be collected.
    if (memory) await page.waitForTimeout(3000);
    const after = memory ? rendererRssMb(process.pid).page : null;
    const mib = (x) => (x == null ? null : Math.round(x));
    return {
      engine,
      threads,
      prefill_tok_s: result.prefill_tokens_per_s,
      decode_tok_s: result.decode_tokens_per_s,
      wall_s: wallMs / 1000,
      ready_s: (engine.startsWith('kerze') ? result.create_engine_ms : result.fetch_ms + result.blob_to_ready_ms) / 1000,
      rss_after_mib: mib(after),
      peak_rss_mib: mib(peak),
      ...(firstVisitPeak != null ? { first_visit_peak_rss_mib: mib(firstVisitPeak) } : {}),
      // kerze: its wasm memory once loaded (reserved; the untouched part is not resident).
      ...(result.wasm_memory_bytes != null ? { wasm_memory_mib: Math.round(result.wasm_memory_bytes / 2 ** 20) } : {}),
      ...(result.simd ? { simd: result.simd } : {}),
      prompt_tokens: result.prompt_tokens,
      gen_tokens: result.gen_tokens,
      prompt_text: result.prompt_text,
    };
  } finally {
    rss.stop();
    await browser.close();
  }
}

/** The decoder section: medians and ratios per thread count into `results`. */
async function decoder(results) {
  let promptText = null;
  for (const threads of THREADS) {
    const runs = Object.fromEntries(DEC_ENGINES.map((e) => [e, []]));
    for (let i = 0; i < RUNS; i++) {
      // Alternate which engine goes first, so that neither always meets a warmer machine.
      const order = i % 2 === 0 ? DEC_ENGINES : [...DEC_ENGINES].reverse();
      for (const engine of order) {
        const r = await runOnce(engine, threads, promptText);
        promptText ??= r.prompt_text;
        delete r.prompt_text;
        console.log(`KERZE_PEERS_RUN ${JSON.stringify(r)}`);
        runs[engine].push(r);
      }
    }
    const med = (xs, k) => median(xs.map((x) => x[k]));
    const keys = ['prefill_tok_s', 'decode_tok_s', 'wall_s', 'ready_s', 'rss_after_mib', 'peak_rss_mib', 'first_visit_peak_rss_mib', 'wasm_memory_mib'];
    const of = (xs) => Object.fromEntries(keys.map((k) => [k, med(xs, k)]).filter(([, v]) => v != null));
    const k = of(runs.kerze ?? []);
    const k128 = of(runs['kerze-simd128'] ?? []);
    const w = of(runs.wllama ?? []);
    results[`${threads}_thread${threads > 1 ? 's' : ''}`] = {
      kerze: k,
      kerze_simd128: k128,
      wllama: w,
      // The relaxed-SIMD build (the LM head's 7-bit filter) against the simd128 build.
      relaxed_over_simd128: {
        prefill: ratio(k.prefill_tok_s, k128.prefill_tok_s),
        decode: ratio(k.decode_tok_s, k128.decode_tok_s),
      },
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
}

/** The scaling section: per engine, one and two threads alternating in pairs. */
async function scaling() {
  const out = {};
  let promptText = null;
  for (const engine of SCALING) {
    const decode = { 1: [], 2: [] };
    for (let i = 0; i < RUNS; i++) {
      for (const threads of i % 2 === 0 ? [1, 2] : [2, 1]) {
        const r = await runOnce(engine, threads, promptText, { memory: false });
        promptText ??= r.prompt_text;
        delete r.prompt_text;
        console.log(`KERZE_PEERS_RUN ${JSON.stringify(r)}`);
        decode[threads].push(r.decode_tok_s);
      }
    }
    const [one, two] = [median(decode[1]), median(decode[2])];
    out[engine] = {
      decode_1_thread: one,
      decode_2_threads: two,
      ratio: ratio(two, one),
      per_pair: decode[1].map((x, i) => ratio(decode[2][i], x)),
    };
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Encoder section.

const MINILM = path.join(ROOT, 'models/onnx/minilm');
const TJS_DIR = path.join(ROOT, 'models/onnx/minilm-transformers-js');
// MiniLM's tokenizer settings as its tokenizer_config.json gives them (transformers.js needs
// the file; models/onnx/minilm/ has tokenizer.json and config.json only).
const TOKENIZER_CONFIG = {
  tokenizer_class: 'BertTokenizer', do_lower_case: true, model_max_length: 512, cls_token: '[CLS]', sep_token: '[SEP]',
  pad_token: '[PAD]', unk_token: '[UNK]', mask_token: '[MASK]', tokenize_chinese_chars: true, strip_accents: null,
  clean_up_tokenization_spaces: true,
};

/**
 * transformers.js's layout of models/onnx/minilm/ beside it: links to its files (nothing
 * copied; tests/serve.py follows them), onnx/model.onnx and onnx/model_quantized.onnx, and
 * the tokenizer_config.json it reads.
 */
function transformersLayout() {
  for (const f of ['model.onnx', 'model_quantized.onnx', 'tokenizer.json', 'config.json']) {
    if (!fs.existsSync(path.join(MINILM, f))) throw new Error(`models/onnx/minilm/${f} is missing: make onnx-models`);
  }
  fs.mkdirSync(path.join(TJS_DIR, 'onnx'), { recursive: true });
  const link = (target, at) => {
    const p = path.join(TJS_DIR, at);
    try {
      if (fs.readlinkSync(p) === target) return;
      fs.unlinkSync(p);
    } catch (e) {
      if (e.code === 'EINVAL') fs.unlinkSync(p); // a file, not a link
      else if (e.code !== 'ENOENT') throw e;
    }
    fs.symlinkSync(target, p);
  };
  link('../minilm/config.json', 'config.json');
  link('../minilm/tokenizer.json', 'tokenizer.json');
  link('../../minilm/model.onnx', 'onnx/model.onnx');
  link('../../minilm/model_quantized.onnx', 'onnx/model_quantized.onnx');
  fs.writeFileSync(path.join(TJS_DIR, 'tokenizer_config.json'), `${JSON.stringify(TOKENIZER_CONFIG, null, 2)}\n`);
}

/** One encoder run: `engine` on `pair` with `threads`, in a fresh browser. */
async function encoderOnce(engine, threads, pair) {
  const browser = await launch();
  const rss = sampler();
  try {
    const context = await browser.newContext();
    const page = await context.newPage();
    const ortFiles = new Set();
    const elsewhere = [];
    context.on('request', (r) => {
      const m = r.url().match(/\/(ort-wasm[^/?]*)$/);
      if (m) ortFiles.add(m[1]);
      // Everything from this server (no model hub, no CDN).
      if (!r.url().startsWith(`${origin}/`) && !/^(blob|data):/.test(r.url())) elsewhere.push(r.url());
    });
    let workers = 0;
    page.on('worker', () => { workers += 1; });
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    const pageEngine = engine === 'kerze-simd128' ? 'kerze&simd=simd128' : engine;
    const url = `${origin}/www/bench-encoder.html?engine=${pageEngine}&threads=${threads}&pair=${pair}&reps=${ENC_REPS}&reps1=${ENC_REPS1}`;
    await page.goto(url);
    await page.waitForFunction(() => window.benchLoaded, null, { timeout: 300000 });
    const loaded = await page.evaluate(() => window.benchLoaded);
    if (loaded.error) throw new Error(`${engine} ${pair} ${threads}: ${loaded.error} ${errors.join('; ')}`);
    const loadPeak = rss.peak();
    // After load, once the garbage of loading could be collected.
    await page.waitForTimeout(2000);
    const afterLoad = rendererRssMb(process.pid).page;
    const result = await page.evaluate(() => window.runEncoder().catch((e) => ({ error: `${e.name}: ${e.message}` })));
    if (result.error) throw new Error(`${engine} ${pair} ${threads}: ${result.error}`);
    if (elsewhere.length) throw new Error(`${engine} ${pair} ${threads}: requests off this server: ${elsewhere.join(' ')}`);
    return {
      engine,
      pair,
      threads,
      file: result.file,
      ready_s: Math.round(result.ready_ms) / 1000,
      rss_after_load_mib: Math.round(afterLoad),
      load_peak_rss_mib: Math.round(loadPeak),
      peak_rss_mib: Math.round(rss.peak()),
      ms_per_sentence: Object.fromEntries(result.rows.map((r) => [`${r.tokens}x${r.batch}`, Math.round(r.ms_per_sentence * 100) / 100])),
      ms_per_call: Object.fromEntries(result.rows.map((r) => [`${r.tokens}x${r.batch}`, r.ms_per_call.map((x) => Math.round(x))])),
      // What ran: the page's workers (kerze: its engine worker and thread pool; onnxruntime-web:
      // its pthreads), onnxruntime-web's wasm files, what each engine says of itself.
      workers,
      ...(ortFiles.size ? { ort_files: [...ortFiles] } : {}),
      info: Object.fromEntries(Object.entries(result).filter(([k]) =>
        ['version', 'ort_version', 'num_threads', 'backend', 'worker', 'cross_origin_isolated'].includes(k))),
      probe_vector: result.probe_vector,
    };
  } finally {
    rss.stop();
    await browser.close();
  }
}

const version = (pkg) => JSON.parse(fs.readFileSync(path.join(ROOT, 'node_modules', pkg, 'package.json'), 'utf8')).version;

const cosine = (a, b) => {
  let ab = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < a.length; i++) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return ab / Math.sqrt(aa * bb);
};

/** The encoder section: medians and transformers.js / kerze ratios per pair and thread count. */
async function encoder() {
  transformersLayout();
  const out = {
    model: 'all-MiniLM-L6-v2 (models/onnx/minilm)',
    runs: ENC_RUNS, reps: { batch_32: ENC_REPS, batch_1: ENC_REPS1 },
    versions: {
      transformers_js: version('@huggingface/transformers'),
      onnxruntime_web: version('onnxruntime-web'),
    },
    ratio_is: 'transformers.js / kerze: above 1, kerze is faster (or lighter)',
    results: {},
  };
  const table = [];
  let config = 0;
  for (const threads of THREADS) {
    for (const pair of ENC_PAIRS) {
      const engines = pair === 'q8' ? ENC_ENGINES_Q8 : ENC_ENGINES;
      const runs = Object.fromEntries(engines.map((e) => [e, []]));
      for (let i = 0; i < ENC_RUNS; i++) {
        // Alternate which engine goes first, across runs and configurations.
        const order = (i + config) % 2 === 0 ? engines : [...engines].reverse();
        for (const engine of order) {
          const r = await encoderOnce(engine, threads, pair);
          const { probe_vector: probe, ...line } = r;
          console.log(`KERZE_PEERS_ENCODER_RUN ${JSON.stringify(line)}`);
          runs[engine].push(r);
        }
      }
      config += 1;
      const of = (xs) => {
        const keys = Object.keys(xs[0].ms_per_sentence);
        return {
          ready_s: median(xs.map((x) => x.ready_s)),
          rss_after_load_mib: median(xs.map((x) => x.rss_after_load_mib)),
          peak_rss_mib: median(xs.map((x) => x.peak_rss_mib)),
          ms_per_sentence: Object.fromEntries(keys.map((k) => [k, median(xs.map((x) => x.ms_per_sentence[k]))])),
        };
      };
      const k = of(runs.kerze);
      const t = of(runs.transformers);
      const k128 = runs['kerze-simd128'] ? of(runs['kerze-simd128']) : null;
      const key = `${threads}_thread${threads > 1 ? 's' : ''}`;
      out.results[pair] ??= {};
      out.results[pair][key] = {
        kerze: k,
        transformers_js: t,
        ...(k128 ? { kerze_simd128: k128 } : {}),
        ratio: {
          ms_per_sentence: Object.fromEntries(Object.keys(k.ms_per_sentence).map((s) => [s, ratio(t.ms_per_sentence[s], k.ms_per_sentence[s])])),
          ...(k128 ? { ms_per_sentence_simd128: Object.fromEntries(Object.keys(k.ms_per_sentence).map((s) => [s, ratio(t.ms_per_sentence[s], k128.ms_per_sentence[s])])) } : {}),
          ready: ratio(t.ready_s, k.ready_s),
          rss_after_load: ratio(t.rss_after_load_mib, k.rss_after_load_mib),
          peak_rss: ratio(t.peak_rss_mib, k.peak_rss_mib),
        },
        // The two engines' vectors of the first 16-token text (1 = the same direction).
        cosine_kerze_transformers: Math.round(cosine(runs.kerze[0].probe_vector, runs.transformers[0].probe_vector) * 1e6) / 1e6,
      };
      for (const s of Object.keys(k.ms_per_sentence)) {
        const [tokens, batch] = s.split('x');
        table.push([pair, threads, tokens, batch, k.ms_per_sentence[s], t.ms_per_sentence[s], ratio(t.ms_per_sentence[s], k.ms_per_sentence[s]),
          k128 ? k128.ms_per_sentence[s] : '', k128 ? ratio(t.ms_per_sentence[s], k128.ms_per_sentence[s]) : '']);
      }
      table.push([pair, threads, 'ready s', '', k.ready_s, t.ready_s, ratio(t.ready_s, k.ready_s)]);
      table.push([pair, threads, 'RSS after load MiB', '', k.rss_after_load_mib, t.rss_after_load_mib, ratio(t.rss_after_load_mib, k.rss_after_load_mib)]);
      table.push([pair, threads, 'peak RSS MiB', '', k.peak_rss_mib, t.peak_rss_mib, ratio(t.peak_rss_mib, k.peak_rss_mib)]);
    }
  }
  const fmt = (x) => (typeof x === 'number' ? (Number.isInteger(x) ? String(x) : x.toFixed(x < 10 ? 2 : 1)) : String(x));
  console.log('\nencoder: ms per sentence (medians), kerze beside transformers.js; ratio = transformers.js / kerze (> 1: kerze faster)');
  console.log(['pair', 'threads', 'tokens', 'batch', 'kerze', 'transformers.js', 'ratio', 'kerze simd128', 'ratio'].join('\t'));
  for (const row of table) console.log(row.map(fmt).join('\t'));
  console.log('');
  return out;
}

const origin = await serve('.', ['--only', 'www,pkg,dist,models,node_modules', '--coop-coep']);
const date = new Date().toISOString().slice(0, 10);
const summary = ONLY === 'encoder' ? { date, load_before: loadavg() }
  : ONLY === 'scaling' ? { model: MODEL, date, runs: RUNS, load_before: loadavg() }
    : { model: MODEL, date, runs: RUNS, prompt_tokens: PROMPT, gen_tokens: GEN, engines: DEC_ENGINES,
      ...(WLLAMA_SKIPPED ? { wllama_skipped: WLLAMA_SKIPPED } : {}), load_before: loadavg(), results: {} };
try {
  if (ONLY === 'scaling') summary.scaling = await scaling();
  if (ONLY === '' || ONLY === 'decoder') await decoder(summary.results);
  if (ONLY === '' || ONLY === 'encoder') summary.encoder = await encoder();
} finally {
  stopServers();
}
summary.load_after = loadavg();
console.log(JSON.stringify(summary));
