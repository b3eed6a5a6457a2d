// The script-tag entry (bundled into dist/kerze.js): registers <kerze-generate>,
// <kerze-search> and <kerze-classify> and exposes window.kerze. Works from another origin
// than the page and without COOP/COEP: the worker starts through a blob: trampoline that
// imports this very file, which then serves as the worker. Nothing downloads until the
// visitor asks (or the element has `preload`).
//
//   <script type="module" src="https://cdn.example/kerze/dist/kerze.js"></script>
//   <kerze-generate model="gemma-3-270m" placeholder="Describe your product…"
//                   max-tokens="64" temperature="0.7"></kerze-generate>
//   <kerze-search model="/models/all-minilm-l6-v2-q8_0.gguf" selector="main section, .faq li"></kerze-search>
//   <kerze-classify model="/models/all-minilm-l6-v2-q8_0.gguf" labels="billing, delivery, account"
//                   for="message"></kerze-classify>
//
// Every element: model (catalog id or URL of a .gguf), sha256 (with a URL), device (auto |
// cpu | webgpu), preload (start the download at once). Its strings follow the page's
// language (`lang` on the element or an ancestor; English and German built in) and are
// overridden by a `strings` attribute (JSON) or property (`labels` on <kerze-generate> and
// <kerze-search>, where that name is free). Styling: CSS custom properties (--kerze-accent,
// --kerze-border, --kerze-radius, --kerze-padding, --kerze-muted, --kerze-error,
// --kerze-font) and ::part() names given below.
//
// <kerze-generate>: prompt (a fixed prompt: the visitor only presses the button) or
// placeholder (the visitor types), max-tokens, temperature, system (a system message), mode
// (chat | complete). With a model whose file has a chat template the visitor's text is sent as
// a chat message through it; with a base model, or mode="complete", it is continued as text.
// Ctrl+Enter generates, Escape stops. Parts: input, generate, stop, progress, status, output.
// Event kerze-done { text }.
//
// <kerze-search>: selector (the page's sections to search; default "main section"), top-k
// (default 3), placeholder. Indexes the matching elements' text on first use (embeddings kept
// in IndexedDB across visits), lists the best matches and scrolls to the best. Parts: form,
// input, search, progress, status, results, result, score. Event kerze-search { query,
// results: [{ element, text, score }] }.
//
// <kerze-classify>: labels (comma-separated, or a JSON array of names or object label →
// examples), for (the id of an input or textarea: classified on its change event, or call
// classify()), method (centroid | logistic, few-shot). Shows the best label. Parts: status,
// output. Event kerze-classify { text, label, score, results } (bubbles, composed).

import * as api from './index.js';
import { serve } from './serve.js';

const inWorker = typeof WorkerGlobalScope !== 'undefined' && globalThis instanceof WorkerGlobalScope;
// Started by index.js as the engine's worker (named so): serve the page.
if (inWorker && globalThis.name === 'kerze') serve(globalThis);

/** Built-in strings; `{name}` fills in. */
export const STRINGS = Object.freeze({
  en: Object.freeze({
    generate: 'Generate',
    stop: 'Stop',
    input: 'Your text',
    output: 'Generated text',
    progress: 'Loading the model',
    starting: 'Starting…',
    downloading: 'Downloading the model (first time only): {loaded} of {total} MB',
    fromCache: 'Loading the model from this browser…',
    loading: 'Loading the model…',
    typeFirst: 'Type something first.',
    stopped: 'Stopped.',
    search: 'Search',
    searchInput: 'Search this page',
    searchPlaceholder: 'Ask a question…',
    indexing: 'Reading this page…',
    results: 'Best matches',
    noResults: 'Nothing on this page matches.',
    nothingToSearch: 'Nothing to search: no element matches "{selector}".',
    classified: '{label} ({percent} %)',
    classifying: 'Classifying…',
    noField: 'No field with id "{id}" on this page.',
    errorDevice: 'This device cannot run the model: {message}',
    errorDownload: 'The model could not be downloaded: {message}',
    errorIntegrity: 'The downloaded model is corrupt: {message}',
    errorWorker: 'The engine could not start on this page: {message}',
  }),
  de: Object.freeze({
    generate: 'Erzeugen',
    stop: 'Anhalten',
    input: 'Ihr Text',
    output: 'Erzeugter Text',
    progress: 'Das Modell wird geladen',
    starting: 'Wird gestartet …',
    downloading: 'Das Modell wird heruntergeladen (nur beim ersten Mal): {loaded} von {total} MB',
    fromCache: 'Das Modell wird aus diesem Browser geladen …',
    loading: 'Das Modell wird geladen …',
    typeFirst: 'Bitte zuerst etwas eingeben.',
    stopped: 'Angehalten.',
    search: 'Suchen',
    searchInput: 'Diese Seite durchsuchen',
    searchPlaceholder: 'Stellen Sie eine Frage …',
    indexing: 'Diese Seite wird gelesen …',
    results: 'Beste Treffer',
    noResults: 'Nichts auf dieser Seite passt.',
    nothingToSearch: 'Nichts zu durchsuchen: kein Element passt zu „{selector}“.',
    classified: '{label} ({percent} %)',
    classifying: 'Wird eingeordnet …',
    noField: 'Kein Feld mit der id „{id}“ auf dieser Seite.',
    errorDevice: 'Dieses Gerät kann das Modell nicht ausführen: {message}',
    errorDownload: 'Das Modell konnte nicht heruntergeladen werden: {message}',
    errorIntegrity: 'Das heruntergeladene Modell ist beschädigt: {message}',
    errorWorker: 'Die Engine konnte auf dieser Seite nicht starten: {message}',
  }),
});

const CSS = `
:host { display: block; font: var(--kerze-font, inherit); color: inherit;
  border: var(--kerze-border, 1px solid #d0d0d0); border-radius: var(--kerze-radius, 8px);
  padding: var(--kerze-padding, 12px); }
textarea, input { width: 100%; box-sizing: border-box; font: inherit; padding: 6px; }
textarea { min-height: 3.5em; }
.row { display: flex; gap: 8px; align-items: center; margin: 8px 0; }
form.row input { flex: 1; }
button { font: inherit; padding: 4px 14px; cursor: pointer; border-radius: 4px;
  border: 1px solid var(--kerze-accent, #1a5fb4); background: var(--kerze-accent, #1a5fb4);
  color: var(--kerze-accent-text, #fff); }
button:focus-visible, input:focus-visible, textarea:focus-visible {
  outline: 2px solid var(--kerze-accent, #1a5fb4); outline-offset: 2px; }
button.result { display: block; width: 100%; text-align: start; margin: 4px 0; background: transparent;
  color: inherit; border-color: var(--kerze-muted, #767676); }
.score { color: var(--kerze-muted, #595959); font-size: .85em; }
progress { flex: 1; height: 8px; }
.out { white-space: pre-wrap; min-height: 1.5em; }
.msg { color: var(--kerze-muted, #595959); font-size: .9em; }
.msg.error { color: var(--kerze-error, #b00020); }
ul { list-style: none; margin: 0; padding: 0; }
[hidden] { display: none !important; }
`;

// Engines shared by elements that use the same model on one page.
const engines = new Map();

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'part' || k === 'className' || k === 'hidden' || k === 'textContent' || k === 'type') e[k] = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

function fill(template, values) {
  return template.replace(/\{(\w+)\}/g, (m, k) => (k in values ? String(values[k]) : m));
}

/** The visible text of a page element, whitespace collapsed, cut to what an encoder reads. */
function sectionText(node) {
  return (node.innerText ?? node.textContent ?? '').replace(/\s+/g, ' ').trim().slice(0, 4000);
}

/** `labels`: comma-separated names, or JSON (an array, or an object label → examples). */
function parseLabels(raw) {
  const s = (raw ?? '').trim();
  if (s.startsWith('[') || s.startsWith('{')) return JSON.parse(s);
  return s.split(',').map((x) => x.trim()).filter(Boolean);
}

/**
 * The element classes. Made on first use in a page: a worker (where this file also runs)
 * has no HTMLElement.
 */
function elementClasses() {
  /** What the elements share: shadow root, strings, the engine, progress and errors. */
  class KerzeElement extends HTMLElement {
    #strings = null;
    root = null;
    ui = null;

    /** The model when the element names none. */
    static defaultModel = 'gemma-3-270m';

    connectedCallback() {
      if (this.root) return;
      this.root = this.attachShadow({ mode: 'open' });
      if ('adoptedStyleSheets' in this.root && typeof CSSStyleSheet === 'function' && 'replaceSync' in CSSStyleSheet.prototype) {
        const sheet = new CSSStyleSheet();
        sheet.replaceSync(CSS);
        this.root.adoptedStyleSheets = [sheet];
      } else {
        this.root.append(el('style', { textContent: CSS }));
      }
      this.ui = this.build();
      this.render();
      if (this.hasAttribute('preload')) this.engine().catch((e) => this.fail(e));
    }

    attributeChangedCallback() {
      if (this.ui) this.render();
    }

    /** The page's language here: `lang` on the element or an ancestor, else the document's. */
    get language() {
      const l = this.closest('[lang]')?.getAttribute('lang') || document.documentElement.lang || 'en';
      return l.toLowerCase().split('-')[0];
    }

    /** The strings in use: built in for the language, overridden by `strings`. */
    get strings() {
      let own = this.#strings;
      const attr = this.getAttribute('strings') ?? (this.constructor.labelsAreStrings ? this.getAttribute('labels') : null);
      if (!own && attr) {
        try {
          own = JSON.parse(attr);
        } catch {
          own = null;
        }
      }
      return { ...STRINGS.en, ...(STRINGS[this.language] ?? {}), ...(own ?? {}) };
    }

    set strings(v) {
      this.#strings = v && typeof v === 'object' ? { ...v } : null;
      if (this.ui) this.render();
    }

    t(key, values = {}) {
      return fill(this.strings[key] ?? STRINGS.en[key] ?? key, values);
    }

    model() {
      const m = this.getAttribute('model') || this.constructor.defaultModel;
      if (m in api.catalog) return m;
      return { url: m, sha256: this.getAttribute('sha256') || undefined };
    }

    /** The shared engine of this element's model and device, with progress shown here. */
    engine() {
      const model = this.model();
      const device = this.getAttribute('device') || 'auto';
      const key = JSON.stringify([model, device]);
      let p = engines.get(key);
      if (!p) {
        const listeners = new Set();
        p = api.createEngine({ model, device, onProgress: (pr) => listeners.forEach((f) => f(pr)) });
        p.listeners = listeners;
        engines.set(key, p);
        p.catch(() => engines.delete(key));
      }
      const show = (pr) => {
        const { bar, msg } = this.ui;
        bar.hidden = pr.phase === 'ready';
        bar.max = pr.total || 1;
        bar.value = pr.loaded;
        const mb = (b) => (b / 1e6).toFixed(0);
        msg.classList.remove('error');
        msg.textContent = {
          compile: this.t('starting'),
          download: this.t('downloading', { loaded: mb(pr.loaded), total: mb(pr.total) }),
          cache: this.t('fromCache'),
          load: this.t('loading'),
          ready: '',
        }[pr.phase] ?? '';
      };
      p.listeners?.add(show);
      return p.finally(() => {
        p.listeners?.delete(show);
        this.ui.bar.hidden = true;
      });
    }

    /** The progress bar and status line every element has. */
    statusParts() {
      const bar = el('progress', { part: 'progress', hidden: true, 'aria-label': this.t('progress') });
      const msg = el('div', { className: 'msg', part: 'status', role: 'status' });
      return { bar, msg };
    }

    say(text, error = false) {
      this.ui.msg.textContent = text;
      this.ui.msg.classList.toggle('error', error);
    }

    fail(e) {
      const key = {
        UnsupportedDeviceError: 'errorDevice',
        DownloadError: 'errorDownload',
        IntegrityError: 'errorIntegrity',
        WorkerError: 'errorWorker',
      }[e?.name];
      this.say(key ? this.t(key, { message: e.message }) : `${e?.name ?? 'Error'}: ${e?.message ?? e}`, true);
      this.ui.bar.hidden = true;
    }
  }

  class KerzeGenerate extends KerzeElement {
    static observedAttributes = ['prompt', 'placeholder', 'lang', 'labels', 'strings'];
    static labelsAreStrings = true;
    #running = null;

    get labels() {
      return this.strings;
    }

    set labels(v) {
      this.strings = v;
    }

    build() {
      const input = el('textarea', { part: 'input' });
      const go = el('button', { part: 'generate', type: 'button' });
      const stop = el('button', { part: 'stop', type: 'button', hidden: true });
      const { bar, msg } = this.statusParts();
      const out = el('div', { className: 'out', part: 'output', 'aria-live': 'polite' });
      this.root.append(input, el('div', { className: 'row' }, go, stop, bar), msg, out);
      go.addEventListener('click', () => this.generate());
      stop.addEventListener('click', () => this.#running?.abort());
      input.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) {
          ev.preventDefault();
          this.generate();
        }
      });
      this.root.addEventListener('keydown', (ev) => {
        if (ev.key === 'Escape' && this.#running) this.#running.abort();
      });
      return { input, go, stop, bar, msg, out };
    }

    render() {
      const { input, go, stop, bar, out } = this.ui;
      input.hidden = this.getAttribute('prompt') != null;
      input.placeholder = this.getAttribute('placeholder') ?? '';
      input.setAttribute('aria-label', this.getAttribute('placeholder') || this.t('input'));
      go.textContent = this.t('generate');
      stop.textContent = this.t('stop');
      bar.setAttribute('aria-label', this.t('progress'));
      out.setAttribute('aria-label', this.t('output'));
    }

    /** Generate from the fixed prompt or the visitor's text. */
    async generate() {
      if (this.#running) return;
      const { input, go, stop, out } = this.ui;
      const prompt = this.getAttribute('prompt') ?? input.value;
      if (!prompt.trim()) {
        this.say(this.t('typeFirst'));
        return;
      }
      const ctl = new AbortController();
      this.#running = ctl;
      go.disabled = true;
      stop.hidden = false;
      out.textContent = '';
      this.say('');
      try {
        const engine = await this.engine();
        const num = (name, dflt) => {
          const v = this.getAttribute(name);
          return v == null || v === '' || Number.isNaN(Number(v)) ? dflt : Number(v);
        };
        this.say('');
        const mode = this.getAttribute('mode') ?? (engine.info.chatTemplate === 'file' ? 'chat' : 'complete');
        if (mode === 'chat') {
          const system = this.getAttribute('system');
          const messages = [...(system ? [{ role: 'system', content: system }] : []), { role: 'user', content: prompt }];
          const stream = await engine.chat.completions.create({
            messages, stream: true, signal: ctl.signal,
            max_tokens: num('max-tokens', 64), temperature: num('temperature', 0.7),
          });
          for await (const f of stream) out.textContent += f.choices[0]?.delta.content ?? '';
        } else {
          for await (const c of engine.generate(prompt, {
            maxTokens: num('max-tokens', 64),
            temperature: num('temperature', 0.7),
            signal: ctl.signal,
          })) {
            out.textContent += c.text;
          }
        }
        this.dispatchEvent(new CustomEvent('kerze-done', { detail: { text: out.textContent } }));
      } catch (e) {
        if (e?.name === 'AbortError') this.say(this.t('stopped'));
        else this.fail(e);
      } finally {
        this.#running = null;
        go.disabled = false;
        stop.hidden = true;
      }
    }
  }


  class KerzeSearch extends KerzeElement {
    static observedAttributes = ['placeholder', 'lang', 'labels', 'strings'];
    static labelsAreStrings = true;
    static defaultModel = 'all-minilm-l6-v2';
    #index = null;
    #targets = [];

    get labels() {
      return this.strings;
    }

    set labels(v) {
      this.strings = v;
    }

    build() {
      const input = el('input', { part: 'input', type: 'search' });
      const go = el('button', { part: 'search', type: 'submit' });
      const form = el('form', { className: 'row', part: 'form', role: 'search' }, input, go);
      const { bar, msg } = this.statusParts();
      const results = el('ul', { part: 'results' });
      this.root.append(form, bar, msg, results);
      form.addEventListener('submit', (ev) => {
        ev.preventDefault();
        this.search(input.value);
      });
      return { input, go, form, bar, msg, results };
    }

    render() {
      const { input, go, results } = this.ui;
      input.placeholder = this.getAttribute('placeholder') ?? this.t('searchPlaceholder');
      input.setAttribute('aria-label', this.t('searchInput'));
      go.textContent = this.t('search');
      results.setAttribute('aria-label', this.t('results'));
    }

    /** Index the page's sections (once), then show the best matches of `query`. */
    async search(query) {
      const q = String(query ?? '').trim();
      if (!q) {
        this.say(this.t('typeFirst'));
        return [];
      }
      const { go, results } = this.ui;
      go.disabled = true;
      try {
        if (!this.#index) {
          const selector = this.getAttribute('selector') || 'main section';
          const nodes = [...document.querySelectorAll(selector)].filter((n) => !this.contains(n) && sectionText(n));
          if (nodes.length === 0) {
            this.say(this.t('nothingToSearch', { selector }), true);
            return [];
          }
          const engine = await this.engine();
          this.say(this.t('indexing'));
          this.#targets = nodes;
          this.#index = await engine.index(nodes.map((n, i) => ({ text: sectionText(n), i })), { key: 'i' });
        }
        const topK = Number.parseInt(this.getAttribute('top-k') ?? '3', 10) || 3;
        const hits = await this.#index.search(q, { topK });
        results.replaceChildren(...hits.map((h) => {
          const node = this.#targets[h.doc.i];
          const b = el('button', { part: 'result', className: 'result', type: 'button' },
            h.doc.text.length > 140 ? `${h.doc.text.slice(0, 140)}…` : h.doc.text, ' ',
            el('span', { className: 'score', part: 'score', textContent: `${Math.round(h.score * 100)} %` }));
          b.addEventListener('click', () => this.#reveal(node));
          return el('li', {}, b);
        }));
        this.say(hits.length ? '' : this.t('noResults'));
        if (hits.length) this.#reveal(this.#targets[hits[0].doc.i], false);
        const detail = { query: q, results: hits.map((h) => ({ element: this.#targets[h.doc.i], text: h.doc.text, score: h.score })) };
        this.dispatchEvent(new CustomEvent('kerze-search', { detail, bubbles: true, composed: true }));
        return detail.results;
      } catch (e) {
        this.fail(e);
        return [];
      } finally {
        go.disabled = false;
      }
    }

    /** Scroll `node` into view; `focus` also moves the keyboard focus there. */
    #reveal(node, focus = true) {
      node.scrollIntoView({ block: 'start', behavior: 'smooth' });
      if (focus) {
        if (!node.hasAttribute('tabindex')) node.setAttribute('tabindex', '-1');
        node.focus({ preventScroll: true });
      }
    }

    /** The index statistics: { encoded, cached } (null before the first search). */
    get stats() {
      return this.#index ? { ...this.#index.stats } : null;
    }
  }


  class KerzeClassify extends KerzeElement {
    static observedAttributes = ['lang', 'strings'];
    static defaultModel = 'all-minilm-l6-v2';
    #field = null;
    #onChange = () => this.classify();

    build() {
      const { bar, msg } = this.statusParts();
      const out = el('div', { className: 'out', part: 'output', 'aria-live': 'polite' });
      this.root.append(bar, msg, out);
      return { bar, msg, out };
    }

    connectedCallback() {
      super.connectedCallback();
      const id = this.getAttribute('for');
      this.#field = id ? document.getElementById(id) : null;
      if (id && !this.#field) this.say(this.t('noField', { id }), true);
      this.#field?.addEventListener('change', this.#onChange);
    }

    disconnectedCallback() {
      this.#field?.removeEventListener('change', this.#onChange);
    }

    render() {
      this.ui.bar.setAttribute('aria-label', this.t('progress'));
    }

    /** Classify `text` (default: the field's value); resolves to [{ label, score }]. */
    async classify(text = this.#field?.value) {
      const t = String(text ?? '').trim();
      if (!t) return [];
      try {
        const labels = parseLabels(this.getAttribute('labels'));
        const engine = await this.engine();
        this.say(this.t('classifying'));
        const method = this.getAttribute('method') || undefined;
        const results = await engine.classify(t, { labels, ...(method ? { method } : {}) });
        const [best] = results;
        this.say('');
        this.ui.out.textContent = this.t('classified', { label: best.label, percent: Math.round(best.score * 100) });
        const detail = { text: t, label: best.label, score: best.score, results: results.map((r) => ({ ...r })) };
        this.dispatchEvent(new CustomEvent('kerze-classify', { detail, bubbles: true, composed: true }));
        return results;
      } catch (e) {
        this.fail(e);
        return [];
      }
    }
  }

  return { KerzeGenerate, KerzeSearch, KerzeClassify };
}

function defineElements() {
  const { KerzeGenerate, KerzeSearch, KerzeClassify } = elementClasses();
  for (const [name, cls] of [['kerze-generate', KerzeGenerate], ['kerze-search', KerzeSearch], ['kerze-classify', KerzeClassify]]) {
    if (!customElements.get(name)) customElements.define(name, cls);
  }
}

if (!inWorker) {
  api._setWorkerUrl(import.meta.url);
  if (typeof customElements !== 'undefined') defineElements();
  globalThis.kerze = Object.freeze({
    createEngine: api.createEngine,
    probe: api.probe,
    cache: api.cache,
    catalog: api.catalog,
    KerzeError: api.KerzeError,
    strings: STRINGS,
  });
}
