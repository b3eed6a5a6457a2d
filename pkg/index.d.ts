// Types of the kerze package (checked with `tsc --noEmit` by `make test`). Here: errors, the
// catalog, models, createEngine's options, the engine info, the device check, the model cache
// and the Engine; the types of generation, of the OpenAI-shaped APIs and of the analysis
// methods are in generate-types.d.ts, openai-types.d.ts and analysis-types.d.ts, exported from
// here under the same names.

import type {
  RouteTag, GenerateOptions, Chunk, Usage, FinishReason, GenerateResult, Completion, Prompt,
} from './generate-types.js';
import type {
  ChatMessage, ChatTool, ChatToolCall, ChatToolCallDelta, ChatCompletionCreateParams, ChatCompletionUsage,
  ChatCompletion, ChatCompletionChunk, RequestOptions, ChatCompletions, EmbeddingsCreateParams, EmbeddingsResponse,
} from './openai-types.js';
import type {
  EmbedOptions, ClassifyOptions, LabelScore, ClassifyUsage, Classified, SearchHit, IndexOptions, SearchIndex,
} from './analysis-types.js';

export type {
  RouteTag, GenerateOptions, Chunk, Usage, FinishReason, GenerateResult, Completion, Prompt,
  ChatMessage, ChatTool, ChatToolCall, ChatToolCallDelta, ChatCompletionCreateParams, ChatCompletionUsage,
  ChatCompletion, ChatCompletionChunk, RequestOptions, ChatCompletions, EmbeddingsCreateParams, EmbeddingsResponse,
  EmbedOptions, ClassifyOptions, LabelScore, ClassifyUsage, Classified, SearchHit, IndexOptions, SearchIndex,
};

/** Every error name the engine produces. */
export type KerzeErrorName =
  | 'GgufError' | 'OnnxError' | 'UnsupportedArchError' | 'UnsupportedTensorTypeError' | 'ModelTooLargeError' | 'ModelConfigError'
  | 'TokenizerError' | 'ContextFullError' | 'InvalidArgumentError' | 'AbortError' | 'ModelError'
  | 'BackendError' | 'DeviceError' | 'IoError' | 'SnapshotError' | 'EngineBusyError' | 'DownloadError' | 'IntegrityError'
  | 'UnsupportedDeviceError' | 'WorkerError' | 'DisposedError' | 'EngineCrashedError'
  | 'CloudError' | 'ConsentError' | 'BudgetError';

export declare const ERROR_NAMES: readonly KerzeErrorName[];

/** An engine error; `name` says the kind. */
export declare class KerzeError extends Error {
  constructor(name: KerzeErrorName, message: string, options?: ErrorOptions);
  name: KerzeErrorName;
  /** ContextFullError: the tokens needed and the context's size. */
  needed?: number;
  nCtx?: number;
  /** ModelTooLargeError: what the model needs and the limit, MB. */
  needMb?: number;
  limitMb?: number;
  /** UnsupportedTensorTypeError: the tensor and its type; UnsupportedArchError: the architecture. */
  tensor?: string;
  tensorType?: string;
  arch?: string;
}

export interface CatalogEntry {
  name: string;
  file: string;
  bytes: number;
  sha256: string;
  url: string | null;
  license: string;
  /** The CPU engine's memory for it at the default context (kerze inspect: needs.peak_bytes). */
  peakBytes: number;
  /** Its largest tensor, the biggest buffer a GPU must hold. */
  largestTensorBytes: number;
}

/** The models kerze knows by id. */
export declare const catalog: Readonly<Record<string, CatalogEntry>>;

/** Any GGUF by URL (relative URLs resolve against the page). */
export interface ModelUrl {
  url: string;
  /** Checked before first use; without it the file is trusted as downloaded. */
  sha256?: string;
  /** Expected size in bytes (a shorter or longer download is an error). */
  bytes?: number;
  /** A catalog id: fills in sha256 and bytes when not given. */
  id?: string;
  name?: string;
  /**
   * An ONNX export (BERT-family encoder: feature extraction or sequence classification; f32,
   * f16 or int8) instead of a GGUF: its tokenizer.json and config.json, each a URL or the
   * parsed JSON. `url` is then the .onnx file, converted in the engine.
   */
  tokenizer?: string | object;
  config?: string | object;
}

/** An ONNX export's bytes with its tokenizer.json and config.json (URLs or parsed JSON). */
export interface OnnxBytes {
  data: ArrayBuffer | ArrayBufferView;
  tokenizer: string | object;
  config: string | object;
  name?: string;
}

export type ModelSpec = string | ModelUrl | OnnxBytes | ArrayBuffer | ArrayBufferView;

export type Device = 'auto' | 'webgpu' | 'cpu';

export interface Progress {
  phase: 'compile' | 'download' | 'cache' | 'load' | 'warmup' | 'ready';
  loaded: number;
  /** 0 when unknown (a download without Content-Length). */
  total: number;
}

export interface CreateEngineOptions {
  /** Catalog id (default 'gemma-3-270m'), `{ url, sha256 }`, or the file's bytes. */
  model?: ModelSpec;
  device?: Device;
  onProgress?: (p: Progress) => void;
  /** Non-fatal problems (e.g. no cache available). Default: console.warn. */
  onWarning?: (message: string) => void;
  /** Cancels the download and the load. */
  signal?: AbortSignal;
  /** Run in a Web Worker (default true); false runs in this thread with the same interface. */
  worker?: boolean;
  /** Threads of the threads build ('auto': when cross-origin isolated); false or 1: one. */
  threads?: 'auto' | number | false;
  /** Context window in tokens (default 4096, at most the model's). */
  nCtx?: number;
  /** Use the Cache API (default true). */
  cache?: boolean;
  /**
   * Where the package's files are served, self-hosted (a CDN, or a copy for a bundler that
   * emits none): the folder holding worker.js and wasm/, as in the npm package. Default: next
   * to the package's modules, or where the bundler emitted them.
   */
  assetsUrl?: string | URL;
  /** A cloud endpoint for what the local model cannot answer (see FallbackOptions). */
  fallback?: FallbackOptions;
  /** Called when answers start coming from another route: { route, reason }. */
  onRoute?: (r: RouteTag) => void;
  /** Simulate a weaker device in the device check (demos, tests): see ProbeOptions.overrides. */
  probeOverrides?: ProbeOptions['overrides'];
  /**
   * Answers to deterministic requests (temperature 0, or a fixed seed) kept in IndexedDB and
   * given again, streamed like fresh ones and tagged `kerze.cached`: keyed by the answering
   * model (sha256, backend and context; the endpoint for cloud answers) and the canonical
   * request. Default `{ ttlMs: 86400000, maxBytes: 8 MiB }`, least recently used out first;
   * `false`: off. Per request `cache: false`.
   */
  responseCache?: false | { ttlMs?: number; maxBytes?: number };
  /**
   * The prompt-prefix KV cache: a chat's messages before its last user message (a system
   * prompt, few-shot turns), or a text prompt's `prefix`, computed once and its keys and
   * values kept in the Cache API, keyed by the model's sha256, the backend, the engine version
   * and the prefix's ids; a later request, also in another visit, that starts with it computes
   * only the rest (`usage.prompt_tokens_details.cached_tokens`). Prefixes under `minTokens`
   * are not kept. Default `{ minTokens: 32, maxBytes: 256 MiB, maxEntries: 16 }`, oldest out
   * first; `false`: off. Per request `cache: false`. A damaged entry is dropped with a warning.
   */
  prefixCache?: false | { minTokens?: number; maxBytes?: number; maxEntries?: number };
  /**
   * Build the constraint engine's token trie while loading (default false: at the first
   * `schema`/`regex`/`grammar`/`choices`/tools request). It takes ~1 s and ~120 MB for Gemma 3's
   * 262 144 tokens; prepared, a constraint compiles in about a millisecond
   * (`engine.info.constraintsMs` says what it took).
   */
  prepareConstraints?: boolean;
  /**
   * Which wasm build runs the CPU engine: 'auto' (default) takes the relaxed-SIMD twin where
   * the browser validates relaxed SIMD, 'relaxed' asks for it (a warning and simd128 where it
   * cannot), 'simd128' never takes it. It changes int8 ONNX exports only: their products run on
   * 7-bit activations there, not exact (all-MiniLM-L6-v2's int8 file: worst cosine 0.993 to
   * its dequantized weights' float run, onnxruntime's own int8 run 0.982) and faster (1.3–1.4×
   * the whole model on an AVX-VNNI Xeon); 'simd128' keeps 16-bit activations (0.9999999).
   * `engine.info.simd` says which ran.
   */
  simd?: 'auto' | 'relaxed' | 'simd128';
}

export type FallbackReason = 'unsupported' | 'loading' | 'context' | 'error' | 'slow';

export interface FallbackOptions {
  /** As in the openai client: ends in /v1; requests go to `${baseURL}/chat/completions`. */
  baseURL: string;
  /** The endpoint's model. */
  model: string;
  headers?: Record<string, string>;
  /** A short-lived token from the site's backend, per request (sent as a Bearer token). Never put a long-lived key in a page. */
  getToken?: () => string | Promise<string>;
  /** When the endpoint answers (default: all). */
  when?: FallbackReason[];
  /** Asked once before a visitor's text first leaves the page; false: nothing is sent (ConsentError). */
  consent?: () => boolean | Promise<boolean>;
  /** Cloud requests per page session (then BudgetError). */
  budget?: number;
  /** `slow`: local decode tokens/s under which later answers go to the endpoint (default 3). */
  slowTokensPerS?: number;
}

export interface EngineInfo {
  /** 'cloud': the local model does not run (the fallback answers generation and chat). */
  backend: 'webgpu' | 'cpu-simd' | 'cpu-simd-threads' | 'cpu-native' | 'cloud';
  /** Why this backend was chosen. */
  reason: string;
  /**
   * The CPU kernels' instruction set: 'relaxed-simd' (browsers with relaxed SIMD: int8 ONNX
   * products on 7-bit activations), 'simd128', natively 'avx2' or 'portable'.
   */
  simd: 'relaxed-simd' | 'simd128' | 'avx2' | 'portable';
  /** The engine's version (a saved prompt prefix is used only by the same one). */
  version: string;
  model: string;
  arch: string;
  nCtx: number;
  nVocab: number;
  nLayer: number;
  nEmbd: number;
  weightBytes: number;
  tokenizerMs: number;
  loadMs: number;
  /** The model family the forward pass runs. */
  family: 'gemma3' | 'llama' | 'qwen2' | 'qwen3' | 'bert';
  /** Tensors per type in the file, e.g. { Q4_1: 210, Q8_0: 1, F32: 61 }. */
  quants: Record<string, number>;
  /** Where chat prompts get their format: the file's template, Gemma's built-in one, none. */
  chatTemplate: 'file' | 'builtin-gemma' | null;
  /** Where the bytes came from. */
  source: 'network' | 'cache' | 'memory';
  threads: number;
  /** Download or cache read, ms. */
  fetchMs: number;
  /** From bytes in memory (or the stored file) to ready, ms. */
  readyMs: number;
  /**
   * How a stored file (a Cache API entry, in the worker) was read while the weights were
   * unpacked on the CPU: 'worker' (a second worker read ahead), 'thread' (read ahead in the
   * engine's own worker, where the page's policy allows no blob: worker or that worker
   * failed), null (not a stored file, or loaded onto the GPU, which reads it plainly).
   */
  readAhead: 'worker' | 'thread' | null;
  /** With `prepareConstraints`: milliseconds the constraint engine's token trie took. */
  constraintsMs?: number;
  sha256: string | null;
  /**
   * Bytes of the engine's wasm memory once loaded (weights, tokenizer, reserved KV cache:
   * pages reserved but never written are not resident). It grows and never shrinks.
   */
  memoryBytes: number | null;
  /**
   * How the engine's worker started: 'script' (the package's worker.js, the one a bundler
   * emitted from it, or assetsUrl's), 'inline' (the package's self-contained copy, for bundles
   * that emit no file the package names: one thread), null (`worker: false`).
   */
  worker: 'script' | 'inline' | null;
  /**
   * Who answers now: 'local', or 'cloud' while the local model does not (it cannot run here,
   * failed to load, or is still downloading: then `reason` says so and the model fields are
   * absent, `model` naming the endpoint's).
   */
  route: 'local' | 'cloud';
}

export interface ProbeResult {
  /** 'risky': it may run, with the problems listed; 'no': it cannot (createEngine refuses). */
  canRun: 'yes' | 'risky' | 'no';
  backend: 'webgpu' | 'cpu-simd' | 'cpu-simd-threads';
  /** Everything the check found, problems included. */
  reasons: string[];
  /** What made it risky or impossible. */
  problems: string[];
  /** Bytes to download (0 when cached); null when unknown. */
  downloadBytes: number | null;
  modelBytes: number | null;
  /**
   * The tab's memory at the CPU engine's peak (catalog: its number; a GGUF URL: the engine's
   * plan from the file's header, `plan`; else 1.6× the file).
   */
  peakBytes: number | null;
  /** A GGUF URL the catalog does not know: what the engine will hold for it, from its header. */
  plan?: MemoryPlan;
  cached: boolean;
  storage: { quota: number | null; usage: number | null } | null;
  crossOriginIsolated: boolean;
  /** The browser validates relaxed SIMD: createEngine's default `simd: 'auto'` takes the relaxed builds. */
  relaxedSimd: boolean;
  deviceMemory: number | null;
}

/** The memory the CPU engine will hold for a model, from its file's header (bytes). */
export interface MemoryPlan {
  /** The weights as the engine keeps them. */
  weightBytes: number;
  /** The KV cache at `nCtx` tokens. */
  kvBytes: number;
  nCtx: number;
  /** The vocabulary's pieces and merges in the header. */
  vocabularyBytes: number;
  fileTensorBytes: number;
  headerBytes: number;
  /** The tab's memory at the load's peak: the above, the tokenizer and the engine's fixed needs. */
  peakBytes: number;
}

export interface ProbeOptions {
  model?: ModelSpec;
  /** The context the memory is planned for (default: the engine's, 4096 for a decoder). */
  nCtx?: number;
  device?: 'auto' | 'webgpu' | 'cpu';
  signal?: AbortSignal;
  /** Simulate a weaker device. */
  overrides?: { deviceMemory?: number; gpu?: false; storage?: { quota: number; usage: number } };
}

/** The device check before any download. */
export declare function probe(options?: ProbeOptions): Promise<ProbeResult>;

/** A loaded model. */
export declare class Engine {
  private constructor();
  /** Replaced (and a warning given) when the engine moves from the GPU to the CPU. */
  readonly info: Readonly<EngineInfo>;
  readonly chat: { readonly completions: ChatCompletions };
  /** OpenAI's embeddings API (an encoder model). */
  readonly embeddings: { create(body: EmbeddingsCreateParams): Promise<EmbeddingsResponse> };
  /**
   * One vector per text from an encoder model (all-MiniLM-L6-v2, BERT…): unit length unless
   * `normalize: false`; a text past the model's sequence length is truncated there
   * (`overflow: 'error'` refuses it, `'chunk'` averages windows).
   */
  embed(texts: string | string[], options?: EmbedOptions): Promise<Float32Array[]>;
  /** Labels and scores for one text (zero-/few-shot on an encoder, generative on a decoder). */
  classify(text: string, options?: ClassifyOptions): Promise<Classified>;
  /** … or one list per text. */
  classify(texts: string[], options?: ClassifyOptions): Promise<Classified[] & { readonly usage: ClassifyUsage }>;
  /** A semantic-search index over docs (an encoder model). */
  index<D extends string | { text: string }>(docs: D[], options?: IndexOptions<D>): Promise<SearchIndex<D>>;
  /** Stream the continuation of `prompt` (user text; control tokens stay text). */
  generate(prompt: Prompt, options?: GenerateOptions): AsyncGenerator<Chunk, GenerateResult, undefined>;
  /** Generate to the end. */
  complete(prompt: Prompt, options?: GenerateOptions): Promise<Completion>;
  tokenize(text: string, options?: { special?: boolean; bos?: boolean }): Promise<number[]>;
  detokenize(ids: ArrayLike<number>, options?: { skipSpecial?: boolean }): Promise<string>;
  /** Teacher-forced diagnostics: the k best [id, logit] for each position from `first`. */
  /**
   * `prefix`: the first ids repeat across calls (at most `first`): they are taken from the
   * prefix cache when it holds them, and kept in it otherwise.
   */
  logitsTopK(ids: ArrayLike<number>, options?: { k?: number; first?: number; prefix?: number }): Promise<Array<Array<[number, number]>>>;
  /** Forget the KV cache. */
  reset(): Promise<void>;
  /** Free the model and stop the worker. */
  dispose(): Promise<void>;
}

export declare function createEngine(options?: CreateEngineOptions): Promise<Engine>;

/** Throws UnsupportedDeviceError where the engine cannot run at all (no wasm SIMD). */
export declare function checkSupport(): void;

export interface ResolvedModel {
  key?: string;
  url?: string;
  sha256?: string | null;
  bytes?: number | null;
  name: string;
  data?: Uint8Array;
}

export declare function resolveModel(model: ModelSpec): ResolvedModel;

export interface CachedModel {
  key: string;
  url: string;
  sha256: string;
  bytes: number;
  name: string;
  storedAt: string;
}

/** The model cache of this origin. */
export declare const cache: {
  list(): Promise<CachedModel[]>;
  /** A catalog id, `{ url, sha256 }`, or a key from list(). */
  delete(model: string | ModelUrl): Promise<boolean>;
  /** Everything, or what is named: resolves to how many entries were removed. */
  clear(what?: { models?: boolean; responses?: boolean; prefixes?: boolean }): Promise<number>;
  size(): Promise<{
    models: { entries: number; bytes: number };
    responses: { entries: number; bytes: number };
    prefixes: { entries: number; bytes: number };
  }>;
};

/** @internal */
export declare function _setWorkerUrl(url: string | URL): void;

declare const kerze: {
  createEngine: typeof createEngine;
  probe: typeof probe;
  cache: typeof cache;
  catalog: typeof catalog;
  KerzeError: typeof KerzeError;
  Engine: typeof Engine;
};
export default kerze;
