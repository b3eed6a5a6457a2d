// The demo page: uses the package exactly as a site would (import from ../pkg/index.js).
import { createEngine, cache, catalog } from '../pkg/index.js';

const $ = (id) => document.getElementById(id);
const MODEL = 'gemma-3-270m';
let engine = null;
let engineKey = '';
let running = null;

function setStatus(text, isError = false) {
  $('status').textContent = text;
  $('status').classList.toggle('error', isError);
}

function modelOption() {
  const entry = catalog[MODEL];
  if ($('source').value === 'catalog') return MODEL;
  return { id: MODEL, url: new URL(`../models/${entry.file}`, location.href).href };
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

async function getEngine(signal) {
  const key = `${$('device').value}|${$('source').value}|${$('useWorker').checked}`;
  if (engine && key === engineKey) return engine;
  if (engine) await engine.dispose();
  engine = null;
  engine = await createEngine({
    model: modelOption(),
    device: $('device').value,
    worker: $('useWorker').checked,
    onProgress: showProgress,
    signal,
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

async function generate() {
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
    const u = r.value.usage;
    setStatus(`Done (${r.value.finishReason}) on ${e.info.backend}.`);
    $('stats').innerHTML = '';
    const t = document.createElement('table');
    const rows = [['backend', `${e.info.backend} — ${e.info.reason}`],
      ['prompt', `${u.promptTokens} tokens, ${u.prefillTokensPerS.toFixed(1)} tok/s prefill`],
      ['output', `${u.completionTokens} tokens, ${u.decodeTokensPerS.toFixed(1)} tok/s decode`],
      ['model', `${e.info.model} from ${e.info.source}, ready in ${(e.info.readyMs / 1000).toFixed(2)} s`]];
    for (const [k, v] of rows) {
      const tr = t.insertRow();
      tr.insertCell().textContent = k;
      tr.insertCell().textContent = v;
    }
    $('stats').append(t);
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
$('stop').addEventListener('click', () => running?.abort());
$('clearCache').addEventListener('click', async () => {
  const n = await cache.clear();
  setStatus(`Removed ${n} cached model${n === 1 ? '' : 's'}.`);
  await showCache();
});
window.kerzeDemo = { engine: null, done: 0, ready: true };
showCache();
