// `make bench-prefix`: time to first token of a chat with a fixed ~400-token system prompt and
// a ~20-token question (Gemma 3 270M Q4_K_M, greedy), in headless Chromium through the package
// (worker, 1 thread) and in `kerze serve` (1 slot, over HTTP, streamed):
// - cold: nothing kept (the whole prompt is computed);
// - warm: the next question on the same engine (the prefix is in its KV cache);
// - restored: after another chat ran in between (the prefix comes back from the store);
// - after a reload (a new page visit, a new engine) / after a restart of the server (from the
//   --prefix-cache folder);
// - and, beside it, the same request with the prefix cache off (cold every time).
// Medians of 3 per case; the response cache is off (every answer is generated). Prints JSON.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT, serve, stopServers, launch, runner } from './lib.mjs';

const RUNS = 3;
const facts = [
  'Orders placed before two in the afternoon leave our warehouse the same working day.',
  'Standard delivery takes two to four working days within the country and costs four euros.',
  'Express delivery arrives the next working day when ordered before noon and costs nine euros.',
  'Orders above fifty euros ship for free with standard delivery.',
  'Every parcel gets a tracking number by email as soon as it leaves the warehouse.',
  'Returns are free within thirty days; the item must be unworn and in its original packaging.',
  'Refunds reach the original payment method within five working days after the return arrives.',
  'We accept cards, bank transfer and invoices for business customers with a customer number.',
  'Invoices are sent as PDF files to the email address of the account that placed the order.',
  'A missing parcel is reported to the carrier after seven working days without a tracking update.',
  'Damaged items are replaced at no cost; a photo of the damage helps us claim it from the carrier.',
  'Sizes follow the European standard; the size chart on each product page lists the measurements.',
  'Gift cards never expire and can be combined with discount codes, but not with other gift cards.',
  'Customer service answers by chat and email from eight in the morning to six in the evening.',
  'Accounts can be deleted at any time from the settings page; orders stay on record for tax law.',
  'Discount codes apply to full-price items only and one code can be used per order.',
];
const SYSTEM = 'You are the support assistant of a small online clothing shop. Answer in one or two friendly sentences, '
  + 'using only these facts; when they do not cover the question, say that a colleague will answer by email.\n\n'
  + [...facts, ...facts.slice(0, 1)].map((f, i) => `${i + 1}. ${f}`).join('\n');
const QUESTIONS = [
  'Hello, I ordered a blue jacket last week and it still has not arrived. Where is it now?',
  'Can I still send back the shoes I bought three weeks ago if they are too small for me?',
  'My invoice shows the wrong company address; could you please send me a corrected one?',
  'Is there any way to get my order delivered tomorrow morning if I order it right now?',
];
const OTHER = { role: 'system', content: 'You are a helpful assistant for a bakery. Answer briefly and kindly.' };
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const catalog = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/catalog.json'), 'utf8'));
const gemma = catalog.models.find((m) => m.id === 'gemma-3-270m');

const origin = await serve('.', ['--only', 'www,pkg,dist,models']);
const browser = await launch();
const out = {};
try {
  const page = await (await browser.newContext()).newPage();
  await page.goto(`${origin}/www/`);
  const run = runner(page);
  const COMMON = `
    const model = { id: arg.id, url: arg.url, sha256: arg.sha256 };
    const ttft = async (e, messages) => {
      const t0 = performance.now();
      const s = await e.chat.completions.create({ messages, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true } });
      let first = null; let usage = null;
      for await (const c of s) {
        if (first == null && c.choices?.[0]?.delta?.content) first = performance.now() - t0;
        if (c.usage) usage = c.usage;
      }
      return { ms: first, prompt: usage.prompt_tokens, cached: usage.prompt_tokens_details.cached_tokens };
    };
    const chat = (q) => [{ role: 'system', content: arg.SYSTEM }, { role: 'user', content: q }];`;
  const arg = { id: gemma.id, url: `/models/${gemma.file}`, sha256: gemma.sha256, SYSTEM, QUESTIONS, OTHER };
  const page1 = await run(`${COMMON}
    await k.cache.clear({ prefixes: true });
    const off = await k.createEngine({ model, threads: 1, responseCache: false, prefixCache: false });
    const none = [];
    for (let i = 0; i < ${RUNS}; i++) { await off.reset(); none.push(await ttft(off, chat(arg.QUESTIONS[i]))); }
    await off.dispose();
    const e = await k.createEngine({ model, threads: 1, responseCache: false });
    const cold = await ttft(e, chat(arg.QUESTIONS[0]));
    const warm = [];
    for (let i = 1; i <= ${RUNS}; i++) warm.push(await ttft(e, chat(arg.QUESTIONS[i % arg.QUESTIONS.length])));
    const restored = [];
    for (let i = 0; i < ${RUNS}; i++) {
      await ttft(e, [arg.OTHER, { role: 'user', content: arg.QUESTIONS[i] }]);
      restored.push(await ttft(e, chat(arg.QUESTIONS[i])));
    }
    const prefixTokens = (await e.tokenize(arg.SYSTEM)).length;
    await e.dispose();
    return { none, cold, warm, restored, prefixTokens, kept: (await k.cache.size()).prefixes };`, arg);
  const reloads = [];
  for (let i = 0; i < RUNS; i++) {
    await page.reload();
    reloads.push(await run(`${COMMON}
      const e = await k.createEngine({ model, threads: 1, responseCache: false });
      const r = await ttft(e, chat(arg.QUESTIONS[${i}]));
      await e.dispose();
      return r;`, arg));
  }
  const pick = (xs) => ({ ttft_ms: median(xs.map((x) => x.ms)), prompt_tokens: xs[0].prompt, cached_tokens: median(xs.map((x) => x.cached)) });
  out.browser = {
    where: 'chromium, 1 thread (worker)',
    system_prompt_tokens: page1.prefixTokens,
    prefix_cache_off: pick(page1.none),
    cold: pick([page1.cold]),
    warm_in_page: pick(page1.warm),
    restored_in_page: pick(page1.restored),
    after_reload: pick(reloads),
    kept: page1.kept,
  };
} finally {
  await browser.close();
  await stopServers();
}

// kerze serve: one slot, streamed over HTTP.
const kerze = path.join(ROOT, 'target/release/kerze');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kerze-bench-prefix-'));
let model = null;
async function server(args) {
  const p = spawn(kerze, ['serve', '--model', path.join(ROOT, 'models', gemma.file), '--port', '0', '--device', 'cpu', '--slots', '1', ...args],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, CANDLE_NUM_THREADS: '1' } });
  let log = '';
  const base = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`kerze serve did not start: ${log}`)), 60000);
    p.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(log);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
  });
  for (let i = 0; i < 600; i++) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r?.ok) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  model = (await (await fetch(`${base}/v1/models`)).json()).data[0].id;
  return { base, stop: () => new Promise((res) => { p.once('exit', res); p.kill('SIGTERM'); }) };
}
async function ttft(base, messages) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  const dec = new TextDecoder();
  let first = null; let usage = null; let buf = '';
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    for (;;) {
      const at = buf.indexOf('\n\n');
      if (at < 0) break;
      const line = buf.slice(0, at).replace(/^data: /, '');
      buf = buf.slice(at + 2);
      if (line === '[DONE]') continue;
      const c = JSON.parse(line);
      if (first == null && c.choices?.[0]?.delta?.content) first = performance.now() - t0;
      if (c.usage) usage = c.usage;
    }
  }
  return { ms: first, prompt: usage.prompt_tokens, cached: usage.prompt_tokens_details.cached_tokens };
}
const chat = (q) => [{ role: 'system', content: SYSTEM }, { role: 'user', content: q }];
try {
  const pick = (xs) => ({ ttft_ms: median(xs.map((x) => x.ms)), prompt_tokens: xs[0].prompt, cached_tokens: median(xs.map((x) => x.cached)) });
  let s = await server(['--prefix-cache-mb', '0']);
  const none = [];
  for (let i = 0; i < RUNS; i++) {
    await ttft(s.base, [OTHER, { role: 'user', content: QUESTIONS[i] }]);
    none.push(await ttft(s.base, chat(QUESTIONS[i])));
  }
  await s.stop();
  s = await server(['--prefix-cache', dir]);
  const cold = await ttft(s.base, chat(QUESTIONS[0]));
  const warm = [];
  for (let i = 1; i <= RUNS; i++) warm.push(await ttft(s.base, chat(QUESTIONS[i % QUESTIONS.length])));
  const restored = [];
  for (let i = 0; i < RUNS; i++) {
    await ttft(s.base, [OTHER, { role: 'user', content: QUESTIONS[i] }]);
    restored.push(await ttft(s.base, chat(QUESTIONS[i])));
  }
  await s.stop();
  const restarts = [];
  for (let i = 0; i < RUNS; i++) {
    s = await server(['--prefix-cache', dir]);
    restarts.push(await ttft(s.base, chat(QUESTIONS[i])));
    await s.stop();
  }
  out.serve = {
    where: 'kerze serve, 1 slot, CANDLE_NUM_THREADS=1',
    prefix_cache_off: pick(none),
    cold: pick([cold]),
    warm_in_slot: pick(warm),
    restored_in_process: pick(restored),
    after_restart: pick(restarts),
  };
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
console.log(JSON.stringify(out, null, 1));
