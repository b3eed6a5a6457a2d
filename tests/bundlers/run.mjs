// The npm package in real web apps: for each bundler, the tiny app under tests/bundlers/<name>/
// is built (production, no bundler configuration) against `npm pack` of pkg/, served on
// 127.0.0.1 and run in headless Chromium; its greedy tokens must equal the native CLI's, its
// console must stay clean (no error, no warning, also in the workers) and the engine must run
// in a worker. Also: Vite's dev server, a Vite build on a cross-origin-isolated page (the
// threads build), `next build` + `next start`, importing the package with no browser globals
// (server rendering), and the types under three TypeScript module resolutions.
//
//   node tests/bundlers/run.mjs          (after `make build`; `make test-bundlers` runs it)
//   KERZE_BUNDLER_TESTS=vite,next ...    only the tests whose name contains one of these
//
// Each app is installed from its own lock file into $KERZE_CACHE/bundlers/<name>/ (outside the
// clone, kept between runs: `npm ci` runs again only when the lock file changes); the app's
// sources and the packed package are copied in fresh every run.
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  ROOT, MODEL_FILE, CERTAIN, cli, freePort, serve, startServer, stopServers, launch, openPage, test, summary, assert,
  assertEq,
} from '../browser/lib.mjs';

const HERE = path.join(ROOT, 'tests/bundlers');
const CACHE = path.join(process.env.KERZE_CACHE ?? path.join(os.homedir(), '.cache/kerze'), 'bundlers');
const catalog = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/catalog.json'), 'utf8'));
const SHA = catalog.models.find((m) => m.id === 'gemma-3-270m').sha256;
const PROMPT = CERTAIN[0];
const WANT = cli(PROMPT).ids;
const only = process.env.KERZE_BUNDLER_TESTS;
const wanted = (name) => !only || only.split(',').some((w) => name.includes(w));

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kerze-bundlers-'));
const tgz = path.join(tmp, execFileSync('npm', ['pack', path.join(ROOT, 'pkg'), '--pack-destination', tmp, '--silent'],
  { encoding: 'utf8' }).trim().split('\n').pop());

/** Run a command in `cwd`; its output is returned, and shown when it fails. */
function sh(cwd, cmd, args, env = {}) {
  try {
    return execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  } catch (e) {
    throw new Error(`${cmd} ${args.join(' ')} in ${cwd} failed:\n${e.stdout ?? ''}${e.stderr ?? ''}`);
  }
}

/** The package as npm would install it: the packed files in node_modules/kerze. */
function installPacked(dir) {
  const mod = path.join(dir, 'node_modules/kerze');
  fs.rmSync(mod, { recursive: true, force: true });
  fs.mkdirSync(mod, { recursive: true });
  sh(dir, 'tar', ['xzf', tgz, '-C', mod, '--strip-components=1']);
}

/**
 * The app `name` in its work dir, installed: its sources copied fresh (with common/app.js as
 * `appJs`), `npm ci` when the lock file changed, the packed package in node_modules.
 */
function prepare(name, appJs) {
  const src = path.join(HERE, name);
  const dir = path.join(CACHE, name);
  fs.mkdirSync(dir, { recursive: true });
  for (const e of fs.readdirSync(dir)) {
    if (e !== 'node_modules' && e !== '.lock-sha256') fs.rmSync(path.join(dir, e), { recursive: true, force: true });
  }
  fs.cpSync(src, dir, { recursive: true });
  fs.copyFileSync(path.join(HERE, 'common/app.js'), path.join(dir, appJs));
  const lock = crypto.createHash('sha256').update(fs.readFileSync(path.join(src, 'package-lock.json'))).digest('hex');
  const stamp = path.join(dir, '.lock-sha256');
  if (!fs.existsSync(stamp) || fs.readFileSync(stamp, 'utf8') !== lock || !fs.existsSync(path.join(dir, 'node_modules'))) {
    const t0 = Date.now();
    fs.rmSync(stamp, { force: true });
    sh(dir, 'npm', ['ci', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error']);
    fs.writeFileSync(stamp, lock);
    console.log(`     ${name}: npm ci in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  }
  installPacked(dir);
  return dir;
}

/** `npm run build`; returns its output (shown on failure) and how long it took. */
function build(dir, env = {}) {
  const t0 = Date.now();
  const out = sh(dir, 'npm', ['run', 'build', '--silent'], env);
  return { out, s: (Date.now() - t0) / 1000 };
}

const M = await serve('.', ['--only', 'models']);
const MODEL_URL = `${M}/models/${MODEL_FILE}`;
const browser = await launch();

/** Files of a built app holding the inline worker's source (a base64 run of 100k+ characters). */
function inlineCopies(dist) {
  return fs.readdirSync(dist, { recursive: true }).map(String)
    .filter((f) => f.endsWith('.js') && /[A-Za-z0-9+/]{100000}/.test(fs.readFileSync(path.join(dist, f), 'latin1')));
}

/**
 * Open the app at `origin` + `page`, wait for its result and check it: the CLI's ids, a
 * clean console, requests only to the app and the model, a worker of the expected kind, and
 * (with `dist`, the static build) that a 'script' worker's page never loaded the inline copy.
 * `choices`: the app makes a constrained request too, through the constraint module the
 * bundler emitted (or the inline worker holds).
 */
async function runApp(origin, { page: at = '/', threads = 1, worker = 'script', assets = null, error = null, dist = null, choices = false } = {}) {
  const rec = await openPage(browser);
  try {
    const q = new URLSearchParams({ model: MODEL_URL, sha256: SHA, prompt: PROMPT, threads: String(threads) });
    if (assets) q.set('assets', assets);
    if (choices) q.set('choices', 'yes,no');
    if (worker === null) q.set('worker', 'false');
    await rec.page.goto(`${origin}${at}?${q}`);
    await rec.page.waitForFunction(() => globalThis.kerzeResult, null, { timeout: 180000 });
    const r = await rec.page.evaluate(() => globalThis.kerzeResult);
    if (error) {
      assertEq(r.error?.name, error, `the app's error (${r.error?.message})`);
    } else {
      assert(!r.error, `the app failed: ${JSON.stringify(r.error)}\n${rec.logs.join('\n')}`);
      assertEq(r.ids, WANT, 'greedy ids equal the CLI\'s');
      assertEq(r.info.worker, worker, 'how the worker was started (info.worker)');
      if (choices) assert(['yes', 'no'].includes(r.choice), `the constrained answer is one of the choices: ${JSON.stringify(r.choice)}`);
      // The engine's worker, and with threads the team's other threads (the worker computes too).
      const want = worker === null ? 0 : 1 + (threads > 1 ? threads - 1 : 0);
      assert(rec.workers.length >= want, `workers started: ${JSON.stringify(rec.workers)}`);
      if (dist && worker === 'script') {
        const copies = inlineCopies(dist);
        assert(copies.length > 0, `the build holds the inline copy somewhere (${filesMatching(dist, /./)})`);
        const loaded = copies.filter((f) => rec.requests.some((u) => new URL(u).pathname === `/${f}`));
        assertEq(loaded, [], 'inline-copy chunks downloaded although the worker script ran');
      }
    }
    assertEq(rec.errors, [], 'console errors');
    // Chromium's own note when the page (not a worker) asks for a WebGPU adapter and has none.
    const warnings = worker === null ? rec.warnings.filter((w) => w !== 'No available adapters.') : rec.warnings;
    assertEq(warnings, [], 'console warnings');
    const stray = rec.requests.filter((u) => !u.startsWith(`${origin}/`) && u !== MODEL_URL
      && !(assets && u.startsWith(assets))
      && !u.startsWith('blob:') && !u.startsWith('data:'));
    assertEq(stray, [], 'requests outside the app and the model');
    return r;
  } finally {
    await rec.context.close();
  }
}

/** Serve a built app's static folder on 127.0.0.1 (COOP/COEP when `isolated`). */
function serveStatic(dir, isolated = false) {
  return serve(dir, isolated ? ['--coop-coep'] : []);
}

/** Files of `dir` (recursive) whose name matches `re`. */
function filesMatching(dir, re) {
  return fs.readdirSync(dir, { recursive: true }).map(String).filter((f) => re.test(path.basename(f)));
}

const timings = {};

try {
  await test('importing the package touches no browser global (server rendering)', async () => {
    // What a server renderer does: import the package where window, navigator, Worker,
    // WebAssembly, document, location and self do not exist; any touch at import time throws.
    const dir = path.join(tmp, 'ssr');
    fs.mkdirSync(dir, { recursive: true });
    installPacked(dir);
    fs.writeFileSync(path.join(dir, 'probe.mjs'), `
for (const name of ['window', 'navigator', 'Worker', 'WebAssembly', 'document', 'location', 'self']) {
  Object.defineProperty(globalThis, name, { configurable: true, get() { throw new Error('touched ' + name + ' at import time'); } });
}
const k = await import('kerze');
if (typeof k.createEngine !== 'function' || typeof k.cache.list !== 'function') throw new Error('exports missing');
console.log('ok');
`);
    assertEq(sh(dir, process.execPath, ['probe.mjs']).trim(), 'ok', 'import with no browser globals');
  });

  await test('types resolve under moduleResolution bundler, node16 and nodenext (tsc)', async () => {
    const dir = path.join(tmp, 'types');
    fs.mkdirSync(dir, { recursive: true });
    installPacked(dir);
    fs.writeFileSync(path.join(dir, 'package.json'), '{ "name": "types-consumer", "private": true, "type": "module" }\n');
    fs.copyFileSync(path.join(ROOT, 'tests/types/example.ts'), path.join(dir, 'example.ts'));
    for (const [module, moduleResolution] of [['ESNext', 'Bundler'], ['Node16', 'Node16'], ['NodeNext', 'NodeNext']]) {
      const config = {
        compilerOptions: {
          target: 'ES2022', module, moduleResolution, lib: ['ES2022', 'DOM', 'DOM.Iterable'],
          strict: true, noEmit: true, skipLibCheck: false, types: [],
        },
        files: ['example.ts'],
      };
      fs.writeFileSync(path.join(dir, `tsconfig.${moduleResolution}.json`), JSON.stringify(config));
      // Type-checks example.ts; the trace shows the package's own types were found.
      const trace = sh(dir, path.join(ROOT, 'node_modules/.bin/tsc'), ['-p', `tsconfig.${moduleResolution}.json`, '--traceResolution']);
      assert(/'kerze' was successfully resolved to '.*node_modules\/kerze\/index\.d\.ts'/.test(trace), `${moduleResolution}: kerze → index.d.ts`);
      assert(/'kerze\/embed' was successfully resolved to '.*node_modules\/kerze\/embed\.d\.ts'/.test(trace), `${moduleResolution}: kerze/embed → embed.d.ts`);
    }
  });

  if (wanted('vite')) {
    const dir = prepare('vite', 'src/app.js');
    await test('Vite: production build, the worker and the wasm emitted, same ids as the CLI', async () => {
      const b = build(dir);
      timings.vite = b.s;
      assert(!/\(!\)|warning/i.test(b.out), `vite build warned:\n${b.out}`);
      const dist = path.join(dir, 'dist');
      assert(filesMatching(dist, /^worker-.*\.js$/).length === 1, `a worker chunk in ${filesMatching(dist, /./)}`);
      assert(filesMatching(dist, /\.wasm$/).length >= 2, `both wasm builds in ${filesMatching(dist, /./)}`);
      await runApp(await serveStatic(dist), { page: '/index.html', dist, choices: true });
    });

    await test('Vite: the same build on a cross-origin-isolated page runs the threads build', async () => {
      const r = await runApp(await serveStatic(path.join(dir, 'dist'), true), { page: '/index.html', threads: 2, choices: true });
      assert(r.isolated, 'the page is cross-origin isolated');
      assertEq(r.info.backend, 'cpu-simd-threads', 'backend');
      assertEq(r.info.threads, 2, 'threads');
    });

    await test('Vite: the dev server', async () => {
      const port = await freePort();
      const server = await startServer(dir, process.execPath, [path.join(dir, 'node_modules/vite/bin/vite.js'),
        '--host', '127.0.0.1', '--port', String(port), '--strictPort'], port);
      try {
        await runApp(`http://127.0.0.1:${port}`);
      } finally {
        server.stop();
      }
    });
  }

  if (wanted('webpack')) {
    const dir = prepare('webpack', 'src/app.js');
    await test('webpack 5: production build, same ids as the CLI', async () => {
      const b = build(dir);
      timings.webpack = b.s;
      const dist = path.join(dir, 'dist');
      assert(filesMatching(dist, /\.wasm$/).length >= 2, `both wasm builds in ${filesMatching(dist, /./)}`);
      await runApp(await serveStatic(dist), { page: '/index.html', dist, choices: true });
    });

    await test('webpack 5: the same build on a cross-origin-isolated page runs the threads build', async () => {
      const r = await runApp(await serveStatic(path.join(dir, 'dist'), true), { page: '/index.html', threads: 2, choices: true });
      assertEq(r.info.backend, 'cpu-simd-threads', 'backend');
    });

    await test('webpack 5: the dev server (webpack serve)', async () => {
      const port = await freePort();
      const server = await startServer(dir, process.execPath, [path.join(dir, 'node_modules/webpack-cli/bin/cli.js'), 'serve',
        '--mode', 'development', '--host', '127.0.0.1', '--port', String(port)], port);
      try {
        await runApp(`http://127.0.0.1:${port}`);
      } finally {
        server.stop();
      }
    });
  }

  if (wanted('rollup')) {
    await test('Rollup (node-resolve): production build, the inline worker, same ids as the CLI', async () => {
      const dir = prepare('rollup', 'src/app.js');
      const b = build(dir);
      timings.rollup = b.s;
      await runApp(await serveStatic(path.join(dir, 'dist')), { page: '/index.html', worker: 'inline', choices: true });
    });
  }

  if (wanted('esbuild')) {
    const dir = prepare('esbuild', 'src/app.js');
    await test('esbuild: production build, the inline worker, same ids as the CLI', async () => {
      const b = build(dir);
      timings.esbuild = b.s;
      await runApp(await serveStatic(path.join(dir, 'dist')), { page: '/index.html', worker: 'inline', choices: true });
    });

    await test('esbuild: assetsUrl points at the package files self-hosted on another origin (a CDN)', async () => {
      const cdn = await serve(path.join(dir, 'node_modules'), ['--only', 'kerze']);
      const app = await serveStatic(path.join(dir, 'dist'));
      await runApp(app, { page: '/index.html', assets: `${cdn}/kerze/`, choices: true });
      // In the page (worker: false) the wasm must come from somewhere: assetsUrl, or a clear error.
      await runApp(app, { page: '/index.html', assets: `${cdn}/kerze/`, worker: null });
      await runApp(app, { page: '/index.html', worker: null, error: 'InvalidArgumentError' });
    });

    await test('esbuild: the dev server (esbuild --servedir)', async () => {
      const port = await freePort();
      const server = await startServer(dir, path.join(dir, 'node_modules/.bin/esbuild'), ['src/main.js', '--bundle', '--format=esm',
        '--outdir=public', '--servedir=public', `--serve=127.0.0.1:${port}`], port);
      try {
        await runApp(`http://127.0.0.1:${port}`, { page: '/index.html', worker: 'inline' });
      } finally {
        server.stop();
      }
    });
  }

  if (wanted('next')) {
    await test('Next.js: next build (server rendering imports the package), next start, same ids as the CLI', async () => {
      const dir = prepare('next', 'app/app.js');
      const env = { NEXT_TELEMETRY_DISABLED: '1' };
      const b = build(dir, env);
      timings.next = b.s;
      assert(/Generating static pages/.test(b.out), `next build prerendered the page:\n${b.out}`);
      const port = await freePort();
      const server = await startServer(dir, process.execPath, [path.join(dir, 'node_modules/next/dist/bin/next'), 'start',
        '-H', '127.0.0.1', '-p', String(port)], port, env);
      try {
        await runApp(`http://127.0.0.1:${port}`, { choices: true });
      } finally {
        server.stop();
      }
    });

    await test('Next.js: the dev server (next dev)', async () => {
      const dir = path.join(CACHE, 'next');
      const port = await freePort();
      const server = await startServer(dir, process.execPath, [path.join(dir, 'node_modules/next/dist/bin/next'), 'dev',
        '-H', '127.0.0.1', '-p', String(port)], port, { NEXT_TELEMETRY_DISABLED: '1' });
      try {
        await runApp(`http://127.0.0.1:${port}`);
      } finally {
        server.stop();
      }
    });
  }
} finally {
  await browser.close();
  stopServers();
  fs.rmSync(tmp, { recursive: true, force: true });
}

console.log(`     build seconds: ${JSON.stringify(timings)}`);
process.exit(summary() ? 1 : 0);
