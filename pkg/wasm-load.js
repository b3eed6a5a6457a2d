// Which wasm build runs the engine here, and its load: the threads build where it may run,
// the relaxed-SIMD twin where the browser validates it and its kernels agree with the portable
// ones, else single-thread simd128; whether the WebGPU path is taken; and the modules the
// builds leave out (the chat-template and constraint modules), loaded on first use and handed
// to the engine's module. Not here: the model's bytes and what runs on the loaded engine
// (core.js). The `import('./wasm/…')` paths and the `new URL(…, import.meta.url)` forms stay
// literal: bundlers follow only those.

import { KerzeError } from './protocol.js';
import { RELAXED_SIMD_PROBE } from './probe.js';

/** The key under which rayon-start.js finds how to start a thread. */
const RAYON_SPAWN = Symbol.for('kerze.spawnRayonWorker');

/** Where the single-thread build's module is: next to this file (bundlers emit it there). */
export function wasmUrl() {
  return new URL('./wasm/kerze_bg.wasm', import.meta.url);
}

/**
 * Where the chat-template module is (src/jinja/: the engine's builds leave the template
 * engine out; it is loaded at the first chat that needs a template).
 */
export function jinjaUrl() {
  return new URL('./wasm/jinja/kerze_jinja_bg.wasm', import.meta.url);
}

/**
 * Where the constraint module is (src/guide/: llguidance; the engine's builds leave it out,
 * it is loaded at the first constrained request or `prepareConstraints`).
 */
export function guideUrl() {
  return new URL('./wasm/guide/kerze_guide_bg.wasm', import.meta.url);
}

/** Whether this browser validates relaxed SIMD (then the relaxed builds can run). */
export function relaxedSimd() {
  return typeof WebAssembly === 'object' && WebAssembly.validate(RELAXED_SIMD_PROBE);
}

/** A thread of the threads build: told first which twin's glue to import (rayon-worker.js). */
function spawnThread(build) {
  const worker = new Worker(new URL('./rayon-worker.js', import.meta.url), { type: 'module', name: 'kerze-rayon' });
  worker.postMessage({ type: 'kerze_rayon_build', build });
  return worker;
}

/**
 * Whether a relaxed-SIMD build's kernels equal the portable ones on this device (a few
 * milliseconds): relaxed SIMD is what the browser lowers it to, so it is checked, not trusted.
 * Not a formality: Node 20's V8 fails it on the dense `Narrow` kernel (so there the engine
 * runs simd128); Chromium 156 passes.
 */
function kernelsAgree(glue, warn) {
  try {
    glue.checkKernels();
    return true;
  } catch (e) {
    warn(`the relaxed-SIMD kernels disagree with the portable ones here (${e?.message ?? e}): running on simd128`);
    return false;
  }
}

/**
 * Load the wasm glue: the threads build when asked for and possible, else single-thread
 * (its module from `wasm()`: a URL, a Response or bytes; `custom`: given by the host, which
 * then has no relaxed twin). `simd`: 'auto' takes the relaxed-SIMD twin where the browser
 * validates it, 'relaxed' asks for it (a warning where it cannot), 'simd128' never takes it.
 */
export async function loadWasm(threads, warn, wasm, simd = 'auto', custom = false) {
  const can = relaxedSimd();
  if (simd === 'relaxed' && !can) warn('relaxed SIMD was asked for, but this browser does not validate it: running on simd128');
  if (simd === 'relaxed' && can && custom && threads <= 1) warn('relaxed SIMD was asked for, but this engine\'s wasm is the host\'s own (the inline worker), with no relaxed twin: running on simd128');
  const relaxed = simd !== 'simd128' && can;
  if (threads > 1) {
    try {
      // How rayon-start.js starts a thread: here, in the literal form bundlers emit as a
      // worker, and outside the threads' own module graph (see there).
      const build = relaxed ? 'relaxed' : 'simd128';
      globalThis[RAYON_SPAWN] = () => spawnThread(build);
      const glue = relaxed ? await import('./wasm/threads-relaxed/kerze.js') : await import('./wasm/threads/kerze.js');
      const exports = await glue.default({
        module_or_path: relaxed
          ? new URL('./wasm/threads-relaxed/kerze_bg.wasm', import.meta.url)
          : new URL('./wasm/threads/kerze_bg.wasm', import.meta.url),
      });
      // The calling thread computes too (src/cpu/team.rs): `threads` in all.
      await glue.initThreadPool(threads - 1);
      if (!relaxed || kernelsAgree(glue, warn)) return { glue, threads, memory: exports.memory };
      // Its pool holds the memory: the single-thread simd128 build takes over.
      return await loadWasm(0, warn, wasm, 'simd128', custom);
    } catch (e) {
      warn(`the threads build did not start (${e?.message ?? e}): running on one thread`);
    }
  }
  if (relaxed && !custom) {
    try {
      const glue = await import('./wasm/relaxed/kerze.js');
      const exports = await glue.default({ module_or_path: new URL('./wasm/relaxed/kerze_bg.wasm', import.meta.url) });
      if (kernelsAgree(glue, warn)) return { glue, threads: 1, memory: exports.memory };
    } catch (e) {
      warn(`the relaxed-SIMD build did not start (${e?.message ?? e}): running on simd128`);
    }
  }
  const glue = await import('./wasm/kerze.js');
  const exports = await glue.default({ module_or_path: await wasm() });
  return { glue, threads: 1, memory: exports.memory };
}

/**
 * Whether to take the WebGPU path: `webgpu` always; `auto` when this context offers an
 * adapter that is not a software fallback. Returns [yes, why not].
 */
export async function probeGpu(device) {
  if (device === 'cpu') return [false, "device 'cpu' was asked for"];
  if (device === 'webgpu') return [true, null];
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) return [false, 'no WebGPU in this browser'];
  try {
    const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
    if (!adapter) return [false, 'no WebGPU adapter'];
    if (adapter.info?.isFallbackAdapter) {
      return [false, `the WebGPU adapter (${adapter.info.description || adapter.info.architecture || 'software'}) is a software fallback (slower than the CPU engine)`];
    }
    return [true, null];
  } catch (e) {
    return [false, `WebGPU failed: ${e?.message ?? e}`];
  }
}

/**
 * The modules the engine's builds leave out, each loaded at its first use: the chat-template
 * module (`jinja`: gives its wasm) and the constraint module (`guide`).
 */
export class ExtraModules {
  constructor(jinja, guide) {
    this.jinja = jinja;
    this.guide = guide;
    /** The chat-template and constraint modules' loads, once started (see #module). */
    this.templates = null;
    this.guides = null;
  }

  /**
   * A module the engine's builds leave out, loaded on first use and handed to the engine's
   * module (`glue`; `hand`: its setter there, given `pick(module)`; a build with the module's
   * code inside, as the wasm tests', has none and needs nothing). `slot`: where the load is
   * kept; a failed load is tried again next time.
   */
  async #module(glue, slot, hand, glueOf, url, what, pick = (m) => m) {
    if (typeof glue?.[hand] !== 'function') return;
    this[slot] ??= (async () => {
      const m = await glueOf();
      await m.default({ module_or_path: await url() });
      return m;
    })().catch((e) => {
      this[slot] = null;
      throw new KerzeError('DownloadError', `the ${what} module did not load (${e?.message ?? e})`, { cause: e });
    });
    // Handed over every time (a setter): a later load in this Core may run another build.
    glue[hand](pick(await this[slot]));
  }

  /**
   * Before a chat with the file's template: the engine's module renders it through the
   * chat-template module (src/jinja/). Pages that never chat, or chat in Gemma's built-in
   * format, never load it. `chatTemplate`: the loaded model's (engine info).
   */
  async forChat(glue, input, chatTemplate) {
    if (!Array.isArray(input.messages) || chatTemplate !== 'file') return;
    await this.#module(glue, 'templates', 'setTemplateRenderer',
      () => import('./wasm/jinja/kerze_jinja.js'), this.jinja, 'chat-template', (m) => m.render);
  }

  /**
   * Before a constrained request (or `prepareConstraints`): the engine's module compiles
   * and matches through the constraint module (src/guide/).
   */
  async forConstraints(glue) {
    await this.#module(glue, 'guides', 'setGuideModule',
      () => import('./wasm/guide/kerze_guide.js'), this.guide, 'constraint');
  }
}
