// The messages between the page (index.js) and the worker (worker.js), and how errors cross
// that boundary: as { name, message } records, rebuilt as KerzeError on the other side. One
// source of truth for both sides.
//
// page → worker  { id, op: 'load' | 'generate' | 'abort' | 'tokenize' | 'detokenize' |
//                  'logitsTopK' | 'reset' | 'dispose' | 'cache', args }
// worker → page  { id, type: 'progress', progress }   load progress
//                { id, type: 'chunk', chunk }         one streamed piece { text, tokenId }
//                { id, type: 'result', value }        the op's result (ends the request)
//                { id, type: 'error', error }         the op failed (ends the request)
//                { type: 'warning', message }         not fatal (e.g. no cache available)
//                { type: 'info', info }               the engine info changed (the GPU was
//                                                     lost: the engine went on on the CPU)

/** Every error name the engine produces (Rust `Error::kind()` plus the JS side's own). */
export const ERROR_NAMES = Object.freeze([
  'GgufError', 'OnnxError', 'UnsupportedArchError', 'UnsupportedTensorTypeError', 'ModelTooLargeError', 'ModelConfigError',
  'TokenizerError', 'ContextFullError', 'InvalidArgumentError', 'AbortError', 'ModelError',
  'BackendError', 'DeviceError', 'IoError', 'SnapshotError', 'EngineBusyError', 'DownloadError', 'IntegrityError',
  'UnsupportedDeviceError', 'WorkerError', 'DisposedError', 'EngineCrashedError',
  'CloudError', 'ConsentError', 'BudgetError',
]);

/** An engine error: `name` says the kind (one of ERROR_NAMES), `message` the cause. */
export class KerzeError extends Error {
  constructor(name, message, options) {
    super(message, options);
    this.name = name;
  }
}

/** Fields an error carries besides name and message (ContextFullError: needed, nCtx; …). */
export const ERROR_FIELDS = Object.freeze(['needed', 'nCtx', 'needMb', 'limitMb', 'tensor', 'tensorType', 'arch', 'status', 'route']);

function fieldsOf(e) {
  const out = {};
  for (const k of ERROR_FIELDS) {
    const v = e?.[k];
    if (typeof v === 'number' || typeof v === 'string') out[k] = v;
  }
  return out;
}

/** An error as a plain record that structured clone keeps intact (its fields too). */
export function serializeError(e) {
  if (e instanceof RangeError && /memory|allocat/i.test(e.message)) {
    return { name: 'UnsupportedDeviceError', message: `not enough memory for this model here: ${e.message}` };
  }
  if (typeof WebAssembly === 'object' && e instanceof WebAssembly.RuntimeError) {
    return { name: 'EngineCrashedError', message: `the engine crashed (${e.message}); create a new engine` };
  }
  if (e && typeof e === 'object' && typeof e.name === 'string' && typeof e.message === 'string') {
    return { name: ERROR_NAMES.includes(e.name) ? e.name : 'WorkerError', message: e.message, ...fieldsOf(e) };
  }
  return { name: 'WorkerError', message: String(e) };
}

/** The record rebuilt as a KerzeError. */
export function deserializeError(r) {
  const e = new KerzeError(r?.name ?? 'WorkerError', r?.message ?? 'unknown error');
  Object.assign(e, fieldsOf(r));
  return e;
}

/** The error an AbortSignal produces. */
export function abortError(signal) {
  const reason = signal?.reason;
  const detail = reason instanceof Error && reason.name !== 'AbortError' ? `: ${reason.message}` : '';
  return new KerzeError('AbortError', `aborted${detail}`);
}
