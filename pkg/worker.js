// The package's worker script. index.js starts it with the literal
// `new Worker(new URL('./worker.js', import.meta.url), { type: 'module' })`, the one form
// bundlers (Vite, webpack, Next.js) recognise, so they bundle it and its wasm as a worker.

import { serve } from './serve.js';

if (typeof WorkerGlobalScope !== 'undefined' && globalThis instanceof WorkerGlobalScope) serve(globalThis);
