// The OpenAI chat completions shapes: a request body → the engine's options, and a
// generation → the response object or the stream's chunks. The same shapes as the Rust side
// (src/openai.rs, which `kerze serve` speaks through); tests/openai.mjs and tests/openai.rs
// check both against the same cases in tests/fixtures/openai/.

import { KerzeError } from './protocol.js';

const WHAT = 'chat.completions.create';

const KNOWN = new Set(['messages', 'model', 'stream', 'stream_options', 'max_tokens',
  'max_completion_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'seed', 'stop',
  'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'n', 'user', 'logprobs',
  'enable_thinking', 'chat_template_kwargs', 'continue_final_message', 'response_format']);

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
    constraint: responseFormat(body.response_format),
  };
}

/**
 * `response_format` as the engine's constraint (src/openai.rs response_format reads it the
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
  if (thinking != null && typeof thinking !== 'boolean') {
    throw bad('enable_thinking must be true or false');
  }
  const cont = body.continue_final_message;
  if (cont != null && typeof cont !== 'boolean') {
    throw bad('continue_final_message must be true or false');
  }
  return { ...(thinking == null ? {} : { enableThinking: thinking }), ...(cont ? { continueFinalMessage: true } : {}) };
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

/** The whole reply ({ id, created, model } in `meta`) as a `chat.completion`. */
export function chatCompletion(meta, text, finish, usage) {
  const split = new ThinkSplitter();
  const a = split.push(text);
  const b = split.end();
  const reasoning = a.reasoning + b.reasoning;
  return {
    id: meta.id, object: 'chat.completion', created: meta.created, model: meta.model,
    choices: [{
      index: 0,
      message: {
        role: 'assistant',
        content: a.content + b.content,
        ...(reasoning ? { reasoning_content: reasoning } : {}),
      },
      finish_reason: finishReason(finish),
      logprobs: null,
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

  constructor(meta, includeUsage) {
    this.#meta = meta;
    this.#includeUsage = includeUsage;
  }

  #frame(delta, finish, usage) {
    const m = this.#meta;
    return {
      id: m.id, object: 'chat.completion.chunk', created: m.created, model: m.model,
      choices: delta ? [{ index: 0, delta, finish_reason: finish, logprobs: null }] : [],
      ...(usage ? { usage } : {}),
    };
  }

  #deltas({ reasoning, content }) {
    return [
      ...(reasoning ? [this.#frame({ reasoning_content: reasoning }, null)] : []),
      ...(content ? [this.#frame({ content }, null)] : []),
    ];
  }

  start() {
    return this.#frame({ role: 'assistant', content: '' }, null);
  }

  push(text) {
    return this.#deltas(this.#split.push(text));
  }

  finish(reason, usage) {
    return [
      ...this.#deltas(this.#split.end()),
      this.#frame({}, finishReason(reason)),
      ...(this.#includeUsage ? [this.#frame(null, null, usageOf(usage))] : []),
    ];
  }
}
