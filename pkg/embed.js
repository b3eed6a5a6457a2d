// The script-tag entry (bundled into dist/kerze.js): registers <kerze-generate> and exposes
// window.kerze. Works from another origin than the page and without COOP/COEP: the worker
// starts through a blob: trampoline that imports this very file, which then serves as the
// worker. Nothing downloads until the visitor asks (or the element has `preload`).
//
//   <script type="module" src="https://cdn.example/kerze/dist/kerze.js"></script>
//   <kerze-generate model="gemma-3-270m" placeholder="Describe your product…"
//                   max-tokens="64" temperature="0.7"></kerze-generate>
//
// Attributes: model (catalog id or URL of a .gguf), sha256 (with a URL), prompt (a fixed
// prompt: the visitor only presses the button) or placeholder (the visitor types), max-tokens,
// temperature, device (auto | cpu | webgpu), preload (start the download at once), system (a
// system message), mode (chat | complete). With a model whose file has a chat template (an
// instruction model, e.g. smollm2-135m-instruct) the visitor's text is sent as a chat message
// through that template; with a base model, or mode="complete", it is continued as text.

import * as api from './index.js';
import { serve } from './serve.js';

const inWorker = typeof WorkerGlobalScope !== 'undefined' && globalThis instanceof WorkerGlobalScope;
// Started by index.js as the engine's worker (named so): serve the page.
if (inWorker && globalThis.name === 'kerze') serve(globalThis);

const CSS = `
:host { display: block; font: inherit; border: 1px solid #d0d0d0; border-radius: 8px; padding: 12px; }
textarea { width: 100%; box-sizing: border-box; min-height: 3.5em; font: inherit; padding: 6px; }
.row { display: flex; gap: 8px; align-items: center; margin: 8px 0; }
button { font: inherit; padding: 4px 14px; cursor: pointer; }
progress { flex: 1; height: 8px; }
.out { white-space: pre-wrap; min-height: 1.5em; }
.msg { color: #555; font-size: .9em; }
.msg.error { color: #b00020; }
[hidden] { display: none !important; }
`;

// Engines shared by elements that use the same model on one page.
const engines = new Map();

function modelOf(el) {
  const m = el.getAttribute('model') || 'gemma-3-270m';
  if (m in api.catalog) return m;
  return { url: m, sha256: el.getAttribute('sha256') || undefined };
}

function friendly(e) {
  switch (e?.name) {
    case 'UnsupportedDeviceError':
      return `This device cannot run the model: ${e.message}`;
    case 'DownloadError':
      return `The model could not be downloaded: ${e.message}`;
    case 'IntegrityError':
      return `The downloaded model is corrupt: ${e.message}`;
    case 'WorkerError':
      return `The engine could not start on this page: ${e.message}`;
    default:
      return `${e?.name ?? 'Error'}: ${e?.message ?? e}`;
  }
}

function defineElement() {
  class KerzeGenerate extends HTMLElement {
    static observedAttributes = ['prompt', 'placeholder'];

    #ui = null;
    #running = null;

    connectedCallback() {
      if (this.#ui) return;
      const root = this.attachShadow({ mode: 'open' });
      if ('adoptedStyleSheets' in root && typeof CSSStyleSheet === 'function' && 'replaceSync' in CSSStyleSheet.prototype) {
        const sheet = new CSSStyleSheet();
        sheet.replaceSync(CSS);
        root.adoptedStyleSheets = [sheet];
      } else {
        const style = document.createElement('style');
        style.textContent = CSS;
        root.append(style);
      }
      const input = document.createElement('textarea');
      input.part = 'input';
      const go = document.createElement('button');
      go.textContent = 'Generate';
      go.part = 'generate';
      const stop = document.createElement('button');
      stop.textContent = 'Stop';
      stop.part = 'stop';
      stop.hidden = true;
      const bar = document.createElement('progress');
      bar.hidden = true;
      const row = document.createElement('div');
      row.className = 'row';
      row.append(go, stop, bar);
      const msg = document.createElement('div');
      msg.className = 'msg';
      msg.setAttribute('role', 'status');
      const out = document.createElement('div');
      out.className = 'out';
      out.part = 'output';
      out.setAttribute('aria-live', 'polite');
      root.append(input, row, msg, out);
      this.#ui = { input, go, stop, bar, msg, out };
      this.#sync();
      go.addEventListener('click', () => this.generate());
      stop.addEventListener('click', () => this.#running?.abort());
      if (this.hasAttribute('preload')) this.#engine().catch((e) => this.#error(e));
    }

    attributeChangedCallback() {
      if (this.#ui) this.#sync();
    }

    #sync() {
      const fixed = this.getAttribute('prompt');
      this.#ui.input.hidden = fixed != null;
      this.#ui.input.placeholder = this.getAttribute('placeholder') ?? '';
    }

    #error(e) {
      this.#ui.msg.textContent = friendly(e);
      this.#ui.msg.classList.add('error');
      this.#ui.bar.hidden = true;
    }

    #engine(signal) {
      const model = modelOf(this);
      const device = this.getAttribute('device') || 'auto';
      const key = JSON.stringify([model, device]);
      let p = engines.get(key);
      if (!p) {
        const listeners = new Set();
        p = api.createEngine({
          model, device, signal,
          onProgress: (pr) => listeners.forEach((f) => f(pr)),
        });
        p.listeners = listeners;
        engines.set(key, p);
        p.catch(() => engines.delete(key));
      }
      const show = (pr) => {
        const { bar, msg } = this.#ui;
        bar.hidden = pr.phase === 'ready';
        bar.max = pr.total || 1;
        bar.value = pr.loaded;
        const mb = (b) => (b / 1e6).toFixed(0);
        msg.classList.remove('error');
        msg.textContent = {
          compile: 'Starting…',
          download: `Downloading the model (first time only): ${mb(pr.loaded)} of ${mb(pr.total)} MB`,
          cache: 'Loading the model from this browser…',
          load: 'Loading the model…',
          ready: '',
        }[pr.phase] ?? '';
      };
      p.listeners?.add(show);
      return p.finally(() => p.listeners?.delete(show));
    }

    /** Generate from the fixed prompt or the visitor's text. */
    async generate() {
      if (this.#running) return;
      const { input, go, stop, out, msg } = this.#ui;
      const prompt = this.getAttribute('prompt') ?? input.value;
      if (!prompt.trim()) {
        msg.textContent = 'Type something first.';
        return;
      }
      const ctl = new AbortController();
      this.#running = ctl;
      go.disabled = true;
      stop.hidden = false;
      out.textContent = '';
      msg.classList.remove('error');
      try {
        const engine = await this.#engine();
        const num = (name, dflt) => {
          const v = this.getAttribute(name);
          return v == null || v === '' || Number.isNaN(Number(v)) ? dflt : Number(v);
        };
        msg.textContent = '';
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
        if (e?.name === 'AbortError') msg.textContent = 'Stopped.';
        else this.#error(e);
      } finally {
        this.#running = null;
        go.disabled = false;
        stop.hidden = true;
      }
    }
  }
  if (!customElements.get('kerze-generate')) customElements.define('kerze-generate', KerzeGenerate);
}

if (!inWorker) {
  api._setWorkerUrl(import.meta.url);
  if (typeof customElements !== 'undefined') defineElement();
  globalThis.kerze = Object.freeze({
    createEngine: api.createEngine,
    cache: api.cache,
    catalog: api.catalog,
    KerzeError: api.KerzeError,
  });
}
