// The OpenAI chat completions shapes: a request body → the engine's options, and a
// generation → the response object or the stream's chunks (those in openai-reply.js,
// re-exported here). The same shapes as the Rust side (src/openai/, which `kerze serve`
// speaks through); tests/openai.mjs and tests/openai.rs check both against the same cases in
// tests/fixtures/openai/. Here: the request bodies of chat completions and embeddings checked
// and mapped.

import { KerzeError } from './protocol.js';

export {
  embeddingsResponse, ThinkSplitter, CallSplitter, finishReason, usageOf, completionId, chatCompletion, ChatStream,
} from './openai-reply.js';

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
