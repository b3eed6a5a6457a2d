// The memory a model will need, stated before its download: the file's header (its first
// megabytes, an HTTP range; from a server without ranges the body is read that far and cut
// off) weighed by the engine's own accounting (`planMemory`, src/engine/memory.rs) in the
// wasm build that would run it here, so the estimate is the layout the load will make, not
// a ratio of the file's size. What `probe` states for a model the catalog does not know.
// Not here: the verdict (probe.js), the load (core.js).

import { KerzeError, abortError } from './protocol.js';
import { relaxedSimd, wasmUrl } from './wasm-load.js';

/** The first read of the header (Llama 3's is 7.8 MB, Gemma 3's 6.5 MB), and the most read. */
const FIRST_BYTES = 8 << 20;
const MOST_BYTES = 128 << 20;

/**
 * The file's first `n` bytes and its length (null where the server does not say): a range
 * request; a server that sends the whole file anyway is read `n` bytes far and cut off.
 */
async function firstBytes(url, n, signal) {
  let res;
  try {
    res = await fetch(url, { headers: { Range: `bytes=0-${n - 1}` }, signal });
  } catch (e) {
    if (signal?.aborted) throw abortError(signal);
    throw new KerzeError('DownloadError', `could not fetch the header of ${url}: ${e?.message ?? e}`);
  }
  if (!res.ok) throw new KerzeError('DownloadError', `HTTP ${res.status} ${res.statusText} fetching the header of ${url}`);
  const range = /\/(\d+)\s*$/.exec(res.headers.get('content-range') ?? '');
  const length = Number(res.headers.get('content-length'));
  const total = range ? Number(range[1]) : (res.status === 200 && Number.isSafeInteger(length) && length > 0 ? length : null);
  const buf = new Uint8Array(Math.min(n, total ?? n));
  let got = 0;
  const reader = res.body.getReader();
  try {
    while (got < buf.length) {
      const { done, value } = await reader.read();
      if (done) break;
      const take = Math.min(value.length, buf.length - got);
      buf.set(value.subarray(0, take), got);
      got += take;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  return { bytes: got === buf.length ? buf : buf.slice(0, got), total: total ?? (got < n ? got : null) };
}

/**
 * The engine's memory plan for the model at `url` at context `nCtx` (default: the engine's):
 * { weightBytes, kvBytes, nCtx, vocabularyBytes, fileTensorBytes, headerBytes, peakBytes }.
 * Loads this browser's wasm build in the calling context (its memory then holds the header
 * once, a few MB, for the page's life). Throws DownloadError, ModelError (not a GGUF model,
 * or a header past 128 MB), AbortError.
 */
export async function planFromHeader(url, { nCtx = null, signal } = {}) {
  const relaxed = relaxedSimd();
  const glue = relaxed ? await import('./wasm/relaxed/kerze.js') : await import('./wasm/kerze.js');
  await glue.default({
    module_or_path: relaxed ? new URL('./wasm/relaxed/kerze_bg.wasm', import.meta.url) : wasmUrl(),
  });
  for (let n = FIRST_BYTES; ; n *= 4) {
    const { bytes, total } = await firstBytes(url, n, signal);
    // Without a length the header's counts are checked against what was read.
    const plan = glue.planMemory(bytes, total ?? bytes.length, JSON.stringify({ nCtx }));
    if (plan) return JSON.parse(plan);
    if (n >= MOST_BYTES) {
      throw new KerzeError('ModelError', `the header of ${url} is larger than ${MOST_BYTES >> 20} MB`);
    }
  }
}
