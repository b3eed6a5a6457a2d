//! wasm-bindgen surface (filled by the browser-package work).
