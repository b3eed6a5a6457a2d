// `make bench-analysis`: text analysis with all-MiniLM-L6-v2 (the catalog's Q8_0 file), in
// headless Chromium through the package (worker, 1 thread) and natively (`kerze classify`):
// zero-shot texts/s with 4 and 40 labels (the labels' embeddings kept, as after the first
// call), the first call's label cost, an index of 200 page sections (first visit, and from
// the IndexedDB cache after a reload), and search latency. Beside it, the cost model of
// transformers.js's zero-shot-classification (NLI: one forward pass per (text, label) pair).
// Prints JSON lines.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT, serve, stopServers, launch, runner } from './lib.mjs';

const catalog = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/catalog.json'), 'utf8'));
const minilm = catalog.models.find((m) => m.id === 'all-minilm-l6-v2');
const data = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/fixtures/classify/dataset.json'), 'utf8'));
const texts = data.texts.filter((t) => t.lang === 'en').map((t) => t.text);
const four = Object.values(data.tasks.support.labels);
const forty = Array.from({ length: 40 }, (_, i) => `${four[i % 4]} (variant ${Math.floor(i / 4)})`);
const sections = Array.from({ length: 200 }, (_, i) => `${texts[i % texts.length]} (section ${i})`);

const origin = await serve('.', ['--only', 'www,pkg,dist,models']);
const browser = await launch();
try {
  const page = await (await browser.newContext()).newPage();
  await page.goto(`${origin}/www/`);
  const run = runner(page);
  const model = { id: minilm.id, url: `/models/${minilm.file}`, sha256: minilm.sha256 };
  const web = await run(`
    const e = await k.createEngine({ model: arg.model, threads: 1 });
    const out = {};
    for (const [name, labels] of [['4', arg.four], ['40', arg.forty]]) {
      const t0 = performance.now();
      await e.classify(arg.texts.slice(0, 8), { labels });
      out['first_call_8_texts_ms_' + name] = performance.now() - t0;
      const t1 = performance.now();
      await e.classify(arg.texts, { labels });
      out['texts_per_s_' + name] = arg.texts.length / (performance.now() - t1) * 1000;
    }
    const t2 = performance.now();
    const ix = await e.index(arg.sections);
    out.index_200_ms = performance.now() - t2;
    const t3 = performance.now();
    for (let i = 0; i < 20; i++) await ix.search(arg.texts[i], { topK: 5 });
    out.search_ms = (performance.now() - t3) / 20;
    await e.dispose();
    return out;`, { model, texts, four, forty, sections });
  await page.reload();
  web.index_200_cached_ms = await run(`
    const e = await k.createEngine({ model: arg.model, threads: 1 });
    const t0 = performance.now();
    const ix = await e.index(arg.sections);
    const ms = performance.now() - t0;
    if (ix.stats.encoded !== 0) throw new Error('not from the cache');
    await e.dispose();
    return ms;`, { model, sections });
  console.log(JSON.stringify({ where: 'chromium, 1 thread (worker)', ...web }));
} finally {
  await browser.close();
  stopServers();
}

// Natively: the same texts through the CLI (usage.ms covers the call, not the load).
const cli = (labels) => {
  const out = execFileSync(path.join(ROOT, 'target/release/kerze'), ['classify', '--json', '--device', 'cpu',
    '--model', path.join(ROOT, 'models', minilm.file), ...labels.flatMap((l) => ['--label', l])],
  { input: texts.join('\n'), encoding: 'utf8', maxBuffer: 256 << 20 });
  return JSON.parse(out.trim().split('\n').pop());
};
const native = {};
for (const [name, labels] of [['4', four], ['40', forty]]) {
  const r = cli(labels);
  native[`texts_per_s_with_label_cost_${name}`] = texts.length / (r.usage.ms ?? 1) * 1000;
}
console.log(JSON.stringify({ where: 'native, kerze classify (labels embedded in the same call)', texts: texts.length, ...native }));
console.log(JSON.stringify({
  cost_model: 'forward passes per text',
  kerze_zero_shot: 1,
  transformers_js_nli: { labels_4: 4, labels_40: 40 },
  note: 'transformers.js zero-shot-classification runs its NLI model (e.g. distilbert-base-uncased-mnli, 67M parameters vs MiniLM-L6 22M) on every (text, hypothesis) pair',
}));
