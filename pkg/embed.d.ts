// The script-tag entry: registers <kerze-generate>, <kerze-search>, <kerze-classify> and sets
// window.kerze.
import type { createEngine, probe, cache, catalog, KerzeError, LabelScore } from './index.js';

/** The strings an element shows, by key (see STRINGS.en for the keys). */
export type KerzeStrings = Record<string, string>;

export interface KerzeGlobal {
  createEngine: typeof createEngine;
  probe: typeof probe;
  cache: typeof cache;
  catalog: typeof catalog;
  KerzeError: typeof KerzeError;
  /** The built-in strings: { en, de }. */
  strings: Readonly<Record<'en' | 'de', Readonly<KerzeStrings>>>;
}

interface KerzeElementBase extends HTMLElement {
  /** The strings in use (the page's language, then `strings`); set to override some. */
  strings: KerzeStrings;
  /** The element's language (its or an ancestor's `lang`), e.g. 'de'. */
  readonly language: string;
}

/** <kerze-generate model prompt|placeholder max-tokens temperature device preload sha256 system mode labels strings> */
export interface KerzeGenerateElement extends KerzeElementBase {
  /** The same as `strings`. */
  labels: KerzeStrings;
  /** Generate from the fixed prompt or the visitor's text. */
  generate(): Promise<void>;
}

/** <kerze-search model selector top-k placeholder device preload sha256 labels strings> */
export interface KerzeSearchElement extends KerzeElementBase {
  labels: KerzeStrings;
  /** Index the page (once) and show the best matches of `query`. */
  search(query: string): Promise<Array<{ element: Element; text: string; score: number }>>;
  /** Texts the encoder ran and texts found in the cache (null before the first search). */
  readonly stats: { encoded: number; cached: number } | null;
}

/** <kerze-classify model labels for method device preload sha256 strings> */
export interface KerzeClassifyElement extends KerzeElementBase {
  /** Classify `text` (default: the field's value). */
  classify(text?: string): Promise<LabelScore[]>;
}

declare global {
  interface Window {
    kerze: KerzeGlobal;
  }
  interface HTMLElementTagNameMap {
    'kerze-generate': KerzeGenerateElement;
    'kerze-search': KerzeSearchElement;
    'kerze-classify': KerzeClassifyElement;
  }
  interface HTMLElementEventMap {
    'kerze-done': CustomEvent<{ text: string }>;
    'kerze-search': CustomEvent<{ query: string; results: Array<{ element: Element; text: string; score: number }> }>;
    'kerze-classify': CustomEvent<{ text: string; label: string; score: number; results: LabelScore[] }>;
  }
}
