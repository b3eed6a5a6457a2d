// The encoder half of `make bench-peers`: all-MiniLM-L6-v2 from the same ONNX file in kerze
// or in transformers.js (@huggingface/transformers, a dev dependency served from
// /node_modules/, onnxruntime-web's wasm backend), timed the same way: ms per sentence at 16,
// 64, 128 and 256 tokens ([CLS] and [SEP] included), 1 and 32 texts per call, mean pooled and
// normalized. Every text of a size has exactly that many tokens, so a batch of 32 has no
// padding. Each engine counts the tokens it encodes (checked here).
const q = new URLSearchParams(location.search);
const engineName = q.get('engine') ?? 'kerze';
const threads = Number(q.get('threads') ?? 1);
const pair = q.get('pair') ?? 'f32';
// kerze's wasm build: 'auto' (the relaxed-SIMD twin where the browser has it), 'simd128'.
const simd = q.get('simd') ?? 'auto';
const REPS = Number(q.get('reps') ?? 3); // timed calls of several texts
const REPS1 = Number(q.get('reps1') ?? 5); // timed calls of one text
const SIZES = (q.get('sizes') ?? '16,64,128,256').split(',').map(Number);
const BATCHES = (q.get('batches') ?? '1,32').split(',').map(Number);
const MINILM = new URL('../models/onnx/minilm/', location.href).href;
// transformers.js's layout of the same files: <id>/{config,tokenizer,tokenizer_config}.json,
// <id>/onnx/model.onnx and model_quantized.onnx (links made by tests/browser/bench-peers.mjs).
// A path, not a URL: transformers.js looks up local files (tokenizer_config.json…) only there.
const TJS_ROOT = new URL('../models/onnx/', location.href).pathname;
const TJS_ID = 'minilm-transformers-js';
const FILE = { f32: 'model.onnx', q8: 'model_quantized.onnx' }[pair];
const ORT_DIST = new URL('../node_modules/onnxruntime-web/dist/', location.href).href;

// Plain prose; every word and punctuation mark of it is one token of MiniLM's vocabulary, so
// a text of n of them has n + 2 tokens. Text i of a size starts at its (9 i)th unit.
const CORPUS = 'The history of the city begins with a small settlement on the river, where traders met to '
  + 'exchange salt, grain and cloth. Over the next three hundred years the market grew into a town with stone '
  + 'walls, a bridge and a church whose tower could be seen from the hills. Farmers brought wool and cheese '
  + 'every week, and merchants from the coast came with fish, wine and news from distant ports. When the old '
  + 'bridge was washed away by a flood, the people built a wider one with seven arches, and the road across it '
  + 'became the main street of the new quarter. Schools and a library followed, then a hospital, a theatre and '
  + 'a railway station near the northern gate. In the winter the river sometimes froze, and children played '
  + 'on the ice from one bank to the other while their parents sold hot bread and soup. The first factory made '
  + 'paper from old rags, the second made glass, and soon the air was full of smoke and the sound of machines. '
  + 'Many families moved from the villages to work there, and the city spread over the fields in long rows of '
  + 'brick houses with small gardens behind them. A park was laid out along the water, with trees, paths and a '
  + 'lake where boats could be rented on summer evenings. During the war the station was damaged and the '
  + 'museum lost part of its collection, but most of the old centre survived. Today students from many '
  + 'countries study at the university, tourists walk along the walls, and the market still opens every '
  + 'Saturday morning in the square below the tower, selling fruit, flowers, honey and fresh bread to anyone '
  + 'who comes early enough.';

/** 32 different texts of exactly `tokens` tokens per size (the vocabulary checks each unit). */
async function makeTexts() {
  const vocab = (await (await fetch(`${MINILM}tokenizer.json`)).json()).model.vocab;
  const units = CORPUS.match(/[A-Za-z0-9]+|[^\sA-Za-z0-9]/g);
  const missing = units.filter((u) => !(u.toLowerCase() in vocab));
  if (missing.length) throw new Error(`not single tokens of the vocabulary: ${missing.join(' ')}`);
  const texts = {};
  for (const size of SIZES) {
    texts[size] = [];
    for (let i = 0; i < Math.max(...BATCHES); i++) {
      let s = '';
      for (let k = 0; k < size - 2; k++) {
        const u = units[(9 * i + k) % units.length];
        s += (s && /^[A-Za-z0-9]/.test(u) ? ' ' : '') + u;
      }
      texts[size].push(s);
    }
  }
  return texts;
}

/** Loads kerze on the ONNX file: { embed(texts) → vectors, warm(texts) → { vectors, tokens }, info }. */
async function loadKerze() {
  const { createEngine } = await import('../pkg/index.js');
  const engine = await createEngine({
    model: { url: `${MINILM}${FILE}`, tokenizer: `${MINILM}tokenizer.json`, config: `${MINILM}config.json` },
    device: 'cpu', threads, cache: false, simd,
  });
  return {
    embed: (texts) => engine.embed(texts),
    // The warm-up call: the same embedding through the OpenAI-style call, which also reports
    // the tokens it encoded (the sum over the texts).
    warm: async (texts) => {
      const r = await engine.embeddings.create({ input: texts });
      return { vectors: r.data.map((d) => d.embedding), tokens: r.usage.prompt_tokens };
    },
    info: { version: null, backend: engine.info.backend, simd: engine.info.simd, threads: engine.info.threads, worker: engine.info.worker },
    keep: engine,
  };
}

/** Loads transformers.js on the same file from this server only (no model hub, no CDN). */
async function loadTransformers() {
  const t = await import('../node_modules/@huggingface/transformers/dist/transformers.js');
  const { env, pipeline } = t;
  env.allowRemoteModels = false;
  env.allowLocalModels = true;
  env.localModelPath = TJS_ROOT;
  // Nothing cached in the Cache API (kerze's side runs with cache: false too).
  env.useBrowserCache = false;
  env.useWasmCache = false;
  const onnx = env.backends.onnx;
  // The runtime built into transformers.js (onnxruntime-web's WebGPU bundle) loads its
  // asyncify wasm build; from node_modules instead of the CDN it would fetch by default.
  onnx.wasm.wasmPaths = {
    mjs: `${ORT_DIST}ort-wasm-simd-threaded.asyncify.mjs`,
    wasm: `${ORT_DIST}ort-wasm-simd-threaded.asyncify.wasm`,
  };
  onnx.wasm.numThreads = threads;
  const extractor = await pipeline('feature-extraction', TJS_ID, {
    dtype: pair === 'q8' ? 'q8' : 'fp32', device: 'wasm',
  });
  const embed = async (texts) => {
    const out = await extractor(texts, { pooling: 'mean', normalize: true });
    const [n, d] = out.dims;
    return Array.from({ length: n }, (_, i) => out.data.subarray(i * d, (i + 1) * d));
  };
  return {
    embed,
    // The warm-up call, and the tokens the pipeline's tokenizer gives (as it calls it).
    warm: async (texts) => {
      const enc = extractor.tokenizer(texts, { padding: true, truncation: true });
      // No padding: the attention mask is all ones when every text has the same length.
      const mask = enc.attention_mask.data;
      let ones = 0;
      for (let i = 0; i < mask.length; i++) ones += Number(mask[i]);
      if (ones !== enc.input_ids.dims[0] * enc.input_ids.dims[1]) throw new Error(`padding in a batch: ${enc.input_ids.dims}`);
      return { vectors: await embed(texts), tokens: ones };
    },
    info: {
      version: env.version,
      ort_version: onnx.versions?.web ?? null,
      num_threads: onnx.wasm.numThreads,
      wasm_paths: onnx.wasm.wasmPaths,
      simd: onnx.wasm.simd ?? null,
      proxy: onnx.wasm.proxy,
    },
    keep: extractor,
  };
}

const median = (xs) => {
  const v = [...xs].sort((a, b) => a - b);
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};

let loaded;
let texts;

async function load() {
  texts = await makeTexts();
  const t0 = performance.now();
  loaded = engineName === 'transformers' ? await loadTransformers() : await loadKerze();
  const readyMs = performance.now() - t0;
  window.benchEngine = loaded.keep; // kept loaded, so the renderer's memory can be read after load
  return { engine: engineName, pair, file: FILE, threads, cross_origin_isolated: globalThis.crossOriginIsolated === true,
    hardware_concurrency: navigator.hardwareConcurrency, ready_ms: readyMs, ...loaded.info };
}

/**
 * One warm-up call per size and batch (all of them first, so that no timing meets code the
 * browser has not optimized yet), then REPS (one text: REPS1) timed calls each; the median.
 */
window.runEncoder = async () => {
  const cases = SIZES.flatMap((size) => BATCHES.map((batch) => ({ size, batch, list: texts[size].slice(0, batch) })));
  let probe = null;
  for (const { size, batch, list } of cases) {
    const { vectors: warm, tokens } = await loaded.warm(list);
    if (tokens !== size * batch) throw new Error(`${engineName}: ${batch} texts of ${size} tokens counted as ${tokens} tokens`);
    if (warm.length !== batch) throw new Error(`${engineName}: ${warm.length} vectors for ${batch} texts`);
    probe ??= Array.from(warm[0], (x) => Math.round(x * 1e6) / 1e6);
  }
  const rows = [];
  for (const { size, batch, list } of cases) {
    const ms = [];
    for (let r = 0; r < (batch === 1 ? REPS1 : REPS); r++) {
      const t0 = performance.now();
      await loaded.embed(list);
      ms.push(performance.now() - t0);
    }
    rows.push({ tokens: size, batch, ms_per_sentence: median(ms) / batch, ms_per_call: ms });
  }
  const result = { ...window.benchLoaded, reps: REPS, reps1: REPS1, rows, probe_vector: probe };
  window.benchResult = result;
  document.getElementById('status').textContent = 'done';
  document.getElementById('result').textContent = JSON.stringify({ ...result, probe_vector: undefined }, null, 2);
  console.log(`KERZE_BENCH_ENCODER ${JSON.stringify({ ...result, probe_vector: undefined })}`);
  return result;
};

load().then((info) => {
  window.benchLoaded = info;
  document.getElementById('status').textContent = `loaded in ${Math.round(info.ready_ms)} ms`;
  document.getElementById('result').textContent = JSON.stringify(info, null, 2);
  if (q.get('run') === '1') {
    window.runEncoder().catch((e) => {
      document.getElementById('status').textContent = `${e.name}: ${e.message}`;
      window.benchResult = { error: `${e.name}: ${e.message}` };
    });
  }
}, (e) => {
  document.getElementById('status').textContent = `${e.name}: ${e.message}`;
  console.log(`KERZE_BENCH_ERROR ${e.name}: ${e.message}`);
  window.benchLoaded = { error: `${e.name}: ${e.message}` };
  window.benchResult = window.benchLoaded;
});
