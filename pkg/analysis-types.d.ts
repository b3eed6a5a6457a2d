// Types of the analysis methods: embed(), classify() and index()'s search. Re-exported by
// index.d.ts (import them from 'kerze'). Not here: the OpenAI embeddings API's shapes
// (openai-types.d.ts).

export interface EmbedOptions {
  /** Default true. */
  normalize?: boolean;
  /** Default 'truncate' (as sentence-transformers). */
  overflow?: 'truncate' | 'error' | 'chunk';
}

export interface ClassifyOptions {
  /**
   * Names or descriptions (zero-shot), or label → example texts (few-shot; encoders).
   * Left out on a sequence-classification model: its own labels, scored by its head.
   */
  labels?: string[] | Record<string, string[] | string>;
  /** Few-shot: nearest centroid (default) or a logistic-regression head on the examples. */
  method?: 'centroid' | 'logistic';
  /** Softmax temperature of the cosine similarities (default 0.05). */
  temperature?: number;
  /** Zero-shot on an encoder: the text embedded for a label (default '{label}'). */
  labelTemplate?: string;
  /** Decoder: the prompt, with {labels} and {text}. */
  prompt?: string;
  /** Decoder: subtract the labels' scores after a content-free text (default true). */
  calibrate?: boolean;
}

export interface LabelScore {
  label: string;
  /** The scores of one text sum to 1. */
  score: number;
}

export interface ClassifyUsage {
  textsEncoded: number;
  labelsEncoded: number;
  promptTokens: number;
  ms: number;
}

export type Classified = LabelScore[] & { readonly usage: ClassifyUsage };

export interface SearchHit<D> {
  doc: D;
  /** Cosine similarity. */
  score: number;
  index: number;
}

export interface IndexOptions<D> {
  /** A doc's identity for remove(): a property name or a function (default: its text). */
  key?: string | ((doc: D, text: string) => unknown);
  /** Keep the docs' embeddings in IndexedDB across visits (default true). */
  cache?: boolean;
}

export interface SearchIndex<D> {
  search(query: string, options?: { topK?: number }): Promise<SearchHit<D>[]>;
  add(docs: D | D[]): Promise<SearchIndex<D>>;
  remove(keysOrDocs: unknown): number;
  readonly size: number;
  /** Texts the encoder ran, and texts found in the cache. */
  readonly stats: { encoded: number; cached: number };
}
