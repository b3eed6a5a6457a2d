// The fallback route: a configured OpenAI-compatible endpoint (`kerze serve`, vLLM, a
// hyperscaler's chat completions) that answers what the local model cannot — this device
// cannot run it (`unsupported`), it is still downloading (`loading`), the prompt passes its
// context (`context`), its load or generation failed (`error`, also midway through a stream:
// the partial answer goes along as the assistant's start, `continue_final_message`, or after
// the prompt of a plain completion, so the answer continues), or it decodes too slowly here
// (`slow`). Nothing leaves the page unless configured; `consent()` is asked before a
// visitor's text first does; `budget` caps cloud requests per page session; `getToken()`
// fetches a short-lived token per request.
//
// RemoteTransport is a Transport (transport.js) like the local ones: it answers the engine's
// `generate` op — a chat (`input.messages`) through `${baseURL}/chat/completions`, a text
// prompt through `${baseURL}/completions` — with the same pieces ({ text }) and result
// ({ finishReason, usage, ids }), so the Engine builds every answer, local or not, one way.

import { KerzeError, abortError } from './protocol.js';
import { WHEN } from './route-policy.js';

const KNOWN = new Set(['baseURL', 'model', 'headers', 'getToken', 'when', 'consent', 'budget', 'slowTokensPerS']);

const bad = (m) => new KerzeError('InvalidArgumentError', `fallback: ${m}`);

/** The `fallback` option checked and completed, or null when there is none. */
export function fallbackOptions(f) {
  if (f == null) return null;
  if (typeof f !== 'object' || Array.isArray(f)) throw bad('must be an object { baseURL, model, when, ... }');
  for (const k of Object.keys(f)) if (!KNOWN.has(k)) throw bad(`unknown option '${k}': known are ${[...KNOWN].join(', ')}`);
  let base;
  try {
    base = new URL(f.baseURL, globalThis.location?.href);
  } catch {
    throw bad(`baseURL '${f.baseURL}' is not a URL (it ends in /v1, as in the openai client)`);
  }
  if (typeof f.model !== 'string' || !f.model) throw bad('model must name the endpoint\'s model');
  const when = f.when ?? WHEN;
  if (!Array.isArray(when) || when.some((w) => !WHEN.includes(w))) throw bad(`when must be a list of ${WHEN.join(', ')}`);
  for (const k of ['getToken', 'consent']) if (f[k] != null && typeof f[k] !== 'function') throw bad(`${k} must be a function`);
  if (f.budget != null && !(Number.isSafeInteger(f.budget) && f.budget >= 0)) throw bad('budget must be a non-negative integer');
  if (f.headers != null && (typeof f.headers !== 'object' || Array.isArray(f.headers))) throw bad('headers must be an object');
  const slow = f.slowTokensPerS ?? 3;
  if (!(typeof slow === 'number' && slow >= 0)) throw bad('slowTokensPerS must be a non-negative number');
  return {
    base: base.href.replace(/\/+$/, ''),
    model: f.model,
    headers: { ...(f.headers ?? {}) },
    getToken: f.getToken ?? null,
    when: new Set(when),
    consent: f.consent ?? null,
    budget: f.budget ?? Infinity,
    slowTokensPerS: slow,
  };
}

/** Engine options (options.js engineOptions) → the OpenAI request's sampling fields. */
const WIRE = {
  maxTokens: 'max_tokens', temperature: 'temperature', topP: 'top_p', topK: 'top_k', minP: 'min_p',
  seed: 'seed', stop: 'stop', presencePenalty: 'presence_penalty', frequencyPenalty: 'frequency_penalty',
  repetitionPenalty: 'repetition_penalty',
};

function wireOptions(options) {
  const out = {};
  for (const [k, v] of Object.entries(options ?? {})) if (k in WIRE && v !== undefined) out[WIRE[k]] = v;
  const format = responseFormatOf(options?.constraint);
  if (format) out.response_format = format;
  return out;
}

/**
 * The engine's constraint as the request's `response_format` (pkg/openai.js responseFormat
 * read backwards): an endpoint that cannot hold it says so (400) rather than answering
 * unconstrained. JSON schema and JSON object in OpenAI's shape; regex, grammar and choices
 * in kerze's (`kerze serve` takes them).
 */
function responseFormatOf(c) {
  if (c == null) return null;
  if (c === 'jsonObject') return { type: 'json_object' };
  if (c.jsonSchema) return { type: 'json_schema', json_schema: { name: 'output', schema: c.jsonSchema, strict: true } };
  if (c.regex != null) return { type: 'regex', regex: c.regex };
  if (c.grammar != null) return { type: 'grammar', grammar: c.grammar };
  if (c.choices) return { type: 'choices', choices: c.choices };
  return null;
}

/** The endpoint as a Transport: the `generate` op, streamed. */
export class RemoteTransport {
  kind = 'remote';
  onInfo = null;
  #f;
  #sent = 0;
  #consent = null;

  constructor(f) {
    this.#f = f;
  }

  get when() {
    return this.#f.when;
  }

  get slowTokensPerS() {
    return this.#f.slowTokensPerS;
  }

  /** Which endpoint and model answer (the response cache keys cloud answers by it). */
  get identity() {
    return `${this.#f.base}|${this.#f.model}`;
  }

  /** The endpoint's model name. */
  get model() {
    return this.#f.model;
  }

  /** Requests sent so far. */
  get sent() {
    return this.#sent;
  }

  /**
   * `generate`: `{ input, options, wire?, prefix?, done? }` — `wire` the caller's own OpenAI
   * chat body (its sampling fields are sent as given), `prefix` the answer so far (`done`
   * tokens of it) that the endpoint continues. Each piece of text goes to `onChunk`.
   */
  async request(op, args, { onChunk, signal } = {}) {
    if (op !== 'generate') {
      throw new KerzeError('UnsupportedDeviceError', `the fallback endpoint answers generation only, not ${op}`);
    }
    const { input, options = {}, wire = null, prefix = '', done = 0 } = args;
    const left = options.maxTokens != null ? Math.max(1, options.maxTokens - done) : undefined;
    let path;
    let body;
    if (input.messages) {
      const base = wire ?? { ...wireOptions(options), messages: input.messages };
      const { signal: _s, stream: _st, stream_options: _so, ...send } = base;
      path = '/chat/completions';
      body = prefix
        ? { ...send, messages: [...input.messages, { role: 'assistant', content: prefix }], continue_final_message: true }
        : { ...send, messages: input.messages };
      if (prefix && left != null) {
        delete body.max_completion_tokens;
        body.max_tokens = left;
      }
    } else if (typeof input.prompt === 'string') {
      path = '/completions';
      body = { ...wireOptions(options), prompt: input.prompt + prefix, ...(left != null ? { max_tokens: left } : {}) };
    } else {
      throw new KerzeError('UnsupportedDeviceError', 'token ids cannot go to the fallback endpoint: give the prompt as text');
    }
    const r = await this.#post(path, { ...body, stream: true, stream_options: { include_usage: true } }, signal);
    let finish = null;
    let usage = null;
    // The endpoint's tool calls become the text form the engine writes (src/chat/tools.rs),
    // which the chat stream splits again: one shape for both routes.
    let open = -1;
    const close = () => {
      if (open >= 0) onChunk?.({ text: '}\n</tool_call>' });
    };
    for await (const c of this.#events(r, signal)) {
      if (c.usage) usage = { promptTokens: c.usage.prompt_tokens ?? 0, completionTokens: c.usage.completion_tokens ?? 0 };
      const ch = c.choices?.[0];
      if (!ch) continue;
      const text = ch.delta?.content ?? ch.text ?? '';
      if (text) onChunk?.({ text });
      for (const call of ch.delta?.tool_calls ?? []) {
        const index = call.index ?? 0;
        if (index !== open) {
          close();
          const name = JSON.stringify(call.function?.name ?? '');
          onChunk?.({ text: `${open >= 0 ? '\n' : ''}<tool_call>\n{"name": ${name}, "arguments": ` });
          open = index;
        }
        if (call.function?.arguments) onChunk?.({ text: call.function.arguments });
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    close();
    // The chat stream says 'tool_calls' again when it finds calls.
    if (finish === 'tool_calls') finish = 'stop';
    return { finishReason: finish ?? 'stop', usage: usage ?? { promptTokens: 0, completionTokens: 0 }, ids: [] };
  }

  terminate() {}

  async #permit() {
    if (this.#f.consent) {
      this.#consent ??= Promise.resolve().then(() => this.#f.consent()).then(Boolean, () => false);
      if (!(await this.#consent)) {
        this.#consent = null; // ask again next time
        throw new KerzeError('ConsentError', 'the visitor did not agree to send the text to the fallback endpoint: nothing was sent');
      }
    }
    if (this.#sent >= this.#f.budget) {
      throw new KerzeError('BudgetError', `the fallback's budget of ${this.#f.budget} requests in this page session is spent`);
    }
    this.#sent += 1;
  }

  async #headers() {
    const h = { 'content-type': 'application/json', ...this.#f.headers };
    if (this.#f.getToken) {
      let token;
      try {
        token = await this.#f.getToken();
      } catch (e) {
        throw new KerzeError('CloudError', `getToken failed: ${e?.message ?? e}`);
      }
      if (token) h.authorization = `Bearer ${token}`;
    }
    return h;
  }

  /** POST a request to `path`; the Response (ok) or a typed error. */
  async #post(path, body, signal) {
    await this.#permit();
    const url = this.#f.base + path;
    let r;
    try {
      r = await fetch(url, {
        method: 'POST', headers: await this.#headers(), signal,
        body: JSON.stringify({ ...body, model: this.#f.model }),
      });
    } catch (e) {
      if (signal?.aborted) throw abortError(signal);
      throw new KerzeError('CloudError', `the fallback endpoint ${url} cannot be reached: ${e?.message ?? e}`);
    }
    if (!r.ok) {
      let msg = `${r.status} ${r.statusText}`;
      try {
        msg = (await r.json())?.error?.message ?? msg;
      } catch { /* not JSON */ }
      const e = new KerzeError('CloudError', `the fallback endpoint answered ${r.status}: ${msg}`);
      e.status = r.status;
      throw e;
    }
    return r;
  }

  /** The JSON events of a streamed answer. */
  async *#events(r, signal) {
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    try {
      for (;;) {
        let step;
        try {
          step = await reader.read();
        } catch (e) {
          if (signal?.aborted) throw abortError(signal);
          throw new KerzeError('CloudError', `the fallback's stream broke off: ${e?.message ?? e}`);
        }
        if (step.done) return;
        buf += dec.decode(step.value, { stream: true });
        let at;
        while ((at = buf.indexOf('\n\n')) >= 0) {
          const event = buf.slice(0, at);
          buf = buf.slice(at + 2);
          for (const line of event.split('\n')) {
            if (!line.startsWith('data:')) continue;
            const data = line.slice(5).trim();
            if (data === '[DONE]') return;
            let chunk;
            try {
              chunk = JSON.parse(data);
            } catch {
              throw new KerzeError('CloudError', `the fallback sent a frame that is not JSON: ${data.slice(0, 80)}`);
            }
            if (chunk.error) throw new KerzeError('CloudError', `the fallback failed midway: ${chunk.error.message ?? JSON.stringify(chunk.error)}`);
            yield chunk;
          }
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }
}
