// `make bench-constrain`: what a JSON-schema constraint costs on Gemma 3 270M Q4_K_M (its
// 262 144-token vocabulary), greedy, 1 thread, in headless Chromium through the package and
// natively (`kerze generate`): decode tok/s without and with the schema (alternating, medians
// of 3), the constraint's own time per generated token (usage.maskMs: masks and commits), the
// tokens it forced (taken without sampling), and its compile time — the first one on a model
// builds the vocabulary's token trie, a repeated schema is kept. Prints JSON.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { ROOT, serve, stopServers, launch, runner } from './lib.mjs';

const RUNS = 3;
const PROMPT = 'A record about a small pet shop in Lisbon, its owner and what it sells, as one JSON object:\n';
const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 40 },
    owner: { type: 'string', maxLength: 40 },
    description: { type: 'string', minLength: 80, maxLength: 240 },
    animals: { type: 'array', items: { type: 'string', maxLength: 20 }, minItems: 2, maxItems: 5 },
  },
  required: ['name', 'owner', 'description', 'animals'],
  additionalProperties: false,
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const catalog = JSON.parse(fs.readFileSync(path.join(ROOT, 'models/catalog.json'), 'utf8'));
const gemma = catalog.models.find((m) => m.id === 'gemma-3-270m');

/** One run's numbers from its usage. */
const numbers = (u, text) => ({
  tokens: u.completionTokens,
  decode_tok_s: u.decodeTokensPerS,
  mask_us_per_token: (1000 * (u.maskMs ?? 0)) / Math.max(1, u.completionTokens),
  forced_tokens: u.forcedTokens ?? 0,
  compile_ms: u.compileMs ?? 0,
  ...(text === undefined ? {} : { valid_json: (() => { try { JSON.parse(text); return true; } catch { return false; } })() }),
});

function summary(free, constrained) {
  const f = median(free.map((r) => r.decode_tok_s));
  const c = median(constrained.map((r) => r.decode_tok_s));
  return {
    free_decode_tok_s: +f.toFixed(1),
    schema_decode_tok_s: +c.toFixed(1),
    schema_over_free: +(c / f).toFixed(3),
    schema_tokens: median(constrained.map((r) => r.tokens)),
    forced_tokens: median(constrained.map((r) => r.forced_tokens)),
    mask_us_per_token: +median(constrained.map((r) => r.mask_us_per_token)).toFixed(1),
    first_compile_ms: +constrained[0].compile_ms.toFixed(1),
    kept_compile_ms: +median(constrained.slice(1).map((r) => r.compile_ms)).toFixed(2),
    all_valid: constrained.every((r) => r.valid_json),
  };
}

const out = { prompt: PROMPT, schema: SCHEMA, runs: RUNS };
const origin = await serve('.', ['--only', 'www,pkg,dist,models']);
const browser = await launch();
try {
  const page = await (await browser.newContext()).newPage();
  await page.goto(`${origin}/www/`);
  const run = runner(page);
  const r = await run(`
    const e = await k.createEngine({ model: { id: arg.id, url: arg.url, sha256: arg.sha256 }, threads: 1, responseCache: false, prefixCache: false });
    const free = []; const constrained = [];
    for (let i = 0; i < arg.RUNS; i++) {
      await e.reset();
      free.push((await e.complete(arg.PROMPT, { maxTokens: 64, temperature: 0 })));
      await e.reset();
      constrained.push((await e.complete(arg.PROMPT, { schema: arg.SCHEMA, maxTokens: 256, temperature: 0 })));
    }
    const info = e.info;
    await e.dispose();
    return { free: free.map((c) => ({ usage: c.usage })), constrained: constrained.map((c) => ({ usage: c.usage, text: c.text })), backend: info.backend };`,
  { id: gemma.id, url: `/models/${gemma.file}`, sha256: gemma.sha256, PROMPT, SCHEMA, RUNS });
  out.chromium = {
    where: `chromium, ${r.backend}, 1 thread (worker)`,
    ...summary(r.free.map((x) => numbers(x.usage)), r.constrained.map((x) => numbers(x.usage, x.text))),
    text: r.constrained[0].text,
  };
} finally {
  await browser.close();
  await stopServers();
}

// Natively: the CLI, one thread.
const kerze = path.join(ROOT, 'target/release/kerze');
const schemaFile = path.join(fs.mkdtempSync('/tmp/kerze-bench-constrain-'), 'schema.json');
fs.writeFileSync(schemaFile, JSON.stringify(SCHEMA));
const cli = (extra) => {
  const o = execFileSync(kerze, ['generate', '--model', path.join(ROOT, 'models', gemma.file), '--device', 'cpu',
    '--prompt', PROMPT, '--temperature', '0', '--json', ...extra], { encoding: 'utf8', env: { ...process.env, CANDLE_NUM_THREADS: '1' } });
  return JSON.parse(o.trim().split('\n').pop());
};
const free = [];
const constrained = [];
for (let i = 0; i < RUNS; i++) {
  free.push(numbers(cli(['--max-tokens', '64']).usage));
  const c = cli(['--max-tokens', '256', '--json-schema', schemaFile]);
  constrained.push(numbers(c.usage, c.text));
}
// Each CLI run is a new process: every compile there builds the trie.
out.native = { where: 'kerze generate, CPU, 1 thread (each run a new process: every compile builds the trie)', ...summary(free, constrained) };
fs.rmSync(path.dirname(schemaFile), { recursive: true, force: true });
console.log(JSON.stringify(out, null, 1));
