// The demo's analysis view: classification (a bar per label), semantic search over a sample
// FAQ, and a similarity heatmap, all with all-MiniLM-L6-v2 in this tab (loaded on first use
// from this server's /models/).
import { createEngine, catalog } from '../pkg/index.js';

const $ = (id) => document.getElementById(id);
const FAQ = [
  'Shipping: orders leave our warehouse within two working days and arrive in three to five days.',
  'Returns: you can send any item back within 30 days; the return label is on your order page.',
  'Refunds: once the return arrives we refund the amount to your original payment method within a week.',
  'Payment: we accept credit cards, PayPal and invoice.',
  'Sizes: our shoes run small; if you are between sizes, order one size up.',
  'Account: reset your password with the link on the login page.',
  'Store: our shop in Leipzig is open Monday to Saturday, 10 am to 7 pm.',
  'Gift cards: gift cards are valid for three years and can be used online and in the store.',
];

let enginePromise = null;
let faqIndex = null;
export const state = { classified: 0, searched: 0, compared: 0 };

function engine() {
  if (!enginePromise) {
    const entry = catalog['all-minilm-l6-v2'];
    const status = $('anaStatus');
    enginePromise = createEngine({
      model: { id: 'all-minilm-l6-v2', url: new URL(`../models/${entry.file}`, location.href).href },
      onProgress: (p) => { status.textContent = p.phase === 'ready' ? '' : `Loading the encoder: ${p.phase}…`; },
    });
    enginePromise.catch(() => { enginePromise = null; });
  }
  return enginePromise;
}

async function run(fn) {
  const status = $('anaStatus');
  status.classList.remove('error');
  try {
    await fn(await engine());
  } catch (e) {
    status.textContent = `${e.name}: ${e.message}`;
    status.classList.add('error');
  }
}

$('clsGo').addEventListener('click', () => run(async (e) => {
  const labels = $('clsLabels').value.split(',').map((s) => s.trim()).filter(Boolean);
  const scores = await e.classify($('clsText').value, { labels });
  $('clsBars').replaceChildren(...scores.flatMap(({ label, score }) => {
    const name = document.createElement('span');
    name.textContent = label;
    name.setAttribute('role', 'listitem');
    const bar = document.createElement('div');
    bar.className = 'bar';
    bar.style.width = `${(score * 100).toFixed(1)}%`;
    bar.setAttribute('aria-hidden', 'true');
    const pct = document.createElement('span');
    pct.textContent = `${(score * 100).toFixed(1)} %`;
    return [name, bar, pct];
  }));
  $('anaStatus').textContent = `${scores.usage.textsEncoded} text, ${scores.usage.labelsEncoded} new label embeddings, ${scores.usage.ms.toFixed(0)} ms`;
  state.classified += 1;
}));

$('faqGo').addEventListener('click', () => run(async (e) => {
  faqIndex ??= await e.index(FAQ);
  const hits = await faqIndex.search($('faqQuery').value, { topK: 3 });
  $('faqHits').replaceChildren(...hits.map((h) => {
    const li = document.createElement('li');
    const s = document.createElement('span');
    s.className = 'score';
    s.textContent = ` (${h.score.toFixed(3)})`;
    li.append(h.doc, s);
    return li;
  }));
  $('anaStatus').textContent = `${faqIndex.stats.encoded} FAQ entries embedded, ${faqIndex.stats.cached} from this browser's cache`;
  state.searched += 1;
}));

$('simGo').addEventListener('click', () => run(async (e) => {
  const lines = $('simText').value.split('\n').map((s) => s.trim()).filter(Boolean).slice(0, 12);
  const v = await e.embed(lines);
  const table = document.createElement('table');
  table.className = 'heat';
  const head = table.insertRow();
  head.insertCell().textContent = '';
  lines.forEach((_, j) => { head.insertCell().textContent = `#${j + 1}`; });
  lines.forEach((line, i) => {
    const row = table.insertRow();
    const h = row.insertCell();
    h.textContent = `#${i + 1} ${line}`;
    h.style.textAlign = 'left';
    lines.forEach((_, j) => {
      let s = 0;
      for (let k = 0; k < v[i].length; k++) s += v[i][k] * v[j][k];
      const c = row.insertCell();
      c.textContent = s.toFixed(2);
      const a = Math.max(0, Math.min(1, s));
      c.style.background = `rgba(58, 111, 216, ${a.toFixed(2)})`;
      c.style.color = a > 0.55 ? '#fff' : '#000';
    });
  });
  $('simHeat').replaceChildren(table);
  state.compared += 1;
}));

window.kerzeAnalysis = state;
