// `make bench-serve`: kerze serve beside llama.cpp's server (llama-cpp-python's
// `llama_cpp.server`) on the same model, machine and requests: requests/s, p50/p99 time to
// first token and decode tok/s per stream at 1, 4 and 16 concurrent streamed completions
// (greedy, up to a fixed number of tokens, prompts of 15–20 tokens that share nothing but
// <bos>). The two servers are up together but loaded one at a time, alternating per
// concurrency level; both get every core. Prints one JSON object and a Markdown table.
//
//   KERZE_REFPY        python with llama-cpp-python[server] (default: the reference venv)
//   KERZE_BENCH_FILE   the .gguf (default models/gemma-3-270m-q4_k_m.gguf)
//   KERZE_BENCH_TOKENS tokens per request (default 32)
import { spawn } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { ROOT, freePort } from '../browser/lib.mjs';

const PY = process.env.KERZE_REFPY ?? path.join(os.homedir(), '.cache/kerze/refpy/venv/bin/python');
const FILE = path.resolve(ROOT, process.env.KERZE_BENCH_FILE ?? 'models/gemma-3-270m-q4_k_m.gguf');
const TOKENS = Number(process.env.KERZE_BENCH_TOKENS ?? 32);
const THREADS = String(os.availableParallelism());
const LEVELS = [1, 4, 16];
const REQUESTS = { 1: 4, 4: 8, 16: 16 };
const PROMPTS = [
  'The history of the city begins with a small settlement on the river, where',
  'In the morning the market opens early, and the first traders',
  'A good recipe for bread needs only four things:',
  'The old lighthouse keeper climbed the stairs and',
];

const procs = [];
process.on('exit', () => procs.forEach((p) => p.exitCode === null && p.kill('SIGKILL')));

async function waitHealthy(base, route) {
  const deadline = Date.now() + 120000;
  for (;;) {
    const r = await fetch(`${base}${route}`).catch(() => null);
    if (r?.status === 200) return;
    if (Date.now() > deadline) throw new Error(`${base}${route} not up`);
    await new Promise((res) => setTimeout(res, 200));
  }
}

async function startKerze() {
  const port = await freePort();
  const p = spawn(path.join(ROOT, 'target/release/kerze'), ['serve', '--model', FILE, '--port', String(port), '--device', 'cpu'],
    { stdio: ['ignore', 'ignore', 'inherit'] });
  procs.push(p);
  const base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, '/health');
  return { name: 'kerze', base, proc: p };
}

async function startLlama() {
  const port = await freePort();
  const p = spawn(PY, ['-m', 'llama_cpp.server', '--model', FILE, '--host', '127.0.0.1', '--port', String(port),
    '--n_ctx', '4096', '--n_threads', THREADS, '--n_threads_batch', THREADS, '--verbose', 'False',
    // Queue concurrent requests (its default cuts the running one off when the next arrives).
    '--interrupt_requests', 'False'],
  { stdio: ['ignore', 'ignore', 'inherit'] });
  procs.push(p);
  const base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, '/v1/models');
  return { name: 'llama.cpp', base, proc: p };
}

/** One streamed greedy completion: { ttft, tokens, decodeTps, ms }. */
async function one(base, prompt) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: TOKENS, temperature: 0, stream: true }),
  });
  if (r.status !== 200) throw new Error(`${base}: ${r.status} ${await r.text()}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let first = null;
  let last = null;
  let tokens = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i).trim();
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.choices?.[0]?.text) {
        const t = performance.now();
        first ??= t;
        last = t;
        tokens += 1;
      }
    }
  }
  return {
    ttft: first - t0,
    tokens,
    decodeTps: tokens > 1 ? ((tokens - 1) * 1000) / (last - first) : 0,
    ms: performance.now() - t0,
  };
}

async function level(server, c) {
  const n = REQUESTS[c];
  let next = 0;
  const results = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: c }, async () => {
    while (next < n) {
      const i = next++;
      // A number first: no request shares more than <bos> with an earlier one (neither
      // server's prompt cache helps).
      results.push(await one(server.base, `${i + 1}. ${PROMPTS[i % PROMPTS.length]}`));
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  const q = (xs, p) => {
    const s = [...xs].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)];
  };
  const ttft = results.map((r) => r.ttft);
  const tps = results.map((r) => r.decodeTps);
  return {
    requests: n,
    requests_per_s: n / wall,
    ttft_p50_ms: q(ttft, 0.5),
    ttft_p99_ms: q(ttft, 0.99),
    decode_tps_per_stream: q(tps, 0.5),
    tokens: results.reduce((a, r) => a + r.tokens, 0),
  };
}

const kerze = await startKerze();
const llama = await startLlama();
// Warm both (first request pays for page faults and buffers).
await one(kerze.base, PROMPTS[0]);
await one(llama.base, PROMPTS[0]);
const out = { file: path.basename(FILE), tokens_per_request: TOKENS, threads: THREADS, levels: {} };
for (const c of LEVELS) {
  const k = await level(kerze, c);
  const l = await level(llama, c);
  out.levels[c] = { kerze: k, llamacpp: l };
}
for (const p of procs) p.kill('SIGTERM');
console.log(JSON.stringify(out, null, 1));
const f = (x, d = 1) => x.toFixed(d);
console.log('\n| streams | server | req/s | TTFT p50 | TTFT p99 | decode tok/s per stream |');
console.log('|---|---|---|---|---|---|');
for (const c of LEVELS) {
  const { kerze: k, llamacpp: l } = out.levels[c];
  console.log(`| ${c} | llama.cpp server | ${f(l.requests_per_s, 2)} | ${f(l.ttft_p50_ms, 0)} ms | ${f(l.ttft_p99_ms, 0)} ms | ${f(l.decode_tps_per_stream)} |`);
  console.log(`| ${c} | kerze serve | ${f(k.requests_per_s, 2)} (${f(k.requests_per_s / l.requests_per_s, 2)}×) | ${f(k.ttft_p50_ms, 0)} ms | ${f(k.ttft_p99_ms, 0)} ms | ${f(k.decode_tps_per_stream)} (${f(k.decode_tps_per_stream / l.decode_tps_per_stream, 2)}×) |`);
}
process.exit(0);
