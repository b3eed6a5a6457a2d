// The OpenAI chat completions shapes: a request body → the engine's options, and a
// generation → the response object or the stream's chunks. The same shapes as the Rust side
// (src/openai/, which `kerze serve` speaks through); tests/openai.mjs and tests/openai.rs
// check both against the same cases in tests/fixtures/openai/.

import { KerzeError } from './protocol.js';

const WHAT = 'chat.completions.create';

const KNOWN = new Set(['messages', 'model', 'stream', 'stream_options', 'max_tokens',
  'max_completion_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'seed', 'stop',
  'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'n', 'user', 'logprobs',
  'enable_thinking', 'chat_template_kwargs', 'continue_final_message', 'response_format',
  'tools', 'tool_choice', 'parallel_tool_calls']);

const EMBED = 'embeddings.create';
const EMBED_KNOWN = new Set(['input', 'model', 'encoding_format', 'dimensions', 'user']);
/** The most texts one embeddings request may give (OpenAI's limit). */
const MAX_EMBEDDING_INPUTS = 2048;

/**
 * An OpenAI embeddings body → { input: string[], encodingFormat: 'float' | 'base64',
 * dimensions?, model? } (an empty string embeds as [CLS] [SEP]; token ids are refused).
 */
export function embeddingsOptions(body) {
  if (!body || typeof body !== 'object' || Array.isArray(body)) {
    throw bad(`${EMBED}: the body must be a JSON object`);
  }
  for (const k of Object.keys(body)) {
    if (!EMBED_KNOWN.has(k)) throw bad(`${EMBED}: '${k}' is not supported`);
  }
  const ids = `${EMBED}: input must be a string or a list of strings (token ids are not supported)`;
  let input;
  if (typeof body.input === 'string') input = [body.input];
  else if (Array.isArray(body.input)) {
    if (body.input.length === 0) throw bad(`${EMBED}: input is an empty list`);
    if (!body.input.every((t) => typeof t === 'string')) throw bad(ids);
    input = body.input;
  } else if (!given(body.input)) throw bad(`${EMBED} needs an input`);
  else throw bad(ids);
  if (input.length > MAX_EMBEDDING_INPUTS) {
    throw bad(`${EMBED}: at most ${MAX_EMBEDDING_INPUTS} inputs per request (${input.length} given)`);
  }
  const f = body.encoding_format ?? 'float';
  if (typeof f !== 'string') throw bad(`${EMBED}: encoding_format must be a string`);
  if (f !== 'float' && f !== 'base64') throw bad(`${EMBED}: encoding_format '${f}' is not one of float, base64`);
  if (given(body.user) && typeof body.user !== 'string') throw bad(`${EMBED}: user must be a string`);
  if (given(body.model) && typeof body.model !== 'string') throw bad(`${EMBED}: model must be a string`);
  if (given(body.dimensions) && (!Number.isSafeInteger(body.dimensions) || body.dimensions < 0)) {
    throw bad(`${EMBED}: dimensions must be a non-negative integer`);
  }
  return { input, encodingFormat: f, dimensions: body.dimensions ?? undefined, model: body.model ?? undefined };
}

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

/** The roles a message may have (OpenAI's; the model's template decides what each becomes). */
const ROLES = ['system', 'developer', 'user', 'assistant', 'tool'];

/** The most stop strings a request may give, and their longest length in bytes. */
const MAX_STOP = 16;
const MAX_STOP_BYTES = 1024;

const bad = (message) => new KerzeError('InvalidArgumentError', message);
const given = (v) => v !== undefined && v !== null;

function number(body, k) {
  const v = body[k];
  if (!given(v)) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v)) throw bad(`${WHAT}: ${k} must be a number`);
  return v;
}

function count(body, k) {
  const v = body[k];
  if (!given(v)) return undefined;
  if (!Number.isSafeInteger(v) || v < 0) throw bad(`${WHAT}: ${k} must be a non-negative integer`);
  return v;
}

function stopStrings(v) {
  if (!given(v)) return undefined;
  const list = typeof v === 'string' ? [v] : v;
  if (!Array.isArray(list) || !list.every((s) => typeof s === 'string')) {
    throw bad(`${WHAT}: stop must be a string or a list of strings`);
  }
  if (list.length > MAX_STOP) throw bad(`${WHAT}: stop takes at most ${MAX_STOP} strings`);
  const bytes = (s) => new TextEncoder().encode(s).length;
  if (list.some((s) => s.length === 0 || bytes(s) > MAX_STOP_BYTES)) {
    throw bad(`${WHAT}: a stop string must have 1 to ${MAX_STOP_BYTES} bytes`);
  }
  return list;
}

/**
 * OpenAI chat parameters → the engine's generate options ({ maxTokens, temperature, … }; a
 * field the request leaves out stays undefined: the engine's default). Ranges (temperature
 * ≥ 0, …) are the engine's to check.
 */
export function chatOptions(body) {
  if (!body || typeof body !== 'object' || Array.isArray(body)) {
    throw bad(`${WHAT}: the body must be a JSON object`);
  }
  for (const k of Object.keys(body)) {
    if (!KNOWN.has(k) && k !== 'signal') throw bad(`${WHAT}: '${k}' is not supported`);
  }
  if (!Array.isArray(body.messages) || body.messages.length === 0) {
    throw bad(`${WHAT} needs a non-empty messages array`);
  }
  body.messages.forEach((m, i) => {
    if (!m || typeof m !== 'object' || !ROLES.includes(m.role)) {
      throw bad(`${WHAT}: messages[${i}].role '${m?.role}' is not one of ${ROLES.join(', ')}`);
    }
  });
  if (given(body.logprobs) && body.logprobs !== false) {
    throw bad(`${WHAT}: logprobs is not supported (only false)`);
  }
  const n = count(body, 'n');
  if (n !== undefined && n !== 1) throw bad(`${WHAT}: only n = 1 is supported`);
  if (given(body.user) && typeof body.user !== 'string') throw bad(`${WHAT}: user must be a string`);
  if (given(body.stream) && typeof body.stream !== 'boolean') throw bad(`${WHAT}: stream must be true or false`);
  streamOptions(body);
  const maxCompletion = count(body, 'max_completion_tokens');
  const format = responseFormat(body.response_format);
  const tools = toolsOf(body);
  if (tools && tools.choice !== 'none' && format !== undefined) {
    throw bad(`${WHAT}: response_format and tool calls cannot be combined (give tool_choice 'none', or leave out response_format)`);
  }
  return {
    maxTokens: maxCompletion ?? count(body, 'max_tokens'),
    temperature: number(body, 'temperature'),
    topP: number(body, 'top_p'),
    topK: count(body, 'top_k'),
    minP: number(body, 'min_p'),
    seed: count(body, 'seed'),
    presencePenalty: number(body, 'presence_penalty'),
    frequencyPenalty: number(body, 'frequency_penalty'),
    repetitionPenalty: number(body, 'repetition_penalty'),
    stop: stopStrings(body.stop),
    constraint: tools && tools.choice !== 'none' ? { tools } : format,
  };
}

/** The most tools a request may give. */
const MAX_TOOLS = 128;

/**
 * `tools`, `tool_choice` and `parallel_tool_calls` of a chat request as the engine's tool
 * constraint ({ tools, choice, parallel }; src/chat/tools.rs reads and checks it the same
 * way), or undefined without tools.
 */
export function toolsOf(body) {
  const list = body.tools;
  if (given(list) && !Array.isArray(list)) throw bad(`${WHAT}: tools must be an array`);
  let choice;
  const tc = body.tool_choice;
  if (typeof tc === 'string') {
    if (!['none', 'auto', 'required'].includes(tc)) throw bad(`${WHAT}: tool_choice '${tc}' is not one of none, auto, required`);
    choice = tc;
  } else if (tc && typeof tc === 'object' && !Array.isArray(tc)) {
    const name = tc.type === 'function' ? tc.function?.name : undefined;
    if (typeof name !== 'string') throw bad(`${WHAT}: tool_choice must be none, auto, required or {type: 'function', function: {name}}`);
    choice = { function: name };
  } else if (given(tc)) {
    throw bad(`${WHAT}: tool_choice must be a string or an object`);
  }
  const p = body.parallel_tool_calls;
  if (given(p) && typeof p !== 'boolean') throw bad(`${WHAT}: parallel_tool_calls must be true or false`);
  if (!given(list)) {
    if (choice !== undefined) throw bad(`${WHAT}: tool_choice needs tools`);
    return undefined;
  }
  const names = checkTools(list);
  if (choice?.function !== undefined && !names.includes(choice.function)) {
    throw bad(`${WHAT}: tool_choice names '${choice.function}', which is not one of the tools`);
  }
  return { tools: list, choice: choice ?? 'auto', parallel: p ?? true };
}

/** The names of a request's tools, each checked as src/chat/tools.rs `functions` does. */
function checkTools(tools) {
  if (tools.length === 0 || tools.length > MAX_TOOLS) {
    throw bad(`${WHAT}: tools: give 1 to ${MAX_TOOLS} tools, not ${tools.length}`);
  }
  const isObj = (v) => v && typeof v === 'object' && !Array.isArray(v);
  const names = [];
  tools.forEach((t, i) => {
    const at = `${WHAT}: tools[${i}]`;
    if (!isObj(t)) throw bad(`${at} must be an object`);
    const k = Object.keys(t).find((x) => !['type', 'function'].includes(x));
    if (k !== undefined) throw bad(`${at}.${k} is not supported`);
    if (t.type !== 'function') throw bad(`${at}.type must be 'function'`);
    const f = t.function;
    if (!isObj(f)) throw bad(`${at}.function must be an object`);
    const fk = Object.keys(f).find((x) => !['name', 'description', 'parameters', 'strict'].includes(x));
    if (fk !== undefined) throw bad(`${at}.function.${fk} is not supported`);
    if (typeof f.name !== 'string') throw bad(`${at}.function.name must be a string`);
    if (!/^[A-Za-z0-9_.-]{1,64}$/.test(f.name)) {
      throw bad(`${at}.function.name '${f.name}' must be 1 to 64 letters, digits, '_', '-' or '.'`);
    }
    if (names.includes(f.name)) throw bad(`${at}.function.name '${f.name}' is given twice`);
    if (given(f.description) && typeof f.description !== 'string') throw bad(`${at}.function.description must be a string`);
    if (given(f.parameters) && !isObj(f.parameters)) throw bad(`${at}.function.parameters must be a JSON schema (an object)`);
    if (given(f.strict) && typeof f.strict !== 'boolean') throw bad(`${at}.function.strict must be true or false`);
    names.push(f.name);
  });
  return names;
}

/** Whether a chat request's reply may hold tool calls (tools given, tool_choice not 'none'). */
export function hasToolCalls(body) {
  return given(body?.tools) && body.tool_choice !== 'none';
}

/**
 * `response_format` as the engine's constraint (src/openai/fields.rs response_format reads it the
 * same way): OpenAI's `{ type: 'text' | 'json_object' }` and `{ type: 'json_schema',
 * json_schema: { name, schema, strict } }`; WebLLM's `{ type: 'json_object', schema }` (an
 * object or a JSON string) and `{ type: 'grammar', grammar }` (Lark); kerze's `{ type:
 * 'regex', regex }` and `{ type: 'choices', choices }`.
 */
export function responseFormat(v) {
  if (!given(v)) return undefined;
  const f = `${WHAT}: response_format`;
  if (typeof v !== 'object' || Array.isArray(v)) throw bad(`${f} must be an object`);
  const ty = v.type;
  if (typeof ty !== 'string') throw bad(`${f}.type must be a string`);
  const allow = (keys) => {
    const k = Object.keys(v).find((x) => x !== 'type' && !keys.includes(x));
    if (k !== undefined) throw bad(`${f}.${k} is not supported with type '${ty}'`);
  };
  const schema = (s, at) => {
    let out = s;
    if (typeof s === 'string') {
      try {
        out = JSON.parse(s);
      } catch (e) {
        throw bad(`${f}.${at} is not JSON: ${e.message}`);
      }
    }
    if (!out || typeof out !== 'object' || Array.isArray(out)) throw bad(`${f}.${at} must be a JSON schema (an object)`);
    return out;
  };
  const text = (k) => {
    if (typeof v[k] !== 'string') throw bad(`${f}.${k} must be a string`);
    return v[k];
  };
  switch (ty) {
    case 'text':
      allow([]);
      return undefined;
    case 'json_object':
      allow(['schema']);
      return given(v.schema) ? { jsonSchema: schema(v.schema, 'schema') } : 'jsonObject';
    case 'json_schema': {
      allow(['json_schema']);
      const js = v.json_schema;
      if (!js || typeof js !== 'object' || Array.isArray(js)) throw bad(`${f}.json_schema must be an object`);
      const k = Object.keys(js).find((x) => !['name', 'schema', 'strict', 'description'].includes(x));
      if (k !== undefined) throw bad(`${f}.json_schema.${k} is not supported`);
      if (!('schema' in js)) throw bad(`${f}.json_schema.schema is missing`);
      return { jsonSchema: schema(js.schema, 'json_schema.schema') };
    }
    case 'grammar':
      allow(['grammar']);
      return { grammar: text('grammar') };
    case 'regex':
      allow(['regex']);
      return { regex: text('regex') };
    case 'choices':
      allow(['choices']);
      if (!Array.isArray(v.choices) || !v.choices.every((c) => typeof c === 'string')) throw bad(`${f}.choices must be an array of strings`);
      return { choices: v.choices };
    default:
      throw bad(`${f}.type '${ty}' is not supported: text, json_object, json_schema, grammar, regex or choices`);
  }
}

/** `stream_options.include_usage` of a request (checked). */
export function streamOptions(body) {
  const o = body.stream_options;
  if (!given(o)) return { includeUsage: false };
  if (typeof o !== 'object' || Array.isArray(o)) throw bad(`${WHAT}: stream_options must be an object`);
  for (const k of Object.keys(o)) {
    if (k !== 'include_usage') throw bad(`${WHAT}: stream_options.${k} is not supported`);
  }
  if (given(o.include_usage) && typeof o.include_usage !== 'boolean') {
    throw bad(`${WHAT}: stream_options.include_usage must be true or false`);
  }
  return { includeUsage: o.include_usage === true };
}

/** The template options of a chat request: `enable_thinking` (Qwen3) at the top level or in
 * `chat_template_kwargs`, as llama-server and vLLM take it. */
export function chatTemplateOptions(body) {
  const kw = body.chat_template_kwargs ?? {};
  if (typeof kw !== 'object' || Array.isArray(kw)) {
    throw bad('chat_template_kwargs must be an object');
  }
  for (const k of Object.keys(kw)) {
    if (k !== 'enable_thinking') {
      throw bad(`chat_template_kwargs.${k} is not supported (enable_thinking is)`);
    }
  }
  const thinking = body.enable_thinking ?? kw.enable_thinking;
  const tools = Array.isArray(body.tools) ? { tools: body.tools } : {};
  if (thinking != null && typeof thinking !== 'boolean') {
    throw bad('enable_thinking must be true or false');
  }
  const cont = body.continue_final_message;
  if (cont != null && typeof cont !== 'boolean') {
    throw bad('continue_final_message must be true or false');
  }
  return { ...(thinking == null ? {} : { enableThinking: thinking }), ...(cont ? { continueFinalMessage: true } : {}), ...tools };
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
