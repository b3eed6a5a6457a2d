// `make bench-scale`: kerze on the shapes people run, beside llama.cpp natively and wllama in
// Chromium. The files are random weights in real shapes with real vocabularies and llama.cpp's
// Q4_K_M mix (tests/scale/make_headers.py, then `kerze synth --shape-of`), in KERZE_SCALE_DIR.
// - Natively: `kerze bench --device cpu --read-rate` and llama.cpp (tests/bench_llama.py in
//   KERZE_REFPY, built for this CPU by the Makefile) on the same prompt ids, greedy tokens and
//   context, alternating (tests/bench-native-lib.mjs: speeds, RSS after load and peak,
//   measured the same way for both; MB a kerze decode step reads beside the file's tensor MB).
//   Ready is from the start of the load to ready for the first token: kerze's `load_s`;
//   llama.cpp's constructor and a first one-token evaluation (tests/bench_llama.py says why).
// - In Chromium: tests/browser/bench-peers.mjs's decoder section on the same file, kerze
//   against wllama, a fresh browser per run; the files up to 3B (wllama loads one piece of at
//   most 2 GiB, and the 8B row is native only).
// Prints each run, then a markdown table in the shape of README's (kerze / peer, the ratio in
// brackets: above 1 kerze is faster; for ready and memory below 1 kerze is quicker or smaller)
// and one JSON line. Timings mean something only on an otherwise idle machine.
//
// KERZE_SCALE_MODELS  comma-separated (default: all six, as the Makefile's list)
// KERZE_SCALE_WHERE   native,chromium (default both)
// KERZE_SCALE_THREADS default 1,2
// KERZE_SCALE_RUNS    runs per engine, model and thread count; the median (default 1)
// KERZE_SCALE_PROMPT, KERZE_SCALE_GEN  prompt and greedy tokens (default 64 and 16; the 8B
//                     at most 32 and 8: it runs ~4 tokens/s on one thread)
// KERZE_SCALE_KERZE_FLAGS  more `kerze bench` flags natively (e.g. --exact)
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT, kerzeBench, llamaBench, promptIds, tensorMb, median, loadavg } from './bench-native-lib.mjs';

const NAMES = {
  'llama-3.2-1b': 'Llama 3.2 1B', 'llama-3.2-3b': 'Llama 3.2 3B', 'llama-3.1-8b': 'Llama 3.1 8B',
  'qwen2.5-1.5b': 'Qwen2.5 1.5B', 'qwen2.5-3b': 'Qwen2.5 3B', 'gemma-3-1b': 'Gemma 3 1B',
};
const NATIVE_ONLY = new Set(['llama-3.1-8b']);
const DIR = process.env.KERZE_SCALE_DIR ?? path.join(process.env.KERZE_CACHE ?? path.join(os.homedir(), '.cache/kerze'), 'scale');
const MODELS = (process.env.KERZE_SCALE_MODELS ?? Object.keys(NAMES).join(',')).split(',');
const WHERE = (process.env.KERZE_SCALE_WHERE ?? 'native,chromium').split(',');
const THREADS = (process.env.KERZE_SCALE_THREADS ?? '1,2').split(',').map(Number);
const RUNS = Number(process.env.KERZE_SCALE_RUNS ?? 1);
const PROMPT = Number(process.env.KERZE_SCALE_PROMPT ?? 64);
const GEN = Number(process.env.KERZE_SCALE_GEN ?? 16);
const KERZE_FLAGS = (process.env.KERZE_SCALE_KERZE_FLAGS ?? '').split(' ').filter(Boolean);
const PY = process.env.KERZE_REFPY;
for (const m of MODELS) if (!NAMES[m]) throw new Error(`KERZE_SCALE_MODELS: ${m} is not one of ${Object.keys(NAMES)}`);
for (const w of WHERE) if (!['native', 'chromium'].includes(w)) throw new Error(`KERZE_SCALE_WHERE: ${w}: native, chromium`);
if (WHERE.includes('native') && !PY) throw new Error('KERZE_REFPY: the python with llama-cpp-python (make bench-scale sets it)');

const file = (m) => path.join(DIR, `${m}-q4_k_m.gguf`);
const tokens = (m) => (NATIVE_ONLY.has(m) ? { prompt: Math.min(PROMPT, 32), gen: Math.min(GEN, 8) } : { prompt: PROMPT, gen: GEN });
const ratio = (a, b) => (a != null && b ? Math.round((a / b) * 100) / 100 : null);
const round = (x, d = 1) => (x == null ? null : Math.round(x * 10 ** d) / 10 ** d);
const threadsLabel = (t) => `${t} thread${t > 1 ? 's' : ''}`;

/** kerze and llama.cpp natively on one file: a row per thread count. */
async function native(m) {
  const f = file(m);
  const { prompt, gen } = tokens(m);
  const ids = promptIds(f, prompt);
  // The same context for both, so that neither holds a larger KV cache.
  const nCtx = JSON.parse(ids).length + gen + 8;
  const fileMb = tensorMb(f);
  const rows = [];
  for (const threads of THREADS) {
    const runs = { kerze: [], 'llama.cpp': [] };
    const k = () => kerzeBench(f, { threads, prompt, gen, nCtx, flags: KERZE_FLAGS });
    const l = () => llamaBench(PY, f, ids, { threads, gen, nCtx });
    for (let i = 0; i < RUNS; i++) {
      // Alternate which engine goes first, so that neither always meets a warmer machine.
      for (const run of i % 2 === 0 ? [k, l] : [l, k]) {
        const r = await run();
        console.log(`KERZE_SCALE_RUN ${JSON.stringify({ model: m, where: 'native', ...r })}`);
        runs[r.engine].push(r);
      }
    }
    const of = (xs) => Object.fromEntries(['prefill_tokens_per_s', 'decode_tokens_per_s', 'ready_s', 'rss_after_load_mb',
      'rss_after_load_anon_mb', 'rss_after_load_file_mb', 'peak_rss_mb']
      .map((key) => [key, median(xs.map((x) => x[key]))]));
    const step = median(runs.kerze.map((x) => x.weights_mb_per_decode_step));
    rows.push({
      model: m, where: 'native', peer: 'llama.cpp', threads, prompt_tokens: prompt, gen_tokens: gen,
      kerze: of(runs.kerze), peer_result: of(runs['llama.cpp']),
      llama_cpp_construct_s: median(runs['llama.cpp'].map((x) => x.construct_s)),
      kerze_mb_per_decode_step: round(step), file_tensor_mb: round(fileMb), step_over_file: ratio(step, fileMb),
      ...(runs.kerze[0].activations ? { kerze_activations: runs.kerze[0].activations } : {}),
      read_gb_per_s: round(median(runs.kerze.map((x) => x.read_gb_per_s)), 2),
    });
  }
  return rows;
}

/** kerze and wllama in Chromium on one file (bench-peers' decoder section): a row per thread count. */
function chromium(m) {
  const { prompt, gen } = tokens(m);
  const out = execFileSync('node', [path.join(ROOT, 'tests/browser/bench-peers.mjs')], {
    encoding: 'utf8', maxBuffer: 1 << 26, stdio: ['ignore', 'pipe', 'inherit'],
    env: {
      ...process.env, KERZE_BENCH_MODEL: file(m), KERZE_PEERS_ONLY: 'decoder', KERZE_PEERS_DECODER_ENGINES: 'kerze,wllama',
      KERZE_PEERS_THREADS: THREADS.join(','), KERZE_PEERS_RUNS: String(RUNS), KERZE_PEERS_PROMPT: String(prompt), KERZE_PEERS_GEN: String(gen),
    },
  });
  const lines = out.trim().split('\n');
  for (const line of lines.slice(0, -1)) if (line.startsWith('KERZE_PEERS_RUN')) console.log(line.replace('KERZE_PEERS_RUN', `KERZE_SCALE_RUN ${m} chromium`));
  const s = JSON.parse(lines.pop());
  const mb = (mib) => (mib == null ? null : (mib * 2 ** 20) / 1e6);
  const of = (r) => ({
    prefill_tokens_per_s: r.prefill_tok_s, decode_tokens_per_s: r.decode_tok_s, ready_s: r.ready_s,
    rss_after_load_mb: mb(r.rss_after_mib), peak_rss_mb: mb(r.peak_rss_mib),
    ...(r.first_visit_peak_rss_mib != null ? { first_visit_peak_rss_mb: mb(r.first_visit_peak_rss_mib) } : {}),
  });
  return THREADS.map((threads) => {
    const r = s.results[`${threads}_thread${threads > 1 ? 's' : ''}`];
    return {
      model: m, where: 'chromium', peer: 'wllama', threads, prompt_tokens: prompt, gen_tokens: gen,
      kerze: of(r.kerze), peer_result: of(r.wllama ?? {}), ...(s.wllama_skipped ? { wllama_skipped: s.wllama_skipped } : {}),
    };
  });
}

/** One markdown row in the shape of README's results table. */
function tableRow(r) {
  const k = r.kerze;
  const p = r.peer_result;
  const pair = (a, b, d = 1) => `${round(a, d)} / ${round(b, d)} (${ratio(a, b)}×)`;
  const where = `${r.where === 'native' ? 'native' : 'Chromium'}, ${threadsLabel(r.threads)}, vs ${r.peer}`;
  const mem = `${ratio(k.rss_after_load_mb, p.rss_after_load_mb)}× / ${ratio(k.peak_rss_mb, p.peak_rss_mb)}× (${round(k.peak_rss_mb / 1e3, 2)} GB)`;
  const step = r.kerze_mb_per_decode_step != null ? `${r.kerze_mb_per_decode_step} / ${r.file_tensor_mb} MB (${r.step_over_file}×)` : '';
  return `| ${NAMES[r.model]} shape | ${where} | ${pair(k.prefill_tokens_per_s, p.prefill_tokens_per_s)} | ${pair(k.decode_tokens_per_s, p.decode_tokens_per_s)} | ${pair(k.ready_s, p.ready_s, 2)} s | ${mem} | ${step} |`;
}

/** What ran: the CPU, llama.cpp's version and the instruction sets its build uses. */
function machine() {
  const cpu = fs.readFileSync('/proc/cpuinfo', 'utf8').match(/^model name\s*:\s*(.*)$/m)?.[1];
  const git = (...a) => execFileSync('git', a, { cwd: ROOT, encoding: 'utf8' }).trim();
  // The commit, and whether the tree's source differs from it (then the numbers are of that tree).
  const info = { cpu, cores: os.cpus().length, commit: git('rev-parse', '--short', 'HEAD'), src_changed: git('status', '--porcelain', 'src', 'Cargo.toml', 'Cargo.lock') !== '' };
  if (PY && WHERE.includes('native')) {
    const py = 'import llama_cpp; print(llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode())';
    const [version, system] = execFileSync(PY, ['-c', py], { encoding: 'utf8' }).trim().split('\n');
    Object.assign(info, { llama_cpp_python: version, llama_cpp_system_info: system });
  }
  if (WHERE.includes('chromium')) {
    info.wllama = JSON.parse(fs.readFileSync(path.join(ROOT, 'node_modules/@wllama/wllama/package.json'), 'utf8')).version;
  }
  return info;
}

for (const m of MODELS) if (!fs.existsSync(file(m))) throw new Error(`${file(m)} is missing: make bench-scale makes it`);
const summary = { date: new Date().toISOString().slice(0, 10), machine: machine(), runs: RUNS, load_before: loadavg(), rows: [] };
for (const m of MODELS) {
  if (WHERE.includes('native')) summary.rows.push(...await native(m));
  if (WHERE.includes('chromium') && !NATIVE_ONLY.has(m)) summary.rows.push(...chromium(m));
}
summary.load_after = loadavg();

const { cpu, cores, commit, src_changed: changed } = summary.machine;
console.log(`\nbench-scale ${summary.date}, commit ${commit}${changed ? ' (src changed)' : ''}, ${cpu} (${cores} cores), median of ${RUNS}, load ${summary.load_before.join(' ')} → ${summary.load_after.join(' ')}\n`);
console.log('| model (Q4_K_M) | where | prefill kerze / peer | decode kerze / peer | ready kerze / peer | RSS after load / peak (kerze\'s peak) | MB a decode step / file |');
console.log('|---|---|---|---|---|---|---|');
for (const r of summary.rows) console.log(tableRow(r));
console.log(`\n${JSON.stringify(summary)}`);
