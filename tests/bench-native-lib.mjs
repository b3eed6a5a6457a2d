// What `make bench-native` and `make bench-scale` share: `kerze bench` and llama.cpp
// (tests/bench_llama.py, in the KERZE_REFPY python) run as child processes on the same prompt
// ids, and their memory read the same way for both:
// - RSS after load: the process's VmRSS (/proc/PID/status, sampled every 50 ms from here) at
//   the moment it says it was ready (kerze: its start plus `load_s`; llama.cpp: `ready_at_ms`),
//   and its two parts: RssAnon (memory of its own) and RssFile (pages of mapped files, which
//   the kernel may drop: llama.cpp maps the model, and the pages it read stay counted);
// - peak: VmHWM as each process reads it in /proc/self/status at the end of its run (kerze
//   bench's `peak_rss_mb`, read before its --read-rate pass, whose 512 MiB buffer would
//   otherwise be the peak; bench_llama.py's `peak_rss_mb`).
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const KERZE = path.join(ROOT, 'target/release/kerze');

export const median = (xs) => {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!s.length) return null;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
export const loadavg = () => fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);

/** The ids `kerze bench --prompt-tokens n` runs (a JSON array, as text): the peer runs them too. */
export const promptIds = (model, n) =>
  execFileSync(KERZE, ['bench', '--model', model, '--device', 'cpu', '--prompt-tokens', String(n), '--prompt-ids'], { encoding: 'utf8' });

/** The file's tensor bytes in MB (`kerze inspect`): what a decode step would read at file size. */
export function tensorMb(model) {
  const v = JSON.parse(execFileSync(KERZE, ['inspect', '--json', '--model', model], { encoding: 'utf8', maxBuffer: 1 << 26 }));
  return Object.values(v.tensor_types).reduce((a, t) => a + t.bytes, 0) / 1e6;
}

const statusMb = (pid) => {
  try {
    const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (k) => Number(s.match(new RegExp(`^${k}:\\s+(\\d+)`, 'm'))?.[1]);
    return { t: Date.now(), rss: (kb('VmRSS') * 1024) / 1e6, anon: (kb('RssAnon') * 1024) / 1e6, file: (kb('RssFile') * 1024) / 1e6 };
  } catch {
    return null; // it has exited
  }
};

/** Runs a command to its end, its VmRSS sampled every 50 ms: { stdout, startedAt, samples }. */
function sampled(cmd, args, { env = process.env, input = '' } = {}) {
  return new Promise((resolve, reject) => {
    const startedAt = Date.now();
    const p = spawn(cmd, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    const samples = [];
    const timer = setInterval(() => { const s = statusMb(p.pid); if (s) samples.push(s); }, 50);
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    p.on('error', reject);
    p.on('close', (code) => {
      clearInterval(timer);
      if (code !== 0) reject(new Error(`${path.basename(cmd)} ${args.join(' ')}: exit ${code}\n${stderr.slice(-2000)}`));
      else resolve({ stdout, startedAt, samples });
    });
    p.stdin.end(input);
  });
}

/** The last sample at or before `t` (the first when none is): { rss, anon, file } in MB. */
const sampleAt = (samples, t) => samples.filter((s) => s.t <= t).pop() ?? samples[0] ?? {};
const afterLoad = (s) => ({ rss_after_load_mb: s.rss ?? null, rss_after_load_anon_mb: s.anon ?? null, rss_after_load_file_mb: s.file ?? null });

/**
 * `kerze bench` on the CPU: { engine, threads, prefill/decode tok/s, ready_s (its load_s: load
 * start to ready), rss_after_load_mb, peak_rss_mb, read rate and MB a decode step }.
 * nCtx: the context (default kerze's); flags: more `kerze bench` flags (e.g. --exact).
 */
export async function kerzeBench(model, { threads, prompt, gen, nCtx, flags = [] }) {
  const args = ['bench', '--model', model, '--device', 'cpu', '--prompt-tokens', String(prompt), '--gen-tokens', String(gen),
    '--json', '--read-rate', ...(nCtx ? ['--n-ctx', String(nCtx)] : []), ...flags];
  const run = await sampled(KERZE, args, { env: { ...process.env, CANDLE_NUM_THREADS: String(threads) } });
  const r = JSON.parse(run.stdout);
  // Each kerze run also measures the machine's read rate on its threads (`--read-rate`): a
  // decode step reads every weight, so what share of that rate the decode takes says how far
  // the threads can still take it.
  const rr = r.read_rate ?? {};
  return {
    engine: 'kerze', threads, prefill_tokens_per_s: r.prefill_tokens_per_s, decode_tokens_per_s: r.decode_tokens_per_s,
    ready_s: r.load_s, ...afterLoad(sampleAt(run.samples, run.startedAt + r.load_s * 1000)), peak_rss_mb: r.peak_rss_mb,
    read_gb_per_s: rr.gb_per_s, weights_mb_per_decode_step: rr.weights_mb_per_decode_step,
    ...(rr.file_mb_per_decode_step != null ? { file_mb_per_decode_step: rr.file_mb_per_decode_step } : {}),
    ...(rr.activations ? { activations: rr.activations } : {}),
    decode_share: rr.decode_share,
  };
}

/** llama.cpp (tests/bench_llama.py in `py`) on the same ids: the same fields as kerzeBench. */
export async function llamaBench(py, model, ids, { threads, gen, nCtx }) {
  const args = [path.join(ROOT, 'tests/bench_llama.py'), model, String(gen), String(threads), ...(nCtx ? [String(nCtx)] : [])];
  const run = await sampled(py, args, { input: ids });
  const r = JSON.parse(run.stdout.trim().split('\n').pop());
  return {
    ...r,
    // Sampled here as kerze's is; bench_llama.py's own reading at the same moment stays beside it.
    rss_after_load_self_mb: r.rss_after_load_mb,
    ...afterLoad(sampleAt(run.samples, r.ready_at_ms)),
  };
}
