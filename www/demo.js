// The demo page: uses the package exactly as a site would (import from ../pkg/index.js).
import { createEngine, probe, cache, catalog } from '../pkg/index.js';

const $ = (id) => document.getElementById(id);
// The chat model follows instructions; the base model continues text.
const CHAT_MODEL = 'smollm2-135m-instruct';
const BASE_PROMPT = 'The three most important things to know about baking bread are';
let engine = null;
let engineKey = '';
let running = null;
/** The conversation so far (chat mode), OpenAI messages. */
let messages = [];

const model = () => $('model').value;
const chatMode = () => model() === CHAT_MODEL;

function setStatus(text, isError = false) {
  $('status').textContent = text;
  $('status').classList.toggle('error', isError);
}

function modelOption() {
  const entry = catalog[model()];
  if ($('source').value === 'catalog') return model();
  return { id: model(), url: new URL(`../models/${entry.file}`, location.href).href };
}

/** Switch the page between chat (instruction model) and continuation (base model). */
function showMode() {
  const chat = chatMode();
  $('chat').hidden = !chat;
  $('newChat').hidden = !chat;
  $('output').hidden = chat;
  $('generate').textContent = chat ? 'Send' : 'Generate';
  const p = $('prompt');
  if (chat && p.value === BASE_PROMPT) p.value = 'Suggest a name for a small bakery by the sea.';
  if (!chat && !p.value) p.value = BASE_PROMPT;
}

function turn(role, text) {
  const div = document.createElement('div');
  div.className = `turn ${role}`;
  div.textContent = text;
  $('chat').append(div);
  return div;
}

const PHASES = { compile: 'Preparing the engine', download: 'Downloading the model',
  cache: 'Reading the model from the cache', load: 'Loading the model', ready: 'Ready' };

function showProgress(p) {
  const bar = $('progress');
  bar.hidden = p.phase === 'ready';
  bar.max = p.total || 1;
  bar.value = p.loaded;
  const mb = (b) => (b / 1e6).toFixed(0);
  const amount = p.total > 1 ? ` — ${mb(p.loaded)} of ${mb(p.total)} MB` : '';
  setStatus(`${PHASES[p.phase] ?? p.phase}${amount}`);
}

/** The weak-device switch: what the device check is told instead of the truth. */
const overrides = () => ($('weak').checked ? { deviceMemory: 0.25, gpu: false } : undefined);

function fallbackOption() {
  const baseURL = $('fallbackUrl').value.trim();
  if (!baseURL) return undefined;
  // A site gets a short-lived token from its own backend here; the demo takes one typed in.
  const token = $('fallbackToken').value.trim();
  return { baseURL, model: $('fallbackModel').value.trim() || 'default', ...(token ? { getToken: async () => token } : {}) };
}

/** The device check for the chosen model: before any download. */
async function showProbe() {
  const box = $('probe');
  try {
    const p = await probe({ model: modelOption(), device: $('device').value, overrides: overrides() });
    const mb = (b) => (b == null ? '?' : `${(b / 1e6).toFixed(0)} MB`);
    box.textContent = `Device check: ${p.canRun} — ${p.backend}, ${p.cached ? 'cached' : `${mb(p.downloadBytes)} to download`}, `
      + `${mb(p.peakBytes)} of memory — ${(p.problems.length ? p.problems : p.reasons).join('; ')}`;
    window.kerzeDemo.probe = p;
  } catch (e) {
    box.textContent = `Device check failed: ${e.name}: ${e.message}`;
  }
}

function showRoute(r) {
  $('route').textContent = r ? `Answered ${r.route === 'local' ? 'on this device' : 'by the fallback endpoint'} — ${r.reason}` : '';
  window.kerzeDemo.routes.push(r);
}

async function getEngine(signal) {
  const key = `${model()}|${$('device').value}|${$('source').value}|${$('useWorker').checked}|${$('weak').checked}|${$('fallbackUrl').value}|${$('fallbackModel').value}`;
  if (engine && key === engineKey) return engine;
  if (engine) await engine.dispose();
  engine = null;
  engine = await createEngine({
    model: modelOption(),
    device: $('device').value,
    worker: $('useWorker').checked,
    onProgress: showProgress,
    signal,
    fallback: fallbackOption(),
    probeOverrides: overrides(),
  });
  engineKey = key;
  window.kerzeDemo.engine = engine;
  await showCache();
  return engine;
}

function options() {
  const num = (id) => ($(id).value === '' ? undefined : Number($(id).value));
  return {
    maxTokens: num('maxTokens'), temperature: num('temperature'), topP: num('topP'),
    topK: num('topK'), seed: num('seed'),
  };
}

function showStats(e, u) {
  $('stats').innerHTML = '';
  const t = document.createElement('table');
  const quants = Object.entries(e.info.quants ?? {}).map(([k, n]) => `${k} ×${n}`).join(', ');
  const rate = (v, what) => (Number.isFinite(v) ? `, ${v.toFixed(1)} tok/s ${what}` : '');
  const simd = e.info.simd ? ` (${e.info.simd})` : '';
  const rows = [['backend', `${e.info.backend}${simd} — ${e.info.reason}`], ['route', $('route').textContent || 'local'],
    ['prompt', `${u.promptTokens} tokens${rate(u.prefillTokensPerS, 'prefill')}`],
    ['output', `${u.completionTokens} tokens${rate(u.decodeTokensPerS, 'decode')}`],
    ['model', e.info.backend === 'cloud' ? `${e.info.model} at the fallback endpoint`
      : `${e.info.model} (${e.info.family}; ${quants}) from ${e.info.source}, ready in ${(e.info.readyMs / 1000).toFixed(2)} s`]];
  for (const [k, v] of rows) {
    const tr = t.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  }
  $('stats').append(t);
}

/** Chat mode: send the text as the next user turn and stream the model's answer. */
async function send() {
  const text = $('prompt').value.trim();
  if (!text) return;
  const ctl = new AbortController();
  running = ctl;
  $('generate').disabled = true;
  $('stop').disabled = false;
  messages.push({ role: 'user', content: text });
  turn('user', text);
  $('prompt').value = '';
  const box = turn('assistant', '');
  box.id = 'generated';
  let answer = '';
  try {
    const e = await getEngine(ctl.signal);
    setStatus(`Answering on ${e.info.backend}…`);
    const num = (id) => ($(id).value === '' ? undefined : Number($(id).value));
    const stream = await e.chat.completions.create({
      messages, stream: true, stream_options: { include_usage: true }, signal: ctl.signal,
      max_tokens: num('maxTokens'), temperature: num('temperature'), top_p: num('topP'),
      top_k: num('topK'), seed: num('seed'),
    });
    let finish = null;
    let usage = null;
    let lastRoute = null;
    const t0 = performance.now();
    let tFirst = null;
    for await (const f of stream) {
      if (f.usage) usage = f.usage;
      if (f.kerze && (f.kerze.route !== lastRoute?.route || f.kerze.reason !== lastRoute?.reason)) {
        lastRoute = f.kerze;
        showRoute(f.kerze);
      }
      const c = f.choices[0];
      if (!c) continue;
      if (c.delta.content) {
        tFirst ??= performance.now();
        answer += c.delta.content;
        box.textContent = answer;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    messages.push({ role: 'assistant', content: answer });
    setStatus(`Done (${finish}) on ${e.info.backend}.`);
    // The chat stream carries no timings: measured here, the first token's wait included in
    // the prefill.
    const t1 = performance.now();
    showStats(e, {
      promptTokens: usage.prompt_tokens, completionTokens: usage.completion_tokens,
      prefillTokensPerS: tFirst ? usage.prompt_tokens / ((tFirst - t0) / 1000) : NaN,
      decodeTokensPerS: tFirst && usage.completion_tokens > 1
        ? (usage.completion_tokens - 1) / ((t1 - tFirst) / 1000) : NaN,
    });
  } catch (err) {
    messages.pop();
    setStatus(err.name === 'AbortError' ? 'Stopped.' : `${err.name}: ${err.message}`, err.name !== 'AbortError');
    $('progress').hidden = true;
  } finally {
    running = null;
    $('generate').disabled = false;
    $('stop').disabled = true;
    window.kerzeDemo.done += 1;
  }
}

async function generate() {
  if (chatMode()) return send();
  const ctl = new AbortController();
  running = ctl;
  $('generate').disabled = true;
  $('stop').disabled = false;
  const out = $('output');
  out.textContent = '';
  const promptSpan = document.createElement('span');
  promptSpan.className = 'prompt';
  promptSpan.textContent = $('prompt').value;
  out.append(promptSpan);
  const gen = document.createElement('span');
  gen.id = 'generated';
  out.append(gen);
  try {
    const e = await getEngine(ctl.signal);
    setStatus(`Generating on ${e.info.backend}…`);
    const it = e.generate($('prompt').value, { ...options(), signal: ctl.signal });
    let r;
    while (!(r = await it.next()).done) gen.textContent += r.value.text;
    setStatus(`Done (${r.value.finishReason}) on ${e.info.backend}.`);
    showStats(e, r.value.usage);
  } catch (err) {
    setStatus(err.name === 'AbortError' ? 'Stopped.' : `${err.name}: ${err.message}`, err.name !== 'AbortError');
    $('progress').hidden = true;
  } finally {
    running = null;
    $('generate').disabled = false;
    $('stop').disabled = true;
    window.kerzeDemo.done += 1;
  }
}

async function showCache() {
  const list = await cache.list();
  const box = $('cache');
  box.textContent = list.length ? '' : 'empty';
  for (const m of list) {
    const div = document.createElement('div');
    div.textContent = `${m.name} — ${(m.bytes / 1e6).toFixed(0)} MB, stored ${new Date(m.storedAt).toLocaleString()}`;
    box.append(div);
  }
}

$('generate').addEventListener('click', generate);
$('model').addEventListener('change', showMode);
$('newChat').addEventListener('click', () => {
  messages = [];
  $('chat').textContent = '';
});
$('stop').addEventListener('click', () => running?.abort());
$('clearCache').addEventListener('click', async () => {
  const n = await cache.clear();
  setStatus(`Removed ${n} cached model${n === 1 ? '' : 's'}.`);
  await showCache();
});
for (const id of ['model', 'device', 'source', 'weak']) $(id).addEventListener('change', showProbe);
window.kerzeDemo = { engine: null, done: 0, ready: true, messages: () => messages, probe: null, routes: [] };
showMode();
showCache();
showProbe();
