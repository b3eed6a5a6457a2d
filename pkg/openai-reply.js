// The OpenAI reply shapes: a generation → the `chat.completion` object or the stream's
// `chat.completion.chunk`s (reasoning split from a leading `<think>…</think>`, tool calls from
// `<tool_call>` blocks, as src/chat/ splits them for `kerze serve`), and the embeddings
// response. openai.js re-exports all of it; tests/openai.mjs checks it against
// tests/fixtures/openai/. Not here: the request bodies (openai.js).

/** Little-endian f32 bytes of `v` in base64. */
function base64f32(v) {
  const bytes = new Uint8Array(Float32Array.from(v).buffer);
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/** The OpenAI embeddings response for `vectors` (Float32Array or number[] each). */
export function embeddingsResponse(model, vectors, promptTokens, encodingFormat = 'float') {
  return {
    object: 'list',
    data: vectors.map((v, index) => ({
      object: 'embedding',
      index,
      embedding: encodingFormat === 'base64' ? base64f32(v) : Array.from(v),
    })),
    model,
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
  };
}

/**
 * Splits a reply that opens with `<think>…</think>` (Qwen3 and other reasoning models) into
 * reasoning and answer, as llama-server's `reasoning_content` does, also when the tags arrive
 * in pieces of a stream. `push(text)` returns { reasoning, content } for what is certain so
 * far; `end()` the rest.
 */
export class ThinkSplitter {
  // start → (think-open → think → answer-open) | answer; "-open": leading newlines dropped.
  #state = 'start';
  #held = '';

  push(text) {
    let reasoning = '';
    let content = '';
    this.#held += text;
    for (;;) {
      const s = this.#state;
      if (s === 'start') {
        const t = this.#held.replace(/^\s+/, '');
        if (t.startsWith('<think>')) {
          this.#held = t.slice('<think>'.length);
          this.#state = 'think-open';
          continue;
        }
        if ('<think>'.startsWith(t)) break; // undecided
        this.#state = 'answer';
        continue;
      }
      if (s === 'think-open' || s === 'answer-open') {
        this.#held = this.#held.replace(/^\n+/, '');
        if (!this.#held) break;
        this.#state = s === 'think-open' ? 'think' : 'answer';
        continue;
      }
      if (s === 'think') {
        const end = this.#held.indexOf('</think>');
        if (end >= 0) {
          reasoning += this.#held.slice(0, end).replace(/\n$/, '');
          this.#held = this.#held.slice(end + '</think>'.length);
          this.#state = 'answer-open';
          continue;
        }
        // Keep back what could be the start of '</think>' (and one newline before it).
        let keep = 0;
        for (let k = Math.min('</think>'.length - 1, this.#held.length); k > 0; k--) {
          if ('</think>'.startsWith(this.#held.slice(-k))) { keep = k; break; }
        }
        if (this.#held.slice(0, this.#held.length - keep).endsWith('\n')) keep += 1;
        reasoning += this.#held.slice(0, this.#held.length - keep);
        this.#held = this.#held.slice(this.#held.length - keep);
        break;
      }
      content += this.#held;
      this.#held = '';
      break;
    }
    return { reasoning, content };
  }

  end() {
    const rest = this.#held;
    this.#held = '';
    // What was held back in 'think' (a newline, a partial '</think>') is reasoning after all.
    if (this.#state === 'think') return { reasoning: rest, content: '' };
    if (this.#state === 'think-open') return { reasoning: rest.replace(/^\n+/, ''), content: '' };
    if (this.#state === 'answer-open') return { reasoning: '', content: '' };
    return { reasoning: '', content: rest };
  }
}

const CALL_OPEN = '<tool_call>';
const CALL_CLOSE = '</tool_call>';

/** The length of the longest suffix of `s` that is a proper prefix of `pat`. */
function partialSuffix(s, pat) {
  for (let k = Math.min(pat.length - 1, s.length); k > 0; k--) {
    if (pat.startsWith(s.slice(-k))) return k;
  }
  return 0;
}

/**
 * `{"name": "N", "arguments": ` (or "parameters") at the start of `s`: { name, n } (the
 * characters read), null while `s` may still become that, false when it cannot.
 */
function callHead(s) {
  let i = 0;
  const ws = () => { while (i < s.length && /\s/.test(s[i])) i += 1; };
  // true: read; null: `s` ends inside it; false: something else.
  const lit = (l) => {
    ws();
    const rest = s.slice(i);
    if (rest.startsWith(l)) { i += l.length; return true; }
    return l.startsWith(rest) ? null : false;
  };
  for (const l of ['{', '"name"', ':', '"']) {
    const r = lit(l);
    if (r !== true) return r;
  }
  const end = s.indexOf('"', i);
  if (end < 0) return null;
  const name = s.slice(i, end);
  if (name.includes('\\')) return false;
  i = end + 1;
  const comma = lit(',');
  if (comma !== true) return comma;
  ws();
  const rest = s.slice(i);
  const key = ['"arguments"', '"parameters"'].find((k) => rest.startsWith(k));
  if (key) i += key.length;
  else return ['"arguments"', '"parameters"'].some((k) => k.startsWith(rest)) ? null : false;
  const colon = lit(':');
  if (colon !== true) return colon;
  ws();
  return i === s.length ? null : { name, n: i };
}

/**
 * Splits a reply into content and tool calls as the pieces of a stream arrive (the same
 * states as src/chat/tools.rs CallSplitter): `push(text)` returns the parts certain so far
 * — { content } | { index, name } (a call begins) | { index, arguments } — and `end()` the
 * rest. Whitespace-only text between and after calls is dropped.
 */
export class CallSplitter {
  #state = 'text';
  #held = '';
  #json = null;
  calls = 0;

  #content(out, text) {
    if (!text || (this.calls > 0 && !text.trim())) return;
    const last = out[out.length - 1];
    if (last && 'content' in last) last.content += text;
    else out.push({ content: text });
  }

  #args(out, text) {
    if (!text) return;
    const index = this.calls - 1;
    const last = out[out.length - 1];
    if (last && 'arguments' in last && last.index === index) last.arguments += text;
    else out.push({ index, arguments: text });
  }

  push(text) {
    this.#held += text;
    const out = [];
    for (;;) {
      if (this.#state === 'text') {
        const at = this.#held.indexOf(CALL_OPEN);
        if (at >= 0) {
          this.#content(out, this.#held.slice(0, at));
          this.#held = this.#held.slice(at + CALL_OPEN.length);
          this.#state = 'head';
          continue;
        }
        let cut = this.#held.length - partialSuffix(this.#held, CALL_OPEN);
        if (this.calls > 0) cut = this.#held.slice(0, cut).trimEnd().length;
        this.#content(out, this.#held.slice(0, cut));
        this.#held = this.#held.slice(cut);
        break;
      }
      if (this.#state === 'head') {
        const h = callHead(this.#held);
        if (h === null) break;
        if (h === false) {
          this.#content(out, CALL_OPEN + this.#held);
          this.#held = '';
          this.#state = 'text';
          break;
        }
        this.#held = this.#held.slice(h.n);
        this.calls += 1;
        out.push({ index: this.calls - 1, name: h.name });
        this.#state = 'args';
        this.#json = { depth: 0, string: false, escape: false };
        continue;
      }
      if (this.#state === 'tail') {
        // The arguments are whole: the rest of the call (`}` and the closing tag) is skipped.
        const at = this.#held.indexOf(CALL_CLOSE);
        if (at < 0) break;
        this.#held = this.#held.slice(at + CALL_CLOSE.length);
        this.#state = 'text';
        continue;
      }
      // In the arguments: a JSON value read as it comes, so that neither a `}` nor the
      // closing tag inside a string is taken for the call's end.
      const a = this.#json;
      const begun = a.depth > 0;
      let end = -1;
      for (let i = 0; i < this.#held.length && end < 0; i++) {
        const c = this.#held[i];
        if (a.escape) a.escape = false;
        else if (c === '\\' && a.string) a.escape = true;
        else if (c === '"') a.string = !a.string;
        else if ((c === '{' || c === '[') && !a.string) a.depth += 1;
        else if ((c === '}' || c === ']') && !a.string) {
          a.depth = Math.max(0, a.depth - 1);
          if (a.depth === 0) end = i + 1;
        }
      }
      const cut = end < 0 ? this.#held.length : end;
      const emit = this.#held.slice(0, cut);
      this.#args(out, begun ? emit : emit.trimStart());
      this.#held = this.#held.slice(cut);
      if (end < 0) break;
      this.#state = 'tail';
    }
    return out;
  }

  end() {
    const held = this.#held;
    const state = this.#state;
    this.#held = '';
    this.#state = 'text';
    const out = [];
    if (state === 'text') this.#content(out, held);
    else if (state === 'head') this.#content(out, CALL_OPEN + held);
    else if (state === 'args') this.#args(out, this.#json.depth > 0 ? held : held.trimStart());
    return out;
  }
}

/** The id of a reply's call `index`: `call_<the reply id's tail>_<index>`. */
function callId(meta, index) {
  return `call_${meta.id.split('-').pop()}_${index}`;
}

const FINISH = { stop: 'stop', length: 'length', context_full: 'length' };

/** `finish_reason` as OpenAI names it (a full context window ends with `length`). */
export function finishReason(r) {
  return FINISH[r] ?? 'stop';
}

/** The engine's usage ({ promptTokens, prefillTokens, completionTokens }) in OpenAI's shape. */
export function usageOf(u) {
  return {
    prompt_tokens: u.promptTokens,
    completion_tokens: u.completionTokens,
    total_tokens: u.promptTokens + u.completionTokens,
    prompt_tokens_details: { cached_tokens: Math.max(0, u.promptTokens - (u.prefillTokens ?? u.promptTokens)) },
  };
}

let completionCounter = 0;
/** A fresh `chatcmpl-…` id. */
export function completionId() {
  const a = new Uint32Array(2);
  crypto.getRandomValues(a);
  completionCounter += 1;
  return `chatcmpl-${a[0].toString(16)}${a[1].toString(16)}${completionCounter}`;
}

/**
 * The whole reply ({ id, created, model } in `meta`) as a `chat.completion`; with
 * `toolCalls`, the calls in it as `tool_calls`.
 */
export function chatCompletion(meta, text, finish, usage, toolCalls = false) {
  const split = new ThinkSplitter();
  const a = split.push(text);
  const b = split.end();
  const reasoning = a.reasoning + b.reasoning;
  let content = a.content + b.content;
  const calls = [];
  if (toolCalls) {
    const s = new CallSplitter();
    content = '';
    for (const p of [...s.push(a.content + b.content), ...s.end()]) {
      if ('content' in p) content += p.content;
      else if ('name' in p) calls.push({ id: callId(meta, p.index), type: 'function', function: { name: p.name, arguments: '' } });
      else calls[p.index].function.arguments += p.arguments;
    }
    if (!content && calls.length) content = null;
  }
  return {
    id: meta.id, object: 'chat.completion', created: meta.created, model: meta.model,
    choices: [{
      index: 0,
      message: {
        role: 'assistant',
        content,
        ...(reasoning ? { reasoning_content: reasoning } : {}),
        ...(calls.length ? { tool_calls: calls } : {}),
      },
      finish_reason: calls.length && finish === 'stop' ? 'tool_calls' : finishReason(finish),
      logprobs: null,
      // kerze: with a `choices` constraint, each choice's log-likelihood and probability.
      ...(usage?.choices ? { choice_scores: usage.choices } : {}),
    }],
    usage: usageOf(usage),
  };
}

/**
 * The chunks of a streamed chat completion: `start()` the role chunk, `push(text)` one per
 * piece of reasoning or answer, `finish(reason, usage)` the finish chunk and, with
 * `includeUsage`, a last one with `usage` and no choices.
 */
export class ChatStream {
  #meta;
  #includeUsage;
  #split = new ThinkSplitter();
  #calls = null;

  /** `toolCalls`: the reply may hold tool calls, streamed as `tool_calls` deltas. */
  constructor(meta, includeUsage, toolCalls = false) {
    this.#meta = meta;
    this.#includeUsage = includeUsage;
    if (toolCalls) this.#calls = new CallSplitter();
  }

  #frame(delta, finish, usage) {
    const m = this.#meta;
    return {
      id: m.id, object: 'chat.completion.chunk', created: m.created, model: m.model,
      choices: delta ? [{ index: 0, delta, finish_reason: finish, logprobs: null }] : [],
      ...(usage ? { usage } : {}),
    };
  }

  #deltas({ reasoning, content }, end = false) {
    const parts = this.#calls ? [...this.#calls.push(content), ...(end ? this.#calls.end() : [])] : [{ content }];
    return [
      ...(reasoning ? [this.#frame({ reasoning_content: reasoning }, null)] : []),
      ...parts.flatMap((p) => {
        if ('content' in p) return p.content ? [this.#frame({ content: p.content }, null)] : [];
        const call = 'name' in p
          ? { index: p.index, id: callId(this.#meta, p.index), type: 'function', function: { name: p.name, arguments: '' } }
          : { index: p.index, function: { arguments: p.arguments } };
        return [this.#frame({ tool_calls: [call] }, null)];
      }),
    ];
  }

  start() {
    return this.#frame({ role: 'assistant', content: '' }, null);
  }

  push(text) {
    return this.#deltas(this.#split.push(text));
  }

  finish(reason, usage) {
    const parts = this.#deltas(this.#split.end(), true);
    const called = (this.#calls?.calls ?? 0) > 0 && reason === 'stop';
    const end = this.#frame({}, called ? 'tool_calls' : finishReason(reason));
    if (usage?.choices) end.choices[0].choice_scores = usage.choices;
    return [
      ...parts,
      end,
      ...(this.#includeUsage ? [this.#frame(null, null, usageOf(usage))] : []),
    ];
  }
}
