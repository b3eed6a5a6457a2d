// Options checked before anything runs: createEngine's (its `fallback` apart: route.js
// fallbackOptions), generate()'s (converted to the engine's names and constraint), the prompt
// and its prefix-cache hints, classify()'s. Pure: throws InvalidArgumentError, never starts
// or asks anything. Not here: the OpenAI request bodies (openai.js), where a request goes
// (route-policy.js).

import { KerzeError } from './protocol.js';
import { RESPONSE_DEFAULTS, PREFIX_DEFAULTS } from './cache.js';
import { checkDevice } from './model.js';

/** createEngine's `simd`: which wasm twin runs the CPU engine (see loadWasm in wasm-load.js). */
const SIMD_CHOICES = ['auto', 'relaxed', 'simd128'];

/**
 * createEngine's options checked, in this order (its `fallback` apart: route.js
 * fallbackOptions). Returns the response and prefix caches' limits, `{ responses, prefixes }`
 * (each null: off).
 */
/** `nCtx` (createEngine's, probe's): absent, or a positive integer. */
export function checkNCtx(nCtx) {
  if (nCtx != null && !(Number.isSafeInteger(nCtx) && nCtx > 0)) {
    throw new KerzeError('InvalidArgumentError', 'nCtx must be a positive integer');
  }
}

export function checkCreateOptions({ device, nCtx, onRoute, responseCache, prefixCache, prepareConstraints, simd }) {
  if (typeof prepareConstraints !== 'boolean') throw new KerzeError('InvalidArgumentError', 'prepareConstraints must be true or false');
  if (!SIMD_CHOICES.includes(simd)) {
    throw new KerzeError('InvalidArgumentError', `simd must be one of ${SIMD_CHOICES.join(', ')}, got '${simd}'`);
  }
  const responses = limitsOf('responseCache', responseCache, RESPONSE_DEFAULTS);
  const prefixes = limitsOf('prefixCache', prefixCache, PREFIX_DEFAULTS);
  checkDevice(device);
  checkNCtx(nCtx);
  if (onRoute != null && typeof onRoute !== 'function') throw new KerzeError('InvalidArgumentError', 'onRoute must be a function');
  return { responses, prefixes };
}

/** Option names of generate(), as JS spells them → as the engine spells them. */
const GENERATE_OPTIONS = {
  maxTokens: 'maxTokens', temperature: 'temperature', topK: 'topK', topP: 'topP', minP: 'minP',
  repetitionPenalty: 'repetitionPenalty', presencePenalty: 'presencePenalty', frequencyPenalty: 'frequencyPenalty',
  penaltyLastN: 'penaltyLastN', seed: 'seed', stop: 'stop', stopTokens: 'stopTokens',
  constraint: 'constraint', jsonWhitespace: 'jsonWhitespace',
};

/** The shorthands of a constraint in generate()'s options → the engine's constraint. */
const CONSTRAINTS = {
  schema: (v) => {
    if (!v || typeof v !== 'object' || Array.isArray(v)) throw new KerzeError('InvalidArgumentError', 'schema must be a JSON schema (an object)');
    return { jsonSchema: v };
  },
  regex: (v) => {
    if (v instanceof RegExp) {
      if (v.flags.replace(/[uv]/g, '')) throw new KerzeError('InvalidArgumentError', `regex: the flags '${v.flags}' are not supported (the match is of the whole output)`);
      return { regex: v.source };
    }
    if (typeof v !== 'string') throw new KerzeError('InvalidArgumentError', 'regex must be a string or a RegExp');
    return { regex: v };
  },
  grammar: (v) => {
    if (typeof v !== 'string') throw new KerzeError('InvalidArgumentError', 'grammar must be a string (a Lark grammar)');
    return { grammar: v };
  },
  choices: (v) => {
    if (!Array.isArray(v) || !v.every((c) => typeof c === 'string')) throw new KerzeError('InvalidArgumentError', 'choices must be an array of strings');
    return { choices: v };
  },
};

/** Generate options checked and converted for the engine (JSON). */
export function engineOptions(options = {}) {
  const out = {};
  for (const [k, v] of Object.entries(options)) {
    if (k === 'signal' || v === undefined) continue;
    if (k in CONSTRAINTS) {
      if (out.constraint !== undefined) {
        throw new KerzeError('InvalidArgumentError', `one constraint per request: ${Object.keys(CONSTRAINTS).join(', ')}`);
      }
      out.constraint = CONSTRAINTS[k](v);
      continue;
    }
    if (!(k in GENERATE_OPTIONS)) {
      throw new KerzeError('InvalidArgumentError',
        `unknown generate option '${k}': known are ${[...Object.keys(GENERATE_OPTIONS), ...Object.keys(CONSTRAINTS)].join(', ')}, signal`);
    }
    out[GENERATE_OPTIONS[k]] = v;
  }
  if (typeof out.stop === 'string') out.stop = [out.stop];
  if (out.seed === undefined) out.seed = randomSeed();
  for (const k of ['maxTokens', 'topK', 'penaltyLastN', 'seed']) {
    if (k in out && !(Number.isSafeInteger(out[k]) && out[k] >= 0)) {
      throw new KerzeError('InvalidArgumentError', `${k} must be a non-negative integer, got ${out[k]}`);
    }
  }
  for (const k of ['temperature', 'topP', 'minP', 'repetitionPenalty', 'presencePenalty', 'frequencyPenalty']) {
    if (k in out && !(typeof out[k] === 'number' && Number.isFinite(out[k]))) {
      throw new KerzeError('InvalidArgumentError', `${k} must be a finite number, got ${out[k]}`);
    }
  }
  return out;
}

function randomSeed() {
  const a = new Uint32Array(1);
  crypto.getRandomValues(a);
  return a[0];
}

/** Whether options (engine names, as given) make the answer deterministic: greedy or seeded. */
export function deterministic(o) {
  return o.temperature === 0 || Number.isSafeInteger(o.seed);
}

/** A cache's limits from its option: false (off), true/undefined (defaults) or some of them. */
function limitsOf(name, o, defaults) {
  if (o === false) return null;
  if (o == null || o === true) return { ...defaults };
  const known = Object.keys(defaults).join(', ');
  if (typeof o !== 'object' || Array.isArray(o)) throw new KerzeError('InvalidArgumentError', `${name} must be false or { ${known} }`);
  for (const k of Object.keys(o)) {
    if (!(k in defaults)) throw new KerzeError('InvalidArgumentError', `${name}: unknown option '${k}': known are ${known}`);
    if (!(Number.isSafeInteger(o[k]) && o[k] > 0)) throw new KerzeError('InvalidArgumentError', `${name}.${k} must be a positive integer`);
  }
  return { ...defaults, ...o };
}

/**
 * `input` with the prefix cache's hints: `cache: false` keeps its prompt out of it (nothing
 * read or saved); `prefix` is the start of a text prompt that repeats (a few-shot block), or
 * for a prompt of ids, how many of its first ids do.
 */
export function withCaching(input, cache, prefix) {
  const out = { ...input };
  if (cache === false) out.prefixCache = false;
  if (prefix == null) return out;
  if (typeof prefix === 'string' && typeof input.prompt === 'string') {
    if (!input.prompt.startsWith(prefix)) throw new KerzeError('InvalidArgumentError', 'prefix: the prompt does not start with it');
    out.prefixText = prefix;
  } else if (Number.isSafeInteger(prefix) && prefix >= 0 && input.ids) {
    out.prefixTokens = prefix;
  } else {
    throw new KerzeError('InvalidArgumentError', 'prefix must be the start of a string prompt, or a number of tokens of an ids prompt');
  }
  return out;
}

/** generate()'s prompt as the engine's input: `{ prompt }` (text) or `{ ids }`. */
export function promptInput(prompt) {
  if (typeof prompt === 'string') return { prompt };
  if (Array.isArray(prompt) && prompt.every((x) => Number.isInteger(x) && x >= 0 && x < 2 ** 32)) return { ids: prompt };
  if (prompt instanceof Uint32Array) return { ids: Array.from(prompt) };
  throw new KerzeError('InvalidArgumentError', 'the prompt must be a string (or an array of token ids)');
}

/** Options of classify besides labels (src/classify.rs ClassifyOptions). */
const CLASSIFY_OPTIONS = new Set(['method', 'temperature', 'labelTemplate', 'prompt', 'calibrate']);

/** `texts` of embed() or classify() (`what`): a string or a non-empty array of strings, as a list. */
export function textList(what, texts) {
  const list = typeof texts === 'string' ? [texts] : texts;
  if (!Array.isArray(list) || list.length === 0 || !list.every((t) => typeof t === 'string')) {
    throw new KerzeError('InvalidArgumentError', `${what}: texts must be a string or a non-empty array of strings`);
  }
  return list;
}

/**
 * classify()'s arguments checked, in this order: its options besides `labels`, the texts, the
 * labels. Returns `{ one, list }`: whether one text was given (not a list), and the texts.
 */
export function classifyArgs(texts, labels, options) {
  for (const k of Object.keys(options)) {
    if (!CLASSIFY_OPTIONS.has(k)) {
      throw new KerzeError('InvalidArgumentError',
        `classify: unknown option '${k}': known are labels, ${[...CLASSIFY_OPTIONS].join(', ')}`);
    }
  }
  const one = typeof texts === 'string';
  const list = textList('classify', texts);
  const isNames = Array.isArray(labels);
  const isExamples = labels && typeof labels === 'object' && !isNames
    && Object.values(labels).every((v) => Array.isArray(v) || typeof v === 'string');
  // No labels: a sequence-classification model's own (the engine says when it has none).
  if (labels != null && !isNames && !isExamples) {
    throw new KerzeError('InvalidArgumentError',
      'classify: labels must be an array of names or an object label → example texts (or left out for a classification model\'s own)');
  }
  return { one, list };
}
