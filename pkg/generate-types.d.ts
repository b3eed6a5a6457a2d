// Types of generation: generate()'s options, its pieces and result, and the route tag every
// answer carries. Re-exported by index.d.ts (import them from 'kerze'). Not here: the engine's
// and the fallback's options (index.d.ts), the OpenAI shapes (openai-types.d.ts).

/** Where an answer came from and why. */
export interface RouteTag {
  route: 'local' | 'cloud';
  /** e.g. 'on this device (cpu-simd)', 'unsupported: …', 'loading: …', 'context: …', 'error: …', 'slow: …'. */
  reason: string;
  /** The answer came from the response cache (no forward pass, no request). */
  cached?: boolean;
}

export interface GenerateOptions {
  maxTokens?: number;
  /** 0: greedy. */
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  repetitionPenalty?: number;
  presencePenalty?: number;
  /** Subtracted × the count of each recent token (0: off). */
  frequencyPenalty?: number;
  penaltyLastN?: number;
  /** Same seed, prompt and options → same text. Default: random. */
  seed?: number;
  /** Generation ends before any of these strings. */
  stop?: string | string[];
  /** Generation ends at these token ids (default: the model's end-of-turn/sequence). */
  stopTokens?: number[];
  /**
   * Constrained output (one of these): JSON valid against a JSON Schema, a whole match of a
   * regex, a sentence of a Lark grammar, or exactly one of the choices. Generation ends when
   * the output is complete (`finishReason: 'stop'`); cut off by `maxTokens` it says 'length'.
   * A schema or grammar that does not compile throws InvalidArgumentError before any token.
   */
  schema?: object;
  regex?: string | RegExp;
  grammar?: string;
  choices?: string[];
  /** Free whitespace between JSON tokens under a JSON constraint (default: compact JSON). */
  jsonWhitespace?: boolean;
  /** Stops the generation within one step; the engine stays usable. */
  signal?: AbortSignal;
  /**
   * Where it runs: 'auto' (the default: locally, or through the fallback endpoint where its
   * `when` covers the case, also midway), 'local' or 'cloud'. A plain prompt goes to the
   * endpoint's `/completions`; token ids stay local.
   */
  route?: 'auto' | 'local' | 'cloud';
  /** false: neither read nor store this request in the response cache or the prefix cache. */
  cache?: boolean;
  /**
   * The start of a string prompt that repeats (a few-shot block), or for a prompt of ids how
   * many of its first ids do: kept in the prefix cache.
   */
  prefix?: string | number;
}

/** One streamed piece: whole UTF-8 characters. */
export interface Chunk {
  text: string;
  /** Absent on pieces from the fallback endpoint. */
  tokenId?: number;
  /** Where this piece came from and why. */
  kerze: RouteTag;
}

export interface Usage {
  promptTokens: number;
  /** Prompt tokens computed (the rest came from the KV cache). */
  prefillTokens: number;
  completionTokens: number;
  prefillMs: number;
  decodeMs: number;
  prefillTokensPerS: number;
  decodeTokensPerS: number;
  /** Tokens run again after the engine moved from the GPU to the CPU (the device was lost). */
  replayedTokens: number;
  replayMs: number;
  /** Milliseconds the output constraint took (its masks and commits; 0 without one). */
  maskMs: number;
  /** Generated tokens that were not sampled: forced by the constraint or a picked choice. */
  forcedTokens: number;
  /** Milliseconds the constraint took to compile (the first one on a model builds its token trie). */
  compileMs: number;
}

export type FinishReason = 'stop' | 'length' | 'context_full';

export interface GenerateResult {
  finishReason: FinishReason | null;
  usage: Usage;
  /** The generated ids (empty for an answer from the fallback endpoint). */
  ids: number[];
  /** The route of the end of the answer (the fallback's when it took over midway). */
  kerze: RouteTag;
  /**
   * The prompt's shared prefix (see `prefixCache`): its tokens and where they came from — the
   * engine's KV cache, the store (restored, not computed) or computed here (and kept).
   */
  prefix?: { tokens: number; from: 'session' | 'storage' | 'computed' };
  /**
   * With `choices`: each choice's log-likelihood after the prompt (summed over its tokens) and
   * its probability among the choices, in the order given; the answer is the one the sampler
   * picked from them (greedy: the likeliest).
   */
  choices?: Array<{ choice: string; logprob: number; prob: number }>;
}

export interface Completion extends GenerateResult {
  text: string;
}

export type Prompt = string | number[] | Uint32Array;
