// Helpers of the browser tests: start tests/serve.py on 127.0.0.1 (stopped by PID at the
// end), launch Debian's Chromium through playwright-core, record every request and every
// console error of a page.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import { chromium } from 'playwright-core';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import os from 'node:os';
import net from 'node:net';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
export const MODEL_FILE = 'gemma-3-270m-q4_k_m.gguf';

const llamacpp = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/fixtures/llamacpp_gemma3_270m.json'), 'utf8'));
/** Prompts whose greedy continuation is clear at every step (counting, alphabet, months). */
export const CERTAIN = llamacpp.cases.filter((c) => c.certain).map((c) => c.prompt);

/** The native CLI's greedy continuation of `prompt`: { ids, text, ... }. */
export function cli(prompt, maxTokens = 16) {
  const out = execFileSync(path.join(ROOT, 'target/release/kerze'), ['generate', '--model', path.join(ROOT, 'models', MODEL_FILE),
    '--prompt', prompt, '--max-tokens', String(maxTokens), '--temperature', '0', '--json'], { encoding: 'utf8' });
  return JSON.parse(out.trim().split('\n').pop());
}

/** Every server process started here: { proc, group } (group: it leads its own process group). */
const servers = [];

/** A free TCP port on 127.0.0.1. */
export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

/** Serve `dir` (relative to the repo) with serve.py flags; resolves to its origin. */
export async function serve(dir, flags = []) {
  const port = await freePort();
  const proc = spawn('python3', [path.join(ROOT, 'tests/serve.py'), path.resolve(ROOT, dir), String(port), ...flags], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  servers.push({ proc, group: false });
  await new Promise((resolve, reject) => {
    proc.stdout.once('data', resolve);
    proc.once('exit', (code) => reject(new Error(`serve.py exited with ${code}`)));
  });
  return `http://127.0.0.1:${port}`;
}

function stop({ proc, group }) {
  if (proc.exitCode !== null) return;
  try {
    process.kill(group ? -proc.pid : proc.pid, 'SIGTERM');
  } catch {
    // it ended meanwhile
  }
}

export function stopServers() {
  for (const s of servers.splice(0)) stop(s);
}

/**
 * Start a server command (a dev server) in its own process group and wait until `port`
 * accepts connections; resolves to { stop }. stopServers() stops it too.
 */
export async function startServer(cwd, cmd, args, port, env = {}) {
  // stdin stays open: esbuild's server stops when it closes.
  const proc = spawn(cmd, args, { cwd, detached: true, stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  const entry = { proc, group: true };
  servers.push(entry);
  let output = '';
  proc.stdout.on('data', (d) => { output += d; });
  proc.stderr.on('data', (d) => { output += d; });
  const deadline = Date.now() + 60000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`${cmd} ${args.join(' ')} exited with ${proc.exitCode}:\n${output}`);
    const up = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => { c.end(); resolve(true); });
      c.on('error', () => resolve(false));
    });
    if (up) return { stop: () => stop(entry) };
    if (Date.now() > deadline) {
      stop(entry);
      throw new Error(`${cmd} did not listen on ${port} within 60 s:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

export async function launch({ webgpu = false, extraArgs = [] } = {}) {
  const args = ['--headless=new', '--no-sandbox', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic',
    ...(webgpu ? ['--enable-unsafe-webgpu'] : []), ...extraArgs];
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args });
}

/**
 * A browser on a fresh profile on disk, as a visitor's (`launch`'s contexts are off the record:
 * there Chromium's Cache API refuses an 800 MB file with "Unexpected internal error", so a
 * 1B model's second visit downloaded again and a benchmark timed that, not a load from the
 * cache). Returns the context (`newPage`) and `close`, which also removes the profile.
 */
export async function launchProfile({ webgpu = false, extraArgs = [] } = {}) {
  const args = ['--headless=new', '--no-sandbox', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic',
    ...(webgpu ? ['--enable-unsafe-webgpu'] : []), ...extraArgs];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kerze-profile-'));
  const context = await chromium.launchPersistentContext(dir, { executablePath: CHROMIUM, headless: true, args });
  return {
    context,
    async close() {
      try {
        await context.close();
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}

/**
 * www/bench.html's result, awaited inside the page (its `benchDone` promise) rather than
 * polled: Playwright's `waitForFunction` polls on requestAnimationFrame, so the page drew a
 * frame every 16 ms through the compositor, the GPU process and the browser for the whole
 * measured run — on 2 vCPUs two threads lost 4-5% of their decode to it (3 alternating
 * rounds: 55.2-55.5 tok/s polled, 57.0-58.2 awaited), and the peer's page was awaited.
 */
export async function benchResult(page, timeoutMs = 600000) {
  return page.evaluate((ms) => {
    if (!window.benchDone) throw new Error('the bench page did not start (no window.benchDone)');
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no bench result in ${ms} ms`)), ms);
    });
    return Promise.race([window.benchDone, late]).finally(() => clearTimeout(timer));
  }, timeoutMs);
}

/** A fresh context + page that records requests (also from workers) and console errors. */
export async function openPage(browser, { bypassCSP = false } = {}) {
  const context = await browser.newContext({ bypassCSP });
  const page = await context.newPage();
  const requests = [];
  const errors = [];
  const warnings = [];
  const logs = [];
  const workers = [];
  context.on('request', (r) => requests.push(r.url()));
  page.on('console', (m) => {
    logs.push(`${m.type()}: ${m.text()}`);
    if (m.type() === 'error') errors.push(m.text());
    if (m.type() === 'warning') warnings.push(m.text());
  });
  page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
  page.on('worker', (w) => {
    workers.push(w.url());
    w.on('console', (m) => {
      logs.push(`worker ${m.type()}: ${m.text()}`);
      if (m.type() === 'error') errors.push(`worker: ${m.text()}`);
      if (m.type() === 'warning') warnings.push(`worker: ${m.text()}`);
    });
  });
  return { context, page, requests, errors, warnings, logs, workers };
}

let failures = 0;
const results = [];
/** Run one named test; failures are counted, the run goes on. */
/** `run(body, arg)`: an async function body run in `page` with `k` (the package) and `arg`. */
export function runner(page) {
  return (body, arg) => page.evaluate(async ([src, a]) => {
    const k = await import('/pkg/index.js');
    // eslint-disable-next-line no-new-func
    return new Function('k', 'arg', `return (async () => { ${src} })();`)(k, a);
  }, [body, arg]);
}

export async function test(name, fn) {
  const only = process.env.KERZE_BROWSER_TESTS;
  if (only && !only.split(',').some((w) => name.includes(w))) return;
  const t0 = Date.now();
  try {
    await fn();
    results.push(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    console.log(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failures += 1;
    results.push(`FAIL ${name}: ${e?.stack ?? e}`);
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
  }
}

export function summary() {
  console.log(`\n${results.length - failures} passed, ${failures} failed`);
  return failures;
}

export function assert(cond, msg) {
  if (!cond) throw new Error(`assertion failed: ${msg}`);
}

export function assertEq(a, b, msg) {
  const sa = JSON.stringify(a);
  const sb = JSON.stringify(b);
  if (sa !== sb) throw new Error(`${msg}: ${sa} != ${sb}`);
}

/** RSS of every renderer of this browser; the largest hosts the page and its worker. */
export function rendererRssMb(browserPid) {
  const all = [];
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      if (!cmd.includes('--type=renderer')) continue;
      // Only this browser's renderers: walk up the parents to its pid.
      let p = pid;
      let ours = false;
      for (let i = 0; i < 8 && p && p !== '1'; i += 1) {
        if (Number(p) === browserPid) { ours = true; break; }
        p = fs.readFileSync(`/proc/${p}/stat`, 'utf8').split(') ')[1].split(' ')[1];
      }
      if (!ours) continue;
      const rss = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
      all.push(Number(rss[1]) / 1024);
    } catch {
      // the process ended meanwhile
    }
  }
  return { page: Math.max(0, ...all), all: all.reduce((a, b) => a + b, 0) };
}
