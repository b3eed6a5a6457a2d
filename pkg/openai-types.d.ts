// Types of the OpenAI-shaped APIs: engine.chat.completions and engine.embeddings (the shapes
// of pkg/openai.js and openai-reply.js). Re-exported by index.d.ts (import them from 'kerze').
// Not here: generate()'s own options and results (generate-types.d.ts).

import type { RouteTag } from './generate-types.js';

export interface ChatMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool';
  /** null in an assistant message that only calls tools. */
  content: string | Array<{ type: 'text'; text: string }> | null;
  /** An earlier assistant turn's thinking (templates of reasoning models read it). */
  reasoning_content?: string;
  /** An earlier assistant turn's calls. */
  tool_calls?: ChatToolCall[];
  /** A tool message: the call it answers. */
  tool_call_id?: string;
  name?: string;
}

/** A function the model may call; `parameters` is the JSON schema its arguments follow. */
export interface ChatTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: object; strict?: boolean };
}

export interface ChatToolCall {
  id: string;
  type: 'function';
  /** arguments: JSON text valid against the function's parameters. */
  function: { name: string; arguments: string };
}

/** A piece of a streamed call: the first has id, type and name; later ones more arguments. */
export interface ChatToolCallDelta {
  index: number;
  id?: string;
  type?: 'function';
  function: { name?: string; arguments: string };
}

export interface ChatCompletionCreateParams {
  messages: ChatMessage[];
  model?: string;
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  max_tokens?: number;
  max_completion_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  seed?: number;
  stop?: string | string[];
  presence_penalty?: number;
  repetition_penalty?: number;
  frequency_penalty?: number;
  /** Only false. */
  logprobs?: boolean;
  /** Only 1. */
  n?: number;
  user?: string;
  signal?: AbortSignal;
  /** Qwen3's thinking switch (default: the template's); also in chat_template_kwargs. */
  enable_thinking?: boolean;
  chat_template_kwargs?: { enable_thinking?: boolean };
  /** The last message is the assistant's start: the answer continues it. */
  continue_final_message?: boolean;
  /**
   * Constrained output: OpenAI's `{ type: 'text' | 'json_object' }` and `{ type:
   * 'json_schema', json_schema: { name, schema, strict } }`, WebLLM's `{ type: 'json_object',
   * schema }` and `{ type: 'grammar', grammar }` (Lark), and `{ type: 'regex', regex }`,
   * `{ type: 'choices', choices }`.
   */
  response_format?:
    | { type: 'text' }
    | { type: 'json_object'; schema?: object | string }
    | { type: 'json_schema'; json_schema: { name?: string; schema: object | string; strict?: boolean; description?: string } }
    | { type: 'grammar'; grammar: string }
    | { type: 'regex'; regex: string }
    | { type: 'choices'; choices: string[] };
  /**
   * Functions the model may call. Under 'auto' (the default) the answer is text or calls,
   * 'required' at least one call, a named function a call of it, 'none' text: each call's
   * arguments valid against its function's schema (constrained decoding).
   */
  tools?: ChatTool[];
  tool_choice?: 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };
  /** Several calls in one answer (default true). */
  parallel_tool_calls?: boolean;
  /** 'auto' (default): local unless a fallback reason holds; 'local' or 'cloud' to choose. */
  route?: 'auto' | 'local' | 'cloud';
  /** false: neither read nor store this request in the response cache or the prefix cache. */
  cache?: boolean;
}

export interface ChatCompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** Prompt tokens taken from the KV cache (the engine's earlier turn), not computed again. */
  prompt_tokens_details: { cached_tokens: number };
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    /** A reply that opens with <think>…</think> has that part in reasoning_content. */
    message: { role: 'assistant'; content: string | null; reasoning_content?: string; tool_calls?: ChatToolCall[] };
    finish_reason: 'stop' | 'length' | 'tool_calls';
    logprobs: null;
    /** kerze: with `response_format: { type: 'choices' }`, each choice's log-likelihood and probability. */
    choice_scores?: Array<{ choice: string; logprob: number; prob: number }>;
  }>;
  usage: ChatCompletionUsage;
  kerze: RouteTag;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    delta: { role?: 'assistant'; content?: string; reasoning_content?: string; tool_calls?: ChatToolCallDelta[] };
    finish_reason: 'stop' | 'length' | 'tool_calls' | null;
    logprobs: null;
    /** On the finish chunk, as in ChatCompletion. */
    choice_scores?: Array<{ choice: string; logprob: number; prob: number }>;
  }>;
  usage?: ChatCompletionUsage;
  kerze: RouteTag;
}

export interface RequestOptions {
  signal?: AbortSignal;
}

export interface ChatCompletions {
  create(body: ChatCompletionCreateParams & { stream: true }, req?: RequestOptions): Promise<AsyncGenerator<ChatCompletionChunk, void, undefined>>;
  create(body: ChatCompletionCreateParams & { stream?: false }, req?: RequestOptions): Promise<ChatCompletion>;
  create(body: ChatCompletionCreateParams, req?: RequestOptions): Promise<ChatCompletion | AsyncGenerator<ChatCompletionChunk, void, undefined>>;
}

export interface EmbeddingsCreateParams {
  /** A text or texts (an empty string embeds as [CLS] [SEP]); at most 2048. */
  input: string | string[];
  model?: string;
  /** 'float' (default) or 'base64' (little-endian f32 bytes). */
  encoding_format?: 'float' | 'base64';
  /** Only the model's own size. */
  dimensions?: number;
  user?: string;
}

export interface EmbeddingsResponse {
  object: 'list';
  data: Array<{ object: 'embedding'; index: number; embedding: number[] | string }>;
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}
