// Entry of the inline worker: the engine as one self-contained script with the single-thread
// wasm, the chat-template and the constraint modules inside (gzip, base64). For bundles that left the package's files behind (esbuild,
// Rollup: see packageLayout() in transport.js), transport.js starts it from a blob: URL. Not shipped
// as is: build-inline.mjs bundles it into pkg/wasm/inline/.

import { serve } from './serve.js';
import { WASM_GZIP_BASE64, JINJA_GZIP_BASE64, GUIDE_GZIP_BASE64 } from './wasm/inline/wasm-gzip-base64.js';

/** A wasm module's bytes (gzip, base64), unpacked as they stream into the compiler. */
function unpack(base64) {
  if (typeof DecompressionStream !== 'function') {
    throw new Error('this browser cannot unpack the inline engine (no DecompressionStream): '
      + "serve the package's files and pass their folder as createEngine's assetsUrl");
  }
  const packed = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream('gzip'));
  return new Response(stream, { headers: { 'Content-Type': 'application/wasm' } });
}

serve(globalThis, {
  wasm: () => unpack(WASM_GZIP_BASE64),
  jinja: () => unpack(JINJA_GZIP_BASE64),
  guide: () => unpack(GUIDE_GZIP_BASE64),
});
