// `make bench-native`: `kerze bench` natively beside llama.cpp (llama-cpp-python built for
// this CPU, the KERZE_REFPY python) on Gemma 3 270M Q4_K_M: the same 128 prompt ids (`kerze
// bench --prompt-ids`) and 64 greedy tokens (end of sequence ignored), 1 and 2 threads, the
// two engines alternating, KERZE_NATIVE_RUNS runs each (default 3). Prints every run, then
// the medians and kerze / llama.cpp (above 1: kerze faster), and one JSON line.
import path from 'node:path';
import { ROOT, kerzeBench, llamaBench, promptIds, median, loadavg } from './bench-native-lib.mjs';

const MODEL = path.join(ROOT, 'models/gemma-3-270m-q4_k_m.gguf');
const PY = process.env.KERZE_REFPY;
const RUNS = Number(process.env.KERZE_NATIVE_RUNS ?? 3);
const THREADS = [1, 2];
const GEN = 64;

const ids = promptIds(MODEL, 128);
const kerze = (threads) => kerzeBench(MODEL, { threads, prompt: 128, gen: GEN });
const llama = (threads) => llamaBench(PY, MODEL, ids, { threads, gen: GEN });

const before = loadavg();
const summary = {};
for (const threads of THREADS) {
  const runs = { kerze: [], 'llama.cpp': [] };
  for (let i = 0; i < RUNS; i++) {
    const order = i % 2 === 0 ? [kerze, llama] : [llama, kerze];
    for (const f of order) {
      const r = await f(threads);
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
