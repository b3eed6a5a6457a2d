// The script-tag entry: registers <kerze-generate> and sets window.kerze.
import type { createEngine, cache, catalog, KerzeError } from './index.js';

export interface KerzeGlobal {
  createEngine: typeof createEngine;
  cache: typeof cache;
  catalog: typeof catalog;
  KerzeError: typeof KerzeError;
}

/** <kerze-generate model prompt|placeholder max-tokens temperature device preload sha256> */
export interface KerzeGenerateElement extends HTMLElement {
  /** Generate from the fixed prompt or the visitor's text. */
  generate(): Promise<void>;
}

declare global {
  interface Window {
    kerze: KerzeGlobal;
  }
  interface HTMLElementTagNameMap {
    'kerze-generate': KerzeGenerateElement;
  }
  interface HTMLElementEventMap {
    'kerze-done': CustomEvent<{ text: string }>;
  }
}
