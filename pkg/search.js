// Semantic search over documents with an encoder model: `await engine.index(docs)` →
// { search(query, { topK }), add(docs), remove(keys), size, stats }. Vectors are unit length
// (the encoder normalises), so a score is a cosine similarity. The documents' embeddings are
// kept in IndexedDB by (model sha256, text sha256) (cache.js): a returning visitor's index
// runs the encoder only for texts it has not seen.

import { KerzeError } from './protocol.js';
import { openEmbeddingStore, textHash } from './cache.js';

const bad = (m) => new KerzeError('InvalidArgumentError', m);

/** The most documents one index holds (a page's sections, an FAQ: far fewer). */
export const MAX_DOCS = 20000;
/** Texts per encoder call while indexing. */
const BATCH = 32;

function textOf(doc, i) {
  const t = typeof doc === 'string' ? doc : doc?.text;
  if (typeof t !== 'string') throw bad(`index: docs[${i}] must be a string or an object with a text string`);
  if (!t.trim()) throw bad(`index: docs[${i}] is empty`);
  return t;
}

export class SearchIndex {
  #embed;
  #store;
  #model;
  #keyOf;
  #docs = [];
  #keys = [];
  #vectors = [];

  /**
   * `embed(texts)` → Float32Array[] (unit length); `model` the model's sha256 (null: no
   * cache); `key` a doc's identity for remove(): a property name, a function, or (default)
   * the doc's text.
   */
  constructor({ embed, model, key, store }) {
    this.#embed = embed;
    this.#model = model;
    this.#store = store;
    if (key == null) this.#keyOf = (doc, text) => text;
    else if (typeof key === 'string') this.#keyOf = (doc) => doc?.[key];
    else if (typeof key === 'function') this.#keyOf = key;
    else throw bad('index: key must be a property name or a function');
    /** Texts run through the encoder, and texts found in the cache, since creation. */
    this.stats = { encoded: 0, cached: 0 };
  }

  static async create(opts, docs, { cache = true, onWarning } = {}) {
    let store = null;
    if (cache && opts.model) {
      const r = await openEmbeddingStore();
      store = r.store;
      if (!store) onWarning?.(`page embeddings will not be cached: ${r.reason}`);
    }
    const ix = new SearchIndex({ ...opts, store });
    if (!Array.isArray(docs)) throw bad('index: docs must be an array of strings or { text } objects');
    if (docs.length === 0) throw bad('index: no docs (give at least one, or add them later to an index of one)');
    await ix.add(docs);
    return ix;
  }

  get size() {
    return this.#docs.length;
  }

  /** Add documents (strings or objects with a `text`); a doc whose key is already in is replaced. */
  async add(docs) {
    if (!Array.isArray(docs)) docs = [docs];
    if (this.#docs.length + docs.length > MAX_DOCS) throw bad(`index: at most ${MAX_DOCS} docs`);
    const texts = docs.map(textOf);
    const vectors = await this.#vectorsOf(texts);
    docs.forEach((doc, i) => {
      const k = this.#keyOf(doc, texts[i]);
      const at = this.#keys.indexOf(k);
      if (at >= 0) {
        this.#docs[at] = doc;
        this.#vectors[at] = vectors[i];
      } else {
        this.#docs.push(doc);
        this.#keys.push(k);
        this.#vectors.push(vectors[i]);
      }
    });
    return this;
  }

  /** Remove documents by key (or the docs themselves); resolves to how many went. */
  remove(keysOrDocs) {
    const list = Array.isArray(keysOrDocs) ? keysOrDocs : [keysOrDocs];
    let removed = 0;
    for (const x of list) {
      let at = this.#keys.indexOf(x);
      if (at < 0) at = this.#docs.indexOf(x);
      if (at < 0) continue;
      this.#docs.splice(at, 1);
      this.#keys.splice(at, 1);
      this.#vectors.splice(at, 1);
      removed += 1;
    }
    return removed;
  }

  /** The `topK` documents most similar to `query`: [{ doc, score, index }], best first. */
  async search(query, { topK = 5 } = {}) {
    if (typeof query !== 'string' || !query.trim()) throw bad('search: the query must be a non-empty string');
    if (!Number.isSafeInteger(topK) || topK < 1) throw bad('search: topK must be a positive integer');
    const [q] = await this.#embed([query]);
    const scored = this.#vectors.map((v, index) => {
      let s = 0;
      for (let j = 0; j < v.length; j++) s += v[j] * q[j];
      return { index, score: s };
    });
    scored.sort((a, b) => b.score - a.score);
    return scored.slice(0, topK).map(({ index, score }) => ({ doc: this.#docs[index], score, index }));
  }

  async #vectorsOf(texts) {
    const out = new Array(texts.length);
    let keys = null;
    if (this.#store) {
      try {
        keys = await Promise.all(texts.map(async (t) => `${this.#model}/${await textHash(t)}`));
        const found = await this.#store.getMany(keys);
        found.forEach((v, i) => {
          if (v instanceof Float32Array) out[i] = v;
        });
      } catch {
        keys = null; // a broken store: embed everything
      }
    }
    const missing = [];
    for (let i = 0; i < texts.length; i++) if (!out[i]) missing.push(i);
    this.stats.cached += texts.length - missing.length;
    for (let b = 0; b < missing.length; b += BATCH) {
      const part = missing.slice(b, b + BATCH);
      const vs = await this.#embed(part.map((i) => texts[i]));
      part.forEach((i, j) => { out[i] = vs[j]; });
      this.stats.encoded += part.length;
      if (this.#store && keys) {
        try {
          await this.#store.putMany(part.map((i) => [keys[i], out[i]]));
        } catch {
          // Quota or a closed store: the index works, the next visit embeds again.
        }
      }
    }
    return out;
  }
}
