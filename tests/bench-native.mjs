// `make bench-native`: `kerze bench` natively beside llama.cpp (llama-cpp-python, the
// KERZE_REFPY python) on Gemma 3 270M Q4_K_M: the same 128 prompt ids (`kerze bench
// --prompt-ids`) and 64 greedy tokens (end of sequence ignored), 1 and 2 threads, the two
// engines alternating, KERZE_NATIVE_RUNS runs each (default 3). Prints every run, then the
// medians and kerze / llama.cpp (above 1: kerze faster), and one JSON line.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const KERZE = path.join(ROOT, 'target/release/kerze');
const MODEL = path.join(ROOT, 'models/gemma-3-270m-q4_k_m.gguf');
const PY = process.env.KERZE_REFPY;
const RUNS = Number(process.env.KERZE_NATIVE_RUNS ?? 3);
const THREADS = [1, 2];
const GEN = 64;

const ids = execFileSync(KERZE, ['bench', '--model', MODEL, '--prompt-tokens', '128', '--prompt-ids'], { encoding: 'utf8' });
const loadavg = () => fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);

// Each kerze run also measures the machine's read rate on its threads (`--read-rate`): a
// decode step reads every weight, so what share of that rate the decode takes says how far
// the threads can still take it.
function kerze(threads) {
  const out = execFileSync(KERZE, ['bench', '--model', MODEL, '--device', 'cpu', '--prompt-tokens', '128', '--gen-tokens', String(GEN), '--json', '--read-rate'], {
    encoding: 'utf8', env: { ...process.env, CANDLE_NUM_THREADS: String(threads) },
  });
  const r = JSON.parse(out);
  return {
    engine: 'kerze', threads, prefill_tokens_per_s: r.prefill_tokens_per_s, decode_tokens_per_s: r.decode_tokens_per_s,
    read_gb_per_s: r.read_rate.gb_per_s, weights_mb_per_decode_step: r.read_rate.weights_mb_per_decode_step, decode_share: r.read_rate.decode_share,
  };
}

function llama(threads) {
  const out = execFileSync(PY, [path.join(ROOT, 'tests/bench_llama.py'), MODEL, String(GEN), String(threads)], { encoding: 'utf8', input: ids });
  return JSON.parse(out.trim().split('\n').pop());
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
const before = loadavg();
const summary = {};
for (const threads of THREADS) {
  const runs = { kerze: [], 'llama.cpp': [] };
  for (let i = 0; i < RUNS; i++) {
    const order = i % 2 === 0 ? [kerze, llama] : [llama, kerze];
    for (const f of order) {
      const r = f(threads);
      console.log(`KERZE_NATIVE_RUN ${JSON.stringify(r)}`);
      runs[r.engine].push(r);
    }
  }
  const med = (xs, k) => median(xs.map((x) => x[k]));
  const row = {};
  for (const k of ['prefill_tokens_per_s', 'decode_tokens_per_s']) {
    const a = med(runs.kerze, k);
    const b = med(runs['llama.cpp'], k);
    row[k] = { kerze: Math.round(a * 10) / 10, llama_cpp: Math.round(b * 10) / 10, ratio: Math.round((a / b) * 100) / 100 };
  }
  for (const k of ['read_gb_per_s', 'decode_share']) row[k] = Math.round(med(runs.kerze, k) * 100) / 100;
  row.weights_mb_per_decode_step = Math.round(runs.kerze[0].weights_mb_per_decode_step);
  summary[`${threads}_thread${threads > 1 ? 's' : ''}`] = row;
}
console.log('\nthreads\tprefill kerze / llama.cpp (ratio)\tdecode kerze / llama.cpp (ratio)');
for (const [t, r] of Object.entries(summary)) {
  const f = (x) => `${x.kerze} / ${x.llama_cpp} (${x.ratio})`;
  console.log(`${t}\t${f(r.prefill_tokens_per_s)}\t${f(r.decode_tokens_per_s)}`);
}
console.log('\nthreads\tmemory read rate\tkerze decode reads (share of it)');
for (const [t, r] of Object.entries(summary)) {
  console.log(`${t}\t${r.read_gb_per_s} GB/s\t${r.weights_mb_per_decode_step} MB a step (${Math.round(r.decode_share * 100)}%)`);
}
console.log(JSON.stringify({ date: new Date().toISOString().slice(0, 10), runs: RUNS, load_before: before, load_after: loadavg(), results: summary }));
