// `kerze serve` against the official npm `openai` client, raw HTTP and a page in headless
// Chromium on another origin, on 127.0.0.1 only (`make test-serve`). Every server started
// here is stopped by its PID at the end. Checked: the client's completions equal
// `kerze generate`, chat whole = the concatenated stream and the usage chunk, models, every
// error status as the client's error class, the API key, CORS preflights, 32 concurrent
// streams on 2 slots (each its solo text or a 429), disconnects free their slot, SIGTERM
// finishes streams in flight, bad input leaves the server serving.
import { execFileSync, spawn } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import {
  ROOT, serve, stopServers, launch, openPage, test, summary, assert, assertEq,
} from '../browser/lib.mjs';

const KERZE = path.join(ROOT, 'target/release/kerze');
const MODEL = path.join(ROOT, 'models/SmolLM2-135M-Instruct.Q4_1.gguf');
const MODEL_ID = 'SmolLM2-135M-Instruct.Q4_1';
const KEY = 'test-key-1';

/** Every kerze serve process started here. */
const procs = [];

/** Start `kerze serve` on a free port; resolves when it listens: { base, proc, log, exited }. */
async function startKerze(args, { wait = true, model = MODEL } = {}) {
  const device = args.includes('--device') ? [] : ['--device', 'cpu'];
  const proc = spawn(KERZE, ['serve', '--model', model, '--port', '0', ...device, ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  procs.push(proc);
  let log = '';
  const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
  const base = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`kerze serve did not listen within 30 s:\n${log}`)), 30000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(log);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    proc.once('exit', (code) => { clearTimeout(t); reject(new Error(`kerze serve exited with ${code}:\n${log}`)); });
  });
  const s = { base, proc, exited, log: () => log };
  if (wait) await ready(base);
  return s;
}

async function ready(base) {
  const deadline = Date.now() + 60000;
  for (;;) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r?.status === 200) return r.json();
    if (Date.now() > deadline) throw new Error(`${base}/health is not 200 after 60 s`);
    await new Promise((res) => setTimeout(res, 50));
  }
}

function stopAll() {
  for (const p of procs) {
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
}

/** `kerze generate`'s greedy continuation of `prompt` (its JSON). */
function generate(prompt, maxTokens) {
  const out = execFileSync(KERZE, ['generate', '--model', MODEL, '--device', 'cpu', '--prompt', prompt,
    '--max-tokens', String(maxTokens), '--temperature', '0', '--json'], { encoding: 'utf8' });
  return JSON.parse(out.trim().split('\n').pop());
}

/** Wait until no request is in the house (a slot gives its place back as it ends a job). */
async function drained(base, what) {
  const deadline = Date.now() + 5000;
  for (;;) {
    if ((await ready(base)).requests === 0) return;
    if (Date.now() > deadline) throw new Error(`${what}: requests still counted after 5 s`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** POST `body` (an object, or a string sent as is) to `base + route`; { status, headers, json }. */
async function post(base, route, body, { key = KEY, headers = {} } = {}) {
  const r = await fetch(`${base}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}), ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, json, text };
}

/** An OpenAI error body: { error: { code, message, type, param } }. */
function assertErrorBody(json, status, what) {
  assert(json && typeof json.error === 'object', `${what}: an error object, got ${JSON.stringify(json)}`);
  assertEq(json.error.code, status, `${what}: error.code`);
  assert(typeof json.error.message === 'string' && json.error.message.length > 0, `${what}: error.message`);
  assert(typeof json.error.type === 'string', `${what}: error.type`);
}

/**
 * Stream a chat or completion with raw fetch: resolves to { status, text, chunks, done }
 * (429 and other errors: { status, json }). `onChunk(n, abort)` is called per data chunk.
 */
async function rawStream(base, route, body, { onChunk, signal } = {}) {
  const ctl = new AbortController();
  signal?.addEventListener('abort', () => ctl.abort());
  const r = await fetch(`${base}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ ...body, stream: true }),
    signal: ctl.signal,
  });
  if (r.status !== 200) return { status: r.status, json: await r.json(), headers: r.headers };
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let text = '';
  let done = false;
  const chunks = [];
  try {
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = ev.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
        if (data === '[DONE]') { done = true; continue; }
        const j = JSON.parse(data);
        chunks.push(j);
        const c = j.choices?.[0];
        text += c?.delta?.content ?? c?.text ?? '';
        onChunk?.(chunks.length, () => ctl.abort());
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
    return { status: 200, text, chunks, done, aborted: true };
  }
  return { status: 200, text, chunks, done };
}

const PROMPTS = [
  'The three most important things to know about baking bread are',
  'Once upon a time',
  'def fibonacci(n):',
  'The capital of France is',
];

const PAGE = await serve('tests/serve', []);
const main = await startKerze(['--api-key', KEY, '--slots', '2', '--queue', '16', '--cors-origin', PAGE]);
const client = new OpenAI({ baseURL: `${main.base}/v1`, apiKey: KEY, maxRetries: 0 });

await test('openai npm: models.list and models.retrieve name the model', async () => {
  const list = await client.models.list();
  assertEq(list.data.map((m) => m.id), [MODEL_ID], 'model ids');
  const m = await client.models.retrieve(MODEL_ID);
  assertEq([m.id, m.object, m.owned_by], [MODEL_ID, 'model', 'kerze'], 'the model');
});

await test('openai npm: completions greedy text equals kerze generate', async () => {
  for (const prompt of PROMPTS.slice(0, 3)) {
    const want = generate(prompt, 24);
    const r = await client.completions.create({ model: MODEL_ID, prompt, max_tokens: 24, temperature: 0 });
    assertEq(r.choices[0].text, want.text, `completion of ${JSON.stringify(prompt)}`);
    assertEq(r.choices[0].finish_reason, want.finish_reason === 'stop' ? 'stop' : 'length', 'finish_reason');
    assertEq(r.usage.prompt_tokens, want.prompt_ids.length, 'prompt_tokens');
    assertEq(r.usage.completion_tokens, want.ids.length, 'completion_tokens');
    assertEq(r.object, 'text_completion', 'object');
    // Streamed, the same text.
    const stream = await client.completions.create({ prompt, max_tokens: 24, temperature: 0, stream: true });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.text ?? '';
    assertEq(text, want.text, 'streamed completion');
  }
});

await test('openai npm: chat whole equals the concatenated stream, and the usage chunk comes last', async () => {
  const messages = [{ role: 'system', content: 'You are a concise assistant.' }, { role: 'user', content: 'What is the capital of France?' }];
  const whole = await client.chat.completions.create({ model: MODEL_ID, messages, temperature: 0, max_tokens: 40 });
  const content = whole.choices[0].message.content;
  assert(/Paris/.test(content), `the answer names Paris: ${content}`);
  assertEq(whole.object, 'chat.completion', 'object');
  assertEq(whole.choices[0].message.role, 'assistant', 'role');
  const stream = await client.chat.completions.create({
    model: MODEL_ID, messages, temperature: 0, max_tokens: 40, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  const chunks = [];
  for await (const c of stream) {
    chunks.push(c);
    text += c.choices[0]?.delta?.content ?? '';
  }
  assertEq(text, content, 'stream = whole');
  assertEq(chunks[0].choices[0].delta.role, 'assistant', 'the first chunk has the role');
  const last = chunks.at(-1);
  assertEq(last.choices, [], 'the usage chunk has no choices');
  assertEq(last.usage.completion_tokens, whole.usage.completion_tokens, 'usage.completion_tokens');
  assertEq(last.usage.prompt_tokens, whole.usage.prompt_tokens, 'usage.prompt_tokens');
  assertEq(chunks.at(-2).choices[0].finish_reason, whole.choices[0].finish_reason, 'finish chunk');
  assert(new Set(chunks.map((c) => c.id)).size === 1, 'one id for the whole stream');
  // The next turn starts with this conversation: its prompt comes from the slot's cache.
  const next = await client.chat.completions.create({
    messages: [...messages, { role: 'assistant', content }, { role: 'user', content: 'And of Germany?' }],
    temperature: 0, max_tokens: 12,
  });
  assert(typeof next.usage.prompt_tokens_details.cached_tokens === 'number', 'cached_tokens reported');
});

await test('openai npm: every error status is the client\'s error class', async () => {
  const expectError = async (what, Cls, status, fn) => {
    try {
      await fn();
    } catch (e) {
      assert(e instanceof Cls, `${what}: ${e?.constructor?.name} is not ${Cls.name}: ${e}`);
      assertEq(e.status, status, `${what}: status`);
      return e;
    }
    throw new Error(`${what}: no error`);
  };
  const msgs = [{ role: 'user', content: 'Hi' }];
  const badKey = new OpenAI({ baseURL: `${main.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await expectError('a wrong key', OpenAI.AuthenticationError, 401, () => badKey.models.list());
  await expectError('a wrong key on chat', OpenAI.AuthenticationError, 401,
    () => badKey.chat.completions.create({ model: MODEL_ID, messages: msgs }));
  await expectError('an unknown model', OpenAI.NotFoundError, 404,
    () => client.chat.completions.create({ model: 'gpt-9', messages: msgs }));
  await expectError('an unknown model id', OpenAI.NotFoundError, 404, () => client.models.retrieve('gpt-9'));
  await expectError('a bad parameter', OpenAI.BadRequestError, 400,
    () => client.chat.completions.create({ model: MODEL_ID, messages: msgs, temperature: -2 }));
  await expectError('an unknown field', OpenAI.BadRequestError, 400,
    () => client.chat.completions.create({ model: MODEL_ID, messages: msgs, temprature: 0 }));
  await expectError('absurd max_tokens', OpenAI.BadRequestError, 400,
    () => client.completions.create({ model: MODEL_ID, prompt: 'x', max_tokens: 1e9 }));
  const big = await expectError('a 10 MB body', OpenAI.APIError, 413,
    () => client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'x'.repeat(10 << 20) }] }));
  assertEq(big.error?.type, 'invalid_request_error', '413 error type');
  // 429: one slot, no queue, a long request in it.
  const tight = await startKerze(['--slots', '1', '--queue', '0']);
  const tc = new OpenAI({ baseURL: `${tight.base}/v1`, apiKey: 'none', maxRetries: 0 });
  // A stream holds the one slot until its client aborts it.
  const hold = new AbortController();
  let started;
  const running = new Promise((r) => { started = r; });
  const long = rawStream(tight.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 3000, temperature: 0.8, seed: 1 },
    { signal: hold.signal, onChunk: () => started() });
  await running;
  const e = await expectError('a full queue', OpenAI.RateLimitError, 429,
    () => tc.completions.create({ prompt: 'x', max_tokens: 2 }));
  assertEq(e.headers?.get?.('retry-after') ?? e.headers?.['retry-after'], '1', 'retry-after');
  // The client retries a 429 on its own (after retry-after) and gets through once the slot
  // frees (the stream's client goes away).
  const patient = new OpenAI({ baseURL: `${tight.base}/v1`, apiKey: 'none', maxRetries: 6 });
  setTimeout(() => hold.abort(), 500);
  const after = await patient.completions.create({ prompt: 'x', max_tokens: 2, temperature: 0 });
  assertEq(after.choices.length, 1, 'a retried request succeeds once the slot is free');
  assertEq((await long).aborted, true, 'the long request was given up by its client');
  // 503: a server that is shutting down.
  tight.proc.kill('SIGTERM');
  await tight.exited;
  // 503 while loading: asked right after the port opens (Gemma's 262k-token vocabulary and
  // weights take a few hundred ms to load).
  const loading = await startKerze([], { wait: false, model: path.join(ROOT, 'models/gemma-3-270m-q4_k_m.gguf') });
  const h = await fetch(`${loading.base}/health`);
  const body = await h.json();
  if (h.status === 503) {
    assertEq(body, { error: { code: 503, message: 'Loading model', type: 'unavailable_error', param: null } }, '503 body');
    const lc = new OpenAI({ baseURL: `${loading.base}/v1`, apiKey: 'none', maxRetries: 0 });
    await expectError('loading', OpenAI.InternalServerError, 503, () => lc.chat.completions.create({ messages: msgs }));
  } else {
    console.log('     (the model loaded before the first /health: 503 checked by the Python test)');
  }
  loading.proc.kill('SIGTERM');
  await loading.exited;
});

await test('the API key is enforced on /v1, not on /health', async () => {
  for (const [route, method] of [['/v1/models', 'GET'], ['/v1/chat/completions', 'POST'], ['/v1/completions', 'POST']]) {
    for (const auth of [null, 'Bearer nope', `Basic ${KEY}`, `Bearer ${KEY}x`]) {
      const r = await fetch(`${main.base}${route}`, { method, headers: auth ? { authorization: auth } : {}, body: method === 'POST' ? '{}' : undefined });
      assertEq(r.status, 401, `${method} ${route} with ${auth}`);
      assertErrorBody(await r.json(), 401, route);
    }
  }
  assertEq((await fetch(`${main.base}/health`)).status, 200, '/health without a key');
});

await test('bad input: 4xx OpenAI errors, and the server keeps serving', async () => {
  const cases = [
    ['malformed JSON', '/v1/chat/completions', '{"messages": [', 400],
    ['not an object', '/v1/chat/completions', '[1,2,3]', 400],
    ['wrong type', '/v1/chat/completions', { messages: 'hi' }, 400],
    ['wrong content type', '/v1/chat/completions', { messages: [{ role: 'user', content: 5 }] }, 400],
    ['max_tokens a string', '/v1/completions', { prompt: 'x', max_tokens: 'ten' }, 400],
    ['absurd max_tokens', '/v1/completions', { prompt: 'x', max_tokens: 10 ** 12 }, 400],
    ['negative seed', '/v1/completions', { prompt: 'x', seed: -1 }, 400],
    ['token id past the vocabulary', '/v1/completions', { prompt: [1, 99999999] }, 400],
    ['unknown model', '/v1/completions', { model: 'nope', prompt: 'x' }, 404],
    ['unknown field', '/v1/completions', { prompt: 'x', best_of: 3 }, 400],
    ['unknown role', '/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }, 400],
    ['a prompt past the context', '/v1/completions', { prompt: 'word '.repeat(6000), max_tokens: 1 }, 400],
    ['a 10 MB body', '/v1/completions', JSON.stringify({ prompt: 'x'.repeat(10 << 20) }), 413],
    ['unknown route', '/v1/moderations', { input: 'x' }, 404],
    ['embeddings on a decoder', '/v1/embeddings', { input: 'x' }, 400],
  ];
  for (const [what, route, body, status] of cases) {
    const r = await post(main.base, route, body);
    assertEq(r.status, status, `${what}: ${r.text.slice(0, 200)}`);
    assertErrorBody(r.json, status, what);
  }
  const r = await fetch(`${main.base}/v1/models`, { method: 'DELETE', headers: { authorization: `Bearer ${KEY}` } });
  assertEq(r.status, 405, 'DELETE /v1/models');
  assertErrorBody(await r.json(), 405, 'method');
  const ok = await post(main.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  assertEq([ok.status, ok.json.choices[0].text], [200, generate('Once upon a time', 8).text], 'still serving');
  await drained(main.base, 'no request left in the house');
});

await test('load: 32 concurrent streams on 2 slots and a queue of 16: each its solo text or a 429', async () => {
  const N = 32;
  const maxTokens = 16;
  const solo = PROMPTS.map((p) => generate(p, maxTokens).text);
  const t0 = Date.now();
  const runs = await Promise.all(Array.from({ length: N }, (_, i) => rawStream(main.base, '/v1/completions',
    { prompt: PROMPTS[i % PROMPTS.length], max_tokens: maxTokens, temperature: 0 })));
  const secs = (Date.now() - t0) / 1000;
  let completed = 0;
  let refused = 0;
  runs.forEach((r, i) => {
    if (r.status === 429) {
      refused += 1;
      assertErrorBody(r.json, 429, `stream ${i}`);
      assertEq(r.headers.get('retry-after'), '1', 'retry-after');
      return;
    }
    assertEq(r.status, 200, `stream ${i}`);
    assert(r.done, `stream ${i} ended with [DONE]`);
    assertEq(r.text, solo[i % PROMPTS.length], `stream ${i}'s text is its solo greedy text`);
    completed += 1;
  });
  console.log(`     ${completed} completed, ${refused} refused (429) in ${secs.toFixed(1)} s`);
  assertEq(completed + refused, N, 'none lost');
  assert(completed >= 18, `at least slots + queue = 18 completed (${completed})`);
  await drained(main.base, 'every place given back');
});

await test('a client that disconnects stops its generation and frees its slot', async () => {
  const streams = [0, 1].map(() => rawStream(main.base, '/v1/completions',
    { prompt: 'Once upon a time', max_tokens: 3000, temperature: 0.8, seed: 1 },
    { onChunk: (n, abort) => { if (n === 3) abort(); } }));
  const rs = await Promise.all(streams);
  for (const r of rs) assert(r.aborted, 'the client aborted');
  // Both slots come free within a few steps.
  const deadline = Date.now() + 5000;
  while ((await ready(main.base)).requests !== 0) {
    assert(Date.now() < deadline, 'the slots were freed');
    await new Promise((r) => setTimeout(r, 20));
  }
  const t0 = Date.now();
  const ok = await post(main.base, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 4, temperature: 0 });
  assertEq(ok.status, 200, 'a new request runs');
  assert(Date.now() - t0 < 5000, 'without waiting for the abandoned ones');
});

await test('SIGTERM mid-stream: the streams finish, new requests are refused, the process exits', async () => {
  const s = await startKerze(['--slots', '2']);
  let signalled = false;
  const streams = [0, 1].map(() => rawStream(s.base, '/v1/completions',
    { prompt: 'Once upon a time', max_tokens: 48, temperature: 0 },
    { onChunk: (n) => { if (n === 2 && !signalled) { signalled = true; s.proc.kill('SIGTERM'); } } }));
  const rs = await Promise.all(streams);
  const want = generate('Once upon a time', 48).text;
  for (const r of rs) {
    assert(r.done, 'the stream ended with [DONE]');
    assertEq(r.text, want, 'the whole text arrived');
  }
  const { code } = await s.exited;
  assertEq(code, 0, 'exit status');
  const after = await fetch(`${s.base}/health`).then((r) => r.status, (e) => e.cause?.code ?? 'refused');
  assert(after !== 200, `after exit, the port answers nothing (${after})`);
});

await test('--timeout: a request past it gets 504 (whole) or an error event (streamed), and its slot is freed', async () => {
  const t = await startKerze(['--timeout', '1', '--slots', '1']);
  try {
    const tc = new OpenAI({ baseURL: `${t.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const t0 = Date.now();
    try {
      await tc.completions.create({ prompt: 'Once upon a time', max_tokens: 3000, temperature: 0.8, seed: 2 });
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.InternalServerError, `${e}`);
      assertEq(e.status, 504, 'status');
      assertEq(e.error?.type, 'timeout_error', 'type');
    }
    const took = Date.now() - t0;
    assert(took >= 900 && took < 5000, `ended after the timeout (${took} ms)`);
    const stream = await tc.chat.completions.create({ messages: [{ role: 'user', content: 'Tell a long story.' }], max_tokens: 3000, temperature: 0.8, seed: 2, stream: true });
    let pieces = 0;
    try {
      for await (const c of stream) pieces += c.choices.length;
      throw new Error('the stream ended without an error');
    } catch (e) {
      assert(e instanceof OpenAI.APIError, `the client throws on the error event: ${e}`);
      assert(/timeout/.test(e.message), e.message);
    }
    assert(pieces > 1, 'tokens arrived before the timeout');
    await drained(t.base, 'the slot is free');
  } finally {
    t.proc.kill('SIGTERM');
    await t.exited;
  }
});

await test('embeddings: an encoder server answers the npm client as kerze embed does; a decoder refuses', async () => {
  const minilm = path.join(ROOT, 'models/all-minilm-l6-v2-q8_0.gguf');
  const s = await startKerze([], { model: minilm });
  try {
    const ec = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const texts = ['The weather is lovely today.', "It's so sunny outside!", 'He drove to the stadium.'];
    const out = execFileSync(KERZE, ['embed', '--model', minilm, '--device', 'cpu', '--json', ...texts.flatMap((t) => ['--text', t])], { encoding: 'utf8' });
    const want = JSON.parse(out.trim().split('\n').pop());
    // The client asks for base64 unless told otherwise, and decodes it.
    for (const encoding_format of [undefined, 'float']) {
      const r = await ec.embeddings.create({ model: 'all-minilm-l6-v2-q8_0', input: texts, ...(encoding_format ? { encoding_format } : {}) });
      assertEq([r.object, r.data.length, r.model, r.usage.prompt_tokens], ['list', 3, 'all-minilm-l6-v2-q8_0', want.usage.prompt_tokens], 'response');
      r.data.forEach((d, i) => {
        const a = Array.from(d.embedding);
        const b = want.data[i].embedding;
        const dot = a.reduce((x, v, j) => x + v * b[j], 0);
        assert(dot > 0.99999, `text ${i} (${encoding_format ?? 'base64'}): cosine ${dot} to kerze embed`);
      });
    }
    const bad = async (what, fn) => {
      try { await fn(); } catch (e) { assert(e instanceof OpenAI.BadRequestError, `${what}: ${e}`); return; }
      throw new Error(`${what}: no error`);
    };
    await bad('dimensions', () => ec.embeddings.create({ input: 'x', dimensions: 3 }));
    await bad('token ids', () => ec.embeddings.create({ input: [[101, 102]] }));
    await bad('chat on an encoder', () => ec.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }] }));
    await bad('completion on an encoder', () => ec.completions.create({ prompt: 'hi' }));
    await bad('embeddings on a decoder', () => client.embeddings.create({ input: 'x' }));
  } finally {
    s.proc.kill('SIGTERM');
    await s.exited;
  }
});

await test('on the GPU (lavapipe, --device webgpu): two slots, each its own device, the CPU\'s greedy text', async () => {
  const g = await startKerze(['--device', 'webgpu', '--slots', '2']);
  try {
    const h = await ready(g.base);
    assertEq([h.backend, h.slots], ['webgpu', 2], 'health');
    const prompts = ['Once upon a time', 'The capital of France is'];
    const rs = await Promise.all(prompts.map((prompt) => post(g.base, '/v1/completions', { prompt, max_tokens: 8, temperature: 0 }, { key: null })));
    rs.forEach((r, i) => assertEq(r.json.choices[0].text, generate(prompts[i], 8).text, `GPU slot answer ${i}`));
  } finally {
    g.proc.kill('SIGTERM');
    await g.exited;
  }
});

await test('CORS: a page on a listed origin calls it with the client\'s headers; another origin cannot', async () => {
  // Preflight as the browser sends it, with the official client's X-Stainless headers.
  const pre = await fetch(`${main.base}/v1/chat/completions`, {
    method: 'OPTIONS',
    headers: {
      origin: PAGE, 'access-control-request-method': 'POST',
      'access-control-request-headers': 'authorization,content-type,x-stainless-lang,x-stainless-os',
    },
  });
  assert(pre.status === 200 || pre.status === 204, `preflight status ${pre.status}`);
  assertEq(pre.headers.get('access-control-allow-origin'), PAGE, 'allow-origin');
  const allowed = pre.headers.get('access-control-allow-headers') ?? '';
  for (const h of ['authorization', 'content-type', 'x-stainless-lang', 'x-stainless-os']) {
    assert(allowed.toLowerCase().includes(h), `allow-headers ${allowed} has ${h}`);
  }
  const other = await fetch(`${main.base}/v1/models`, { method: 'OPTIONS', headers: { origin: 'http://127.0.0.1:1', 'access-control-request-method': 'GET' } });
  assertEq(other.headers.get('access-control-allow-origin'), null, 'no allow-origin for another origin');

  const browser = await launch();
  try {
    const rec = await openPage(browser);
    await rec.page.goto(`${PAGE}/page.html`);
    const out = await rec.page.evaluate(async ([base, key, model]) => {
      const headers = { 'content-type': 'application/json', authorization: `Bearer ${key}`, 'x-stainless-lang': 'js', 'x-stainless-os': 'Linux' };
      const r = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST', headers,
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'What is the capital of France?' }], temperature: 0, max_tokens: 12 }),
      });
      const j = await r.json();
      const denied = await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${key}` } })
        .then((x) => x.status);
      return { status: r.status, content: j.choices?.[0]?.message?.content, denied };
    }, [main.base, KEY, MODEL_ID]);
    assertEq(out.status, 200, 'the page\'s request');
    assert(/Paris/.test(out.content), `the page got the answer: ${out.content}`);
    assertEq(out.denied, 200, 'a simple GET from the listed origin');
    // The same page on an origin that is not listed: the browser blocks the call.
    const PAGE2 = PAGE.replace('127.0.0.1', 'localhost');
    const rec2 = await openPage(browser);
    await rec2.page.goto(`${PAGE2}/page.html`);
    const blocked = await rec2.page.evaluate(async ([base, key]) => fetch(`${base}/v1/models`, {
      headers: { authorization: `Bearer ${key}` },
    }).then(() => 'allowed', (e) => e.name), [main.base, KEY]);
    assertEq(blocked, 'TypeError', 'a page on another origin is blocked');
  } finally {
    await browser.close();
  }
});

main.proc.kill('SIGTERM');
const { code } = await main.exited;
await test('the main server exited cleanly on SIGTERM', async () => assertEq(code, 0, 'exit status'));
stopAll();
stopServers();
process.exit(summary() ? 1 : 0);
